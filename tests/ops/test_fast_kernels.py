"""The fast kernels (blocked conv, packed dense, blocked pools, layout transforms),
the AlterOpLayout pass that chooses them, threading and the per-node profiler,
all compared with onnxruntime.

Every case asserts that the fast op really ran (the lowered graph uses it), so a
pass that silently falls back to the generic kernels fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from pipeline.frontend import from_onnx
from tests.support import REPO
from tests.support.compare import build_and_load, run_ort
from tests.support.fast_kernels import (
    AVX512,
    HASWELL,
    NATIVE,
    RELU,
    conv_net,
    host_has_avx512,
    ops_used,
)
from tests.support.onnx_models import make_model, rand

pytest.importorskip("onnxruntime")

node = helper.make_node
TARGETS = [pytest.param(HASWELL, id="haswell"),
           pytest.param(AVX512, id="avx512", marks=pytest.mark.skipif(
               not host_has_avx512(), reason="host has no AVX-512"))]


# The direct blocked conv's cases: AlterOpLayout would pick Winograd for some 3x3
# ones (tests/ops/test_conv_winograd.py covers that kernel).
DIRECT = {"AlterOpLayout.winograd": False}


def check(model, feeds, target, must_use=(), threads=(None,), rtol=1e-4, atol=1e-4,
          config=DIRECT):
    """Build at opt_level 3 for `target`, run at each thread count, compare with ORT."""
    want = run_ort(model, feeds)
    graph, params = from_onnx(model)
    gm, factory = build_and_load(graph, params, target=target, config=config)
    assert set(must_use) <= ops_used(factory), ops_used(factory)
    for t in threads:
        if t is not None:
            gm.set_num_threads(t)
        gm.run(**feeds)
        for k, w in enumerate(want):
            np.testing.assert_allclose(gm.get_output(k), w, rtol=rtol, atol=atol)
    return gm, factory


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", [
    dict(c=32, oc=32, hw=9, after=[RELU]),                          # flat plan, pads
    dict(c=32, oc=64, hw=20, k=3, after=[RELU]),                     # rows, border tiles
    dict(c=16, oc=32, hw=40, k=3),                                   # rows with a tile loop
    dict(c=32, oc=16, hw=17, k=1, pads=[0, 0, 0, 0]),                # 1x1, odd size
    dict(c=16, oc=32, hw=23, k=3, stride=2, after=[RELU]),           # stride 2
    dict(c=32, oc=64, hw=18, k=1, stride=2, pads=[0, 0, 0, 0]),      # 1x1 stride 2
    dict(c=3, oc=16, hw=30, k=7, stride=2, pads=[3, 3, 3, 3]),       # narrow input block
    dict(c=24, oc=32, hw=13, k=5, pads=[2, 2, 2, 2], after=[RELU]),   # 24: blocks of 12 (b 16)
    dict(c=16, oc=16, hw=12, k=3, pads=[0, 1, 2, 0], bias=False),    # asymmetric pads
    dict(c=16, oc=32, hw=10, hw2=27, k=3, batch=2),                  # batch 2, rectangle
    dict(c=32, oc=32, hw=14, residual=True, after=[RELU]),           # residual add + relu
    dict(c=16, oc=16, hw=8, clip=(0.0, 0.5)),                       # clip epilogue
], ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items() if k != "after"))
def test_blocked_conv_matches_onnxruntime(target, case):
    check(*conv_net(**case), target, must_use={"conv2d_nchwc", "layout_transform"})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("hw, stride, pads, k", [(14, 1, [1, 1, 1, 1], 3), (15, 2, [1, 1, 1, 1], 3),
                                                 (40, 1, [2, 2, 2, 2], 5), (9, 2, [0, 1, 1, 0], 3)])
def test_blocked_depthwise_conv(target, hw, stride, pads, k):
    """Depthwise conv (MobileNet style) + bias + Clip(0, 6), then a pointwise conv."""
    c = 32
    inits = {"dw": rand(c, 1, k, k, seed=1), "db": rand(c, seed=2),
             "pw": rand(16, c, 1, 1, seed=3) * np.float32(0.2),
             "lo": np.float32(0.0), "hi": np.float32(6.0)}
    nodes = [node("Conv", ["x", "dw", "db"], ["d"], group=c, pads=pads,
                  strides=[stride, stride]),
             node("Clip", ["d", "lo", "hi"], ["r"]), node("Conv", ["r", "pw"], ["y"])]
    model = make_model(nodes, [("x", (1, c, hw, hw))], [("y", None)], inits)
    check(model, {"x": rand(1, c, hw, hw, seed=4)}, target,
          must_use={"depthwise_conv2d_nchwc", "clip", "conv2d_nchwc"})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_conv_pads_odd_channels_into_blocks(target, stride):
    """36 channels (no multiple of 8 or 16): the depthwise conv still runs blocked, on
    zero padding channels and zero filters; its output goes plain (cropped) to a graph
    output and re-blocked to a 1x1 conv. Random weights, 1 and 2 threads, against
    onnxruntime."""
    c, hw = 36, 19
    inits = {"dw": rand(c, 1, 3, 3, seed=1), "db": rand(c, seed=2),
             "pw": rand(16, c, 1, 1, seed=3) * np.float32(0.2),
             "lo": np.float32(0.0), "hi": np.float32(6.0)}
    nodes = [node("Conv", ["x", "dw", "db"], ["d"], group=c, pads=[1, 1, 1, 1],
                  strides=[stride, stride]),
             node("Clip", ["d", "lo", "hi"], ["r"]), node("Conv", ["r", "pw"], ["y"]),
             node("Sigmoid", ["r"], ["z"])]
    model = make_model(nodes, [("x", (1, c, hw, hw))], [("y", None), ("z", None)], inits)
    _, factory = check(model, {"x": rand(1, c, hw, hw, seed=4)}, target,
                       must_use={"depthwise_conv2d_nchwc", "clip"}, threads=(1, 2))
    assert "conv2d" not in ops_used(factory)


@pytest.mark.parametrize("block", [8, 16])
def test_layout_transform_pads_and_crops_channels(block):
    """NCHW -> NCHW{b}c of 20 channels fills the last block's padding channels with
    zeros, and back (channels=20) drops them: whole-vector transposes for 32 pixels
    and element by element for the 3 left, against numpy."""
    from pipeline.ir.graph import Graph, Node, TensorType
    from pipeline.ops import infer_types
    from tests.support.compare import build_and_load

    x = rand(2, 20, 5, 7, seed=7)
    nodes = (Node.make("layout_transform", "to", ("x",), ("b",), src_layout="NCHW",
                       dst_layout=f"NCHW{block}c"),
             Node.make("layout_transform", "back", ("b",), ("y",),
                       src_layout=f"NCHW{block}c", dst_layout="NCHW", channels=20))
    types = {"x": TensorType(x.shape, "float32")}
    for n in nodes:
        types.update(zip(n.outputs, infer_types(n, [types[i] for i in n.inputs]),
                         strict=True))
    graph = Graph(("x",), (), ("b", "y"), nodes, types)
    gm, _ = build_and_load(graph, {}, target=NATIVE)
    gm.run(x=x)
    padded = np.pad(x, [(0, 0), (0, -20 % block), (0, 0), (0, 0)])
    want = padded.reshape(2, -1, block, 5, 7).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(gm.get_output(0), want)
    np.testing.assert_array_equal(gm.get_output(1), x)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("c, oc, groups, hw, hw2, after", [
    (12, 20, 2, 9, 9, "residual"),   # channel tiles and pixel blocks both overlap at the end
    (32, 20, 1, 5, 5, "relu"),       # filters not a multiple of the block; 25 pixels
    (8, 12, 4, 3, 3, "row"),         # fewer pixels than lanes; a per-column (W) operand
    (24, 28, 4, 7, 10, "row"),       # pixel vectors across rows: the epilogue in a 2nd pass
    (16, 8, 2, 1, 1, None),          # one pixel
], ids=lambda v: str(v))
def test_pointwise_conv_matches_onnxruntime(target, c, oc, groups, hw, hw2, after):
    """1x1 convs that do not block (groups, odd filter counts) run conv2d_pointwise with
    their epilogue: a residual Add + Relu, Relu, or an Add of a [W] constant. Only the
    [W] constant needs the epilogue's second pass (a vector of pixels may run across
    rows); the bias, a per-channel buffer the chain does not read, does not (it did,
    and that serial pass took over half of shufflenet's pointwise time)."""
    from pipeline.codegen.render import render

    shape = (2, c, hw, hw2)
    inits = {"w": rand(oc, c // groups, 1, 1, seed=1) * np.float32(0.3), "b": rand(oc, seed=2),
             "k": rand(hw2, seed=5)}
    nodes = [node("Conv", ["x", "w", "b"], ["t"], group=groups)]
    if after == "residual":
        inits["r"] = rand(2, oc, hw, hw2, seed=6)
        nodes += [node("Add", ["t", "r"], ["u"]), node("Relu", ["u"], ["y"])]
    elif after == "relu":
        nodes.append(node("Relu", ["t"], ["y"]))
    elif after == "row":
        nodes.append(node("Add", ["t", "k"], ["y"]))
    else:
        nodes[0].output[0] = "y"
    model = make_model(nodes, [("x", shape)], [("y", None)], inits)
    _, factory = check(model, {"x": rand(*shape, seed=3)}, target,
                       must_use={"conv2d_pointwise"}, threads=(1, 2))
    [spec] = [s for s in factory.kernels if s.ops[0].op == "conv2d_pointwise"]
    assert ("eh.head" in render(spec)) == (after == "row")  # plane_epilogue's loop


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", ["relu", "bare", "row", "second_reader", "other_perm"])
def test_channel_shuffle_is_where_the_conv_stores(target, case):
    """ShuffleNet's Reshape -> Transpose (0, 2, 1, 3, 4) -> Reshape of a grouped 1x1
    conv's output (through a Relu, or straight) becomes the conv's shuffle_groups: no
    transpose runs, and a per-channel Add after the shuffle (fused into the conv's
    epilogue) sees the shuffled channels, as does a per-column one (the epilogue's
    second pass over the stored planes: "row"). A shuffled tensor with a second reader, or
    another transpose, keeps the copy. Random weights (a permutation bug shows), 1 and
    2 threads, against onnxruntime."""
    c, oc, g, hw = 24, 36, 3, 6
    inits = {"w": rand(oc, c // g, 1, 1, seed=1) * np.float32(0.3), "b": rand(oc, seed=2),
             "split": np.array([1, g, oc // g, hw, hw], np.int64),
             "back": np.array([1, oc, hw, hw], np.int64),
             "k": rand(hw, seed=5) if case == "row" else rand(oc, 1, 1, seed=5)}
    perm = [0, 2, 1, 3, 4] if case != "other_perm" else [0, 1, 2, 4, 3]
    nodes = [node("Conv", ["x", "w", "b"], ["t"], group=g)]
    nodes += [node("Relu", ["t"], ["r"])] if case != "bare" else \
        [node("Identity", ["t"], ["r"])]
    nodes += [node("Reshape", ["r", "split"], ["s"]),
              node("Transpose", ["s"], ["p"], perm=perm),
              node("Reshape", ["p", "back"], ["q"]),
              node("Add", ["q", "k"], ["y"])]
    outputs = [("y", None)]
    if case == "second_reader":
        nodes.append(node("Sigmoid", ["r"], ["z"]))
        outputs.append(("z", None))
    model = make_model(nodes, [("x", (1, c, hw, hw))], outputs, inits)
    _, factory = check(model, {"x": rand(1, c, hw, hw, seed=3)}, target,
                       must_use={"conv2d_pointwise"}, threads=(1, 2))
    folded = case in ("relu", "bare", "row")
    assert ("transpose" not in ops_used(factory)) == folded, ops_used(factory)
    [conv] = [b for n in factory.lowered.graph.nodes for b in n.attr("body", (n,))
              if b.op == "conv2d_pointwise"]
    assert conv.attr("shuffle_groups", 1) == (g if folded else 1)


@pytest.mark.parametrize("hw", [7, 8])
def test_blocked_elementwise_kernel_goes_band_by_band(hw):
    """DenseNet's pattern: two convs concatenated (in place), then batch norm + ReLU
    as a kernel of its own over the blocked tensor, then a conv. The elementwise
    kernel's rows go band by band over H (dsl/elementwise.py), with a last band past
    an odd H; against onnxruntime at 1 and 2 threads."""
    c = 16
    inits = {"w1": rand(c, c, 3, 3, seed=1) * np.float32(0.1),
             "w2": rand(c, c, 1, 1, seed=2) * np.float32(0.3),
             "s": rand(1, 2 * c, 1, 1, seed=3), "b": rand(1, 2 * c, 1, 1, seed=4),
             "w3": rand(c, 2 * c, 1, 1, seed=5) * np.float32(0.2)}
    nodes = [node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             node("Conv", ["x", "w2"], ["b2"]),
             node("Concat", ["a", "b2"], ["cat"], axis=1),
             node("Mul", ["cat", "s"], ["m"]), node("Add", ["m", "b"], ["n"]),
             node("Relu", ["n"], ["r"]), node("Conv", ["r", "w3"], ["y"])]
    model = make_model(nodes, [("x", (1, c, hw, hw))], [("y", None)], inits)
    _, factory = check(model, {"x": rand(1, c, hw, hw, seed=6)}, NATIVE, threads=(1, 2))
    graph = factory.lowered.graph
    [bn] = [n for n in graph.nodes
            if tuple(b.op for b in n.attr("body", (n,))) == ("mul", "add", "relu")]
    assert len(graph.types[bn.outputs[0]].shape) == 5  # blocked: the banded rows


@pytest.mark.parametrize("target", TARGETS)
def test_elementwise_kernels_are_parallel_vector_loops(target):
    """A kernel of elementwise ops runs as rows of vectors split over the team
    (dsl/elementwise.py): the row spans the trailing dims every argument is whole or
    broadcast over (a per-channel scale: rows of H*W = 35, two vectors of 16 and one
    of 3 on AVX-512), else the last dim (a per-column [W] operand: rows of 7). An
    int64 chain keeps the scalar loop nest. Each against onnxruntime, 1 and 2 threads."""
    from pipeline.codegen.render import render
    from pipeline.dsl.elementwise import row_split

    assert row_split((2, 3, 5, 7), [(2, 3, 5, 7), (3, 1, 1)]) == 2
    assert row_split((2, 3, 5, 7), [(2, 3, 5, 7), (7,)]) == 3
    assert row_split((2, 3, 5, 7), [(2, 3, 5, 7), ()]) == 0
    inits = {"s": rand(3, 1, 1, seed=1), "c": rand(7, seed=2), "k": np.array([3], np.int64),
             "lo": np.float32(-0.5), "hi": np.float32(0.5)}
    nodes = [node("Mul", ["x", "s"], ["a"]), node("Relu", ["a"], ["y"]),
             node("Sub", ["x", "c"], ["b"]), node("Clip", ["b", "lo", "hi"], ["z"]),
             node("Mul", ["i", "k"], ["w"])]
    ints = [helper.make_tensor_value_info(n, onnx.TensorProto.INT64, [4, 5]) for n in "iw"]
    model = make_model(nodes, [("x", (2, 3, 5, 7)), ints[0]],
                       [("y", None), ("z", None), ints[1]], inits)
    feeds = {"x": rand(2, 3, 5, 7, seed=3) - np.float32(0.5),
             "i": np.arange(20, dtype=np.int64).reshape(4, 5)}
    _, factory = check(model, feeds, target, threads=(1, 2))
    rows = sorted((s.ops[0].op, s.params[0].dtype, ".rows" in render(s))
                  for s in factory.kernels)
    assert rows == [("mul", "float32", True), ("mul", "int64", False),
                    ("sub", "float32", True)], rows


@pytest.mark.parametrize("target", TARGETS)
def test_padded_filters(target):
    """Filter counts that are not a multiple of the block are padded with zero filters:
    a 3x3 conv of 20 (stem) -> Relu -> Mul by a per-channel constant -> MaxPool (blocked,
    padded) -> a plain Softmax; a
    16 -> 16 conv and then a 1x1 of 20 on its blocked output -> global average pool."""
    inits = {"w": rand(20, 3, 3, 3, seed=1), "b": rand(20, seed=2),
             "w2": rand(16, 3, 3, 3, seed=3), "w3": rand(20, 16, 1, 1, seed=4)}
    inits["s"] = rand(20, 1, 1, seed=6)
    nodes = [node("Conv", ["x", "w", "b"], ["a"], pads=[1] * 4), node("Relu", ["a"], ["q"]),
             node("Mul", ["q", "s"], ["r"]),
             node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Softmax", ["p"], ["y"], axis=1),
             node("Conv", ["x", "w2"], ["c"], pads=[1] * 4),
             node("Conv", ["c", "w3"], ["d"]), node("GlobalAveragePool", ["d"], ["z"])]
    model = make_model(nodes, [("x", (2, 3, 12, 11))], [("y", None), ("z", None)], inits)
    _, factory = check(model, {"x": rand(2, 3, 12, 11, seed=5)}, target,
                       must_use={"conv2d_nchwc", "max_pool2d_nchwc", "global_avg_pool_nchwc"})
    assert "conv2d" not in ops_used(factory) and "conv2d_pointwise" not in ops_used(factory)


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_concat(target):
    """A fire module (squeezenet): 1x1 and 3x3 expand convs concatenated along channels,
    max-pooled and squeezed again, all blocked, with the plain input concatenated too."""
    c = 16
    inits = {"s": rand(c, c, 1, 1, seed=1) * np.float32(0.3),
             "e1": rand(2 * c, c, 1, 1, seed=2) * np.float32(0.3),
             "e3": rand(c, c, 3, 3, seed=3) * np.float32(0.1),
             "q": rand(c, 4 * c, 1, 1, seed=4) * np.float32(0.2)}
    nodes = [node("Conv", ["x", "s"], ["a"]), node("Relu", ["a"], ["r"]),
             node("Conv", ["r", "e1"], ["b1"]), node("Conv", ["r", "e3"], ["b3"], pads=[1] * 4),
             node("Concat", ["b1", "b3", "x"], ["cat"], axis=1),
             node("MaxPool", ["cat"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
             # a 1-high output: the blocked pool's row index folds to a Python int
             node("AveragePool", ["p0"], ["p"], kernel_shape=[5, 1], pads=[0, 0, 0, 0]),
             node("Conv", ["p", "q"], ["y"])]
    model = make_model(nodes, [("x", (2, c, 10, 10))], [("y", None)], inits)
    _, factory = check(model, {"x": rand(2, c, 10, 10, seed=5)}, target,
                       must_use={"concat", "max_pool2d_nchwc", "avg_pool2d_nchwc"})
    ops = [b.op for n in factory.lowered.graph.nodes
           for b in (n.attr("body") if n.op == "fused" else (n,))]
    assert ops.count("layout_transform") == 2, ops  # x in (for conv and concat), y out


def test_long_concat_rows_split_over_threads():
    """Concat copies each input's rows in pieces of at most CONCAT_PIECE elements that
    split over threads (one image: one row per input): 307200 elements take 19
    pieces, 6400 one (and too little work for a second thread); transposes and plain
    pools split their leading dims (parallel_nest). Against onnxruntime at 1 and 2
    threads."""
    from pipeline.codegen.render import render
    from pipeline.kernels.shape import CONCAT_PIECE

    assert 6400 < CONCAT_PIECE and -(-307200 // CONCAT_PIECE) == 19
    nodes = [node("Concat", ["a", "b", "c"], ["y"], axis=1),
             node("Transpose", ["y"], ["t"], perm=[0, 2, 1, 3]),
             node("MaxPool", ["a"], ["p"], kernel_shape=[3, 3], pads=[1] * 4)]
    shapes = {"a": (1, 48, 80, 80), "b": (1, 1, 80, 80), "c": (1, 48, 80, 80)}
    model = make_model(nodes, list(shapes.items()), [("t", None), ("p", None)])
    feeds = {k: rand(*v, seed=i) for i, (k, v) in enumerate(shapes.items())}
    _, factory = check(model, feeds, NATIVE, threads=(1, 2))
    for spec in factory.kernels:
        assert "pl_parallel" in render(spec), spec.ops[0].op


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_pools(target):
    """conv -> relu -> maxpool (ceil) and avgpool (with pad) and the global pools,
    all on blocked tensors, summed so one output covers every path."""
    c, hw = 16, 13
    inits = {"w": rand(c, c, 3, 3, seed=1) * np.float32(0.2)}
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"]),
             node("MaxPool", ["r"], ["mp"], kernel_shape=[3, 3], strides=[2, 2],
                  pads=[1, 1, 1, 1], ceil_mode=1),
             node("AveragePool", ["r"], ["ap"], kernel_shape=[3, 3], strides=[2, 2],
                  pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1),
             node("AveragePool", ["r"], ["ap2"], kernel_shape=[2, 2], strides=[2, 2],
                  pads=[0, 0, 1, 1], ceil_mode=1),
             node("Add", ["mp", "ap"], ["s"]), node("Add", ["s", "ap2"], ["s2"]),
             node("GlobalAveragePool", ["s2"], ["g1"]), node("GlobalMaxPool", ["r"], ["g2"]),
             node("Add", ["g1", "g2"], ["y"])]
    model = make_model(nodes, [("x", (1, c, hw, hw))], [("y", None)], inits)
    check(model, {"x": rand(1, c, hw, hw, seed=3)}, target,
          must_use={"max_pool2d_nchwc", "avg_pool2d_nchwc", "global_avg_pool_nchwc",
                    "global_max_pool_nchwc"})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n_out, m", [(1000, 1), (48, 3), (5, 2), (100, 7), (64, 24)])
def test_packed_dense(target, n_out, m):
    """Gemm (with bias, transB) and relu: full blocks, a partial last block, a
    layer narrower than one block, a tail tile of rows with a last group of
    fewer blocks, and whole register tiles (with AVX-512)."""
    k = 40
    inits = {"w": rand(n_out, k, seed=5), "b": rand(n_out, seed=6)}
    nodes = [node("Gemm", ["a", "w", "b"], ["g"], transB=1), node("Relu", ["g"], ["y"])]
    model = make_model(nodes, [("a", (m, k))], [("y", None)], inits)
    check(model, {"a": rand(m, k, seed=7)}, target, must_use={"dense_packed"})


def test_blocked_and_plain_consumers_mix():
    """A blocked conv output also read by an op without a blocked form (Softmax over
    channels), by a per-channel Mul, and returned as a graph output itself."""
    c = 16
    inits = {"w": rand(c, c, 3, 3, seed=1) * np.float32(0.3), "s": rand(1, c, 1, 1, seed=2)}
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("Softmax", ["c"], ["sm"], axis=1), node("Mul", ["c", "s"], ["m"]),
             node("Relu", ["m"], ["r"])]
    model = make_model(nodes, [("x", (1, c, 6, 6))], [("sm", None), ("r", None), ("c", None)],
                       inits)
    check(model, {"x": rand(1, c, 6, 6, seed=3)}, NATIVE, must_use={"conv2d_nchwc"})


def test_ineligible_convs_keep_the_generic_kernel():
    """Grouped (not depthwise, not 1x1), dilated and channel counts that do not block
    stay plain conv2d."""
    inits = {"w1": rand(16, 8, 3, 3, seed=1), "w2": rand(20, 16, 3, 3, seed=2)}
    nodes = [node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], group=2),
             node("Conv", ["a", "w2"], ["y"], pads=[2, 2, 2, 2], dilations=[2, 2])]
    model = make_model(nodes, [("x", (1, 16, 8, 8))], [("y", None)], inits)
    _, factory = check(model, {"x": rand(1, 16, 8, 8, seed=3)}, NATIVE)
    assert "conv2d_nchwc" not in ops_used(factory)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_counts_match_onnxruntime(threads):
    """The same library at 1, 2 and 3 threads (more threads than this machine may
    have cores is still correct), set per GraphModule."""
    model, feeds = conv_net(32, 64, 15, after=[RELU, ("MaxPool", {"kernel_shape": [2, 2],
                                                                  "strides": [2, 2]})])
    check(model, feeds, NATIVE, must_use={"conv2d_nchwc"}, threads=(threads,))


def test_small_kernels_run_inline_large_ones_on_the_team():
    """The conv (4M multiply-adds) may split over up to 3 threads through the library's
    own team (pl_parallel, else libgomp); the max pool after it is too small to be
    worth a second thread and has no parallel call at all. 2 threads, many runs in a
    row (workers joining late or not at all), same result as onnxruntime every time."""
    from pipeline.codegen.render import render
    from pipeline.dsl.vector import MIN_WORK_PER_THREAD, thread_cap

    assert thread_cap(100, None) == 100 and thread_cap(100, 10) == 1
    assert thread_cap(2, 50 * MIN_WORK_PER_THREAD) == 2
    assert thread_cap(100, 3 * MIN_WORK_PER_THREAD + 1) == 3
    model, feeds = conv_net(32, 64, 15, after=[RELU, ("MaxPool", {"kernel_shape": [2, 2],
                                                                  "strides": [2, 2]})])
    gm, factory = check(model, feeds, NATIVE, must_use={"conv2d_nchwc"}, threads=(2,))
    calls = {s.ops[0].op: ("pl_parallel" in (ir := render(s)), "GOMP_parallel" in ir)
             for s in factory.kernels}
    assert calls["conv2d_nchwc"] == (True, True), calls
    assert calls["max_pool2d_nchwc"] == (False, False), calls
    want = gm.get_output(0).copy()
    for _ in range(200):
        gm.run(**feeds)
        np.testing.assert_array_equal(gm.get_output(0), want)


def test_thread_count_from_environment_and_errors(tmp_path):
    """PIPELINE_NUM_THREADS sets the default in a fresh process that imports only the
    runtime (the library dlopens with its libgomp); bad counts are refused."""
    from pipeline import build
    from pipeline.runtime import GraphModule, load_module
    from pipeline.transform import PassContext

    model, feeds = conv_net(16, 32, 12, after=[RELU])
    graph, params = from_onnx(model)
    with PassContext(opt_level=3):
        path = build(graph, target=NATIVE, params=params).export_library(tmp_path / "m.so")
    np.save(tmp_path / "x.npy", feeds["x"])
    np.save(tmp_path / "want.npy", run_ort(model, feeds)[0])
    script = (
        "import sys, numpy as np\n"
        "from pipeline.runtime import GraphModule, load_module\n"
        f"gm = GraphModule(load_module({str(path)!r})['default']())\n"
        "assert gm.module.num_threads == 3, gm.module.num_threads\n"
        f"gm.run(x=np.load({str(tmp_path / 'x.npy')!r}))\n"
        f"np.testing.assert_allclose(gm.get_output(0), np.load({str(tmp_path / 'want.npy')!r}),"
        " rtol=1e-4, atol=1e-4)\n"
        "assert 'llvmlite' not in sys.modules and 'onnx' not in sys.modules\n"
        "import os; assert os.environ['GOMP_SPINCOUNT'] == '10000'\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_NUM_THREADS": "3"}
    env.pop("GOMP_SPINCOUNT", None)  # the loader limits libgomp's idle spinning
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    gm = GraphModule(load_module(path)["default"](), num_threads=2)
    assert gm.module.num_threads == 2
    for bad in (0, -1, 1.5, "two"):
        with pytest.raises(ValueError, match="thread count"):
            gm.set_num_threads(bad)


def test_profile_names_every_node():
    from pipeline.runtime.profile import format_profile, profile_nodes

    model, feeds = conv_net(16, 32, 12, after=[RELU])
    graph, params = from_onnx(model)
    gm, factory = build_and_load(graph, params, target=NATIVE, config=DIRECT)
    gm.set_input(**feeds)
    rows = profile_nodes(gm, runs=3)
    assert len(rows) == len(factory.lowered.graph.nodes)
    assert [r.ms for r in rows] == sorted((r.ms for r in rows), reverse=True)
    conv = next(r for r in rows if r.kernel.startswith("conv2d_nchwc"))
    assert conv.outputs == [(1, 2, 12, 12, 16)] or conv.outputs == [(1, 4, 12, 12, 8)]
    text = format_profile(rows, top=2)
    assert rows[0].kernel[:40] in text and "total of 3 nodes" in text


def test_layout_transforms_only_where_layouts_meet():
    """A ResNet-like chain stays blocked from the first conv to the global pool: one
    transform in (the image), one out (the pooled features), none in between."""
    from pipeline.ir.target import parse_target
    from pipeline.transform import PassContext, optimize

    c = 16
    inits = {"w1": rand(c, 3, 3, 3, seed=1), "w2": rand(c, c, 3, 3, seed=2),
             "w3": rand(c, c, 1, 1, seed=3), "fc": rand(10, c, seed=4), "fb": rand(10, seed=5)}
    nodes = [node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), node("Relu", ["a"], ["b"]),
             node("MaxPool", ["b"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Conv", ["p", "w2"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["d"]),
             node("Conv", ["d", "w3"], ["e"]), node("Add", ["e", "p"], ["f"]),
             node("Relu", ["f"], ["g"]), node("GlobalAveragePool", ["g"], ["h"]),
             node("Flatten", ["h"], ["i"]), node("Gemm", ["i", "fc", "fb"], ["y"], transB=1)]
    model = make_model(nodes, [("x", (1, 3, 16, 16))], [("y", None)], inits)
    graph, params = from_onnx(model)
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        graph, _ = optimize(graph, params, target=parse_target(AVX512 if host_has_avx512()
                                                               else HASWELL))
    ops = [n.op for n in graph.nodes]
    assert ops.count("layout_transform") == 2, ops
    assert ops[0] == "layout_transform" and "dense_packed" in ops
    assert "conv2d" not in ops and "max_pool2d" not in ops
    check(model, {"x": rand(1, 3, 16, 16, seed=6)}, NATIVE)
