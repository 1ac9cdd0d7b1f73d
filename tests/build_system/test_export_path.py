"""One export path: the Python API (from_onnx -> build -> export_library) and
`doit build` link through the same functions (pipeline/link/export.py), so one
model gives the same lib0.o, devc.o, params and .so bytes both ways.

The doit side runs doit's own runner in a subprocess (tests/support/doit_runner.py);
the API side exports a .so and a .tar, whose members are its lib0.o, devc.o and
executor.o (the C executor, which doit compiles in its runtime task).
"""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import pipeline
from pipeline.frontend import from_onnx
from pipeline.runtime.params import save_params
from pipeline.transform import PassContext
from tests.support.checkouts import matrix
from tests.support.doit_runner import doit
from tests.support.onnx_models import tiny_convnet

TARGET = "llvm -mcpu=native"  # the target matrix's matrix builds


def _api_export(onnx_path: Path, out: Path) -> tuple[bytes, dict[str, bytes], bytes]:
    """(.so bytes, {tar member: bytes}, params bytes) exported through the Python API."""
    graph, params = from_onnx(onnx_path)
    with PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params)
    so = factory.export_library(out / "model.so")
    with tarfile.open(factory.export_library(out / "model.tar")) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    return so.read_bytes(), members, save_params(factory.get_params())


def _build_id(so: Path) -> str:
    notes = subprocess.run(["readelf", "-n", str(so)], capture_output=True, text=True,
                           check=True).stdout
    return next(line.split()[-1] for line in notes.splitlines() if "Build ID" in line)


@pytest.mark.parametrize("model", ["tiny", "mlp"])
def test_api_and_doit_export_identical_bytes(tmp_path: Path, model: str):
    """tiny: conv, folded batch norm, pool, gemm; mlp: the models/ generator, 38 MB
    of weights (streamed from a mapped .params file by doit, from the arrays by the API)."""
    if model == "tiny":
        onnx_path = tmp_path / "nets" / "tiny.onnx"
        tiny_convnet(onnx_path, seed=5)
        matrix(tmp_path, "tiny: {path: nets/tiny.onnx}\n")
    else:  # the API reads the ONNX file doit's model task generates
        onnx_path = tmp_path / "out" / "models" / f"{model}.onnx"
        matrix(tmp_path, f"{model}: {{generator: {model}}}\n")
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml", "target=llvm")
    assert code == 0, out[-3000:]
    assert {f"{step}:{model}@llvm" for step in ("lib0", "devc", "export")} <= executed
    built = tmp_path / "out" / model / "llvm"

    so, members, params = _api_export(onnx_path, tmp_path / "api")
    assert sorted(members) == ["devc.o", "executor.o", "lib0.o"]
    assert members["executor.o"] == (tmp_path / "out/runtime/llvm/executor.o").read_bytes()
    assert members["lib0.o"] == (built / "lib0.o").read_bytes()
    assert members["devc.o"] == (built / "devc.o").read_bytes()
    assert params == (built / f"{model}.params").read_bytes()
    assert so == (built / f"{model}.so").read_bytes()
    # Both carry the build id made from lib0.o and the blob checksum (a sha1).
    assert re.fullmatch("[0-9a-f]{40}", _build_id(built / f"{model}.so"))


def test_export_without_kernels(tmp_path: Path):
    """A graph with no node (its output is its input) has no kernel: the library
    is devc.o and the executor, and still loads and runs."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(helper.make_graph([], "passthrough", [x], [x]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    graph, params = from_onnx(model)
    with PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params)
    assert factory.kernels == []
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    for suffix in (".so", ".tar"):
        lib = pipeline.runtime.load_module(factory.export_library(tmp_path / f"p{suffix}"))
        m = pipeline.runtime.GraphModule(lib["default"]())
        m.set_input("x", value)
        m.run()
        np.testing.assert_array_equal(m.get_output(0), value)
    with tarfile.open(tmp_path / "p.tar") as tar:
        assert tar.getnames() == ["devc.o", "executor.o"]


@pytest.mark.parametrize("name", ["model.dylib", "model"])
def test_export_rejects_other_suffixes(tmp_path: Path, name: str):
    from pipeline.link.export import link_library

    with pytest.raises(ValueError, match=r"a model library is a \.so, \.tar, \.o file"):
        link_library(None, tmp_path / "devc.o", tmp_path / name)
