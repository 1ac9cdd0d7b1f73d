"""A Cortex-M4 board, emulated: models built with the AOT executor for
`thumbv7em-none-eabihf -mcpu=cortex-m4` by arm-none-eabi-gcc and picolibc, linked
into the semihosting test firmware and run by `doit validate` under
qemu-system-arm -M mps2-an386, against onnx.reference / onnxruntime. Also the host
entry of executor aot under doit, the sizes and board budgets, and the incremental
and reproducible builds of both.

Needs gcc-arm-none-eabi, picolibc-arm-none-eabi and qemu-system-arm: skipped
without them, failed under CI=true (tests/support/toolchains.py)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.link.elf import section_sizes
from tests.support.aot_models import kws_cnn, quantized, tiny_cnn
from tests.support.build_outputs import build_report, how
from tests.support.doit_runner import doit
from tests.support.toolchains import require_board

M4 = """\
m4:
  target: "llvm -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4"
  cc: arm-none-eabi-gcc
  run: "qemu-system-arm -M mps2-an386 -nographic -semihosting-config
        enable=on,target=native -kernel"
  ram_kib: {ram}
  flash_kib: 1024
host: {{target: "llvm -mcpu=native", executor: aot}}
"""
INT8 = "{reference: onnxruntime, quant_steps: 1}"


def _checkout(folder: Path, ram: int = 256) -> Path:
    """folder/matrix.yaml: the tiny float CNN, its int8 version and the int8 keyword
    spotter, for the M4 board and for this machine with executor aot."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_cnn(), folder / "tiny.onnx")
    onnx.save(quantized(tiny_cnn()), folder / "tiny_q.onnx")
    onnx.save(quantized(kws_cnn()), folder / "kws_q.onnx")
    onnx.save(quantized(kws_cnn(pool="average")), folder / "kws_avg_q.onnx")
    _write_matrix(folder, ram)
    return folder


