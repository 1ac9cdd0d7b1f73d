"""Symbolic dimensions (pipeline/ir/dims.py, docs/vm.md): the expression type, shape
rules computing with symbols, the ONNX import keeping dim_params, which kernels run
over symbolic rows, plans at the bounds, and the config's `dims:`."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from pipeline.errors import ConfigError, GraphError, ModelError
from pipeline.frontend import from_onnx
from pipeline.ir.dims import (
    dim_difference,
    dim_product,
    dim_quotient,
    dim_sum,
    parse_bounds,
    substitute,
    symbols_of,
)
from pipeline.ir.graph import Graph, Node, TensorType
from pipeline.ir.target import parse_target
from pipeline.lower.kernel import kernel_spec
from pipeline.lower.rows import at_rows, row_prefix
from pipeline.ops import infer_types
from pipeline.plan import plan_memory
from pipeline.tasks.config import executor_of, load_config


def test_expressions():
    assert dim_product(["seq", 2, "batch"]) == "2*batch*seq"
    assert dim_product([3, 4]) == 12 and dim_product(["n", 1]) == "n"
    assert dim_quotient("2*batch*seq", "batch") == "2*seq"
    assert dim_quotient("batch*seq", 2) is None and dim_quotient("seq", "batch") is None
    assert dim_quotient("4*n", 4) == "n" and dim_quotient("2*past+2", 2) == "past+1"
    assert dim_difference("past+seq", "past") == "seq" and dim_difference("seq+1", 1) == "seq"
    assert dim_difference("seq", "seq") == 0 and dim_difference("seq", "past") is None
    assert dim_difference(3, "seq") is None
    assert dim_sum(["past", 1]) == "past+1" and dim_sum(["past+1", "past"]) == "2*past+1"
    assert dim_product(["past+1", 2]) == "2*past+2" and dim_sum([2, 3]) == 5
    assert substitute(("batch", "2*seq", 3), {"batch": 2, "seq": 5}) == (2, 10, 3)
    with pytest.raises(GraphError, match="'seq' has no value"):
        substitute(("seq",), {})
    assert symbols_of(("batch", "seq*batch", 4), ("n",)) == ["batch", "seq", "n"]


def test_bounds_parse_and_refuse_in_one_line():
    assert parse_bounds({"seq": [1, 512]}) == {"seq": (1, 512)}
    assert parse_bounds(["batch=1:8", "seq=2:64"]) == {"batch": (1, 8), "seq": (2, 64)}
    assert parse_bounds(["past=0:64"]) == {"past": (0, 64)}  # a KV cache starting empty
    for bad in (["seq=1"], ["seq=a:b"], ["seq=5:2"], ["seq=-1:3"], {"2x": [1, 2]}):
        with pytest.raises(ValueError, match="dims") as err:
            parse_bounds(bad)
        assert "\n" not in str(err.value)


def _node_types(op: str, types: list[TensorType], **attrs) -> list[TensorType]:
    node = Node.make(op, "n", [f"i{k}" for k in range(len(types))], ["o"], **attrs)
    return infer_types(node, types)


def test_shape_rules_compute_with_symbols():
    x = TensorType(("batch", "seq", 32))
    assert _node_types("add", [x, TensorType((32,))]) == [x]
    assert _node_types("matmul", [x, TensorType((32, 64))], trans_a=0, trans_b=0) == [
        TensorType(("batch", "seq", 64))]
    assert _node_types("softmax", [x], axis=2, flatten=0) == [x]
    assert _node_types("transpose", [x], perm=(1, 0, 2)) == [TensorType(("seq", "batch", 32))]
    assert _node_types("reshape", [x], shape=("batch", "seq", 4, 8)) == [
        TensorType(("batch", "seq", 4, 8))]
    assert _node_types("reshape", [x], shape=("batch*seq", 32)) == [
        TensorType(("batch*seq", 32))]
    assert _node_types("reduce_mean", [x], axes=(2,), keepdims=1) == [
        TensorType(("batch", "seq", 1))]
    ids = TensorType(("batch", "seq"), "int64")
    assert _node_types("gather", [TensorType((50, 32)), ids], axis=0) == [x]
    assert _node_types("cast", [x], to="float16") == [TensorType(x.shape, "float16")]
    assert _node_types("concat", [x, TensorType(("batch", 1, 32))], axis=1) == [
        TensorType(("batch", "seq+1", 32))]
    with pytest.raises(GraphError, match="no static size"):
        _ = x.size


def _model(nodes, inits, out_shape, out_type=TensorProto.FLOAT):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", out_type, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_import_keeps_dim_params_for_the_vm_only():
    shape = helper.make_tensor("s", TensorProto.INT64, [3], [0, -1, 4])
    model = _model([helper.make_node("Reshape", ["x", "s"], ["r"]),
                    helper.make_node("Unsqueeze", ["r", "a"], ["u"]),
                    helper.make_node("Squeeze", ["u", "a"], ["y"])],
                   [shape, helper.make_tensor("a", TensorProto.INT64, [1], [0])],
                   ["batch", None, 4])
    graph, _ = from_onnx(model, symbolic=True)
    assert graph.types["y"] == TensorType(("batch", "2*seq", 4))
    graph.verify(infer_types)
    graph, _ = from_onnx(model, {"x": ("batch", 3, 8)}, symbolic=True)
    assert graph.types["y"] == TensorType(("batch", 6, 4))
    with pytest.raises(ModelError, match="symbolic dimension 'batch', 'seq'.*executor: vm"):
        from_onnx(model)
    with pytest.raises(ModelError, match="only the VM executor keeps symbolic"):
        from_onnx(model, {"x": ("batch", 3, 8)})
    # Shape -> Gather -> Concat -> Reshape (torch.onnx's view) folds to symbols ...
    view = _model([helper.make_node("Shape", ["x"], ["s"]),
                   helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
                   helper.make_node("Unsqueeze", ["b", "a"], ["b1"]),
                   helper.make_node("Concat", ["b1", "rest"], ["t"], axis=0),
                   helper.make_node("Reshape", ["x", "t"], ["y"])],
                  [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
                   helper.make_tensor("a", TensorProto.INT64, [1], [0]),
                   helper.make_tensor("rest", TensorProto.INT64, [2], [-1, 4])],
                  ["batch", None, 4])
    graph, _ = from_onnx(view, symbolic=True)
    assert graph.types["y"] == TensorType(("batch", "2*seq", 4))
    assert [n.op for n in graph.nodes] == ["reshape"]
    # ... ConstantOfShape of such a value is an expand to a symbolic shape ...
    fill = _model([helper.make_node("Shape", ["x"], ["s"]),
                   helper.make_node("ConstantOfShape", ["s"], ["y"])], [],
                  ["batch", "seq", 8])
    graph, _ = from_onnx(fill, symbolic=True)
    assert [n.op for n in graph.nodes] == ["expand"]
    assert graph.types["y"] == TensorType(("batch", "seq", 8))
    # ... a Range of a symbolic length by a step other than 1 is refused in one line
    steps = _model([helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
                    helper.make_node("Range", ["zero", "n", "two"], ["r"]),
                    helper.make_node("Cast", ["r"], ["c"], to=TensorProto.FLOAT),
                    helper.make_node("Add", ["x", "c"], ["y"])],
                   [helper.make_tensor(k, TensorProto.INT64, [], [v])
                    for k, v in (("zero", 0), ("one", 1), ("two", 2))],
                   ["batch", "seq", 8])
    with pytest.raises(ModelError, match="Range.*by 2 over symbolic") as err:
        from_onnx(steps, symbolic=True)
    assert "\n" not in str(err.value)


def _spec(op: str, ins: list[TensorType], out: TensorType, **attrs):
    names = [f"i{k}" for k in range(len(ins))]
    node = Node.make(op, "n", names, ["o"], **attrs)
    graph = Graph(tuple(names), (), ("o",), (node,),
                  {**dict(zip(names, ins, strict=True)), "o": out})
    return kernel_spec(node, graph, parse_target("llvm"), 3)


def test_kernels_run_by_rows_or_refuse_in_one_line():
    x = TensorType(("batch", "seq", 32))
    spec = _spec("matmul", [x, TensorType((32, 16))], TensorType(("batch", "seq", 16)),
                 trans_a=0, trans_b=0)
    assert spec.symbols == ("s0", "s1") and row_prefix(spec) == ("s0", "s1")
    assert at_rows(spec, ("s0", "s1"), 8).params[0].shape == (8, 1, 32)
    renamed = _spec("matmul", [TensorType(("n", "m", 32)), TensorType((32, 16))],
                    TensorType(("n", "m", 16)), trans_a=0, trans_b=0)
    assert renamed.hash == spec.hash  # the hash names which dims are symbolic, not how
    over_batch = _spec("softmax", [x], x, axis=0, flatten=0)
    with pytest.raises(GraphError, match="softmax works along a symbolic dimension"):
        row_prefix(over_batch)
    moved = _spec("transpose", [x], TensorType((32, "batch", "seq")), perm=(2, 0, 1))
    with pytest.raises(GraphError, match="not all leading") as err:
        row_prefix(moved)
    assert "\n" not in str(err.value)


def test_plan_at_the_bounds():
    x, h = TensorType(("batch", "seq", 32)), TensorType(("batch", "seq", 64))
    graph = Graph(("x",), ("w",), ("y",), (
        Node.make("matmul", "m", ["x", "w"], ["h"], trans_a=0, trans_b=0),
        Node.make("relu", "r", ["h"], ["y"])),
        {"x": x, "w": TensorType((32, 64)), "h": h, "y": h})
    plan = plan_memory(graph, {"batch": 4, "seq": 128})
    assert plan.storage_bytes[plan.storage_id["h"]] == 4 * 128 * 64 * 4
    assert plan.storage_bytes[plan.storage_id["x"]] == 4 * 128 * 32 * 4


def test_config_dims(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"")
    base = "models:\n  m:\n    path: m.onnx\n{extra}targets:\n  llvm: {{target: llvm}}\n"

    def load(extra: str):
        (tmp_path / "c.yaml").write_text(base.format(extra=extra))
        return load_config(tmp_path / "c.yaml")

    cfg = load("    executor: vm\n    dims: {seq: [1, 64]}\n    inputs: {x: [1, seq, 8]}\n")
    m = cfg.models["m"]
    assert m.dims == {"seq": (1, 64)} and m.inputs == {"x": (1, "seq", 8)}
    assert executor_of(m, cfg.targets["llvm"]) == "vm"
    with pytest.raises(ConfigError, match=r"models\.m\.dims: .*only in the VM"):
        executor_of(load("    dims: {seq: [1, 64]}\n").models["m"], cfg.targets["llvm"])
    with pytest.raises(ConfigError, match=r"models\.m\.dims: 'seq': bounds 9\.\.2"):
        load("    executor: vm\n    dims: {seq: [9, 2]}\n")
    with pytest.raises(ConfigError, match=r"models\.m\.inputs\.x: must be a list"):
        load("    executor: vm\n    inputs: {x: [1, seq, 8]}\n")


def test_symbolic_graph_verifies():
    x = TensorType(("batch", 4))
    graph = Graph(("x",), (), ("y",), (Node.make("relu", "r", ["x"], ["y"]),), {"x": x, "y": x})
    graph.verify(infer_types)
    assert Graph.from_json(graph.to_json()) == graph
    assert np.prod(substitute(x.shape, {"batch": 3})) == 12
