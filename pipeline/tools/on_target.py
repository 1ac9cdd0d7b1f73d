"""Run a library on its target through `pipeline-run` and the target's `run` prefix
(an emulator such as `qemu-aarch64 -L /usr/aarch64-linux-gnu`, or a remote shell):
what `doit validate` and `doit bench` do for a library this machine cannot load.

    run_on_target(prefix, pipeline_run, lib, feeds, n_outputs, repeat=3)
        -> (outputs, median ms per run or None, wall seconds of the process)

Inputs go to the program as .npy files, outputs come back as DIR/output_<i>.npy.
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
