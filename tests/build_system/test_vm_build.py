"""`executor: vm` in the build matrix (docs/vm.md): a VM entry's devc stage writes the
executable out/<m>/<t>/<m>.ro (a declared artifact) and devc.o holding it, its export
links the VM; a matrix mixes graph and VM entries, the model's `executor:` winning
over the target's; rebuilds are no-ops, `doit -n 2` gives the same bytes, validate
runs the VM library."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.runtime import load_module
from pipeline.runtime.vm import VirtualMachine, is_vm_library
from pipeline.vm.format import RO_MAGIC
from tests.support.checkouts import TARGET, matrix
from tests.support.doit_runner import doit
from tests.support.onnx_models import tiny_convnet

TARGETS = f"llvm: {TARGET}\nvmt: {{target: \"llvm -mcpu=native\", executor: vm}}\n"
MODELS = """\
    tiny: {path: nets/tiny.onnx}
    tiny_graph: {path: nets/tiny.onnx, executor: graph}
    """


def _checkout(folder: Path) -> Path:
    tiny_convnet(folder / "nets" / "tiny.onnx")
    matrix(folder, MODELS, TARGETS)
    return folder


def test_mixed_matrix_builds_vm_and_graph_entries(tmp_path: Path):
    tiny = _checkout(tmp_path / "a")
    code, executed, out = doit(tiny, "build", "config=matrix.yaml")
    assert code == 0, out
    assert {"devc:tiny@vmt", "export:tiny@vmt", "runtime:vmt"} <= executed, executed
    out_dir = tiny / "out"
    ro = out_dir / "tiny" / "vmt" / "tiny.ro"
    assert ro.read_bytes()[:8] == RO_MAGIC
    assert (out_dir / "runtime" / "vmt" / "vm.o").is_file()
    assert not (out_dir / "runtime" / "llvm" / "vm.o").exists()  # no VM entry on llvm
    # The model's executor wins: tiny_graph on vmt is a graph library, without a .ro.
    for m, t, vm in (("tiny", "llvm", False), ("tiny", "vmt", True),
                     ("tiny_graph", "llvm", False), ("tiny_graph", "vmt", False)):
        so = out_dir / m / t / f"{m}.so"
        assert is_vm_library(so) == vm, (m, t)
        assert (out_dir / m / t / f"{m}.ro").exists() == vm, (m, t)
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16), dtype=np.float32)
    want = ort.InferenceSession(str(tiny / "nets" / "tiny.onnx")).run(None, {"x": x})[0]
    got = VirtualMachine(out_dir / "tiny" / "vmt" / "tiny.so").run(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert load_module(out_dir / "tiny_graph" / "vmt" / "tiny_graph.so").kernels

    code, executed, out = doit(tiny, "build", "config=matrix.yaml")
    assert code == 0 and executed == set(), executed
    code, executed, out = doit(tiny, "validate", "config=matrix.yaml", "model=tiny",
                               "target=vmt")
    assert code == 0, out
    assert json.loads((out_dir / "tiny" / "vmt" / "validation.json").read_text())["passed"]

    # Another folder, two workers: the same bytes.
    other = _checkout(tmp_path / "b")
    code, _, out = doit(other, "-n", "2", "build", "config=matrix.yaml", "target=vmt")
    assert code == 0, out
    for name in ("tiny.ro", "devc.o", "tiny.so"):
        assert (other / "out" / "tiny" / "vmt" / name).read_bytes() == \
            (out_dir / "tiny" / "vmt" / name).read_bytes(), name


def test_bad_executor_is_one_config_line(tmp_path: Path):
    tiny_convnet(tmp_path / "nets" / "tiny.onnx")
    matrix(tmp_path, "tiny: {path: nets/tiny.onnx, executor: interpreter}\n")
    code, _, out = doit(tmp_path, "build", "config=matrix.yaml")
    assert code != 0
    lines = [line for line in out.splitlines() if "executor" in line]
    want = "models.tiny.executor: 'interpreter' is not an executor; allowed: graph, aot, vm"
    assert lines and want in lines[0], out


def test_symbolic_model_builds_once_and_runs_at_any_shape(tmp_path: Path):
    """A model with `dims:` (executor vm): the import keeps [batch, seq], one library
    runs at two shapes; a rebuild is a no-op; validate runs it at the highs; the same
    model on a graph-executor target is one ConfigError line."""
    import onnx

    from tests.runtime.dims_models import VOCAB, token_mlp

    (tmp_path / "nets").mkdir()
    model = token_mlp()
    onnx.save(model, tmp_path / "nets" / "mlp.onnx")
    matrix(tmp_path, "mlp: {path: nets/mlp.onnx, executor: vm, "
                     "dims: {batch: [1, 2], seq: [1, 40]}}\n")
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml")
    assert code == 0, out
    so = tmp_path / "out" / "mlp" / "llvm" / "mlp.so"
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString())
    vm = VirtualMachine(so)
    for shape in ((1, 3), (2, 40)):
        ids = np.random.default_rng(shape[1]).integers(0, VOCAB, shape).astype(np.int64)
        np.testing.assert_allclose(vm.run(ids)[0], session.run(None, {"ids": ids})[0],
                                   rtol=1e-4, atol=1e-5)
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml")
    assert code == 0 and executed == set(), executed
    code, executed, out = doit(tmp_path, "validate", "config=matrix.yaml")
    assert code == 0, out
    assert json.loads((tmp_path / "out" / "mlp" / "llvm" / "validation.json").read_text(
        ))["passed"]
    matrix(tmp_path, "mlp: {path: nets/mlp.onnx, dims: {batch: [1, 2], seq: [1, 40]}}\n")
    code, _, out = doit(tmp_path, "build", "config=matrix.yaml")
    assert code != 0 and "models.mlp.dims: symbolic dimensions run only in the VM" in out, out
