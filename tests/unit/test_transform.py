"""Graph passes, checked on graph structure (before -> expected) and, where the
rewrite changes arithmetic, on numerics against onnxruntime."""

from __future__ import annotations

import difflib

import numpy as np
import pytest
from onnx import helper

from pipeline.errors import ConfigError
from pipeline.frontend import from_onnx
from pipeline.ir.graph import Graph, Node, TensorType
from pipeline.ir.target import parse_target
from pipeline.ops import infer_types
from pipeline.transform import (
    PASS_NAMES,
    PIPELINE,
    PassConfig,
    PassContext,
    PassInstrument,
    PassTimingInstrument,
    optimize,
)
from tests.support.compare import assert_matches_ort
from tests.support.onnx_models import make_model, rand

node = helper.make_node
X = (1, 4, 6, 6)


def bn_inits(c=4):
    return {"s": rand(c, seed=3), "bb": rand(c, seed=4), "m": rand(c, seed=5),
            "v": rand(c, seed=6, low=0.5, high=2.0)}


def bn(inp, out):
    return node("BatchNormalization", [inp, "s", "bb", "m", "v"], [out], epsilon=1e-3)


def conv(inp, out, w="w"):
    return node("Conv", [inp, w], [out], pads=[1, 1, 1, 1])


def run(model, **ctx):
    """(graph, params) of `model` after optimize under PassContext(**ctx)."""
    graph, params = from_onnx(model)
    with PassContext(**ctx):
        out, out_params = optimize(graph, params)
    out.verify(infer_types)
    return out, out_params


def ops(graph):
    return [n.op for n in graph.nodes]


def body_ops(graph):
    return [tuple(b.op for b in n.attr("body")) for n in graph.nodes]


def test_fold_batch_norm_into_conv():
    pytest.importorskip("onnxruntime")
    inits = {"w": rand(4, 4, 3, 3, seed=1), **bn_inits()}
    model = make_model([conv("x", "c"), bn("c", "y")], [("x", X)], [("y", None)], inits)
    graph, params = run(model, opt_level=1, disabled_pass=["FuseOps"])
    assert ops(graph) == ["conv2d"]
    (c,) = graph.nodes
    assert len(c.inputs) == 3 and c.outputs == ("y",)
    assert params[c.inputs[2]].shape == (4,)
    assert_matches_ort(model, {"x": rand(*X)}, opt_level=3)


def residual():
    nodes = [conv("x", "c"), node("Add", ["c", "x"], ["a"]), node("Relu", ["a"], ["y"])]
    return make_model(nodes, [("x", X)], [("y", None)], {"w": rand(4, 4, 3, 3, seed=1)})


def test_disabled_fuse_ops_builds_and_matches_ort():
    pytest.importorskip("onnxruntime")
    graph, _ = run(residual(), opt_level=3, disabled_pass=["FuseOps"])
    assert "fused" not in ops(graph)
    assert ops(graph) == ["conv2d", "add", "relu"]
    assert_matches_ort(residual(), {"x": rand(*X)}, opt_level=3, disabled_pass=["FuseOps"])


@pytest.mark.parametrize("kwargs", [
    {"disabled_pass": ["NoSuchPass"]},
    {"required_pass": ["FoldEverything"]},
    {"config": {"FuseOps.depth": 3}},
    {"config": {"FuseOps.max_depth": "3"}},
    {"opt_level": 4},
    {"opt_level": -1},
])
def test_bad_pass_context_is_config_error(kwargs):
    with pytest.raises(ConfigError):
        PassContext(**kwargs)


def test_every_pass_keeps_the_graph_valid():
    inits = {"w": rand(4, 4, 3, 3, seed=1), **bn_inits(), "k1": rand(4, 1, 1, seed=8),
             "k2": rand(4, 1, 1, seed=9)}
    nodes = [node("Dropout", ["x"], ["d"]), conv("d", "c"), bn("c", "b"),
             node("Mul", ["k1", "k2"], ["k"]), node("Add", ["b", "k"], ["a"]),
             node("Add", ["a", "x"], ["r"]), node("Relu", ["r"], ["y"])]
    model = make_model(nodes, [("x", X)], [("y", None)], inits)
    graph, params = from_onnx(model)
    cfg = PassConfig(opt_level=3)
    for p in PIPELINE:
        graph, params = p.run(graph, params, cfg)
        graph.verify(infer_types)
        assert set(graph.params) == set(params), p.name
    assert body_ops(graph) == [("conv2d", "add", "add", "relu")]
    with PassContext(opt_level=3):
        again, _ = optimize(*from_onnx(model))
    again.verify(infer_types)
    assert again == graph


