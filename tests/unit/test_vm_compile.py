"""The VM compiler's parts (docs/vm.md): control-flow import into nodes holding
subgraphs (checked by the frontend's verify_graph), bytecode verification, and the
.ro format's round trip and refusals."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

import pipeline
from pipeline.errors import FormatError, GraphError
from pipeline.frontend.onnx.importer import verify_graph
from pipeline.ir.graph import Graph, Node
from pipeline.vm import bytecode as bc
from pipeline.vm.compile import Executable
from pipeline.vm.format import RO_VERSION, read_ro, write_ro

t = helper.make_tensor_value_info


def _if_model():
    def branch(k):
        return helper.make_graph(
            [helper.make_node("Constant", [], ["k"], value=helper.make_tensor(
                "kv", T.FLOAT, [2], [k, k])), helper.make_node("Add", ["x", "k"], ["y"])],
            "b", [], [t("y", T.FLOAT, [2])])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=branch(1.0),
                          else_branch=branch(-1.0))],
        "g", [t("c", T.BOOL, []), t("x", T.FLOAT, [2])], [t("y", T.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_if_imports_as_a_node_with_two_subgraphs_and_renamed_constants():
    graph, params = pipeline.frontend.from_onnx(_if_model(), control_flow=True)
    (node,) = graph.nodes
    then, orelse = node.attr("then_branch"), node.attr("else_branch")
    assert node.op == "if" and isinstance(then, Graph) and isinstance(orelse, Graph)
    # each branch's constant "k" is an outer param of its own name, captured by both
    assert node.inputs == ("c", "x", "k", "k.1") == ("c", *then.inputs) == ("c", *orelse.inputs)
    np.testing.assert_array_equal(params["k"], [1, 1])
    np.testing.assert_array_equal(params["k.1"], [-1, -1])


def test_verify_graph_checks_the_subgraphs():
    graph, _ = pipeline.frontend.from_onnx(_if_model(), control_flow=True)
    node = graph.nodes[0]
    then = node.attr("then_branch")
    broken = then.replace(nodes=(Node.make("add", "a", ("x", "nope"), ("y",)),))
    bad = graph.replace(nodes=(Node(node.op, node.name, node.inputs, node.outputs,
                                    tuple((k, broken if k == "then_branch" else v)
                                          for k, v in node.attrs)),))
    with pytest.raises(GraphError, match=r"node 'branch' \(if\), subgraph then_branch: node "
                                         r"'a' \(add\) uses 'nope' before it is defined"):
        verify_graph(bad)


def test_bytecode_verify_and_ro_round_trip():
    f32 = bc.TensorType("x", "float32", (2,))
    main = bc.Function("main", (f32,), (f32,), 4, (
        bc.Scalar(1, 3, 0), bc.Scalar(2, 3, 1), bc.Less(3, 1, 2), bc.If(3, 4, 5),
        bc.Fail(0), bc.Ret((0,))))
    exe = Executable((main,), {}, ())
    ro = write_ro(exe)
    assert read_ro(ro) == exe and ro[8:12] == RO_VERSION.to_bytes(4, "little")
    for code, needle in (((bc.Scalar(1, 0, 0), bc.Ret((0,))), "a scalar is int64 or bool"),
                         ((bc.Fail(7),), "unknown failure 7"),
                         ((bc.Move(9, 0), bc.Ret((0,))), "register out of range 0..3"),
                         ((bc.Invoke(0, (), ()), bc.Ret((0,))), "wrong number of arguments")):
        bad = Executable((bc.Function("main", (f32,), (f32,), 4, code),), {}, ())
        with pytest.raises(FormatError, match=re.escape(needle)):
            bad.verify()


def test_graph_json_nests_subgraphs_and_verify_checks_them(tmp_path):
    """The import stage's format keeps a Loop's body and an If's branches: the graph
    comes back equal, its JSON the same text; Graph.verify (without shape rules too)
    names the node and subgraph of a broken one."""
    from tests.support.onnx_models import tiny_loop_if

    tiny_loop_if(tmp_path / "loop.onnx")
    graph, _ = pipeline.frontend.from_onnx(tmp_path / "loop.onnx", control_flow=True)
    text = graph.to_json()
    again = Graph.from_json(text)
    assert again == graph and again.to_json() == text
    loop = next(n for n in again.nodes if n.op == "loop")
    assert isinstance(loop.attr("body"), Graph) and loop.attr("body").outputs
    verify_graph(again)
    body = loop.attr("body")
    broken = body.replace(outputs=(*body.outputs[:-1], "missing"))
    bad = again.replace(nodes=tuple(
        Node(n.op, n.name, n.inputs, n.outputs,
             tuple((k, broken if k == "body" else v) for k, v in n.attrs)) if n is loop else n
        for n in again.nodes))
    with pytest.raises(GraphError, match=r"node 'rnn' \(loop\), subgraph body: graph output "
                                         r"'missing' is never defined"):
        Graph.from_json(bad.to_json()).verify()


def test_program_json_round_trip_keeps_the_constant_order():
    """What optimize writes for a VM program (functions as JSON, constants apart)
    gives the same executable back; a constant without a value is one error."""
    from pipeline.vm.compile import program_from_json, program_json

    f32 = bc.TensorType("x", "float32", (2,))
    main = bc.Function("main", (f32,), (f32, f32), 4, (
        bc.LoadConst(1, 0), bc.LoadConst(2, 1), bc.View(3, 0, 0, 0, (2,)), bc.Ret((1, 2))))
    # LoadConst indexes the pool in its order, which is not the names' sorted order
    constants = {f"{k}:c": np.full(2, k, np.float32) for k in (10, 2)}
    exe = Executable((main,), constants, ("kernel_a",))
    text = program_json(exe)
    back = program_from_json(text, dict(sorted(constants.items())))
    assert back.functions == exe.functions and back.kernels == exe.kernels
    assert list(back.constants) == ["10:c", "2:c"]
    assert write_ro(back) == write_ro(exe)
    with pytest.raises(FormatError, match="constant '2:c' has no value"):
        program_from_json(text, {"10:c": constants["10:c"]})
