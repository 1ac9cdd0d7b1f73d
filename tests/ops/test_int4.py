"""int4 and uint4 tensors, held two to a byte in the library as ONNX stores them:
casts both ways on odd sizes large enough to split over threads (the nibble stores of
two threads may share a byte), QuantizeLinear to them, blocked DequantizeLinear of
int4 weights feeding MatMul (the QDQ form of onnxruntime's 4-bit quantizer), the
params keeping them packed (with the 2-bit ones, in tests/ops/test_lowbit2.py), and
pipeline-run reading and writing them and int2; against onnx.reference."""

from __future__ import annotations

import subprocess

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import pipeline
from pipeline.ir.nibbles import pack_nibbles
from pipeline.link.runtime_c import build_pipeline_run
from tests.support.compare import run_ours

t = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, inits=()):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("code", [T.INT4, T.UINT4])
def test_cast_both_ways_on_a_large_odd_tensor(code, opt_level):
    x = np.random.default_rng(code).uniform(-20, 20, (301, 37)).round().astype(np.float32)
    model = _model([helper.make_node("Cast", ["x"], ["q"], to=code),
                    helper.make_node("Cast", ["q"], ["y"], to=T.FLOAT)],
                   [t("x", T.FLOAT, x.shape)], [t("q", code, x.shape), t("y", T.FLOAT, x.shape)])
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x}, opt_level=opt_level)
    assert got[0].dtype == want[0].dtype
    np.testing.assert_array_equal(got[0].astype(np.int8), want[0].astype(np.int8))
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("code", [T.INT4, T.UINT4])
def test_quantize_to_4_bits_per_axis(code):
    x = np.random.default_rng(3).standard_normal((5, 9)).astype(np.float32)
    scale = np.linspace(0.1, 0.5, 9).astype(np.float32)
    zp = np.arange(9) % 3 - (1 if code == T.INT4 else -4)
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1)],
                   [t("x", T.FLOAT, x.shape)], [t("q", code, x.shape)],
                   [helper.make_tensor("s", T.FLOAT, [9], scale),
                    helper.make_tensor("z", code, [9], zp.tolist())])
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = run_ours(model, {"x": x})[0]
    np.testing.assert_array_equal(got.astype(np.int8), want.astype(np.int8))


