"""int2, uint2 (four to a byte), float4_e2m1fn (two to a byte) and float8_e8m0fnu
tensors: casts both ways on odd sizes large enough to split over threads (the stores of
two threads may share a byte), e8m0's round modes and saturation, QuantizeLinear and
DequantizeLinear, and the params keeping them (and int4, uint4) packed; against
onnx.reference, bit for bit. pipeline-run's int2 files are tested with int4's in
tests/ops/test_int4.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

from pipeline.runtime.params import load_params, save_params
from tests.support.compare import run_ours

t = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, inits=(), opset=25):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 11
    return model


def _bits(a: np.ndarray) -> np.ndarray:
    """The stored bits of each element (ml_dtypes holds sub-byte ones in the low bits)."""
    return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("code", [T.INT2, T.UINT2, T.FLOAT4E2M1])
def test_cast_both_ways_on_a_large_odd_tensor(code, opt_level):
    x = np.random.default_rng(code).uniform(-9, 9, (301, 37)).astype(np.float32)
    if code != T.FLOAT4E2M1:
        x = x.round()
    x[0, :6] = [np.nan, np.inf, -np.inf, -0.0, 0.25, -0.75]  # float4: saturation, ties
    if code != T.FLOAT4E2M1:
        x[0, :3] = 0
    model = _model([helper.make_node("Cast", ["x"], ["q"], to=code),
                    helper.make_node("Cast", ["q"], ["y"], to=T.FLOAT)],
                   [t("x", T.FLOAT, x.shape)], [t("q", code, x.shape), t("y", T.FLOAT, x.shape)])
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x}, opt_level=opt_level)
    assert got[0].dtype == want[0].dtype
    np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]))
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_cast_to_e8m0_rounds_and_saturates_as_onnx(mode, saturate):
    x = np.array([0, 1, 1.5, 1.25, 1.75, 3, 0.3, -6, 2e-39, 1e-45, 3e38, 3.4e38,
                  np.inf, -np.inf, np.nan, 2 ** 127, 1.5 * 2 ** 127, 0.5], np.float32)
    x = np.concatenate([x, np.random.default_rng(1).lognormal(0, 20, 301).astype(np.float32)])
    model = _model([helper.make_node("Cast", ["x"], ["q"], to=T.FLOAT8E8M0, round_mode=mode,
                                     saturate=saturate),
                    helper.make_node("Cast", ["q"], ["y"], to=T.FLOAT)],
                   [t("x", T.FLOAT, x.shape)],
                   [t("q", T.FLOAT8E8M0, x.shape), t("y", T.FLOAT, x.shape)])
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x})
    np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]))
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("code", [T.INT2, T.UINT2, T.FLOAT4E2M1])
def test_quantize_and_dequantize_per_axis(code):
    x = np.random.default_rng(3).standard_normal((5, 9)).astype(np.float32)
    scale = np.linspace(0.1, 0.9, 9).astype(np.float32)
    zp = [0] * 9 if code == T.FLOAT4E2M1 else (np.arange(9) % 2 - (1 if code == T.INT2 else 0))
    inits = [helper.make_tensor("s", T.FLOAT, [9], scale),
             helper.make_tensor("z", code, [9], list(zp))]
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
                    helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)],
                   [t("x", T.FLOAT, x.shape)], [t("q", code, x.shape), t("y", T.FLOAT, x.shape)],
                   inits)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x})
    np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]))
    np.testing.assert_array_equal(got[1], want[1])


def test_params_hold_sub_byte_values_packed():
    values = {"a": np.array([[-2, 1, -1], [0, 1, -2], [1, 1, 0]], ml_dtypes.int2),
              "b": np.array([3, 0, 2, 1, 3], ml_dtypes.uint2),
              "c": np.array([-6, 0.5, 3], ml_dtypes.float4_e2m1fn),
              "d": np.array([1, 2 ** -20, 2 ** 30], ml_dtypes.float8_e8m0fnu),
              "e": np.array([[-8, 7, -1], [3, 0, 5]], ml_dtypes.int4),
              "f": np.array([15, 0, 9], ml_dtypes.uint4)}
    data = save_params(values)
    back = load_params(data)
    for name, value in values.items():
        assert back[name].dtype == value.dtype
        np.testing.assert_array_equal(_bits(back[name]), _bits(value))
    # 9 int2 values: 3 bytes of data; 5 uint2: 2; 3 float4: 2; 6 int4: 3; 3 uint4: 2
    assert len(data) == len(save_params({"a": np.zeros((1, 3), np.uint8),
                                         "b": np.zeros(2, np.uint8), "c": np.zeros(2, np.uint8),
                                         "d": np.zeros(3, ml_dtypes.float8_e8m0fnu),
                                         "e": np.zeros((1, 3), np.uint8),
                                         "f": np.zeros(2, np.uint8)}))