class Recorder(PassInstrument):
    """Logs every hook call; skips the passes named in `skip`."""

    def __init__(self, log: list, tag: str, skip=()):
        self.log, self.tag, self.skip = log, tag, set(skip)

    def enter_pass_ctx(self):
        self.log.append((self.tag, "enter"))

    def exit_pass_ctx(self):
        self.log.append((self.tag, "exit"))

    def should_run(self, graph, info):
        self.log.append((self.tag, "should_run", info.name))
        return info.name not in self.skip

    def run_before_pass(self, graph, info):
        self.log.append((self.tag, "before", info.name, len(graph.nodes)))

    def run_after_pass(self, graph, info):
        self.log.append((self.tag, "after", info.name, len(graph.nodes)))


def test_instruments_see_each_pass_in_order_and_can_skip_one():
    graph, params = from_onnx(residual())
    log: list = []
    timing = PassTimingInstrument()
    with PassContext(opt_level=1, instruments=[Recorder(log, "a", skip=["FuseOps"]),
                                               Recorder(log, "b"), timing]):
        out, _ = optimize(graph, params)
    assert "fused" not in ops(out)  # one instrument said no: FuseOps did not run
    ran = ["SimplifyInference", "FuseQDQ", "FuseLayerNorm", "FuseGelu", "FuseAttention",
           "FoldBatchNorm"]  # opt_level 1 without FuseOps
    assert [e[2] for e in log if e[:2] == ("b", "before")] == ran
    assert [e[2] for e in log if e[:2] == ("b", "should_run")] == [*ran, "FuseOps"]
    assert log[0] == ("a", "enter") and log[1] == ("b", "enter")
    assert log[-2:] == [("a", "exit"), ("b", "exit")]
    first = log.index(("a", "before", "SimplifyInference", 3))
    assert log[first + 1] == ("b", "before", "SimplifyInference", 3)  # in the order given
    assert [t["pass"] for t in timing.timings] == ran
    assert all(t["seconds"] >= 0 for t in timing.timings)
    assert "FoldBatchNorm" in timing.render() and "total" in timing.render()


def test_exit_pass_ctx_runs_when_a_pass_fails():
    log: list = []

    class Boom(Recorder):
        def run_before_pass(self, graph, info):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError), PassContext(instruments=[Boom(log, "x")]):
        optimize(*from_onnx(residual()))
    assert log[-1] == ("x", "exit")


def test_fold_constant_folds_mul_of_constants():
    pytest.importorskip("onnxruntime")
    k1, k2 = rand(3, 4, seed=1), rand(4, seed=2)
    nodes = [node("Mul", ["k1", "k2"], ["k"]), node("Add", ["x", "k"], ["y"])]
    model = make_model(nodes, [("x", (3, 4))], [("y", None)], {"k1": k1, "k2": k2})
    graph, params = run(model, opt_level=2, disabled_pass=["FuseOps"])
    assert ops(graph) == ["add"]
    assert graph.nodes[0].inputs == ("x", "k")
    assert set(params) == {"k"}
    np.testing.assert_allclose(params["k"], k1 * k2, rtol=1e-6)
    assert_matches_ort(model, {"x": rand(3, 4)}, opt_level=3)


def test_fold_constant_off_below_opt_level_2():
    nodes = [node("Mul", ["k1", "k2"], ["k"]), node("Add", ["x", "k"], ["y"])]
    model = make_model(nodes, [("x", (3, 4))], [("y", None)],
                       {"k1": rand(3, 4), "k2": rand(4)})
    graph, _ = run(model, opt_level=1, disabled_pass=["FuseOps"])
    assert ops(graph) == ["mul", "add"]


# -- pass-level tests: a hand-built (or imported) `before` graph, ONE pass, and a
# hand-built `expected` graph compared structurally. Pass-generated names (folded
# params, fused nodes, blocked tensors, layout_transform nodes) are deterministic
# and documented by the passes, so they are part of what is compared.

