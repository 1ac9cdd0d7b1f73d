"""Models on the emulated Cortex-M4 board (qemu-system-arm -M mps2-an386) through
`doit validate`: the default MLP generator at a small input and small CNNs (float,
and int8 by onnxruntime's quantizer), for the LLVM target and for the c target
(kernels as C built by arm-none-eabi-gcc); the c target on this machine for the
graph executor; each model's workspace against the planner's lower bound, the
sizes the build prints, the C in the Model Library Format, and a parallel rebuild
giving the same bytes.

Needs gcc-arm-none-eabi, picolibc-arm-none-eabi and qemu-system-arm: skipped
without them, failed under CI=true (tests/support/toolchains.py)."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.support.aot_models import kws_cnn, quantized, tiny_cnn
from tests.support.doit_runner import doit
from tests.support.toolchains import require_board

RUN = ("qemu-system-arm -M mps2-an386 -nographic -semihosting-config "
       "enable=on,target=native -kernel")
INT8 = "{reference: onnxruntime, quant_steps: 1}"
MATRIX = f"""\
models:
  mlp16: {{generator: mlp, args: {{size: 16}}}}
  tiny: {{path: tiny.onnx}}
  kws: {{path: kws.onnx, validate: {{rtol: 1.0e-3, atol: 1.0e-4}}}}
  kws_q: {{path: kws_q.onnx, validate: {INT8}}}
targets:
  m4:
    target: "llvm -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4"
    cc: arm-none-eabi-gcc
    run: "{RUN}"
    ram_kib: 256
    flash_kib: 1024
  m4c:
    target: "c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4"
    cc: arm-none-eabi-gcc
    run: "{RUN}"
    ram_kib: 256
    flash_kib: 1024
  hostc: {{target: c}}
validate: {{reference: onnx, rtol: 1.0e-4, atol: 1.0e-4}}
"""
MODELS = ("mlp16", "tiny", "kws", "kws_q")


def _checkout(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_cnn(), folder / "tiny.onnx")
    onnx.save(kws_cnn(), folder / "kws.onnx")
    onnx.save(quantized(kws_cnn()), folder / "kws_q.onnx")
    (folder / "matrix.yaml").write_text(MATRIX)
    return folder


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> tuple[Path, str]:
    require_board()
    folder = _checkout(tmp_path_factory.mktemp("board_c"))
    code, _, log = doit(folder, "validate", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    return folder, log


@pytest.mark.parametrize("target", ["m4", "m4c", "hostc"])
@pytest.mark.parametrize("model", MODELS)
def test_models_validate(board, model: str, target: str):
    folder, _ = board
    report = json.loads((folder / "out" / model / target / "validation.json").read_text())
    assert report["passed"], report
    assert report.get("executor", "graph") == ("graph" if target == "hostc" else "aot")
    if target != "hostc":
        assert report["ran_on"] == "target"


@pytest.mark.parametrize("model", MODELS)
def test_c_and_llvm_kernels_agree_on_the_board(board, model: str):
    folder, _ = board
    ours = [np.load(folder / "out" / model / t / "validation" / "output_0.npy")
            for t in ("m4", "m4c")]
    np.testing.assert_allclose(ours[0], ours[1], rtol=1e-4, atol=1e-4 if "q" not in model
                               else 0.2)


@pytest.mark.parametrize("target", ["m4", "m4c"])
@pytest.mark.parametrize("model", MODELS)
def test_workspace_within_a_tenth_of_the_lower_bound(board, model: str, target: str):
    """The static workspace against the most bytes alive at one node (the planner's
    lower bound, in metadata.json and `pipeline info`)."""
    folder, log = board
    module = json.loads((folder / "out" / model / target / "metadata.json").read_text())[
        "modules"][model]
    workspace = module["memory"]["functions"]["main"][0]["workspace_size_bytes"]
    bound = module["workspace_lower_bound_bytes"]
    assert bound <= workspace <= 1.1 * bound, (workspace, bound)
    sizes = module["sizes"]
    assert 0 < sizes["flash_bytes"] <= 1024 * 1024 and 0 < sizes["ram_bytes"] <= 256 * 1024


def test_model_library_format_carries_the_kernels_c(board):
    folder, _ = board
    d = folder / "out" / "tiny" / "m4c"
    symbols = {k["symbol"] for k in json.loads((d / "kernels.json").read_text())["kernels"]}
    with tarfile.open(d / "tiny.tar") as tar:
        sources = {Path(n).name: tar.extractfile(n).read().decode() for n in tar.getnames()
                   if re.fullmatch(r"codegen/host/src/\w+_[0-9a-f]{20}\.c", n)}
    assert set(sources) == {f"{s}.c" for s in symbols}
    for symbol in symbols:
        assert f"int32_t {symbol}(void * p0)" in sources[f"{symbol}.c"]
    with tarfile.open(folder / "out" / "tiny" / "m4" / "tiny.tar") as tar:
        assert not any(n.endswith(".c") and "_aot" not in n for n in tar.getnames())


def test_parallel_rebuild_is_byte_identical(board, tmp_path: Path):
    folder, _ = board
    again = _checkout(tmp_path / "again")
    code, _, log = doit(again, "-n", "2", "build", "config=matrix.yaml", "target=m4c,hostc",
                        "cache=cache")
    assert code == 0, log
    for model in ("mlp16", "kws_q"):
        for name in (f"lib{model}.a", f"{model}.tar", f"{model}.elf", "lib0.o"):
            a = (folder / "out" / model / "m4c" / name).read_bytes()
            assert a == (again / "out" / model / "m4c" / name).read_bytes(), (model, name)
        a = (folder / "out" / model / "hostc" / f"{model}.so").read_bytes()
        assert a == (again / "out" / model / "hostc" / f"{model}.so").read_bytes(), model


@pytest.mark.parametrize("arch", ["aarch64", "riscv64"])
def test_c_target_on_linux_boards_under_qemu_user(arch: str, tmp_path: Path):
    """The c target for another Linux machine: its gcc builds the kernels' C into the
    graph executor's .so, which `doit validate` runs under qemu-user (the int8
    convolutions take the portable path: C has no dot-product instruction)."""
    from tests.support.toolchains import require_tools

    cc, run = f"{arch}-linux-gnu-gcc", f"qemu-{arch} -L /usr/{arch}-linux-gnu"
    require_tools(cc, run.split()[0])
    cpu = " -mcpu=cortex-a76" if arch == "aarch64" else ""
    onnx.save(tiny_cnn(), tmp_path / "tiny.onnx")
    onnx.save(quantized(tiny_cnn()), tmp_path / "tiny_q.onnx")
    (tmp_path / "matrix.yaml").write_text(
        f"models:\n  tiny: {{path: tiny.onnx}}\n  tiny_q: {{path: tiny_q.onnx, validate: {INT8}}}\n"
        f"targets:\n  board: {{target: \"c -mtriple={arch}-linux-gnu{cpu}\", cc: {cc}, "
        f"run: \"{run}\"}}\nvalidate: {{reference: onnx, rtol: 1.0e-4, atol: 1.0e-4}}\n")
    code, _, log = doit(tmp_path, "validate", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    for model in ("tiny", "tiny_q"):
        report = json.loads((tmp_path / "out" / model / "board" / "validation.json").read_text())
        assert report["passed"] and report["ran_on"] == "target", report
