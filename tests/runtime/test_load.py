"""Under load: many threads running one library, and many executors created and
dropped, give the right outputs and leak nothing.

PIPELINE_LOAD_SECONDS (default 10) sets how long the threads run; by hand:
    PIPELINE_LOAD_SECONDS=60 python -m pytest -q tests/runtime/test_load.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.runtime import GraphModule, load_module
from tests.support import REPO
from tests.support.onnx_models import tiny_convnet
from tests.support.soak import anon_bytes, mapped_bytes

SECONDS = float(os.environ.get("PIPELINE_LOAD_SECONDS", "10"))
THREADS = 8


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> tuple:
    """(the loaded tiny library, its ONNX path)."""
    d = tmp_path_factory.mktemp("load")
    tiny_convnet(d / "tiny.onnx")
    graph, params = pipeline.frontend.from_onnx(d / "tiny.onnx")
    factory = pipeline.build(graph, target="llvm -mcpu=native", params=params)
    return load_module(factory.export_library(d / "tiny.so")), d / "tiny.onnx"


@pytest.mark.slow  # SECONDS of running, 12 s in all by default
def test_threads_running_one_library_agree_with_one_thread(lib):
    module, onnx_path = lib
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1, 3, 16, 16), dtype=np.float32) for _ in range(THREADS)]
    single = GraphModule(module["default"]())
    expected = []
    for x in inputs:
        single.run(x=x)
        expected.append(single.get_output(0))
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(onnx_path))
    for x, y in zip(inputs, expected, strict=True):  # the single thread is right, too
        np.testing.assert_allclose(y, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)

    # In a process of its own: this one's RSS moves with what earlier tests left.
    tmp = onnx_path.parent
    lib_path = str(tmp / "tiny.so")  # the fixture's export
    np.savez(tmp / "inputs.npz", *inputs)
    np.savez(tmp / "expected.npz", *expected)
    proc = subprocess.run([sys.executable, "-m", "tests.support.soak", lib_path,
                           str(tmp / "inputs.npz"), str(tmp / "expected.npz"), str(SECONDS)],
                          capture_output=True, text=True, timeout=SECONDS + 120,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert not result["errors"], result["errors"]
    assert all(n > 0 for n in result["runs"]), result["runs"]
    growth = result["rss_end"] - result["rss_warm"]
    print(f"\n{sum(result['runs'])} runs in {SECONDS:.0f} s on {THREADS} threads; "
          f"RSS {result['rss_warm'] / 2**20:.1f} -> {result['rss_end'] / 2**20:.1f} MiB")
    assert growth < 8 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB after warm-up"


# In a process of its own: in the test process, threads earlier tests left running
# (thread pools, a Dask client) allocate meanwhile, and the RSS grew 15.7 MiB in one CI
# run without a leak.
_CHURN_CHILD = """
import gc, json, sys, weakref
import numpy as np
from pipeline.runtime import GraphModule, load_module
from tests.support.soak import rss_bytes
module = load_module(sys.argv[1])
x = np.ones((1, 3, 16, 16), np.float32)
def churn(n):
    refs = []
    for _ in range(n):
        executor = module["default"]()
        GraphModule(executor).run(x=x)
        refs.append(weakref.ref(executor))
    return refs