def make_graph(inputs: dict, params: dict, outputs, nodes) -> Graph:
    """A verified Graph: input types from `inputs` ({name: shape}, float32), param
    types from their values, node output types from the operators' shape rules."""
    types = {k: TensorType(tuple(s)) for k, s in inputs.items()}
    types |= {k: TensorType(v.shape, str(v.dtype)) for k, v in params.items()}
    for n in nodes:
        types.update(zip(n.outputs, infer_types(n, [types[i] for i in n.inputs]), strict=True))
    graph = Graph(tuple(inputs), tuple(sorted(params)), tuple(outputs), tuple(nodes), types)
    graph.verify(infer_types)
    return graph


def fused(name, inputs, *body):
    return Node.make("fused", name, inputs, body[-1].outputs, body=body)


def _node_lines(n, indent=""):
    attrs = {k: v for k, v in n.attrs if k != "body"}
    lines = [f"{indent}{n.op} {n.name!r} {list(n.inputs)} -> {list(n.outputs)} {attrs}"]
    for inner in n.attr("body", ()):
        lines += _node_lines(inner, indent + "    ")
    return lines


def assert_graph_equal(got: Graph, expected: Graph, got_params=None, expected_params=None):
    """Same nodes (op, name, inputs, outputs, attrs, fused bodies) in order, same
    inputs/params/outputs and types; with params given, the same param values."""
    problems = []
    for field in ("inputs", "params", "outputs"):
        if getattr(got, field) != getattr(expected, field):
            problems.append(f"{field}: got {getattr(got, field)}, "
                            f"expected {getattr(expected, field)}")
    if got.nodes != expected.nodes:
        diff = difflib.unified_diff([x for n in expected.nodes for x in _node_lines(n)],
                                    [x for n in got.nodes for x in _node_lines(n)],
                                    "expected", "got", lineterm="")
        problems.append("nodes differ:\n" + "\n".join(diff))
    for name in sorted(set(got.types) | set(expected.types)):
        if got.types.get(name) != expected.types.get(name):
            problems.append(f"type of {name!r}: got {got.types.get(name)}, "
                            f"expected {expected.types.get(name)}")
    if got_params is not None:
        if set(got_params) != set(expected_params):
            problems.append(f"param names: got {sorted(got_params)}, "
                            f"expected {sorted(expected_params)}")
        for name in sorted(set(got_params) & set(expected_params)):
            g, e = got_params[name], np.asarray(expected_params[name])
            if g.shape != e.shape or g.dtype != e.dtype or not np.allclose(g, e, 1e-6, 1e-6):
                problems.append(f"param {name!r}: got {g.dtype}{list(g.shape)}, expected "
                                f"{e.dtype}{list(e.shape)}, max |diff| "
                                f"{np.abs(g - e).max() if g.shape == e.shape else '-'}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def run_pass(name, graph, params, target=None, **ctx):
    """(graph, params) after only pass `name`, run by optimize under a PassContext
    that requires it and disables every other pass."""
    graph.verify(infer_types)
    others = [p for p in PASS_NAMES if p != name]
    with PassContext(opt_level=0, required_pass=[name], disabled_pass=others, **ctx):
        out, out_params = optimize(graph, params, target=target)
    out.verify(infer_types)
    return out, out_params


def conv2d(name, inputs, out):
    return Node.make("conv2d", name, inputs, (out,), dilations=(1, 1), groups=1,
                     pads=(1, 1, 1, 1), strides=(1, 1))


# FoldConstant

def test_fold_constant_pass_folds_constant_subexpression_only():
    k1, k2, k3 = rand(3, 4, seed=1), rand(4, seed=2), rand(3, 4, seed=3)
    params = {"k1": k1, "k2": k2, "k3": k3}
    before = make_graph({"x": (3, 4)}, params, ["y"], [
        Node.make("mul", "m", ["k1", "k2"], ["k"]),
        Node.make("add", "a", ["k", "k3"], ["c"]),     # constant: folds with `m`
        Node.make("add", "ax", ["x", "c"], ["s"]),     # runtime: stays
        Node.make("relu", "r", ["s"], ["y"])])
    got, got_params = run_pass("FoldConstant", before, params)
    folded = {"c": k1 * k2 + k3}
    expected = make_graph({"x": (3, 4)}, folded, ["y"], [
        Node.make("add", "ax", ["x", "c"], ["s"]),
        Node.make("relu", "r", ["s"], ["y"])])
    assert_graph_equal(got, expected, got_params, folded)


def test_fold_constant_pass_keeps_constant_graph_output():
    params = {"k1": rand(4, seed=1), "k2": rand(4, seed=2)}
    before = make_graph({"x": (4,)}, params, ["k", "y"], [
        Node.make("mul", "m", ["k1", "k2"], ["k"]),
        Node.make("add", "a", ["x", "k"], ["y"])])
    got, got_params = run_pass("FoldConstant", before, params)
    assert_graph_equal(got, before, got_params, params)


# SimplifyInference

def test_simplify_inference_pass_drops_identities_and_splits_batch_norm():
    nodes = [node("Identity", ["x"], ["i"]), node("Dropout", ["i"], ["d"]), bn("d", "b"),
             node("Relu", ["b"], ["y"])]
    before, params = from_onnx(make_model(nodes, [("x", X)], [("y", None)], bn_inits()))
    got, got_params = run_pass("SimplifyInference", before, params)
    i = bn_inits()
    scale = i["s"] / np.sqrt(i["v"].astype(np.float64) + 1e-3)
    want = {"BatchNormalization_2.scale": scale.astype(np.float32).reshape(4, 1, 1),
            "BatchNormalization_2.shift":
                (i["bb"] - i["m"] * scale).astype(np.float32).reshape(4, 1, 1)}
    expected = make_graph({"x": X}, want, ["y"], [
        Node.make("mul", "BatchNormalization_2.scale",
                  ["x", "BatchNormalization_2.scale"], ["b.scaled"]),
        Node.make("add", "BatchNormalization_2.shift",
                  ["b.scaled", "BatchNormalization_2.shift"], ["b"]),
        Node.make("relu", "Relu_3", ["b"], ["y"])])
    assert_graph_equal(got, expected, got_params, want)


def test_simplify_inference_pass_keeps_identity_that_is_a_graph_output():
    before = make_graph({"x": X}, {}, ["y"], [Node.make("identity", "i", ["x"], ["y"])])
    got, got_params = run_pass("SimplifyInference", before, {})
    assert_graph_equal(got, before, got_params, {})


def test_simplify_inference_pass_new_tensor_names_avoid_existing_ones():
    """A model may already hold a tensor named like the pass's intermediate."""
    c = 3
    inits = {"g": rand(c, seed=1), "beta": rand(c, seed=2), "mu": rand(c, seed=3),
             "var": rand(c, seed=4, low=0.5, high=1.5), "one": np.ones((1, c, 4, 4), np.float32)}
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "beta", "mu", "var"], ["b"]),
             helper.make_node("Add", ["b", "one"], ["b.scaled"]),
             helper.make_node("Mul", ["b", "b.scaled"], ["y"])]
    graph, params = from_onnx(make_model(nodes, [("x", [1, c, 4, 4])], [("y", [1, c, 4, 4])],
                                         inits))
    got, _ = run_pass("SimplifyInference", graph, params)
    assert [n.op for n in got.nodes] == ["mul", "add", "add", "mul"]
    assert got.nodes[0].outputs == ("b.scaled.1",)


