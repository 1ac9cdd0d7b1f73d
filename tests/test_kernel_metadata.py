"""Per-kernel metadata (flops, bytes moved, constant bytes in every library's graph
JSON; stack scratch from a kernel's IR), checked against counts made independently
from the ONNX model."""

from __future__ import annotations

import pytest
from conftest import build_and_load, make_model, rand
from onnx import helper

from pipeline.frontend import from_onnx
from pipeline.lower.cost import stack_bytes
from pipeline.runtime import load_module
from pipeline.runtime.metadata import kernel_metadata

node = helper.make_node
N, C, H, W, OC, CLASSES = 1, 3, 12, 12, 16, 10


def model():
    """conv(3->16, 3x3, bias) -> relu -> maxpool 2x2 -> flatten -> gemm(+bias)."""
    inits = {"w": rand(OC, C, 3, 3, seed=1), "b": rand(OC, seed=2),
             "fc": rand(CLASSES, OC * (H // 2) * (W // 2), seed=3), "fcb": rand(CLASSES)}
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             node("Relu", ["c"], ["r"]),
             node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Flatten", ["p"], ["f"]),
             node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1)]
    return make_model(nodes, [("x", (N, C, H, W))], [("y", None)], inits), inits


def onnx_flops() -> int:
    """The same rules as pipeline/lower/cost.py, applied to the ONNX nodes."""
    conv_out = N * OC * H * W
    conv = 2 * conv_out * C * 3 * 3 + conv_out          # multiply-adds + bias
    relu = conv_out
    pool = N * OC * (H // 2) * (W // 2) * 2 * 2           # one per window element
    k = OC * (H // 2) * (W // 2)
    gemm = 2 * N * CLASSES * k + N * CLASSES               # + bias
    return conv + relu + pool + gemm


@pytest.fixture(scope="module", params=[3, 0], ids=["opt3", "opt0"])
def built(request):
    onnx_model, inits = model()
    graph, params = from_onnx(onnx_model)
    gmod, factory = build_and_load(graph, params, opt_level=request.param)
    return factory, inits


def test_flops_match_the_onnx_count(built):
    factory, _ = built
    kernels = kernel_metadata(factory.get_graph_json())
    assert sum(k["flops"] * k["calls"] for k in kernels) == onnx_flops()


def test_constant_bytes_are_the_weights_read(built):
    factory, inits = built
    kernels = kernel_metadata(factory.get_graph_json())
    # At opt_level 0 the weights are the ONNX initializers; at 3 they are repacked
    # (the dense weight padded to whole vectors): the library's params then.
    expected = inits if _opt_level(factory) == 0 else factory.get_params()
    assert sum(k["constant_bytes"] for k in kernels) == sum(v.nbytes for v in expected.values())


def _opt_level(factory) -> int:
    return factory.kernels[0].opt_level


def test_bytes_moved_and_the_library_carries_it(built, tmp_path):
    factory, _ = built
    path = factory.export_library(str(tmp_path / "m.so"))
    from_library = kernel_metadata(load_module(path).graph_json)
    assert from_library == kernel_metadata(factory.get_graph_json())
    gemm = next(k for k in from_library if "dense" in k["symbol"])
    k = OC * (H // 2) * (W // 2)
    # x [1, k], the weight (k x CLASSES floats; packed into whole vectors at opt 3),
    # bias, output [1, CLASSES].
    weight = k * CLASSES if _opt_level(factory) == 0 else max(
        v.size for v in factory.get_params().values())
    assert gemm["bytes_moved"] == 4 * (k + weight + CLASSES + CLASSES)


def test_stack_bytes_counts_arrays_not_slots():
    ir = """
  %panel = alloca float, i64 2304, align 64
  %acc = alloca <16 x float>, align 64
  %args = alloca ptr, i32 2, align 8
  %tile = alloca [8 x double], i64 3
"""
    assert stack_bytes(ir) == 2304 * 4 + 2 * 8 + 3 * 64

