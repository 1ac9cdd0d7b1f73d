"""A bare-metal RISC-V board, emulated: the default MLP generator at a small input
(float) and the tests' int8 keyword spotter (onnxruntime's quantizer), built with the
AOT executor for `riscv32-unknown-elf` (RV32GC, ilp32d) as LLVM kernels and as C
kernels by riscv64-unknown-elf-gcc and picolibc, linked into the semihosting test
firmware and run by `doit validate` under qemu-system-riscv32 -M virt, against
onnx.reference / onnxruntime.

Needs gcc-riscv64-unknown-elf, picolibc-riscv64-unknown-elf and qemu-system-misc:
skipped without them, failed under CI=true (tests/support/toolchains.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.ir.target import cc_machine_flags, parse_target
from pipeline.link.firmware import board_of
from tests.support.aot_models import kws_cnn, quantized
from tests.support.doit_runner import doit
from tests.support.toolchains import require_riscv32_board

RUN = ("qemu-system-riscv32 -M virt -bios none -nographic -semihosting-config "
       "enable=on,target=native -kernel")
MATRIX = f"""\
models:
  mlp16: {{generator: mlp, args: {{size: 16}}}}
  kws_q: {{path: kws_q.onnx, validate: {{reference: onnxruntime, quant_steps: 1}}}}
targets:
  rv32:
    target: "llvm -mtriple=riscv32-unknown-elf"
    cc: riscv64-unknown-elf-gcc
    run: "{RUN}"
    ram_kib: 256
    flash_kib: 1024
  rv32c:
    target: "c -mtriple=riscv32-unknown-elf"
    cc: riscv64-unknown-elf-gcc
    run: "{RUN}"
validate: {{reference: onnx, rtol: 1.0e-4, atol: 1.0e-4}}
"""
MODELS = ("mlp16", "kws_q")
TARGETS = ("rv32", "rv32c")


def test_the_triple_is_bare_metal_rv32gc_on_the_virt_board():
    target = parse_target("llvm -mtriple=riscv32-unknown-elf")
    assert (target.triple, target.bare_metal) == ("riscv32-unknown-none-elf", True)
    assert target.features == "+a,+c,+d,+f,+m" and target.elf_flags() == 0x5  # RVC, ilp32d
    assert board_of(target) == "virt"
    assert cc_machine_flags(target.triple, target.cpu, target.features)[:2] == [
        "-march=rv32imafdc", "-mabi=ilp32d"]
    # Without the D extension LLVM's ABI is ilp32, and the compiler's flags follow.
    soft = parse_target("llvm -mtriple=riscv32-unknown-elf -mattr=-f,-d")
    assert soft.elf_flags() == 0x1
    assert cc_machine_flags(soft.triple, soft.cpu, soft.features)[:2] == [
        "-march=rv32imac", "-mabi=ilp32"]


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> Path:
    require_riscv32_board()
    folder = tmp_path_factory.mktemp("board_rv32")
    onnx.save(quantized(kws_cnn()), folder / "kws_q.onnx")
    (folder / "matrix.yaml").write_text(MATRIX)
    code, _, log = doit(folder, "validate", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    return folder


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", MODELS)
def test_models_validate_on_the_emulated_board(board: Path, model: str, target: str):
    d = board / "out" / model / target
    report = json.loads((d / "validation.json").read_text())
    assert report["passed"] and report["ran_on"] == "target" and report["executor"] == "aot"
    module = json.loads((d / "metadata.json").read_text())["modules"][model]
    workspace = module["memory"]["functions"]["main"][0]["workspace_size_bytes"]
    assert workspace <= 1.1 * module["workspace_lower_bound_bytes"]
    assert 0 < module["sizes"]["flash_bytes"] <= 1024 * 1024
    assert 0 < module["sizes"]["ram_bytes"] <= 256 * 1024


@pytest.mark.parametrize("target", TARGETS)
def test_int8_outputs_the_board_wrote_match_onnxruntime(board: Path, target: str):
    ort = pytest.importorskip("onnxruntime")
    folder = board / "out" / "kws_q" / target / "validation"
    x = np.load(folder / "in_x.npy")
    session = ort.InferenceSession(str(board / "kws_q.onnx"),
                                   providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    ours = np.load(folder / "output_0.npy")
    assert ours.shape == expected.shape == (1, 12)
    # onnxruntime's float softmax after the int8 layers: the bytes agree, not the last bit.
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)


def test_firmware_is_rv32_hard_float_and_single_threaded(board: Path):
    d = board / "out" / "mlp16" / "rv32"
    elf = (d / "mlp16.elf").read_bytes()
    # ELF32, EM_RISCV; e_flags: RVC and the double-float ABI of picolibc's multilib.
    assert elf[:5] == b"\x7fELF\x01" and int.from_bytes(elf[18:20], "little") == 243
    assert int.from_bytes(elf[36:40], "little") == 0x5
    code = subprocess.run(["riscv64-unknown-elf-objdump", "-d", str(d / "lib0.o")],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(r"\tf(madd|mul|add)\.s\t", code)  # the float model uses the FPU
    lib0 = (d / "lib0.o").read_bytes()
    assert b"GOMP_parallel" not in lib0 and b"omp_get_max_threads" not in lib0


def test_parallel_rebuild_is_byte_identical(board: Path, tmp_path: Path):
    """The same models linked again in another folder by `doit -n 2` (the kernels from
    the first build's cache): the same bytes, firmware and sizes included."""
    onnx.save(quantized(kws_cnn()), tmp_path / "kws_q.onnx")
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    code, _, log = doit(tmp_path, "-n", "2", "build", "config=matrix.yaml",
                        f"cache={board / 'cache'}")
    assert code == 0, log
    for model in MODELS:
        for target in TARGETS:
            for name in (f"lib{model}.a", f"{model}.tar", f"{model}.elf", "sizes.json"):
                a = (board / "out" / model / target / name).read_bytes()
                b = (tmp_path / "out" / model / target / name).read_bytes()
                assert a == b, (model, target, name)