# FoldBatchNorm

@pytest.mark.parametrize("with_bias", [False, True])
def test_fold_batch_norm_pass_folds_scale_and_shift_into_conv(with_bias):
    w, b = rand(8, 4, 3, 3, seed=1), rand(8, seed=2)
    s, t = rand(8, 1, 1, seed=3), rand(8, 1, 1, seed=4)
    params = {"w": w, "s": s, "t": t} | ({"b": b} if with_bias else {})
    before = make_graph({"x": X}, params, ["y"], [
        conv2d("conv", ["x", "w", "b"] if with_bias else ["x", "w"], "c"),
        Node.make("mul", "scale", ["c", "s"], ["m"]),
        Node.make("add", "shift", ["t", "m"], ["y"])])
    got, got_params = run_pass("FoldBatchNorm", before, params)
    # y[o] = s[o] * (sum w[o] * x + b[o]) + t[o]  =  sum (s[o] w[o]) * x + (s[o] b[o] + t[o])
    s64 = s.reshape(8).astype(np.float64)
    want = {"conv.weight_folded": (w * s64[:, None, None, None]).astype(np.float32),
            "conv.bias_folded": ((b * s64 if with_bias else 0) + t.reshape(8))
            .astype(np.float32)}
    expected = make_graph({"x": X}, want, ["y"], [
        conv2d("conv", ["x", "conv.weight_folded", "conv.bias_folded"], "y")])
    assert_graph_equal(got, expected, got_params, want)


