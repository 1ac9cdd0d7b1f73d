"""What the fast-kernel tests (test_fast_kernels.py, test_conv_winograd.py) share:
the CPU targets, a conv-net builder and the operators a build really used."""

from __future__ import annotations

import numpy as np
from onnx import helper
from onnx.reference import ReferenceEvaluator

from pipeline.frontend import from_onnx
from tests.support.compare import build_and_load
from tests.support.onnx_models import make_model, rand

node = helper.make_node
NATIVE = "llvm -mcpu=native"
HASWELL = "llvm -mcpu=haswell"  # AVX2 only: 8-float blocks
AVX512 = "llvm -mcpu=skylake-avx512"


def host_has_avx512() -> bool:
    from pipeline.ir.target import parse_target

    return parse_target(NATIVE).vector_width == 16


def ops_used(factory) -> set[str]:
    """Every operator of the lowered graph, looking inside fused nodes."""
    ops = set()
    for n in factory.lowered.graph.nodes:
        body = n.attr("body") if n.op == "fused" else (n,)
        ops |= {b.op for b in body}
    return ops


def conv_net(c, oc, hw, k=3, stride=1, pads=None, bias=True, after=(), batch=1,
             residual=False, hw2=None, clip=None):
    """x -> Conv [-> Add(x)] -> `after` ops (Relu, MaxPool ...) [-> Clip(*clip)],
    weights scaled so outputs stay O(1)."""
    pads = [k // 2] * 4 if pads is None else pads
    inits = {"w": rand(oc, c, k, k, seed=1) * np.float32(1 / np.sqrt(c * k * k))}
    if bias:
        inits["b"] = rand(oc, seed=2)
    nodes = [node("Conv", ["x", "w", *(["b"] if bias else [])], ["t0"], pads=pads,
                  strides=[stride, stride])]
    if residual:
        nodes.append(node("Add", ["t0", "x"], ["t1"]))
    for i, (op, attrs) in enumerate(after):
        src = nodes[-1].output[0]
        nodes.append(node(op, [src], [f"a{i}"], **attrs))
    if clip:
        inits |= {"lo": np.float32(clip[0]), "hi": np.float32(clip[1])}
        nodes.append(node("Clip", [nodes[-1].output[0], "lo", "hi"], ["clipped"]))
    shape = (batch, c, hw, hw2 or hw)
    model = make_model(nodes, [("x", shape)], [(nodes[-1].output[0], None)], inits)
    return model, {"x": rand(*shape, seed=3)}


RELU = ("Relu", {})


WINOGRAD = "conv2d_winograd_nchwc"


def check_winograd(model, feeds, target, uses_winograd=True, **ctx):
    """Build `model` for `target` at opt_level 3 (whether it uses the Winograd conv must
    be `uses_winograd`), run at 1 and 2 threads, compare with onnx.reference."""
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    graph, params = from_onnx(model)
    gm, factory = build_and_load(graph, params, target=target, **ctx)
    assert (WINOGRAD in ops_used(factory)) == uses_winograd, ops_used(factory)
    for threads in (1, 2):
        gm.set_num_threads(threads)
        gm.run(**feeds)
        np.testing.assert_allclose(gm.get_output(0), want, rtol=1e-4, atol=1e-4)