def _write_matrix(folder: Path, ram: int) -> None:
    (folder / "matrix.yaml").write_text(
        "models:\n  tiny: {path: tiny.onnx}\n"
        f"  tiny_q: {{path: tiny_q.onnx, validate: {INT8}}}\n"
        f"  kws_q: {{path: kws_q.onnx, validate: {INT8}}}\n"
        f"  kws_avg_q: {{path: kws_avg_q.onnx, validate: {INT8}}}\n"
        "targets:\n" + textwrap.indent(M4.format(ram=ram), "  ")
        + "validate: {reference: onnx, rtol: 1.0e-4, atol: 1.0e-4}\n")


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> Path:
    require_board()
    folder = _checkout(tmp_path_factory.mktemp("board"))
    code, _, log = doit(folder, "validate", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    return folder


@pytest.mark.parametrize("model", ["tiny", "tiny_q", "kws_q", "kws_avg_q"])
def test_models_validate_on_the_emulated_board(board: Path, model: str):
    report = json.loads((board / "out" / model / "m4" / "validation.json").read_text())
    assert report["passed"] and report["ran_on"] == "target" and report["executor"] == "aot"
    folder = board / "out" / model / "m4" / "validation"
    assert (folder / "in_x.npy").exists()
    ours = np.load(folder / "output_0.npy")
    assert ours.shape == (1, 12 if model.startswith("kws") else 10)
    host = np.load(board / "out" / model / "host" / "validation" / "output_0.npy")
    np.testing.assert_allclose(ours, host, rtol=1e-4, atol=1e-4 if model == "tiny" else 0.2)


def test_firmware_and_libraries(board: Path):
    d = board / "out" / "tiny" / "m4"
    elf = (d / "tiny.elf").read_bytes()
    assert elf[:4] == b"\x7fELF" and elf[4] == 1 and int.from_bytes(elf[18:20], "little") == 40
    # The float model uses the FPU: hard-float calls (libm's in s0, s1) and VFP code.
    attributes = subprocess.run(["arm-none-eabi-readelf", "-A", str(d / "lib0.o")],
                                capture_output=True, text=True, check=True).stdout
    assert "Tag_ABI_VFP_args: VFP registers" in attributes
    code = subprocess.run(["arm-none-eabi-objdump", "-d", str(d / "lib0.o")],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(r"\tv(fma|mla|add|mul)\.f32", code)
    lib0 = (d / "lib0.o").read_bytes()
    assert b"GOMP_parallel" not in lib0 and b"omp_get_max_threads" not in lib0
    assert section_sizes(elf)["text"] > 0
    for name in ("libtiny.a", "tiny.h", "tiny.tar", "metadata.json"):
        assert (d / name).exists(), name


@pytest.mark.parametrize("model", ["kws_q", "kws_avg_q"])
def test_int8_keyword_spotter_workspace(board: Path, model: str):
    metadata = json.loads((board / "out" / model / "m4" / "metadata.json").read_text())
    module = metadata["modules"][model]
    workspace = module["memory"]["functions"]["main"][0]["workspace_size_bytes"]
    assert workspace <= 1.1 * module["workspace_lower_bound_bytes"]
    assert workspace <= 24 * 1024  # its two largest activations, int8: 2 x 8000 bytes
    assert module["sizes"]["ram_bytes"] < 256 * 1024


def test_budget_change_reruns_only_the_budget_task_and_fails_in_one_line(board: Path):
    _write_matrix(board, ram=8)
    try:
        code, executed, log = doit(board, "build", "config=matrix.yaml", "cache=cache")
        assert code != 0
        assert {t.partition(":")[0] for t in executed} <= {"budget"}, executed
        # doit stops at the first entry past the budget: one line naming the consumers.
        assert re.search(r"\nmodel \w+ needs [0-9.]+ KiB of RAM, the target's ram_kib allows "
                         r"8 KiB; biggest: (workspace|stack) [0-9.]+ KiB", log), log
    finally:
        _write_matrix(board, ram=256)
    code, executed, log = doit(board, "build", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    assert {t.partition(":")[0] for t in executed} <= {"budget"}, executed
    assert all(v in ("computed",) for v in how(build_report(board)).values())


def test_parallel_rebuild_is_byte_identical(board: Path, tmp_path: Path):
    again = _checkout(tmp_path / "again")
    code, _, log = doit(again, "-n", "2", "build", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    for model in ("tiny", "kws_q"):
        for target in ("m4", "host"):
            for name in (f"lib{model}.a", f"{model}.h", f"{model}.tar", f"{model}.elf"):
                a = (board / "out" / model / target / name).read_bytes()
                b = (again / "out" / model / target / name).read_bytes()
                assert a == b, (model, target, name)


# Other Cortex-M cores, each on the qemu board that carries it (pipeline.link.firmware):
# the float CNN here; the int8 keyword spotter (this file's kws_q) is validated on
# each of these cores by tests/cross/test_board_int8.py (its kws_u8).
CORES = {"m7": ("thumbv7em-none-eabihf", "cortex-m7", "mps2-an500"),
         "m33": ("thumbv8m.main-none-eabihf", "cortex-m33", "mps2-an505"),
         "m55": ("thumbv8.1m.main-none-eabihf", "cortex-m55", "mps3-an547")}


@pytest.fixture(scope="module")
def other_cores(tmp_path_factory) -> Path:
    """The float CNN validated on each of CORES: one doit run (two workers)."""
    require_board()
    folder = tmp_path_factory.mktemp("other_cores")
    onnx.save(tiny_cnn(), folder / "tiny.onnx")
    (folder / "matrix.yaml").write_text(
        "models:\n  tiny: {path: tiny.onnx}\ntargets:\n" + "".join(
            f"  {core}:\n    target: \"llvm -mtriple={triple} -mcpu={cpu}\"\n"
            f"    cc: arm-none-eabi-gcc\n    run: \"qemu-system-arm -M {board} -nographic "
            "-semihosting-config enable=on,target=native -kernel\"\n"
            for core, (triple, cpu, board) in CORES.items())
        + "validate: {reference: onnx, rtol: 1.0e-4, atol: 1.0e-4}\n")
    code, _, log = doit(folder, "-n", "2", "validate", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    return folder


@pytest.mark.parametrize("core", CORES)
def test_other_cores_validate_on_their_boards(other_cores: Path, core: str):
    report = json.loads((other_cores / "out" / "tiny" / core / "validation.json").read_text())
    assert report["passed"] and report["ran_on"] == "target"