def test_fold_batch_norm_pass_skips_conv_with_other_users():
    params = {"w": rand(4, 4, 3, 3, seed=1), "s": rand(4, 1, 1, seed=3),
              "t": rand(4, 1, 1, seed=4)}
    before = make_graph({"x": X}, params, ["y"], [
        conv2d("conv", ["x", "w"], "c"),
        Node.make("mul", "scale", ["c", "s"], ["m"]),
        Node.make("add", "shift", ["m", "t"], ["a"]),
        Node.make("add", "res", ["a", "c"], ["y"])])
    got, got_params = run_pass("FoldBatchNorm", before, params)
    assert_graph_equal(got, before, got_params, params)


def test_fold_batch_norm_pass_skips_conv_with_runtime_bias():
    params = {"w": rand(4, 4, 3, 3, seed=1), "s": rand(4, 1, 1, seed=3)}
    before = make_graph({"x": X, "b": (4,)}, params, ["y"], [
        conv2d("conv", ["x", "w", "b"], "c"), Node.make("mul", "scale", ["c", "s"], ["y"])])
    got, got_params = run_pass("FoldBatchNorm", before, params)
    assert_graph_equal(got, before, got_params, params)


# FuseLayerNorm

def decomposed_layer_norm(square="Pow", affine=True, axes=(-1,), extra_use=False,
                          shape=(2, 5, 16)):
    """LayerNorm as exporters before opset 17 write it (patterns.py's doc)."""
    d = shape[-1]
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
             "g": rand(d, seed=1, low=0.5, high=1.5), "b": rand(d, seed=2)}
    node = helper.make_node
    nodes = [node("ReduceMean", ["x"], ["m"], axes=list(axes)),
             node("Sub", ["x", "m"], ["d"]),
             node("Pow", ["d", "two"], ["p"]) if square == "Pow" else
             node("Mul", ["d", "d"], ["p"]),
             node("ReduceMean", ["p"], ["v"], axes=list(axes)),
             node("Add", ["v", "eps"], ["ve"]), node("Sqrt", ["ve"], ["s"]),
             node("Div", ["d", "s"], ["n" if affine else "y"])]
    if affine:
        nodes += [node("Mul", ["n", "g"], ["gn"]), node("Add", ["gn", "b"], ["y"])]
    outputs = [("y", list(shape))] + ([("d", list(shape))] if extra_use else [])
    return make_model(nodes, [("x", list(shape))], outputs, inits)


@pytest.mark.parametrize("square, affine", [("Pow", True), ("Mul", True), ("Pow", False)])
def test_fuse_layer_norm_pass_makes_one_layer_norm(square, affine):
    model = decomposed_layer_norm(square, affine)
    graph, params = from_onnx(model)
    got, _ = run_pass("FuseLayerNorm", graph, params)
    assert [n.op for n in got.nodes] == ["layer_norm"]
    assert got.nodes[0].attr("axis") == 2 and got.nodes[0].attr("epsilon") == pytest.approx(1e-5)
    assert got.nodes[0].outputs == ("y",)
    x = rand(2, 5, 16, low=-2, high=3)
    assert_matches_ort(model, {"x": x}, opt_level=1)
    assert_matches_ort(model, {"x": x}, opt_level=3)


@pytest.mark.parametrize("case", ["not_trailing", "intermediate_is_output"])
def test_fuse_layer_norm_pass_leaves_other_graphs(case):
    model = decomposed_layer_norm(axes=(1,)) if case == "not_trailing" else \
        decomposed_layer_norm(extra_use=True)
    graph, params = from_onnx(model)
    got, _ = run_pass("FuseLayerNorm", graph, params)
    assert "layer_norm" not in [n.op for n in got.nodes]
    assert_matches_ort(model, {"x": rand(2, 5, 16, low=-2, high=3)}, opt_level=3)


# FuseGelu