churn(100)  # warm-up
gc.collect()
before = rss_bytes()
refs = churn(1000)
gc.collect()
print(json.dumps({"grew": rss_bytes() - before, "alive": sum(r() is not None for r in refs)}))
"""


def test_a_thousand_executors_leak_nothing(lib):
    """1,000 executors created, run and dropped: none outlives its last reference and
    the process's RSS stays flat (one executor holds ~50 KiB of buffers: 1,000 leaked
    would be ~50 MiB)."""
    _, onnx_path = lib
    child = subprocess.run([sys.executable, "-c", _CHURN_CHILD, str(onnx_path.with_suffix(".so"))],
                           capture_output=True, text=True, cwd=REPO, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.returncode == 0, child.stderr
    churn = json.loads(child.stdout)
    assert churn["alive"] == 0, "executors outlive their last reference"
    assert churn["grew"] < 8 * 2**20, f"RSS grew by {churn['grew'] / 2**20:.1f} MiB"


def _big_matmul(seed: int, rows):
    """y = x @ w with w 1024 x 8192 random float32 (32 MiB) as an initializer; x has
    `rows` rows (a number or a symbolic dimension's name)."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((1024, 8192)).astype(np.float32)
    return helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")]), opset_imports=[helper.make_opsetid("", 17)])


def test_params_are_held_once(tmp_path):
    """The loader checks the blob in place and the executor copies each param out of
    the mapped library giving the file's pages back: 32 MB of weights stay resident
    once (the executor's copy), not two or three times; pages read again later (the
    params, a second executor) come back from the file intact."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = _big_matmul(3, 2)  # 32 MiB of weights
    w = numpy_helper.to_array(model.graph.initializer[0])
    graph, params = pipeline.frontend.from_onnx(model)
    path = pipeline.build(graph, target="llvm -mcpu=native", params=params).export_library(
        tmp_path / "big.so")
    x = np.random.default_rng(4).standard_normal((2, 1024)).astype(np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    module = load_module(path)  # its checksum pass read every page
    assert mapped_bytes(Path(path).resolve()) < 4 * 2**20  # of a 32 MiB library
    first = GraphModule(module["default"]())  # copies the params out
    assert mapped_bytes(Path(path).resolve()) < 4 * 2**20
    first.run(x=x)
    np.testing.assert_allclose(first.get_output(0), want, rtol=1e-4, atol=1e-3)
    packed = next(iter(module.params.values()))  # read back from the file's pages
    assert packed.size == w.size and np.isclose(np.sort(packed.ravel()), np.sort(w.ravel())).all()
    second = GraphModule(module["default"]())
    second.run(x=x)
    np.testing.assert_array_equal(second.get_output(0), first.get_output(0))


# Run in a process of its own: in the test process, memory an earlier test freed (or
# frees meanwhile) hides or offsets what loading adds. The child first leaves 96 MiB of
# freed, still resident heap behind, as a long-lived process does (glibc raises its
# mmap threshold to 32 MiB after big frees): an arena taken from malloc would reuse it
# and stay resident after unloading.
_VM_MEMORY_CHILD = """
import ctypes, json, sys
import numpy as np
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.mallopt(-3, 32 << 20), libc.mallopt(-1, 1 << 30)  # M_MMAP_/M_TRIM_THRESHOLD
blocks = [libc.malloc(4 << 20) for _ in range(24)]
for b in blocks:
    ctypes.memset(b, 1, 4 << 20)
guard = libc.malloc(4 << 20)  # keeps the freed blocks from the heap's top
for b in blocks:
    libc.free(b)
from pathlib import Path
from pipeline.runtime.vm import VirtualMachine
from tests.support.soak import anon_bytes, mapped_bytes
lib, x_file, y_file = sys.argv[1:]
x = np.load(x_file)
before = anon_bytes()
vm = VirtualMachine(lib)
np.save(y_file, vm.run(x)[0])
loaded = anon_bytes()
mapped = mapped_bytes(Path(lib).resolve())
del vm
print(json.dumps({"load": loaded - before, "mapped": mapped, "unload": loaded - anon_bytes()}))
"""


def test_vm_constants_are_held_once(tmp_path):
    """A VM library's weights (constants of its .ro) are copied once, into the VM's
    arena, and the library file's pages of them are given back: loading and running a
    32 MiB one adds one copy, not three (Python's bytes, its numpy copies and the C
    reader's, as before), and leaves the mapping nearly empty. The copy is a mapping of
    its own: unloading gives it back (from malloc it could be heap memory that stays)."""
    from onnx.reference import ReferenceEvaluator

    model = _big_matmul(5, "n")  # 32 MiB of weights
    graph, params = pipeline.frontend.from_onnx(model, symbolic=True)
    path = pipeline.build(graph, target="llvm -mcpu=native", params=params, executor="vm",
                          dims={"n": (1, 8)}).export_library(tmp_path / "big.so")
    x = np.random.default_rng(6).standard_normal((3, 1024)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    child = subprocess.run(
        [sys.executable, "-c", _VM_MEMORY_CHILD, str(path), str(tmp_path / "x.npy"),
         str(tmp_path / "y.npy")], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert child.returncode == 0, child.stderr
    memory = json.loads(child.stdout)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-3)
    assert 32 * 2**20 <= memory["load"] < 48 * 2**20, memory  # one copy
    assert memory["mapped"] < 4 * 2**20, memory  # of a 32 MiB library
    assert memory["unload"] >= 30 * 2**20, memory


@pytest.mark.parametrize("executor", ["graph", "vm"])
def test_pipeline_run_holds_the_weights_once(tmp_path, executor):
    """Without Python: `pipeline-run --print-memory` on a library of 32 MiB of weights
    reports a peak of one copy of them plus the runtime's few MB (not two: the file's
    pages are given back as the weights are copied out), and writes the right output."""
    from onnx.reference import ReferenceEvaluator

    from pipeline.link.runtime_c import build_pipeline_run

    model = _big_matmul(8, 2)  # 32 MiB of weights
    graph, params = pipeline.frontend.from_onnx(model)
    path = pipeline.build(graph, target="llvm -mcpu=native", params=params,
                          executor=executor).export_library(tmp_path / "big.so")
    build_pipeline_run(tmp_path / "pipeline-run")
    x = np.random.default_rng(9).standard_normal((2, 1024)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([str(tmp_path / "pipeline-run"), str(path), "--input",
                           f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "y"),
                           "--print-memory"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "y" / "output_0.npy"), want, rtol=1e-4,
                               atol=1e-3)
    found = re.fullmatch(r"memory: peak (\d+\.\d) MB resident\n", proc.stdout)
    assert found, proc.stdout
    assert 32 * 2**20 / 1e6 <= float(found.group(1)) < 32 * 2**20 / 1e6 + 16, proc.stdout


def test_vm_storages_planned_at_bounds_stay_lazy(tmp_path):
    """A VM storage is planned at its dimensions' bounds (here 4096 x 8192 floats, 128
    MiB) but only the pages a run writes become resident: a run at 2 rows adds a few
    MiB, not the bound (storages are mapped, not malloc'd and zeroed)."""
    from onnx import TensorProto, helper

    from pipeline.runtime.vm import VirtualMachine

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8192])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8192])]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph, params = pipeline.frontend.from_onnx(model, symbolic=True)
    path = pipeline.build(graph, target="llvm -mcpu=native", params=params, executor="vm",
                          dims={"n": (1, 4096)}).export_library(tmp_path / "wide.so")
    x = np.random.default_rng(7).standard_normal((2, 8192)).astype(np.float32)
    vm = VirtualMachine(path)
    before = anon_bytes()
    for _ in range(3):
        np.testing.assert_array_equal(vm.run(x)[0], -np.maximum(x, 0))
    assert anon_bytes() - before < 16 * 2**20
