"""ONNX's official backend test suite over pipeline.tools.backend, at opt_level 0 and 3.

onnx.backend.test.BackendTest generates the node tests in Python (about 1,900)
and reads the model suites the wheel ships (pytorch-converted,
pytorch-operator, simple); it compares our outputs with the stored reference
outputs. A test is skipped only when pipeline.tools.backend.unsupported() names a
reason (an operator without a converter, a dtype the IR lacks, or a limit its
converter declares); every other test runs and a failure is a failure.

The small model suites (simple, pytorch-operator) at opt_level 3 run by
default; the node suite (~2 minutes of compiling per opt level on 2 cores),
pytorch-converted and everything at opt_level 0 are marked slow. The "real"
suite (full-size model-zoo networks on dummy inputs) is left out.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto

pytest.importorskip("onnx.backend.test")

from pipeline.tools.conformance import SUITES, make_backend_tests  # noqa: E402

with warnings.catch_warnings():
    # The node-case generators overflow casts on purpose (the Cast tests).
    warnings.simplefilter("ignore", RuntimeWarning)
    for _level in (3, 0):
        for _name, _case in make_backend_tests(_level, SUITES).items():
            if _level == 0 or _case.suite not in ("Simple", "PyTorchOperator"):
                _case = pytest.mark.slow(_case)
            globals()[_name] = _case


@pytest.mark.slow
def test_no_declared_limit_is_stale():
    """Every declared converter limit must still be needed: of the tests it skips, at least
    one fails when run anyway (else it only hides passing tests)."""
    from pipeline.tools.conformance import audit_limits

    stale = {r: v["passed"] for r, v in audit_limits().items() if not v["failed"]}
    assert not stale, ("converter limits (pipeline/ops, onnx_op(limits=...)) that hide only "
                       f"passing tests: {stale}")


# -- the backend's own behaviour, against onnx.reference -----------------------------

def _reference(model, feeds):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def test_run_node_matches_reference():
    from onnx import helper

    from pipeline.tools import backend

    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    (got,) = backend.run_node(node, [x])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]))
    np.testing.assert_allclose(got, _reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_symbolic_shapes_and_runtime_shape_values_compile_per_input_shape():
    """A symbolic batch dim and a Reshape shape fed as an input: one VM library per
    distinct input shape, serving every shape value, reused when the shape repeats."""
    from onnx import helper

    from pipeline.tools import backend

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6]),
                     helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 13)])
    rep = backend.prepare(model, opt_level=0)
    rng = np.random.default_rng(1)
    runs = [(2, [3, -1]), (2, [4, 3]), (4, [3, -1]), (2, [3, -1])]
    for n, shape in runs:
        feeds = {"x": rng.standard_normal((n, 6)).astype(np.float32),
                 "s": np.array(shape, np.int64)}
        (got,) = rep.run([feeds["x"], feeds["s"]])
        want = _reference(model, feeds)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # One VM library per input shape: the Reshape's runtime shape value needs no new
    # library (it did, one per value, before the VM ran data-dependent shapes).
    assert len(rep._cache) == 2


def test_unsupported_names_operator_dtype_and_limit():
    from onnx import helper

    from pipeline.tools import backend

    def model(node, dtype=TensorProto.FLOAT):
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", dtype, [1, 2, 4, 4])],
            [helper.make_empty_tensor_value_info(o) for o in node.output])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    relu = helper.make_node("Relu", ["x"], ["y"])
    assert backend.unsupported(model(relu)) == []
    assert backend.unsupported(model(relu, TensorProto.DOUBLE)) == []
    assert backend.unsupported(model(relu, TensorProto.FLOAT16)) == []
    assert backend.unsupported(model(relu, TensorProto.BFLOAT16)) == []
    assert backend.unsupported(model(relu, TensorProto.FLOAT4E2M1)) == []
    assert backend.unsupported(model(relu, TensorProto.UINT64)) == ["Relu: dtype UINT64"]
    assert backend.unsupported(model(relu, TensorProto.STRING)) == ["dtype STRING"]
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])
    assert backend.unsupported(model(pool, TensorProto.DOUBLE)) == ["MaxPool: dtype DOUBLE"]
    assert backend.unsupported(model(helper.make_node("NoSuchOp", ["x"], ["y"]))) == [
        "NoSuchOp (opset 13): no converter"]
    pool = helper.make_node("MaxPool", ["x"], ["y", "indices"], kernel_shape=[2, 2])
    assert backend.unsupported(model(pool)) == ["MaxPool: the Indices output"]
    assert backend.unsupported(model(pool), limits=False) == []


def test_legacy_broadcast_axis_matches_onnxruntime_on_the_modern_equivalent():
    """Add-6 with broadcast=1, axis=1 lines B [3] up with A [2, 3, 4] at dim 1;
    onnxruntime (opset >= 7 only) runs the same thing as A + Reshape(B, [3, 1])."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper

    from pipeline.tools import backend

    a = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    b = np.random.default_rng(3).standard_normal(3).astype(np.float32)
    io = ([helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape),
           helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, a.shape)])
    for op in ("Add", "Sub", "Mul", "Div", "Pow"):
        legacy = helper.make_model(helper.make_graph(
            [helper.make_node(op, ["a", "b"], ["y"], broadcast=1, axis=1)], "g", *io),
            opset_imports=[helper.make_opsetid("", 6)])
        modern = helper.make_model(helper.make_graph(
            [helper.make_node("Reshape", ["b", "s"], ["b3"]),
             helper.make_node(op, ["a", "b3"], ["y"])], "g", *io,
            [helper.make_tensor("s", TensorProto.INT64, [2], [3, 1])]),
            opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        x = np.abs(a) if op == "Pow" else a
        (want,) = ort.InferenceSession(modern.SerializeToString(),
                                       providers=["CPUExecutionProvider"]).run(
            None, {"a": x, "b": b})
        (got,) = backend.run_model(legacy, [x, b], opt_level=0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=op)


def test_build_kernel_cache_compiles_each_kernel_once():
    """Two models sharing a kernel: the second build compiles only its new one (and
    the backend, which shares a cache this way, still matches onnx.reference)."""
    from onnx import helper

    from pipeline.driver.build import build
    from pipeline.frontend import from_onnx
    from pipeline.tools import backend
    from pipeline.transform import PassContext

    def model(*ops):
        nodes = [helper.make_node(op, [f"t{k}"], [f"t{k + 1}"]) for k, op in enumerate(ops)]
        return helper.make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4, 5])],
            [helper.make_tensor_value_info(f"t{len(ops)}", TensorProto.FLOAT, None)]),
            opset_imports=[helper.make_opsetid("", 13)])

    cache: dict[str, bytes] = {}
    with PassContext(opt_level=0):  # no fusion: one kernel per node
        first = build(*from_onnx(model("Exp"))[:1], target=backend.TARGET, kernel_cache=cache)
        assert len(cache) == 1
        second = build(*from_onnx(model("Exp", "Neg"))[:1], target=backend.TARGET,
                       kernel_cache=cache)
    assert len(cache) == 2 and len(second.kernels) == 2
    assert second.objects[first.kernels[0].symbol] is cache[first.kernels[0].hash]
    x = np.random.default_rng(4).standard_normal((4, 5)).astype(np.float32)
    (got,) = backend.run_model(model("Exp", "Neg"), [x], opt_level=0)
    np.testing.assert_allclose(got, _reference(model("Exp", "Neg"), {"t0": x})[0], rtol=1e-5)