def dense_gelu(half_first=False, mul_by_inverse=False, n=40):
    """MatMul + bias, then exact GELU as torch exports it (models/bert.py), or with
    0.5 * x first and x * (1 / sqrt 2): the dense layer's epilogue takes the gelu."""
    node = helper.make_node
    inits = {"w": rand(24, n, seed=1) * np.float32(0.5), "b": rand(n, seed=2),
             "k": np.array(1 / np.sqrt(2) if mul_by_inverse else np.sqrt(2), np.float32),
             "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [node("MatMul", ["a", "w"], ["m"]), node("Add", ["m", "b"], ["x"]),
             node("Mul" if mul_by_inverse else "Div", ["x", "k"], ["z"]),
             node("Erf", ["z"], ["e"]), node("Add", ["one", "e"], ["p"])]
    if half_first:
        nodes += [node("Mul", ["half", "x"], ["h"]), node("Mul", ["h", "p"], ["y"])]
    else:
        nodes += [node("Mul", ["p", "x"], ["t"]), node("Mul", ["t", "half"], ["y"])]
    model = make_model(nodes, [("a", [3, 7, 24])], [("y", None)], inits)
    return model, {"a": rand(3, 7, 24, seed=3, low=-3, high=3)}


@pytest.mark.parametrize("half_first, mul_by_inverse", [(False, False), (True, True)])
def test_fuse_gelu_pass_makes_one_gelu_in_the_dense_epilogue(half_first, mul_by_inverse):
    model, feeds = dense_gelu(half_first, mul_by_inverse)
    graph, params = from_onnx(model)
    got, _ = run_pass("FuseGelu", graph, params)
    assert [n.op for n in got.nodes] == ["dense", "add", "gelu"]
    assert_matches_ort(model, feeds, opt_level=1)
    # opt_level 3: dense_packed (40 outputs: two vectors and a partial one with
    # AVX-512) with bias and gelu as its epilogue, whole vectors and lane by lane
    for target in ("llvm -mcpu=native", "llvm -mcpu=haswell"):
        assert_matches_ort(model, feeds, opt_level=3, target=target)


def test_fuse_gelu_pass_leaves_other_constants():
    model, feeds = dense_gelu()
    for init in model.graph.initializer:
        if init.name == "half":
            init.float_data[:] = [0.25] if init.float_data else []
            if not init.float_data:
                init.raw_data = np.array(0.25, np.float32).tobytes()
    graph, params = from_onnx(model)
    got, _ = run_pass("FuseGelu", graph, params)
    assert "gelu" not in [n.op for n in got.nodes]
    assert_matches_ort(model, feeds, opt_level=3)


# FuseAttention

def bert_attention(s=20, h=2, d=12, mask=True, scale_op="Div", transposes=True,
                   probs_out=False):
    """Self-attention as torch.onnx writes it (models/bert.py): heads split by
    Reshape + Transpose (K straight to [b, h, d, s]), MatMul, scale, mask, Softmax,
    MatMul, heads merged by Transpose + Reshape; or plain 4-D operands."""
    node = helper.make_node
    inits = {"scale": np.array(np.sqrt(d) if scale_op == "Div" else 1 / np.sqrt(d),
                               np.float32),
             "heads": np.array([1, s, h, d], np.int64), "merged": np.array([1, s, h * d],
                                                                          np.int64)}
    nodes, names = [], {}
    if transposes:
        for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            nodes += [node("Reshape", [t, "heads"], [f"{t}4"]),
                      node("Transpose", [f"{t}4"], [f"{t}t"], perm=perm)]
            names[t] = f"{t}t"
        inputs = [(t, [1, s, h * d]) for t in "qkv"]
    else:
        names = {t: t for t in "qkv"}
        inputs = [("q", [1, h, s, d]), ("k", [1, h, d, s]), ("v", [1, h, s, d])]
    nodes += [node("MatMul", [names["q"], names["k"]], ["sc"]),
              node(scale_op, ["sc", "scale"], ["ss"])]
    scores = "ss"
    if mask:
        inits["mask"] = np.where(rand(1, 1, 1, s, seed=9) > 0.4, 0.0, -10000.0
                                 ).astype(np.float32)
        nodes.append(node("Add", ["ss", "mask"], ["ms"]))
        scores = "ms"
    nodes += [node("Softmax", [scores], ["p"], axis=-1), node("MatMul", ["p", names["v"]],
                                                            ["ctx"])]
    if transposes:
        nodes += [node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
                  node("Reshape", ["ct", "merged"], ["y"])]
    else:
        nodes.append(node("Identity", ["ctx"], ["y"]))
    outputs = [("y", None)] + ([("p", None)] if probs_out else [])
    model = make_model(nodes, inputs, outputs, inits)
    feeds = {name: rand(*shape, seed=k + 1, low=-2, high=2)
             for k, (name, shape) in enumerate(inputs)}
    return model, feeds


