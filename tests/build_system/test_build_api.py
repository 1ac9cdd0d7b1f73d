"""The Python API without doit: from_onnx -> build -> export_library -> load_module."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import pipeline
from tests.support.onnx_models import tiny_convnet


@pytest.fixture(scope="module")
def tiny_factory(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "tiny.onnx"
    tiny_convnet(path, seed=3)
    graph, params = pipeline.frontend.from_onnx(path)
    with pipeline.transform.PassContext(opt_level=3):
        return path, pipeline.build(graph, target="llvm -mcpu=native", params=params)


@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_export_and_run_matches_onnxruntime(tiny_factory, tmp_path, suffix):
    ort = pytest.importorskip("onnxruntime")
    onnx_path, factory = tiny_factory
    lib = pipeline.runtime.load_module(factory.export_library(tmp_path / f"tiny{suffix}"))
    m = pipeline.runtime.GraphModule(lib["default"]())
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16), dtype=np.float32)
    m.set_input("x", x)
    m.run()
    ref = ort.InferenceSession(str(onnx_path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(m.get_output(0), ref, rtol=1e-4, atol=1e-5)
    assert m.get_num_outputs() == 1 and m.get_num_inputs() == 1


def test_memory_plan_reuses_storage(tiny_factory):
    _, factory = tiny_factory
    plan = factory.lowered.memory
    assert plan.planned_bytes < plan.intermediate_bytes
    storage = factory.get_graph_json()
    assert '"storage_id"' in storage


def test_export_rejects_unknown_suffix(tiny_factory, tmp_path):
    with pytest.raises(ValueError, match=r"writes \.so, \.tar, \.o files"):
        tiny_factory[1].export_library(tmp_path / "tiny.dylib")


# Two tensors of one size freed by the same node, then a third of that size:
# which freed storage it takes must not depend on set iteration order.
PLAN_SCRIPT = """
from pipeline.ir.graph import Graph, Node, TensorType
from pipeline.plan.plan_memory import plan_memory
nodes = (Node.make("relu", "n1", ["x"], ["a"]), Node.make("relu", "n2", ["x"], ["b"]),
         Node.make("add", "n3", ["a", "b"], ["c"]), Node.make("relu", "n4", ["c"], ["d"]),
         Node.make("relu", "n5", ["d"], ["y"]))
graph = Graph(("x",), (), ("y",), nodes, {n: TensorType((64,)) for n in "xabcdy"})
print(sorted(plan_memory(graph).storage_id.items()))
"""


def test_memory_plan_does_not_depend_on_the_hash_seed():
    """Each process hashes strings with its own seed (PYTHONHASHSEED); the plan,
    which lands in the graph JSON, must be the same bytes in every one."""
    plans = {subprocess.run([sys.executable, "-c", PLAN_SCRIPT], capture_output=True,
                            text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
             for seed in range(8)}
    assert len(plans) == 1 and "('d'," in plans.pop()
