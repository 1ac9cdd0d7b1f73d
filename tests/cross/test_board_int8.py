"""The int8 kernels of the Cortex-M cores: the DSP extension's SXTB16/SMLAD on M4, M7
and M33 (dot kind smlad), MVE's VMLAV on M55 (mve), each validated on its emulated
board (tests/cross/test_board.py's boards) on int8 keyword spotters quantized by
onnxruntime -- QDQ with uint8 and with int8 activations, and QOperator -- whose
outputs must equal onnxruntime's bit for bit. The instruction counts of a run are
printed (pipeline/tools/board_count.py), never asserted: qemu counts no cycles.

Needs gcc-arm-none-eabi, picolibc-arm-none-eabi and qemu-system-arm (skipped
without them, failed under CI=true)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.ir.target import parse_target
from pipeline.kernels.qconv_blocked import dot_kind
from pipeline.tools.board_count import count
from tests.support.aot_models import kws_cnn, quantized
from tests.support.doit_runner import doit
from tests.support.toolchains import require_board

# core: (triple, cpu, qemu board, dot kind)
CORES = {"m4": ("thumbv7em-none-eabihf", "cortex-m4", "mps2-an386", "smlad"),
         "m7": ("thumbv7em-none-eabihf", "cortex-m7", "mps2-an500", "smlad"),
         "m33": ("thumbv8m.main-none-eabihf", "cortex-m33", "mps2-an505", "smlad"),
         "m55": ("thumbv8.1m.main-none-eabihf", "cortex-m55", "mps3-an547", "mve")}
MODELS = {"kws_u8": {}, "kws_s8": {"activations": "int8"}, "kws_qop": {"fmt": "QOperator"}}
INT8 = "{reference: onnxruntime, quant_steps: 1}"


@pytest.mark.parametrize("target,kind", [
    ("llvm -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4", "smlad"),
    ("llvm -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m7", "smlad"),
    ("llvm -mtriple=thumbv8m.main-none-eabihf -mcpu=cortex-m33", "smlad"),
    ("llvm -mtriple=thumbv8m.main-none-eabihf -mcpu=cortex-m33 -mattr=-dsp", "portable"),
    ("llvm -mtriple=thumbv8m.main-none-eabi -mcpu=cortex-m23", "portable"),
    ("llvm -mtriple=thumbv7m-none-eabi -mcpu=cortex-m3", "portable"),
    ("llvm -mtriple=thumbv8.1m.main-none-eabihf -mcpu=cortex-m55", "mve"),
    ("llvm -mtriple=thumbv8.1m.main-none-eabihf -mcpu=cortex-m55 -mattr=-mve", "smlad"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76", "sdot"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a53", "portable"),
    ("llvm -mcpu=icelake-server", "vnni")])
def test_dot_kind_follows_the_core(target: str, kind: str):
    assert dot_kind(parse_target(target)) == kind


@pytest.fixture(scope="module")
def boards(tmp_path_factory) -> Path:
    require_board()
    folder = tmp_path_factory.mktemp("int8_boards")
    for name, how in MODELS.items():
        onnx.save(quantized(kws_cnn(), **how), folder / f"{name}.onnx")
    targets = "".join(
        f"  {core}:\n    target: \"llvm -mtriple={triple} -mcpu={cpu}\"\n"
        f"    cc: arm-none-eabi-gcc\n    run: \"qemu-system-arm -M {board} -nographic "
        "-semihosting-config enable=on,target=native -kernel\"\n"
        for core, (triple, cpu, board, _) in CORES.items())
    (folder / "matrix.yaml").write_text(
        "models:\n" + "".join(f"  {m}: {{path: {m}.onnx, validate: {INT8}}}\n" for m in MODELS)
        + "targets:\n" + targets)
    # Two workers: the 12 entries are independent (parallel builds are checked for
    # identical bytes in tests/cross/test_board.py).
    code, _, log = doit(folder, "-n", "2", "validate", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    return folder


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("model", MODELS)
def test_board_outputs_equal_onnxruntime_bit_for_bit(boards: Path, model: str, core: str):
    import onnxruntime as ort

    folder = boards / "out" / model / core / "validation"
    session = ort.InferenceSession(str(boards / f"{model}.onnx"),
                                   providers=["CPUExecutionProvider"])
    want, = session.run(None, {"x": np.load(folder / "in_x.npy")})
    got = np.load(folder / "output_0.npy")
    assert got.dtype == want.dtype and np.array_equal(got, want), np.abs(got - want).max()


def _disassembly(obj: Path) -> str:
    # LLVM marks no MVE in the object's attributes: name the architecture.
    return subprocess.run(["arm-none-eabi-objdump", "-d", "-m", "armv8.1-m.main", str(obj)],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("core", CORES)
def test_kernels_use_the_cores_multiply_accumulate(boards: Path, core: str):
    code = _disassembly(boards / "out" / "kws_u8" / core / "lib0.o")
    if CORES[core][3] == "smlad":
        assert "\tsmlad\t" in code and "\tuxtb16\t" in code and "\tsxtb16\t" in code
        assert "\tsmlabb\t" in code and "\tsmlatt\t" in code  # the depthwise kernel
    else:
        assert "\tvmlav.u32\t" in code and "\tvldrb.s32\t" in code
    # No libm call in the int8 kernels: roundevenf, fmaxf, fminf are software on M4.
    kernels = re.split(r"\n(?=[0-9a-f]+ <)", code)
    int8 = [k for k in kernels if re.match(r"[0-9a-f]+ <q(conv2d|depthwise|dense)", k)]
    assert len(int8) >= 3
    assert not [k for k in int8 if re.search(r"<(roundevenf|fmaxf|fminf)>", k)]


def test_depthwise_pads_inside_the_kernel(boards: Path):
    """The keyword spotter's workspace is its two largest int8 activations: the
    depthwise kernels read the unpadded input (no padded copy in the workspace)."""
    import json

    for core in CORES:
        metadata = json.loads((boards / "out" / "kws_u8" / core / "metadata.json").read_text())
        module = metadata["modules"]["kws_u8"]
        assert module["memory"]["functions"]["main"][0]["workspace_size_bytes"] == 16000


def test_instruction_counts_are_printed(boards: Path, capsys):
    """The executed instructions of one run of each model on each board (not asserted:
    figures for docs/microcontrollers.md)."""
    for model in MODELS:
        for core in CORES:
            c = count(boards / "out" / model / core)
            assert c["instructions"] > 0 and c["kernels_text"] > 0
            with capsys.disabled():
                print(f"\n{model} {core} ({c['board']}): {c['instructions']:,} instructions, "
                      f"kernels .text {c['kernels_text']:,} B", end="")