@pytest.mark.parametrize("kwargs", [{}, {"mask": False, "scale_op": "Mul"},
                                    {"transposes": False, "s": 7, "d": 16}],
                         ids=["bert", "mul_scale_no_mask", "plain_operands"])
def test_fuse_attention_pass_makes_one_attention(kwargs):
    model, feeds = bert_attention(**kwargs)
    graph, params = from_onnx(model)
    got, _ = run_pass("FuseAttention", graph, params)
    ops = [n.op for n in got.nodes]
    assert ops.count("attention") == 1 and not {"matmul", "softmax", "transpose"} & set(ops)
    assert_matches_ort(model, feeds, opt_level=1)
    assert_matches_ort(model, feeds, opt_level=3)


def test_fuse_attention_pass_leaves_probabilities_that_are_read():
    model, feeds = bert_attention(probs_out=True)
    graph, params = from_onnx(model)
    got, _ = run_pass("FuseAttention", graph, params)
    assert "attention" not in [n.op for n in got.nodes]
    assert_matches_ort(model, feeds, opt_level=3)


# FuseOps

def conv_bias_add_relu():
    """conv -> + per-channel bias -> + residual x -> relu, as nodes and params."""
    nodes = (conv2d("conv", ["x", "w"], "c"), Node.make("add", "bias", ["c", "b"], ["cb"]),
             Node.make("add", "res", ["cb", "x"], ["a"]), Node.make("relu", "relu", ["a"], ["y"]))
    return nodes, {"w": rand(4, 4, 3, 3, seed=1), "b": rand(4, 1, 1, seed=2)}


@pytest.mark.parametrize("max_depth", [None, 4, 3, 2, 1])
def test_fuse_ops_pass_fuses_conv_bias_add_relu_up_to_max_depth(max_depth):
    (conv, bias, res, relu), params = conv_bias_add_relu()
    before = make_graph({"x": X}, params, ["y"], [conv, bias, res, relu])
    config = {} if max_depth is None else {"config": {"FuseOps.max_depth": max_depth}}
    got, got_params = run_pass("FuseOps", before, params, **config)
    expected_nodes = {
        4: [fused("fused_conv2d_add_add_relu_0", ["x", "w", "b"], conv, bias, res, relu)],
        3: [fused("fused_conv2d_add_add_0", ["x", "w", "b"], conv, bias, res),
            fused("fused_relu_1", ["a"], relu)],
        2: [fused("fused_conv2d_add_0", ["x", "w", "b"], conv, bias),
            fused("fused_add_relu_1", ["cb", "x"], res, relu)],
        1: [fused("fused_conv2d_0", ["x", "w"], conv), fused("fused_add_1", ["c", "b"], bias),
            fused("fused_add_2", ["cb", "x"], res), fused("fused_relu_3", ["a"], relu)],
    }[max_depth or 4]
    expected = make_graph({"x": X}, params, ["y"], expected_nodes)
    assert_graph_equal(got, expected, got_params, params)


def test_fuse_ops_pass_does_not_fuse_across_a_tensor_with_two_consumers():
    # c feeds both relu and add: conv ends its group; relu and add fuse on their own
    conv, params = conv2d("conv", ["x", "w"], "c"), {"w": rand(4, 4, 3, 3, seed=1)}
    relu = Node.make("relu", "relu", ["c"], ["r"])
    add = Node.make("add", "add", ["c", "r"], ["y"])
    before = make_graph({"x": X}, params, ["y"], [conv, relu, add])
    got, got_params = run_pass("FuseOps", before, params)
    expected = make_graph({"x": X}, params, ["y"], [
        fused("fused_conv2d_0", ["x", "w"], conv), fused("fused_relu_add_1", ["c"], relu, add)])
    assert_graph_equal(got, expected, got_params, params)


# AlterOpLayout