def test_blocked_int4_weights_feeding_matmul():
    """DequantizeLinear(int4 [K, N], block_size 32 along K) -> MatMul, as onnxruntime's
    quantizer writes the QDQ form (K = 80: a partial last block)."""
    rng = np.random.default_rng(4)
    k, n = 80, 24
    w = rng.integers(-8, 8, (k, n))
    scale = rng.uniform(0.01, 0.1, (3, n)).astype(np.float32)
    zp = rng.integers(-2, 3, (3, n))
    x = rng.standard_normal((2, k)).astype(np.float32)
    model = _model([helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0,
                                     block_size=32),
                    helper.make_node("MatMul", ["x", "wf"], ["y"])],
                   [t("x", T.FLOAT, x.shape)], [t("y", T.FLOAT, [2, n])],
                   [helper.make_tensor("w", T.INT4, w.shape, w.flatten().tolist()),
                    helper.make_tensor("s", T.FLOAT, scale.shape, scale.flatten()),
                    helper.make_tensor("z", T.INT4, zp.shape, zp.flatten().tolist())])
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_ours(model, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    # the pair became one matmul_nbits over the 4-bit values (no float copy of them)
    graph, params = pipeline.frontend.from_onnx(model)
    assert [n.op for n in graph.nodes] == ["matmul_nbits"]
    assert not [v for v in params.values() if v.dtype == np.float32 and v.size >= k * n]


def test_onnxruntime_qdq_4bit_form_matches_onnxruntime():
    """The QDQ form onnxruntime's quantizer writes (its quantize_qdq_matmul_4bits
    kernel: int4 [K, N] packed, scales [K / 32, N], block_size 32 along K, symmetric)."""
    pytest.importorskip("onnxruntime")
    from onnxruntime.capi import _pybind_state as ort_c

    from tests.support.compare import run_ort

    rng = np.random.default_rng(5)
    k, n = 128, 40
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = np.zeros((k * n + 1) // 2, np.uint8)
    zero = np.zeros((n * (k // 32) + 1) // 2, np.uint8)
    scales = np.zeros((k // 32, n), np.float32)
    ort_c.quantize_qdq_matmul_4bits(packed, w, scales, zero, 32, n, k, True)
    weight = helper.make_tensor("w", T.INT4, [k, n], packed.tobytes(), raw=True)
    model = _model([helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0,
                                     block_size=32),
                    helper.make_node("MatMul", ["x", "wf"], ["y"])],
                   [t("x", T.FLOAT, [3, k])], [t("y", T.FLOAT, [3, n])],
                   [weight, helper.make_tensor("s", T.FLOAT, scales.shape, scales.flatten())])
    x = rng.standard_normal((3, k)).astype(np.float32)
    np.testing.assert_allclose(run_ours(model, {"x": x})[0], run_ort(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("code, dtype, span", [(T.INT4, ml_dtypes.int4, 16),
                                              (T.INT2, ml_dtypes.int2, 4)])
def test_pipeline_run_reads_and_writes_sub_byte_ints_one_value_a_byte(tmp_path, code, dtype,
                                                                      span):
    """pipeline-run takes an int4/int2 input as ml_dtypes' .npy or as int8, and writes
    the output as int8, one value a byte."""
    model = _model([helper.make_node("Cast", ["q"], ["f"], to=T.FLOAT),
                    helper.make_node("Neg", ["f"], ["g"]),
                    helper.make_node("Cast", ["g"], ["y"], to=code)],
                   [t("q", code, [3, 5])], [t("y", code, [3, 5])])
    graph, params = pipeline.frontend.from_onnx(model)
    so = pipeline.build(graph, target="llvm -mcpu=native", params=params).export_library(
        tmp_path / "m.so")
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run)
    q = (np.arange(15) % span - span // 2).astype(dtype).reshape(3, 5)
    want = ReferenceEvaluator(model).run(None, {"q": q})[0]
    for k, saved in enumerate([q, q.astype(np.int8)]):
        np.save(tmp_path / "q.npy", saved)
        proc = subprocess.run([str(run), str(so), "--input", f"q={tmp_path / 'q.npy'}",
                               "--output-dir", str(tmp_path / f"o{k}")], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        got = np.load(tmp_path / f"o{k}" / "output_0.npy")
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got, want.astype(np.int8))


def test_ro_constants_hold_int4_packed():
    """A VM executable's constants (the params of a control-flow model) keep int4 two
    to a byte in the .ro file and come back as they were."""
    from pipeline.vm import bytecode as bc
    from pipeline.vm.compile import Executable
    from pipeline.vm.format import read_ro, write_ro

    f32 = bc.TensorType("x", "float32", (2,))
    main = bc.Function("main", (f32,), (f32,), 1, (bc.Ret((0,)),))
    q = np.array([[-8, 7, 1], [0, -1, 5], [3, 3, -4]], ml_dtypes.int4)
    b16 = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    exe = Executable((main,), {"q": q, "h": b16}, ())
    ro = write_ro(exe)
    back = read_ro(ro).constants
    assert back["q"].dtype == q.dtype and back["h"].dtype == b16.dtype
    np.testing.assert_array_equal(back["q"].astype(np.int8), q.astype(np.int8))
    np.testing.assert_array_equal(back["h"].view(np.uint16), b16.view(np.uint16))
    assert pack_nibbles(q).tobytes() in ro and q.view(np.uint8).tobytes() not in ro


def test_aot_constants_hold_int4_packed():
    """The AOT executor's constants (the params its entry point passes the kernels)
    hold int4 weights two to a byte, as the kernels read them."""
    from pipeline.driver.build import lower_graph
    from pipeline.ir.target import parse_target
    from pipeline.link.aot import render_aot

    w = np.array([-8, 7, 1, 0, -1, 5, 3], ml_dtypes.int4)
    model = _model([helper.make_node("Cast", ["w"], ["wf"], to=T.FLOAT),
                    helper.make_node("Add", ["x", "wf"], ["y"])],
                   [t("x", T.FLOAT, [7])], [t("y", T.FLOAT, [7])],
                   [helper.make_tensor("w", T.INT4, [7], w.astype(np.int8).tolist())])
    graph, params = pipeline.frontend.from_onnx(model)
    with pipeline.transform.PassContext(opt_level=0):
        lowered = lower_graph(graph, params, parse_target("llvm -mcpu=native"), 0, None)
    aot = render_aot("q", lowered.graph_json, lowered.params)
    assert pack_nibbles(w).tobytes() in aot.constants
    assert w.view(np.uint8).tobytes() not in aot.constants
