"""Grouped convolutions whose groups' channels and filters are whole vector blocks
(alexnet's two-group convs) run the blocked conv2d_nchwc with attr groups: each
channel tile reads its own group's input blocks. Against onnxruntime, at one and two
threads, for AVX2 (8-float blocks) and AVX-512 (16) targets."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from pipeline.frontend import from_onnx
from pipeline.ir.target import parse_target
from tests.support.compare import build_and_load, run_ort
from tests.support.onnx_models import make_model, rand

HASWELL, AVX512 = "llvm -mcpu=haswell", "llvm -mcpu=skylake-avx512"
TARGETS = [pytest.param(HASWELL, id="haswell"),
           pytest.param(AVX512, id="avx512", marks=pytest.mark.skipif(
               parse_target("llvm -mcpu=native").vector_width != 16,
               reason="host has no AVX-512"))]


def _ops(factory) -> list[str]:
    ops = []
    for n in factory.lowered.graph.nodes:
        ops += [b.op for b in (n.attr("body") if n.op == "fused" else (n,))]
    return ops


def _check(c, oc, hw, k, groups, stride=1, pad=0, bias=True, relu=True, target=HASWELL):
    inits = {"w": rand(oc, c // groups, k, k, seed=1) * np.float32(0.2)}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rand(oc, seed=2)
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if relu else "y"], group=groups,
                              strides=[stride, stride], pads=[pad] * 4)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    model = make_model(nodes, [("x", (1, c, hw, hw))], [("y", None)], inits)
    feeds = {"x": rand(1, c, hw, hw, seed=3)}
    want = run_ort(model, feeds)[0]
    graph, params = from_onnx(model)
    gm, factory = build_and_load(graph, params, target=target,
                                 config={"AlterOpLayout.winograd": False})
    return gm, factory, feeds, want


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("c, oc, hw, k, groups, stride, pad, bias, relu", [
    (96, 256, 27, 5, 2, 1, 2, True, True),    # alexnet's second conv, row by row
    (64, 96, 13, 3, 2, 1, 1, True, False),   # a 13 x 13 plane, 48 filters a group
    (64, 64, 8, 3, 4, 2, 1, False, True),    # four groups, stride 2, a flat 4 x 4 plane
    (32, 48, 9, 3, 2, 1, 0, True, True),     # groups of one block (AVX2) / (AVX-512: plain)
])
def test_grouped_conv_matches_onnxruntime(target, c, oc, hw, k, groups, stride, pad, bias,
                                          relu):
    gm, factory, feeds, want = _check(c, oc, hw, k, groups, stride, pad, bias, relu, target)
    vw = parse_target(target).vector_width
    blocked = (c // groups) % vw == 0 and (oc // groups) % vw == 0
    assert ("conv2d_nchwc" in _ops(factory)) == blocked, _ops(factory)
    for threads in (1, 2):
        gm.set_num_threads(threads)
        gm.run(**feeds)
        np.testing.assert_allclose(gm.get_output(0), want, rtol=1e-4, atol=1e-4)


def test_grouped_1x1_conv_keeps_the_pointwise_kernel():
    """A grouped 1x1 conv (shufflenet's) stays conv2d_pointwise on plain tensors."""
    _, factory, _, _ = _check(32, 32, 6, 1, 2)
    assert "conv2d_pointwise" in _ops(factory) and "conv2d_nchwc" not in _ops(factory)
