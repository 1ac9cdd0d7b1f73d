"""Graph passes, checked on graph structure (before -> expected) and, where the
rewrite changes arithmetic, on numerics against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_ort, make_model, rand
from onnx import helper

from pipeline.errors import ConfigError
from pipeline.frontend import from_onnx
from pipeline.ops import infer_types
from pipeline.transform import PIPELINE, PassConfig, PassContext, optimize

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


def test_simplify_inference_removes_noops_and_rewrites_batch_norm():
    nodes = [node("Identity", ["x"], ["i"]), node("Dropout", ["i"], ["d"]), bn("d", "b"),
             node("Relu", ["b"], ["y"])]
    model = make_model(nodes, [("x", X)], [("y", None)], bn_inits())
    before, _ = from_onnx(model)
    assert ops(before) == ["identity", "identity", "batch_norm", "relu"]
    graph, params = run(model, opt_level=0)
    assert ops(graph) == ["mul", "add", "relu"]
    mul, add, _ = graph.nodes
    assert mul.inputs[0] == "x" and add.inputs[0] == mul.outputs[0]
    init = bn_inits()
    scale = init["s"] / np.sqrt(init["v"] + 1e-3)
    np.testing.assert_allclose(params[mul.inputs[1]], scale.reshape(4, 1, 1), rtol=1e-6)
    np.testing.assert_allclose(params[add.inputs[1]],
                               (init["bb"] - init["m"] * scale).reshape(4, 1, 1),
                               rtol=1e-5, atol=1e-6)
    assert not {"s", "bb", "m", "v"} & set(params)


def test_simplify_inference_keeps_identity_that_is_a_graph_output():
    model = make_model([node("Identity", ["x"], ["y"])], [("x", X)], [("y", None)])
    graph, _ = run(model, opt_level=0)
    assert ops(graph) == ["identity"]


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


def test_fold_batch_norm_skips_conv_with_other_users():
    inits = {"w": rand(4, 4, 3, 3, seed=1), **bn_inits()}
    nodes = [conv("x", "c"), bn("c", "b"), node("Add", ["b", "c"], ["y"])]
    model = make_model(nodes, [("x", X)], [("y", None)], inits)
    graph, _ = run(model, opt_level=1, disabled_pass=["FuseOps"])
    assert ops(graph) == ["conv2d", "mul", "add", "add"]


def residual():
    nodes = [conv("x", "c"), node("Add", ["c", "x"], ["a"]), node("Relu", ["a"], ["y"])]
    return make_model(nodes, [("x", X)], [("y", None)], {"w": rand(4, 4, 3, 3, seed=1)})


def test_fuse_ops_groups_conv_add_relu():
    graph, _ = run(residual(), opt_level=1)
    assert ops(graph) == ["fused"]
    assert body_ops(graph) == [("conv2d", "add", "relu")]
    assert graph.nodes[0].outputs == ("y",)
    assert set(graph.nodes[0].inputs) == {"x", "w"}


def test_fuse_ops_max_depth_one_fuses_nothing():
    graph, _ = run(residual(), opt_level=1, config={"FuseOps.max_depth": 1})
    assert ops(graph) == ["fused"] * 3
    assert body_ops(graph) == [("conv2d",), ("add",), ("relu",)]


def test_fuse_ops_max_depth_two():
    graph, _ = run(residual(), opt_level=1, config={"FuseOps.max_depth": 2})
    assert body_ops(graph) == [("conv2d", "add"), ("relu",)]


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
