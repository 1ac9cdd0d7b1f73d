"""float16, int8 and uint8 tensors end to end: ONNX import, params, kernels (narrow
storage, wider compute: pipeline/dsl/builder.py), the C executor; against
onnx.reference, exactly (a float16 op computed in float32 and rounded once is the
IEEE half result; integers wrap)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import make_model, run_ours
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

from pipeline.runtime.params import load_params, save_params


def _mixed_dtypes_model() -> onnx.ModelProto:
    """Casts into and out of float16/int8/uint8, arithmetic in each, fusable chains
    (Add -> Mul in float16, Add -> Cast in int8: each step must round or wrap) and
    float16 / uint8 weights."""
    t = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=T.FLOAT16),
        helper.make_node("Add", ["h", "w16"], ["s"]),
        helper.make_node("Mul", ["s", "s"], ["m"]),
        helper.make_node("Cast", ["m"], ["y"], to=T.FLOAT),
        helper.make_node("Cast", ["x"], ["i8"], to=T.INT8),
        helper.make_node("Add", ["i8", "i8"], ["i8s"]),
        helper.make_node("Cast", ["i8s"], ["fi"], to=T.FLOAT),
        helper.make_node("Cast", ["x"], ["u8"], to=T.UINT8),
        helper.make_node("Add", ["u8", "u8"], ["u8s"]),
        helper.make_node("Div", ["u8s", "d8"], ["u8d"]),
        helper.make_node("Max", ["u8d", "u8"], ["u8m"]),
    ]
    rng = np.random.default_rng(0)
    inits = {"w16": rng.standard_normal(33).astype(np.float16),
             "d8": np.array([3, 7, 200], np.uint8).repeat(11)}
    outs = [("y", T.FLOAT), ("m", T.FLOAT16), ("i8s", T.INT8), ("fi", T.FLOAT),
            ("u8s", T.UINT8), ("u8m", T.UINT8)]
    return make_model(nodes, [t("x", T.FLOAT, [4, 33])], [t(n, e, None) for n, e in outs],
                      inits, opset=17)


@pytest.mark.parametrize("opt_level", [0, 3])
def test_narrow_dtypes_match_reference_exactly(opt_level):
    model = _mixed_dtypes_model()
    # Whole numbers in int8 range plus fractions: casts truncate, sums overflow and wrap.
    x = np.random.default_rng(1).uniform(-127, 127, (4, 33)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x}, opt_level=opt_level)
    for name, g, w in zip(("y", "m", "i8s", "fi", "u8s", "u8m"), got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_array_equal(g, w, err_msg=name)


def test_params_keep_narrow_dtypes_with_tvm_type_codes():
    """float16 is DLPack (float=2, 16 bits), int8 (int=0, 8), uint8 (uint=1, 8)."""
    arrays = {"h": np.array([1.5, -65504, np.inf], np.float16),
              "i": np.array([-128, 127], np.int8), "u": np.arange(250, 256, dtype=np.uint8)}
    raw = save_params(arrays)
    back = load_params(raw)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype
        np.testing.assert_array_equal(back[name], a)
    # The (code, bits, lanes) of each array header, in sorted name order.
    headers = [raw[k + 28:k + 32] for k in range(len(raw) - 8)
               if raw[k:k + 8] == (0xDD5E40F096B4A13F).to_bytes(8, "little")]
    assert headers == [bytes([2, 16, 1, 0]), bytes([0, 8, 1, 0]), bytes([1, 8, 1, 0])]
