"""Unary, binary, comparison, logic, Where and Cast operators compiled end to end
and compared with onnxruntime at pass opt_level 0 and 3, on float32, float64,
int64, int32 and bool tensors.
The cases: tests/support/op_cases/elementwise.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from pipeline.errors import ModelError
from pipeline.frontend import from_onnx
from tests.support.compare import run_ours
from tests.support.onnx_models import make_model, rand
from tests.support.op_cases.elementwise import (
    CASES,
    NOT_IN_ONNXRUNTIME,
    S,
    check,
    doubles,
    ints,
    model_of,
    typed,
    unary,
)

pytest.importorskip("onnxruntime")

node = helper.make_node


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime(case, opt_level):
    model, feeds = CASES[case]()
    check(model, feeds, opt_level, reference=case in NOT_IN_ONNXRUNTIME)


def test_unsupported_input_dtype_names_the_input_and_node():
    x = helper.make_tensor_value_info("x", T.STRING, list(S))
    model = make_model([node("Identity", ["x"], ["y"], name="r")], [x],
                       [helper.make_tensor_value_info("y", T.STRING, None)])
    with pytest.raises(ModelError, match=r"input 'x' \(used by node 'r' \(Identity\)\) has "
                                         r"unsupported element type STRING "):
        from_onnx(model)


def test_uint64_on_an_op_without_unsigned_lowering_names_the_node():
    """ArgMax compares with signed instructions: a uint64 input is refused, not wrapped."""
    x = helper.make_tensor_value_info("x", T.UINT64, list(S))
    model = make_model([node("ArgMax", ["x"], ["y"], name="r")], [x],
                       [helper.make_tensor_value_info("y", T.INT64, None)])
    with pytest.raises(ModelError, match=r"node 'r' \(argmax\): uint64 input is not supported"):
        from_onnx(model)


def test_cast_to_unsupported_dtype_names_the_node():
    model = make_model([node("Cast", ["x"], ["y"], to=T.STRING, name="to_str")],
                       [typed("x", rand(*S))], [helper.make_tensor_value_info("y", T.STRING,
                                                                               None)])
    with pytest.raises(ModelError, match=r"node 'to_str' \(Cast\): cast to STRING"):
        from_onnx(model)


def test_unsupported_initializer_dtype_names_the_tensor_and_node():
    k = helper.make_tensor("k", T.STRING, [4], [b"1"] * 4)
    model = model_of([node("Cast", ["k"], ["k32"], to=T.FLOAT, name="widen"),
                      node("Add", ["x", "k32"], ["y"])], {"x": rand(*S)}, inits=[k])
    with pytest.raises(ModelError, match=r"initializer 'k' \(used by node 'widen' \(Cast\)\) "
                                         r"has unsupported element type STRING"):
        from_onnx(model)


def test_float_only_op_on_int_names_the_node():
    model = model_of([node("Exp", ["x"], ["y"], name="e")], {"x": ints(*S)}, np.int64)
    with pytest.raises(ModelError, match=r"node 'e' \(exp\): input dtype int64"):
        from_onnx(model)


def test_float32_only_op_on_float64_names_the_node():
    x = doubles(1, 2, 4, 4)
    model = model_of([node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], name="pool")],
                     {"x": x}, np.float64)
    with pytest.raises(ModelError, match=r"node 'pool' \(max_pool2d\): float64 input is not "
                                         "supported"):
        from_onnx(model)


@pytest.mark.parametrize("opt_level", [0, 3])
def test_erf_float32_polynomial_accuracy(opt_level):
    """float32 Erf is a polynomial (pipeline/ops/unary.py): within 3 ulp of math.erf
    (double) on a dense grid over both pieces, the split point, the tails where erf
    rounds to +-1, tiny and subnormal inputs; exact at 0, -0, +-inf, NaN kept. Gelu
    built on it within 1e-5 relative (+ 1e-12) of the exact double Gelu, its negative
    tail included (erfc there, not 1 + erf)."""
    import math

    dense = np.linspace(-7, 7, 280_001)
    tiny = np.geomspace(1e-44, 1, 3001)
    x = np.concatenate([dense, tiny, -tiny, [0.921875, np.nextafter(0.921875, 0), 4.0, 9.0,
                                             1e30, np.finfo(np.float32).max]])
    x = x.astype(np.float32).reshape(1, -1)
    (got,) = run_ours(*unary("Erf", x), opt_level=opt_level)
    want = np.vectorize(math.erf)(x.astype(np.float64))
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    worst = np.argmax(np.abs(got - want) / ulp)
    assert np.abs(got - want).flat[worst] <= 3 * ulp.flat[worst], (x.flat[worst],
                                                                   got.flat[worst])
    special = np.array([[0.0, -0.0, np.inf, -np.inf, np.nan]], np.float32)
    (got,) = run_ours(*unary("Erf", special), opt_level=opt_level)
    np.testing.assert_array_equal(got, [[0.0, -0.0, 1.0, -1.0, np.nan]])
    assert np.signbit(got[0, 1])
    (gelu,) = run_ours(*unary("Gelu", x[:, ::7], opset=20), opt_level=opt_level)
    xd = x[:, ::7].astype(np.float64)
    exact = 0.5 * xd * np.vectorize(math.erfc)(-xd / math.sqrt(2))
    np.testing.assert_allclose(gelu, exact, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("opt_level", [0, 3])
def test_erf_double_is_double_precision(opt_level):
    """Neither reference has a double Erf (onnx.reference rounds through float32):
    compare with Python's math.erf."""
    import math

    model, feeds = unary("Erf", doubles(*S, low=-3, high=3))
    (got,) = run_ours(model, feeds, opt_level=opt_level)
    want = np.vectorize(math.erf)(feeds["x"])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