def conv_add_relu_softmax(oc):
    """x[1,4,6,6] -> conv(oc) -> + per-channel k -> relu (output r) -> softmax (output y)."""
    params = {"w": rand(oc, 4, 3, 3, seed=1), "b": rand(oc, seed=2), "k": rand(oc, 1, 1, seed=3)}
    nodes = [conv2d("conv", ["x", "w", "b"], "c"), Node.make("add", "add", ["c", "k"], ["a"]),
             Node.make("relu", "relu", ["a"], ["r"]),
             Node.make("softmax", "softmax", ["r"], ["y"], axis=1, flatten=0)]
    return make_graph({"x": X}, params, ["r", "y"], nodes), params


@pytest.mark.parametrize("cpu, vw, packed_shape", [
    # [OC/(K*vw), C/ib, KH, KW, ib, K*vw] with ib = C = 4 (a narrow first layer) and
    # K = 2 output blocks per register tile (ops/conv_blocked.py tiling() for 6x6 outputs)
    ("skylake-avx512", 16, (1, 1, 3, 3, 4, 32)),
    ("haswell", 8, (2, 1, 3, 3, 4, 16)),
])
def test_alter_op_layout_pass_blocks_conv_and_its_epilogue(cpu, vw, packed_shape):
    oc = 32
    before, params = conv_add_relu_softmax(oc)
    target = parse_target(f"llvm -mcpu={cpu}")
    assert target.vector_width == vw
    got, got_params = run_pass("AlterOpLayout", before, params, target=target)
    w = params["w"]
    ko = packed_shape[-1]  # output channels per packed group
    packed = w.reshape(oc // ko, ko, 1, 4, 3, 3).transpose(0, 2, 4, 5, 3, 1)
    assert packed.shape == packed_shape
    # one element by its index formula: packed[g, 0, i, j, c, o] = w[g*ko + o, c, i, j]
    assert packed[-1, 0, 2, 1, 3, 5] == w[oc - ko + 5, 3, 2, 1]
    k_blocked = params["k"].reshape(1, oc // vw, vw, 1, 1).transpose(0, 1, 3, 4, 2)
    assert k_blocked[0, 1, 0, 0, 3] == params["k"][vw + 3, 0, 0]
    want = {"w.packed": packed, "b": params["b"], f"k.nchw{vw}c": k_blocked}
    expected = make_graph({"x": X}, want, ["r", "y"], [
        Node.make("layout_transform", "x.to_nchw4c", ["x"], ["x.nchw4c"],
                  src_layout="NCHW", dst_layout="NCHW4c"),
        Node.make("conv2d_nchwc", "conv", ["x.nchw4c", "w.packed", "b"], [f"c.nchw{vw}c"],
                  dilations=(1, 1), groups=1, pads=(1, 1, 1, 1), strides=(1, 1), oc_block=vw),
        Node.make("add", "add", [f"c.nchw{vw}c", f"k.nchw{vw}c"], [f"a.nchw{vw}c"]),
        Node.make("relu", "relu", [f"a.nchw{vw}c"], [f"r.nchw{vw}c"]),
        # one transform back for r, shared by softmax and the graph output
        Node.make("layout_transform", "r.to_nchw", [f"r.nchw{vw}c"], ["r"],
                  src_layout=f"NCHW{vw}c", dst_layout="NCHW"),
        Node.make("softmax", "softmax", ["r"], ["y"], axis=1, flatten=0)])
    assert_graph_equal(got, expected, got_params, want)


@pytest.mark.parametrize("target, opt_level, disabled", [
    ("skylake-avx512", 3, ["AlterOpLayout"]),
    ("skylake-avx512", 2, []),   # an opt_level 3 pass
    (None, 3, []),               # graph-only optimisation: no target
    ("nehalem", 3, []),          # 4-wide vectors: not worth blocking
])
def test_alter_op_layout_pass_leaves_graph_unchanged(target, opt_level, disabled):
    before, params = conv_add_relu_softmax(32)
    others = [p for p in PASS_NAMES if p != "AlterOpLayout"]
    with PassContext(opt_level=opt_level, disabled_pass=others + disabled):
        got, got_params = optimize(before, params,
                                   target=target and parse_target(f"llvm -mcpu={target}"))
    got.verify(infer_types)
    assert_graph_equal(got, before, got_params, params)
