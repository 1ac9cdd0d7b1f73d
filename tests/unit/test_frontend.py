"""The ONNX frontend: whole-model checks, error messages, initializers, shapes,
Constant nodes and the graph IR's JSON form."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from models._onnx import GraphBuilder, with_initializers_as_inputs
from pipeline.errors import GraphError, ModelError, UnsupportedOperatorError
from pipeline.frontend import from_onnx
from pipeline.ir.graph import Graph, TensorType
from pipeline.ops import infer_types
from pipeline.transform import PassContext, optimize
from tests.support.compare import assert_matches_ort, run_ort, run_ours
from tests.support.onnx_models import make_model, rand

node = helper.make_node


def small_mlp() -> onnx.ModelProto:
    gb = GraphBuilder("tiny_mlp")
    x = gb.input("x", [2, 6])
    w1 = gb.initializer("w1", rand(6, 5, seed=1))
    b1 = gb.initializer("b1", rand(5, seed=2))
    w2 = gb.initializer("w2", rand(3, 5, seed=3))
    b2 = gb.initializer("b2", rand(3, seed=4))
    h = gb.node("MatMul", [x, w1], "fc1")
    h = gb.node("Add", [h, b1], "fc1_bias")
    h = gb.node("Relu", [h], "relu1")
    y = gb.node("Gemm", [h, w2, b2], "fc2", transB=1)
    gb.output(y, [2, 3])
    return gb.build()


def unsupported_model() -> onnx.ModelProto:
    nodes = [
        node("Relu", ["x"], ["r"], name="ok_relu"),
        node("Foo", ["r"], ["f"], name="my_foo", domain="com.example"),
        node("StringNormalizer", ["f"], ["h"], name="my_strings"),
        node("Relu", ["h"], ["y"], name="ok_relu2"),
    ]
    inits = [onnx.numpy_helper.from_array(rand(1, 8, 3), "W"),
             onnx.numpy_helper.from_array(rand(1, 8, 2), "R")]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", 1, [1, 1, 3])],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                   helper.make_opsetid("com.example", 1)])


def test_unsupported_operators_listed_in_one_line():
    with pytest.raises(UnsupportedOperatorError) as info:
        from_onnx(unsupported_model())
    msg = str(info.value)
    assert "\n" not in msg
    for part in ("Foo", "com.example", "my_foo", "StringNormalizer (opset 13)", "my_strings"):
        assert part in msg, (part, msg)
    assert "ok_relu" not in msg


def test_truncated_file_is_a_model_error(tmp_path):
    data = small_mlp().SerializeToString()
    path = tmp_path / "half.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="half.onnx"):
        from_onnx(path)


def test_missing_file_is_a_model_error(tmp_path):
    path = tmp_path / "nope.onnx"
    with pytest.raises(ModelError, match="nope.onnx"):
        from_onnx(str(path))


def test_model_from_path_matches_ort(tmp_path):
    pytest.importorskip("onnxruntime")
    model = small_mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    feeds = {"x": rand(2, 6)}
    got = run_ours(str(path), feeds)
    np.testing.assert_allclose(got[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_initializers_listed_as_inputs_become_params():
    pytest.importorskip("onnxruntime")
    model = with_initializers_as_inputs(small_mlp())
    assert {"w1", "b1", "w2", "b2"} <= {vi.name for vi in model.graph.input}
    graph, params = from_onnx(model)
    assert graph.inputs == ("x",)
    assert graph.params == tuple(sorted(params))
    assert "b1" in params  # used as is by the Add
    np.testing.assert_array_equal(params["b1"], rand(5, seed=2))
    assert not set(graph.inputs) & set(params)
    assert_matches_ort(model, {"x": rand(2, 6)})


def symbolic_model() -> onnx.ModelProto:
    inits = {"w": rand(3, 4, seed=1)}
    nodes = [node("MatMul", ["data", "w"], ["m"]), node("Sigmoid", ["m"], ["y"])]
    return make_model(nodes, [("data", ["batch", 3])], [("y", ["batch", 4])], inits)


def test_shape_override_fixes_symbolic_batch():
    pytest.importorskip("onnxruntime")
    model = symbolic_model()
    graph, _ = from_onnx(model, shape={"data": (5, 3)})
    assert graph.types["data"].shape == (5, 3)
    assert graph.types["y"].shape == (5, 4)
    assert_matches_ort(model, {"data": rand(5, 3)}, shape={"data": (5, 3)})


def test_symbolic_dim_without_override_names_the_input():
    with pytest.raises(ModelError, match="'data'.*symbolic"):
        from_onnx(symbolic_model())


def test_shape_override_for_unknown_input():
    with pytest.raises(ModelError, match="nothere"):
        from_onnx(symbolic_model(), shape={"nothere": (1, 3)})


def test_constant_nodes_become_params():
    pytest.importorskip("onnxruntime")
    k = rand(4, seed=7)
    nodes = [node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(k)),
             node("Constant", [], ["two"], value_float=2.0),
             node("Add", ["x", "k"], ["a"]),
             node("Mul", ["a", "two"], ["y"])]
    model = make_model(nodes, [("x", [3, 4])], [("y", None)])
    graph, params = from_onnx(model)
    assert {"k", "two"} <= set(graph.params)
    assert [n.op for n in graph.nodes] == ["add", "mul"]
    np.testing.assert_array_equal(params["k"], k)
    assert params["two"].dtype == np.float32
    assert_matches_ort(model, {"x": rand(3, 4)}, opt_level=0)


def test_graph_verifies_and_json_round_trips():
    graph, params = from_onnx(small_mlp())
    graph.verify(infer_types)
    again = Graph.from_json(graph.to_json())
    assert again == graph
    again.verify(infer_types)


def test_verify_checks_structure_alone_and_shape_rules_when_given_them():
    graph, _ = from_onnx(small_mlp())
    out = graph.outputs[0]
    t = graph.types[out]
    wrong = graph.replace(types={**graph.types, out: TensorType((*t.shape, 1), t.dtype)})
    wrong.verify()  # structure only: the IR does not know the operators
    with pytest.raises(GraphError, match="shape rule gives"):
        wrong.verify(infer_types)
    untyped = graph.replace(types={k: v for k, v in graph.types.items() if k != out})
    with pytest.raises(GraphError, match="has no type"):
        untyped.verify()


def test_fused_graph_json_round_trips():
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", [1, 2, 5, 5])], [("y", None)], {"w": rand(3, 2, 3, 3)})
    graph, params = from_onnx(model)
    with PassContext(opt_level=3):
        fused, _ = optimize(graph, params)
    assert any(n.op == "fused" for n in fused.nodes)
    again = Graph.from_json(fused.to_json())
    assert again == fused
    again.verify(infer_types)
