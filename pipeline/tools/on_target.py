"""Run a library on its target through `pipeline-run` and the target's `run` prefix
(an emulator such as `qemu-aarch64 -L /usr/aarch64-linux-gnu`, or a remote shell):
what `doit validate` and `doit bench` do for a library this machine cannot load.

    run_on_target(prefix, pipeline_run, lib, feeds, n_outputs, repeat=3)
        -> (outputs, median ms per run or None, wall seconds of the process)

Inputs go to the program as .npy files, outputs come back as DIR/output_<i>.npy.

A model of executor aot runs as its own program (pipeline/runtime/c/aot_main.c: the
host's program, or a bare-metal target's firmware given to `qemu-system-arm ...
-kernel`), in a folder holding input_<i>.bin; it writes output_<i>.bin there:

    run_aot_program(prefix, program, metadata, feeds) -> (outputs, wall seconds)
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time

import numpy as np

from pipeline.errors import PipelineError


class TargetRunError(PipelineError):
    """pipeline-run could not run the library on the target."""


_MEDIAN = re.compile(r"median ([0-9.]+) ms per run")


def require_run(run: str | None, config: str, target: str, arch: str) -> list[str]:
    """The `run` prefix as words; PipelineError naming targets.<t>.run when it is unset
    or its program is not installed."""
    if not run and ("thumb" in arch or arch == "riscv32"):
        example = ("qemu-system-riscv32 -M virt -bios none" if arch == "riscv32"
                   else "qemu-system-arm -M mps2-an386")
        raise PipelineError(
            f"{config}: targets.{target}.run is not set: a firmware for {arch} runs on its "
            f"board or an emulator of it; give the command the firmware follows, e.g. "
            f"\"{example} -nographic -semihosting-config enable=on,target=native -kernel\" "
            f"(Debian package {'qemu-system-misc' if arch == 'riscv32' else 'qemu-system-arm'})")
    if not run:
        raise PipelineError(
            f"{config}: targets.{target}.run is not set: a library for {arch} cannot run on "
            f"this machine, so give the command prefix that runs {arch} programs (e.g. "
            f"\"qemu-{arch} -L /usr/{arch}-linux-gnu\", Debian package qemu-user)")
    words = shlex.split(run)
    if shutil.which(words[0]) is None:
        raise PipelineError(f"{config}: targets.{target}.run: {words[0]!r} is not installed "
                            "(qemu-user for the qemu-* emulators)")
    return words


# An emulated board is slow; a firmware that hangs (a fault loops in its handler) is
# stopped after this long.
AOT_TIMEOUT_S = 900


def run_aot_program(prefix: list[str], program: str, metadata: dict, feeds: dict
                    ) -> tuple[list[np.ndarray], float]:
    """Run an AOT model's program (`prefix + [program]`, in a temporary folder) on
    `feeds` ({input name: array}); metadata: its metadata.json (input order, output
    dtypes and shapes). Its outputs and the wall seconds of the process;
    TargetRunError with the program's last line when it fails."""
    (module,) = metadata["modules"].values()
    with tempfile.TemporaryDirectory(prefix="aot-run-") as tmp:
        for i, (name, spec) in enumerate(module["inputs"].items()):
            value = np.ascontiguousarray(feeds[name], dtype=spec["dtype"])
            value.tofile(os.path.join(tmp, f"input_{i}.bin"))
        cmd = [*prefix, os.path.abspath(program)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp,
                                  timeout=AOT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise TargetRunError(f"{shlex.join(cmd)}: no exit after {AOT_TIMEOUT_S} s") from None
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            raise TargetRunError(f"{shlex.join(cmd)} failed (exit {proc.returncode}): {why}")
        outputs = [np.fromfile(os.path.join(tmp, f"output_{i}.bin"), dtype=spec["dtype"])
                   .reshape(spec["shape"]) for i, spec in enumerate(module["outputs"].values())]
    return outputs, seconds


def run_on_target(prefix: list[str], pipeline_run: str, lib: str, feeds: dict,
                  n_outputs: int, threads: int | None = None, repeat: int = 0,
                  ) -> tuple[list[np.ndarray], float | None, float]:
    """Run `lib` once on `feeds` ({input name: array}) with `prefix + [pipeline_run]`,
    then `repeat` timed runs; its outputs, the median ms it printed (None without
    repeat) and the wall seconds of the whole process (emulator start included).
    TargetRunError with pipeline-run's one error line when it fails."""
    with tempfile.TemporaryDirectory(prefix="on-target-") as tmp:
        cmd = [*prefix, os.path.abspath(pipeline_run), os.path.abspath(lib)]
        for i, (name, value) in enumerate(feeds.items()):
            file = os.path.join(tmp, f"input_{i}.npy")
            np.save(file, np.ascontiguousarray(value))
            cmd += ["--input", f"{name}={file}"]
        cmd += ["--output-dir", tmp]
        if threads:
            cmd += ["--threads", str(threads)]
        if repeat:
            cmd += ["--repeat", str(repeat)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise TargetRunError(f"{shlex.join(cmd[:len(prefix) + 2])} failed: {why}")
        outputs = [np.load(os.path.join(tmp, f"output_{i}.npy")) for i in range(n_outputs)]
    found = _MEDIAN.search(proc.stdout)
    if repeat and not found:
        raise TargetRunError(f"pipeline-run printed no median time: {proc.stdout.strip()!r}")
    return outputs, (float(found.group(1)) if found else None), seconds
