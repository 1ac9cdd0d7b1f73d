"""bfloat16 and float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) end to end: casts both ways
with and without saturation on every special value (vector and scalar code paths),
QuantizeLinear / DequantizeLinear to and from float8, blocked DequantizeLinear,
bfloat16 weights in the params, an operator without bfloat16 kernels (MatMul, run in
float32 between casts) and pipeline-run reading and writing them; all against
onnx.reference."""

from __future__ import annotations

import subprocess

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import pipeline
from pipeline.link.runtime_c import build_pipeline_run
from pipeline.runtime.params import load_params, save_params
from tests.support.compare import run_ours

CODES = {T.BFLOAT16: "bfloat16", T.FLOAT8E4M3FN: "float8_e4m3fn",
         T.FLOAT8E4M3FNUZ: "float8_e4m3fnuz", T.FLOAT8E5M2: "float8_e5m2",
         T.FLOAT8E5M2FNUZ: "float8_e5m2fnuz"}
t = helper.make_tensor_value_info


def _values() -> np.ndarray:
    """Every float8 rounding boundary region, the limits and specials, plus random
    magnitudes from 2^-20 to 2^20 (67 x 3: not a whole number of vectors)."""
    special = [0, -0.0, 1, -1.5, 447, 449, 464, 465, 500, 1e6, 57344, 61440, 65536, 240,
               248, 250, 2**-7, 2**-9, 2**-10, 3 * 2**-11, 2**-17, 1e-7, np.inf, -np.inf,
               np.nan, 3.0e38, -1.0e-45]
    rng = np.random.default_rng(0)
    rand = rng.choice([-1, 1], 174) * 2.0 ** rng.uniform(-20, 20, 174)
    return np.concatenate([special, rand]).astype(np.float32).reshape(67, 3)


def _model(nodes, inputs, outputs, inits=(), opset=21):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _same(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("code", sorted(CODES))
def test_cast_both_ways_matches_reference_bit_for_bit(code, saturate, opt_level):
    x = _values()
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=code, saturate=saturate),
                    helper.make_node("Cast", ["y"], ["z"], to=T.FLOAT)],
                   [t("x", T.FLOAT, x.shape)], [t("y", code, x.shape), t("z", T.FLOAT, x.shape)])
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x}, opt_level=opt_level)
    assert got[0].dtype == np.dtype(CODES[code])
    np.testing.assert_array_equal(got[0].view(np.uint8), want[0].view(np.uint8))
    _same(got[1], want[1])


@pytest.mark.parametrize("code", [T.FLOAT8E4M3FN, T.FLOAT8E5M2])
def test_float8_quantize_dequantize_match_reference(code):
    x = (_values()[:, :2] * 0.01).astype(np.float32)
    scale = np.array([0.5, 2.0], np.float32)
    zero = helper.make_tensor("zp", code, [2], [0.0, 0.0])
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=1,
                                     saturate=1),
                    helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=1)],
                   [t("x", T.FLOAT, x.shape)], [t("q", code, x.shape), t("y", T.FLOAT, x.shape)],
                   [helper.make_tensor("s", T.FLOAT, [2], scale), zero])
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x})
    np.testing.assert_array_equal(got[0].view(np.uint8), want[0].view(np.uint8))
    _same(got[1], want[1])


def test_blocked_dequantize_feeding_matmul_matches_reference():
    """int8 weights with one scale and zero point per 4 rows of a column (opset 21
    block_size; 10 rows: a partial last block)."""
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (10, 6)).astype(np.int8)
    scale = rng.uniform(0.01, 0.1, (3, 6)).astype(np.float32)
    zp = rng.integers(-5, 5, (3, 6)).astype(np.int8)
    x = rng.standard_normal((2, 10)).astype(np.float32)
    model = _model([helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0,
                                     block_size=4),
                    helper.make_node("MatMul", ["x", "wf"], ["y"])],
                   [t("x", T.FLOAT, x.shape)], [t("y", T.FLOAT, [2, 6])],
                   [helper.make_tensor("w", T.INT8, w.shape, w.flatten()),
                    helper.make_tensor("s", T.FLOAT, scale.shape, scale.flatten()),
                    helper.make_tensor("z", T.INT8, zp.shape, zp.flatten())])
    want = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(run_ours(model, {"x": x})[0], want[0], rtol=1e-5, atol=1e-5)


def _bf16_matmul_model():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((8, 5)).astype(ml_dtypes.bfloat16)
    weight = helper.make_tensor("w", T.BFLOAT16, w.shape, w.view(np.uint16).tobytes(), raw=True)
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"]),
                   helper.make_node("Relu", ["y"], ["r"])],
                  [t("x", T.BFLOAT16, [3, 8])], [t("r", T.BFLOAT16, [3, 5])], [weight])


def test_param_dicts_keep_bfloat16_and_float8():
    values = {name: np.array([1.5, -2.0, 0.25], name) for name in CODES.values()}
    back = load_params(save_params(values))
    for name, value in values.items():
        assert back[name].dtype == value.dtype
        np.testing.assert_array_equal(back[name].view(np.uint8), value.view(np.uint8))


def test_bfloat16_weights_and_matmul_match_reference():
    """MatMul (no bfloat16 kernel) runs in float32 between exact widenings and one
    rounding of its result."""
    model = _bf16_matmul_model()
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = run_ours(model, {"x": x})[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2,
                               atol=1e-2)


def test_pipeline_run_reads_and_writes_bfloat16_as_bits(tmp_path):
    """pipeline-run takes what np.save writes for an ml_dtypes array (void) or its
    uint16 bits, and writes the bits as uint16."""
    model = _bf16_matmul_model()
    graph, params = pipeline.frontend.from_onnx(model)
    so = pipeline.build(graph, target="llvm -mcpu=native", params=params).export_library(
        tmp_path / "m.so")
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run)
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for k, saved in enumerate([x, x.view(np.uint16)]):
        np.save(tmp_path / "x.npy", saved)
        out = tmp_path / f"out{k}"
        proc = subprocess.run([str(run), str(so), "--input", f"x={tmp_path / 'x.npy'}",
                               "--output-dir", str(out)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        got = np.load(out / "output_0.npy")
        assert got.dtype == np.uint16
        np.testing.assert_allclose(got.view(ml_dtypes.bfloat16).astype(np.float32),
                                   want.astype(np.float32), rtol=1e-2, atol=1e-2)
