"""The operator cases of tests/ops/test_ops_elementwise.py: CASES maps a name to a function
returning (model, feeds). tests/cross/test_cpu_sweep.py compiles them for every CPU."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.support.compare import run_ort, run_ours
from tests.support.onnx_models import make_model, rand

node = helper.make_node
S = (2, 3, 4)


def typed(name: str, array_or_shape, dtype=None):
    """A ValueInfoProto for an input (from an array) or an output (shape, dtype)."""
    if isinstance(array_or_shape, np.ndarray):
        dtype, shape = array_or_shape.dtype, array_or_shape.shape
    else:
        shape = array_or_shape
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
        np.dtype(dtype)), shape)


def model_of(nodes, feeds: dict, out_dtype=np.float32, opset=13, inits=None, outputs=("y",),
             out_shape=None):
    """A model of `nodes` whose inputs are typed like `feeds`; output shapes by ONNX
    shape inference unless `out_shape` is given."""
    return make_model(nodes, [typed(k, v) for k, v in feeds.items()],
                      [typed(o, out_shape, out_dtype) for o in outputs], inits or {}, opset)


def ints(*shape, seed=0, low=-9, high=10, dtype=np.int64):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(dtype)


def doubles(*shape, seed=0, low=-1.0, high=1.0):
    """float64 data with digits float32 cannot hold (so a float32 path shows)."""
    return np.random.default_rng(seed).uniform(low, high, size=shape) + 1e-9


def bools(*shape, seed=0):
    return np.random.default_rng(seed).random(shape) < 0.5


def check(model, feeds, opt_level, reference=False):
    """Our outputs equal onnxruntime's (onnx.reference's if `reference`, for
    kernels onnxruntime lacks): same dtype and shape, floats to 1e-5."""
    want = ReferenceEvaluator(model).run(None, feeds) if reference else run_ort(model, feeds)
    got = run_ours(model, feeds, opt_level=opt_level)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype == np.float64:  # far below float32's resolution: computed in double
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
        elif w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)


def unary(op_type, x=None, opset=13, **attrs):
    x = rand(*S, low=-3, high=3) if x is None else x
    return model_of([node(op_type, ["x"], ["y"], **attrs)], {"x": x}, x.dtype, opset), \
        {"x": x}


def binary(op_type, a, b, out_dtype=None, opset=13):
    feeds = {"a": a, "b": b}
    return model_of([node(op_type, ["a", "b"], ["y"])], feeds, out_dtype or a.dtype, opset), \
        feeds


def mod(a, b, fmod=0):
    feeds = {"a": a, "b": b}
    return model_of([node("Mod", ["a", "b"], ["y"], fmod=fmod)], feeds, a.dtype), feeds


def variadic(op_type, *arrays):
    feeds = {f"x{k}": a for k, a in enumerate(arrays)}
    return model_of([node(op_type, list(feeds), ["y"])], feeds, arrays[0].dtype), feeds


def cast(x, to, opset=13):
    np_to = helper.tensor_dtype_to_np_dtype(to)
    return model_of([node("Cast", ["x"], ["y"], to=to)], {"x": x}, np_to, opset), {"x": x}


POSITIVE = rand(*S, low=0.1, high=4)
HALVES = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -0.4, 0.6, 7.0], np.float32)
FRACTIONS = np.array([-2.7, -1.5, -0.2, 0.0, 0.3, 1.5, 2.9, 1e5], np.float32)

SPECIAL = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 3.0, -0.0, -np.nan])

CASES = {
    # -- unary float math and activations
    "leaky_relu": lambda: unary("LeakyRelu", alpha=0.2),
    "leaky_relu_default": lambda: unary("LeakyRelu"),
    "elu": lambda: unary("Elu", alpha=0.7),
    "selu": lambda: unary("Selu"),
    "selu_attrs": lambda: unary("Selu", alpha=1.5, gamma=2.0),
    "sigmoid": lambda: unary("Sigmoid"),
    "hard_sigmoid": lambda: unary("HardSigmoid", alpha=0.3, beta=0.4),
    "hard_swish": lambda: unary("HardSwish", opset=14),
    "tanh": lambda: unary("Tanh"),
    "exp": lambda: unary("Exp"),
    "log": lambda: unary("Log", POSITIVE),
    "sqrt": lambda: unary("Sqrt", POSITIVE),
    "reciprocal": lambda: unary("Reciprocal", POSITIVE),
    "neg": lambda: unary("Neg"),
    "abs": lambda: unary("Abs"),
    "erf": lambda: unary("Erf"),
    "gelu_none": lambda: unary("Gelu", opset=20),
    "gelu_tanh": lambda: unary("Gelu", opset=20, approximate="tanh"),
    "softplus": lambda: unary("Softplus", rand(*S, low=-30, high=30)),
    "floor": lambda: unary("Floor", FRACTIONS),
    "ceil": lambda: unary("Ceil", FRACTIONS),
    "round_half_even": lambda: unary("Round", HALVES),
    **{f"trig_{op.lower()}": lambda op=op, lo=lo, hi=hi: unary(op, rand(*S, low=lo, high=hi),
                                                               opset=9)
       for op, lo, hi in (("Sin", -5, 5), ("Cos", -5, 5), ("Tan", -1.5, 1.5),
                          ("Asin", -1, 1), ("Acos", -1, 1), ("Atan", -9, 9),
                          ("Sinh", -3, 3), ("Cosh", -3, 3), ("Asinh", -9, 9),
                          ("Acosh", 1, 9), ("Atanh", -0.99, 0.99))},
    "sign": lambda: unary("Sign", FRACTIONS),
    "sign_int32": lambda: unary("Sign", ints(*S, dtype=np.int32)),
    "softsign": lambda: unary("Softsign"),
    "thresholded_relu": lambda: unary("ThresholdedRelu", alpha=0.5),
    "shrink": lambda: unary("Shrink", FRACTIONS, opset=9, lambd=1.0, bias=0.5),
    "mish": lambda: unary("Mish", rand(*S, low=-9, high=9), opset=18),
    "celu": lambda: unary("Celu", opset=12, alpha=0.5),
    "swish": lambda: unary("Swish", opset=24, alpha=1.5),
    "isnan_double": lambda: (model_of([node("IsNaN", ["x"], ["y"])], f := {"x": SPECIAL},
                                      np.bool_), f),
    "isinf_negative_only": lambda: (model_of(
        [node("IsInf", ["x"], ["y"], detect_positive=0)], f := {"x": SPECIAL.astype(np.float32)},
        np.bool_), f),
    "sin_double": lambda: unary("Sin", doubles(*S, low=-5, high=5)),
    "atanh_double": lambda: unary("Atanh", doubles(*S, low=-0.9, high=0.9)),
    "relu_int64": lambda: unary("Relu", ints(*S), opset=14),
    "neg_int64": lambda: unary("Neg", ints(*S)),
    "abs_int32": lambda: unary("Abs", ints(*S, dtype=np.int32)),
    "clip_int64": lambda: (model_of([node("Clip", ["x", "lo", "hi"], ["y"])],
                                    {"x": ints(*S)}, np.int64,
                                    inits={"lo": np.array(-2, np.int64),
                                           "hi": np.array(5, np.int64)}), {"x": ints(*S)}),
    # -- binary float
    "pow_float": lambda: binary("Pow", POSITIVE, rand(3, 4, seed=1, low=-2, high=2)),
    "pow_int_exponent": lambda: binary("Pow", rand(*S, low=-2, high=2),
                                       np.array([2, 3, 0, 1], np.int64)),
    "pow_int64_int64": lambda: binary("Pow", ints(*S, low=-4, high=5), ints(4, seed=1, low=0,
                                                                          high=4)),
    "pow_int32_float": lambda: binary("Pow", ints(*S, low=0, high=6, dtype=np.int32),
                                      np.array([0.5, 1, 2, 3], np.float32)),
    "max_broadcast": lambda: binary("Max", rand(*S), rand(3, 1, seed=1)),
    "min3": lambda: variadic("Min", rand(*S), rand(4, seed=1), rand(3, 1, seed=2)),
    "max1": lambda: variadic("Max", rand(*S)),
    "mean3": lambda: variadic("Mean", rand(*S), rand(4, seed=1), rand(*S, seed=2)),
    "sum1": lambda: variadic("Sum", rand(*S)),
    "prelu_channel": lambda: binary("PRelu", rand(2, 3, 4, 5), rand(3, 1, 1, seed=1)),
    "prelu_scalar": lambda: binary("PRelu", rand(*S), rand(1, seed=1)),
    # -- binary int64 / int32
    "add_int64": lambda: binary("Add", ints(*S), ints(4, seed=1)),
    "sub_int32": lambda: binary("Sub", ints(*S, dtype=np.int32), ints(3, 1, seed=1,
                                                                     dtype=np.int32)),
    "mul_int64": lambda: binary("Mul", ints(*S), ints(*S, seed=1)),
    "div_int64_truncates": lambda: binary("Div", ints(*S, low=-50, high=50),
                                          ints(4, seed=1, low=1, high=7) *
                                          np.array([1, -1, 1, -1], np.int64)),
    "mod_int64": lambda: mod(ints(*S, low=-50, high=50),
                             ints(4, seed=1, low=1, high=7) * np.array([1, -1, 1, -1])),
    "mod_int32_fmod": lambda: mod(ints(*S, low=-50, high=50, dtype=np.int32),
                                  ints(3, 1, seed=1, low=1, high=7, dtype=np.int32) *
                                  np.array([[1], [-1], [1]], np.int32), fmod=1),
    "mod_float_fmod": lambda: mod(rand(*S, low=-9, high=9), rand(4, seed=1, low=0.5, high=3) *
                                  np.array([1, -1, 1, -1], np.float32), fmod=1),
    "mod_float_python": lambda: mod(rand(*S, low=-9, high=9), rand(4, seed=1, low=0.5, high=3)
                                    * np.array([1, -1, 1, -1], np.float32)),
    "max_int64": lambda: variadic("Max", ints(*S), ints(4, seed=1), ints(3, 1, seed=2)),
    "min_int32": lambda: binary("Min", ints(*S, dtype=np.int32), ints(4, seed=1,
                                                                     dtype=np.int32)),
    # -- comparisons -> bool
    "equal_float": lambda: binary("Equal", np.round(rand(*S) * 2), np.round(rand(4) * 2),
                                  np.bool_),
    "less_float": lambda: binary("Less", rand(*S), rand(3, 1, seed=1), np.bool_),
    "greater_float": lambda: binary("Greater", rand(*S), rand(4, seed=1), np.bool_),
    "less_equal_int64": lambda: binary("LessOrEqual", ints(*S, low=-2, high=2),
                                       ints(4, seed=1, low=-2, high=2), np.bool_),
    "greater_equal_float": lambda: binary("GreaterOrEqual", np.round(rand(*S)),
                                          np.round(rand(4, seed=1)), np.bool_),
    "equal_int64": lambda: binary("Equal", ints(*S, low=0, high=3), ints(4, seed=1, low=0,
                                                                        high=3), np.bool_),
    "equal_bool": lambda: binary("Equal", bools(*S), bools(4, seed=1), np.bool_),
    "greater_int32": lambda: binary("Greater", ints(*S, dtype=np.int32),
                                    ints(*S, seed=1, dtype=np.int32), np.bool_),
    # -- logic
    "and": lambda: binary("And", bools(*S), bools(4, seed=1)),
    "or": lambda: binary("Or", bools(*S), bools(3, 1, seed=1)),
    "xor": lambda: binary("Xor", bools(*S), bools(*S, seed=1)),
    "not": lambda: unary("Not", bools(*S)),
    # -- Where
    "where_float": lambda: (model_of([node("Where", ["c", "x", "y0"], ["y"])],
                                     f := {"c": bools(*S), "x": rand(4), "y0": rand(3, 1)}),
                            f),
    "where_int64": lambda: (model_of([node("Where", ["c", "x", "y0"], ["y"])],
                                     f := {"c": bools(3, 1), "x": ints(*S), "y0": ints(4)},
                                     np.int64), f),
    "where_const_bool_int64_params": lambda: (model_of(
        [node("Where", ["c", "k", "x"], ["y"])], f := {"x": ints(*S)}, np.int64,
        inits={"c": bools(3, 4, seed=3), "k": ints(4, seed=4)}), f),
    "where_of_less": lambda: (model_of([node("Less", ["x", "z"], ["c"]),
                                        node("Where", ["c", "x", "z"], ["y"])],
                                       f := {"x": rand(*S), "z": rand(4, seed=1)}), f),
    "masked_fill_chain": lambda: (model_of(
        [node("Greater", ["x", "t"], ["m"]), node("Not", ["m"], ["nm"]),
         node("Cast", ["nm"], ["mf"], to=TensorProto.FLOAT), node("Mul", ["x", "mf"], ["y"])],
        f := {"x": rand(*S), "t": rand(4, seed=1)}), f),
    # -- Cast
    "cast_float_int64": lambda: cast(FRACTIONS, TensorProto.INT64),
    "cast_float_int32": lambda: cast(FRACTIONS, TensorProto.INT32),
    "cast_float_bool": lambda: cast(np.array([0.0, -0.0, 0.5, -2.0, 0.0], np.float32),
                                    TensorProto.BOOL),
    "cast_int64_float": lambda: cast(ints(*S), TensorProto.FLOAT),
    "cast_int64_int32": lambda: cast(ints(*S, low=-1000, high=1000), TensorProto.INT32),
    "cast_int32_int64": lambda: cast(ints(*S, dtype=np.int32), TensorProto.INT64),
    "cast_int64_bool": lambda: cast(ints(*S, low=-2, high=2), TensorProto.BOOL),
    "cast_bool_float": lambda: cast(bools(*S), TensorProto.FLOAT),
    "cast_bool_int64": lambda: cast(bools(*S), TensorProto.INT64),
    "cast_same": lambda: cast(rand(*S), TensorProto.FLOAT),
    "castlike": lambda: (model_of([node("CastLike", ["x", "like"], ["y"])],
                                  f := {"x": FRACTIONS, "like": ints(1)}, np.int64, opset=15),
                         f),
    # -- float64
    "add_double_broadcast": lambda: binary("Add", doubles(*S), doubles(4, seed=1)),
    "sub_double": lambda: binary("Sub", doubles(*S), doubles(3, 1, seed=1)),
    "mul_double": lambda: binary("Mul", doubles(*S), doubles(*S, seed=1)),
    "div_double": lambda: binary("Div", doubles(*S), doubles(4, seed=1, low=0.5, high=2)),
    "pow_double": lambda: binary("Pow", doubles(*S, low=0.1, high=4), doubles(4, seed=1)),
    "max_double": lambda: variadic("Max", doubles(*S), doubles(4, seed=1)),
    "mean3_double": lambda: variadic("Mean", doubles(*S), doubles(4, seed=1),
                                     doubles(*S, seed=2)),
    "mod_double_fmod": lambda: mod(doubles(*S, low=-9, high=9),
                                   doubles(4, seed=1, low=0.5, high=3), fmod=1),
    "mod_double_python": lambda: mod(doubles(*S, low=-9, high=9),
                                     doubles(4, seed=1, low=-3, high=-0.5)),
    "exp_double": lambda: unary("Exp", doubles(*S, low=-3, high=3)),
    "log_double": lambda: unary("Log", doubles(*S, low=0.1, high=4)),
    "sqrt_double": lambda: unary("Sqrt", doubles(*S, low=0.1, high=4)),
    "tanh_double": lambda: unary("Tanh", doubles(*S, low=-3, high=3)),
    "sigmoid_double": lambda: unary("Sigmoid", doubles(*S, low=-3, high=3)),
    "softplus_double": lambda: unary("Softplus", doubles(*S, low=-30, high=30)),
    "elu_double": lambda: unary("Elu", doubles(*S, low=-3, high=3), alpha=0.7),
    "neg_abs_double": lambda: (model_of([node("Neg", ["x"], ["n"]), node("Abs", ["n"], ["y"])],
                                        f := {"x": doubles(*S)}, np.float64), f),
    "relu_clip_double": lambda: (model_of(
        [node("Relu", ["x"], ["r"]), node("Clip", ["r", "lo", "hi"], ["y"])],
        f := {"x": doubles(*S, low=-3, high=3)}, np.float64,
        inits={"lo": np.array(0.25), "hi": np.array(1.5)}), f),
    "floor_double": lambda: unary("Floor", doubles(*S, low=-5, high=5)),
    "less_double": lambda: binary("Less", doubles(*S), doubles(3, 1, seed=1), np.bool_),
    "equal_double": lambda: binary("Equal", np.round(doubles(*S) * 2),
                                   np.round(doubles(4) * 2), np.bool_),
    "where_double": lambda: (model_of([node("Where", ["c", "x", "y0"], ["y"])],
                                      f := {"c": bools(*S), "x": doubles(4),
                                            "y0": doubles(3, 1)}, np.float64), f),
    "cast_float_double": lambda: cast(rand(*S), TensorProto.DOUBLE),
    "cast_double_float": lambda: cast(doubles(*S), TensorProto.FLOAT),
    "cast_double_int64": lambda: cast(doubles(*S, low=-50, high=50), TensorProto.INT64),
    "cast_int32_double": lambda: cast(ints(*S, dtype=np.int32), TensorProto.DOUBLE),
    "cast_bool_double": lambda: cast(bools(*S), TensorProto.DOUBLE),
    "cast_double_bool": lambda: cast(np.array([0.0, -0.0, 1e-300, -2.0]), TensorProto.BOOL),
    # -- BitCast (opset 26): the bits of special floats; int8 wrapped by a fused Add
    "bitcast_float_int32": lambda: (model_of(
        [node("BitCast", ["x"], ["y"], to=TensorProto.INT32)],
        f := {"x": SPECIAL.astype(np.float32) * np.float32(-1)}, np.int32, opset=26), f),
    "bitcast_add_int8_uint8": lambda: (model_of(
        [node("Add", ["a", "b"], ["s"]), node("BitCast", ["s"], ["y"], to=TensorProto.UINT8)],
        f := {"a": ints(*S, low=-128, high=128, dtype=np.int8),
              "b": ints(*S, seed=1, low=-128, high=128, dtype=np.int8)}, np.uint8, opset=26), f),
    # -- fusion: a dtype change after an anchor must not fuse into it
    "dense_greater_cast": lambda: (model_of(
        [node("MatMul", ["x", "w"], ["m"]), node("Greater", ["m", "t"], ["g"]),
         node("Cast", ["g"], ["y"], to=TensorProto.FLOAT)], f := {"x": rand(3, 8)},
        inits={"w": rand(8, 5, seed=3), "t": np.float32(0.1).reshape(())}), f),
}

# Its CPU provider has float Relu only, float Mod only with fmod=1 (before opset 28),
# no double Mean, Softplus, Elu or Atanh, and no Swish (opset 24) or BitCast (26).
NOT_IN_ONNXRUNTIME = {"relu_int64", "mod_float_python", "mod_double_python", "mean3_double",
                      "softplus_double", "elu_double", "atanh_double", "swish",
                      "bitcast_float_int32", "bitcast_add_int8_uint8"}
