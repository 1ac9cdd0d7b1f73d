"""qdense_packed with a column count that is no multiple of the vector width (a
1000-class int8 classifier): the weights, column sums, bias and multipliers are
zero-padded to whole blocks and the last block's outputs stored lane by lane.
QLinearMatMul (requantized) and MatMulInteger (int32) against onnxruntime, for the
portable dot product (AVX2) and VNNI (AVX-512, where the host has it)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from pipeline.frontend import from_onnx
from pipeline.ir.target import parse_target
from tests.support.compare import build_and_load, run_ort
from tests.support.onnx_models import make_model

HASWELL, NATIVE = "llvm -mcpu=haswell", "llvm -mcpu=native"
TARGETS = [pytest.param(HASWELL, id="haswell"),
           pytest.param(NATIVE, id="native", marks=pytest.mark.skipif(
               parse_target(NATIVE).vector_width != 16, reason="host has no AVX-512"))]


def _run(model, feeds, target):
    want = run_ort(model, feeds)[0]
    graph, params = from_onnx(model)
    gm, factory = build_and_load(graph, params, target=target)
    ops = {b.op for n in factory.lowered.graph.nodes
           for b in (n.attr("body") if n.op == "fused" else (n,))}
    assert "qdense_packed" in ops and "matmul_integer" not in ops, ops
    for threads in (1, 2):
        gm.set_num_threads(threads)
        gm.run(**feeds)
        np.testing.assert_array_equal(gm.get_output(0), want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rows, k, n", [(1, 1280, 1000), (3, 64, 37), (5, 8, 5), (4, 32, 24)])
def test_qlinear_matmul_partial_last_block(target, rows, k, n):
    rng = np.random.default_rng(rows + n)
    inits = {"b": rng.integers(-127, 128, (k, n)).astype(np.int8),
             "as": np.float32(0.02), "az": np.uint8(3),
             "bs": rng.uniform(0.0005, 0.002, n).astype(np.float32),
             "bz": np.zeros(n, np.int8), "ys": np.float32(0.3), "yz": np.uint8(120)}
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                              ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, (rows, k))],
                       [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    _run(model, {"a": rng.integers(0, 256, (rows, k)).astype(np.uint8)}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rows, n", [(1, 21), (2, 1000)])
def test_matmul_integer_partial_last_block(target, rows, n):
    """int32 outputs, int8 activations (the dot product's sign offset)."""
    k, rng = 36, np.random.default_rng(n)
    inits = {"b": rng.integers(-128, 128, (k, n)).astype(np.int8), "az": np.int8(-5),
             "bz": np.int8(0)}
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.INT8, (rows, k))],
                       [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    _run(model, {"a": rng.integers(-128, 128, (rows, k)).astype(np.int8)}, target)
