"""Helpers shared by the neural-network operator tests (test_ops_conv.py,
test_ops_nn.py): small models with typed inputs, models that skip ONNX's
checker (for error cases), and the comparison with onnxruntime (or
onnx.reference where onnxruntime refuses a valid model)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from pipeline.errors import ModelError
from pipeline.frontend import from_onnx
from tests.support.compare import run_ort, run_ours
from tests.support.onnx_models import make_model, rand

node = helper.make_node


def model(nodes, inputs: dict, inits=None, opset=13, outputs=(("y", None),)):
    """A model whose graph inputs are the arrays in `inputs` (float32 unless int64)."""
    vis = [helper.make_tensor_value_info(k, TensorProto.INT64 if v.dtype == np.int64
                                         else TensorProto.FLOAT, v.shape)
           for k, v in inputs.items()]
    outs = [o if not isinstance(o, tuple) else
            helper.make_tensor_value_info(o[0], TensorProto.FLOAT, o[1]) for o in outputs]
    return make_model(nodes, vis, outs, inits or {}, opset), inputs


def one(op_type, x_shape, inits=None, extra=(), opset=13, low=-1.0, high=1.0, **attrs):
    """A single `op_type` node on input x (plus initializers named in `extra`)."""
    return model([node(op_type, ["x", *extra], ["y"], **attrs)],
                 {"x": rand(*x_shape, low=low, high=high)}, inits, opset)


def unchecked(nodes, x_shape, inits=None, opset=13, outputs=("y",)):
    """A model built without ONNX's checker (to carry attributes it would reject);
    outputs are float32 except one named "indices" (int64)."""
    inits = [helper.make_tensor(k, TensorProto.FLOAT if v.dtype != np.int64 else
                                TensorProto.INT64, v.shape, v.reshape(-1).tolist())
             for k, v in (inits or {}).items()]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x_shape)], [helper.make_tensor_value_info(
            o, TensorProto.INT64 if o == "indices" else TensorProto.FLOAT, None)
            for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(m, feeds: dict, opt_level: int, reference: bool = False) -> None:
    """Our outputs match onnxruntime's (or onnx.reference's): dtype, shape, and
    values to rtol 1e-4 / atol 1e-5 (floats) or exactly (integers)."""
    want = ReferenceEvaluator(m).run(None, feeds) if reference else run_ort(m, feeds)
    got = run_ours(m, feeds, opt_level=opt_level)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)


def check_error(build, needle: str) -> None:
    """Importing the model `build()` returns fails with one line containing `needle`."""
    with pytest.raises(ModelError) as err:
        from_onnx(build())
    message = str(err.value)
    assert "\n" not in message and needle in message


def with_epilogue(m, feeds: dict):
    """`m` (one output "y" of known shape) followed by Add of a constant of y's full
    shape and Relu: at opt_level >= 1 both fuse into the anchor's kernel as its
    epilogue, so every output index the anchor hands the epilogue is checked."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    out = m.graph.output[0]
    shape = [d.dim_value for d in out.type.tensor_type.shape.dim]
    for n in m.graph.node:
        n.output[:] = ["t" if o == "y" else o for o in n.output]
    m.graph.initializer.append(numpy_helper.from_array(rand(*shape, seed=17), "k"))
    m.graph.node.extend([node("Add", ["t", "k"], ["e"]), node("Relu", ["e"], ["y"])])
    onnx.checker.check_model(m)
    return m, feeds
