"""The operator cases of tests/ops/test_ops.py: CASES (and DOUBLE_CASES, float64)
map a name to a function returning (model, feeds). tests/cross/test_cpu_sweep.py
compiles them for every CPU."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from tests.support.onnx_models import make_model, rand

node = helper.make_node
X4 = (1, 4, 8, 8)


def unary(op_type, shape=(2, 3, 4, 5), opset=13, inits=None, extra_inputs=(), **attrs):
    n = node(op_type, ["x", *extra_inputs], ["y"], **attrs)
    return make_model([n], [("x", shape)], [("y", None)], inits or {}, opset), \
        {"x": rand(*shape)}


def conv(w_shape, x_shape=X4, bias=True, seed=1, **attrs):
    inits = {"w": rand(*w_shape, seed=seed)}
    if bias:
        inits["b"] = rand(w_shape[0], seed=seed + 1)
    n = node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], **attrs)
    return make_model([n], [("x", x_shape)], [("y", None)], inits), {"x": rand(*x_shape)}


def bn_params(c, prefix="", seed=3):
    return {f"{prefix}s": rand(c, seed=seed), f"{prefix}bb": rand(c, seed=seed + 1),
            f"{prefix}m": rand(c, seed=seed + 2),
            f"{prefix}v": rand(c, seed=seed + 3, low=0.5, high=2.0)}


def batch_norm(shape=X4, after_conv=False):
    c = shape[1]
    inits = bn_params(c)
    nodes = [node("BatchNormalization", ["t", "s", "bb", "m", "v"], ["y"], epsilon=1e-3)]
    if after_conv:
        inits["w"] = rand(c, c, 3, 3, seed=9)
        nodes.insert(0, node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]))
    else:
        nodes[0].input[0] = "x"
    return make_model(nodes, [("x", shape)], [("y", None)], inits), {"x": rand(*shape)}


def binary(op_type, a_shape, b_shape, b_const=False):
    b = rand(*b_shape, seed=2, low=0.5, high=1.5)  # away from 0 for Div
    inputs = [("a", a_shape)] + ([] if b_const else [("b", b_shape)])
    feeds = {"a": rand(*a_shape)} | ({} if b_const else {"b": b})
    model = make_model([node(op_type, ["a", "b"], ["y"])], inputs, [("y", None)],
                       {"b": b} if b_const else {})
    return model, feeds


def multi_input(op_type, shapes, inits=None, **attrs):
    names = [f"x{k}" for k in range(len(shapes))]
    inits = inits or {}
    inputs = [(n, s) for n, s in zip(names, shapes, strict=True) if n not in inits]
    feeds = {n: rand(*s, seed=k) for k, (n, s) in enumerate(inputs)}
    return make_model([node(op_type, names, ["y"], **attrs)], inputs, [("y", None)],
                      inits), feeds


def gemm(a_shape, b_shape, c_shape=None, **attrs):
    inits = {"b": rand(*b_shape, seed=5)}
    if c_shape is not None:
        inits["c"] = rand(*c_shape, seed=6)
    ins = ["a", "b", *(["c"] if c_shape is not None else [])]
    return make_model([node("Gemm", ins, ["y"], **attrs)], [("a", a_shape)], [("y", None)],
                      inits), {"a": rand(*a_shape)}


def reshape(shape, target):
    return unary("Reshape", shape, inits={"shape": np.array(target, np.int64)},
                 extra_inputs=["shape"])


def clip13(lo, hi):
    inits, names = {}, []
    for key, value in (("lo", lo), ("hi", hi)):
        if value is not None:
            inits[key] = np.array(value, np.float32)
        names.append(key if value is not None else "")
    while names and not names[-1]:
        names.pop()
    return unary("Clip", inits=inits, extra_inputs=names)


def residual_block():
    inits = {"w": rand(4, 4, 3, 3, seed=7), **bn_params(4)}
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             node("Add", ["n", "x"], ["a"]),
             node("Relu", ["a"], ["y"])]
    return make_model(nodes, [("x", X4)], [("y", None)], inits), {"x": rand(*X4)}


def chain(first, *, shape=(2, 3, 4, 5), opset=13, **attrs):
    """`first` (a no-op at inference) followed by Relu, so it is not the output."""
    nodes = [node(first, ["x"], ["t"], **attrs), node("Relu", ["t"], ["y"])]
    return make_model(nodes, [("x", shape)], [("y", None)], {}, opset), {"x": rand(*shape)}


def epilogue(anchor, x_shape, const_shape, const_op="Add", inits=None, **attrs):
    """`anchor` followed by `const_op` with a constant and Relu: one fused kernel."""
    inits = {**(inits or {}), "k": rand(*const_shape, seed=11)}
    nodes = [node(anchor, ["x", *[i for i in inits if i != "k"]], ["a"], **attrs),
             node(const_op, ["a", "k"], ["e"]), node("Relu", ["e"], ["y"])]
    return make_model(nodes, [("x", x_shape)], [("y", None)], inits), {"x": rand(*x_shape)}


CASES = {
    # -- Conv
    "conv_pads1_bias": lambda: conv((4, 4, 3, 3), pads=[1, 1, 1, 1]),
    "conv_asym_pads_nobias": lambda: conv((6, 4, 3, 3), bias=False, pads=[0, 1, 2, 0]),
    "conv_same_upper_s1_k2": lambda: conv((4, 4, 2, 2), auto_pad="SAME_UPPER"),
    "conv_same_lower_s1_k2": lambda: conv((4, 4, 2, 2), auto_pad="SAME_LOWER"),
    "conv_same_upper_s2": lambda: conv((4, 4, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2]),
    "conv_same_lower_s2": lambda: conv((4, 4, 4, 4), x_shape=(1, 4, 7, 7),
                                       auto_pad="SAME_LOWER", strides=[2, 2]),
    "conv_valid_s2": lambda: conv((4, 4, 3, 3), auto_pad="VALID", strides=[2, 2]),
    "conv_s2_pads1_nobias": lambda: conv((8, 4, 3, 3), bias=False, strides=[2, 2],
                                         pads=[1, 1, 1, 1]),
    "conv_dilation2": lambda: conv((4, 4, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),
    "conv_dilation2_nopad": lambda: conv((4, 4, 3, 3), dilations=[2, 2]),
    "conv_groups2": lambda: conv((6, 2, 3, 3), group=2, pads=[1, 1, 1, 1]),
    "conv_depthwise": lambda: conv((4, 1, 3, 3), group=4, pads=[1, 1, 1, 1]),
    "conv_depthwise_x2_nobias": lambda: conv((8, 1, 3, 3), bias=False, group=4,
                                             strides=[2, 2], pads=[1, 1, 1, 1]),
    "conv_1x1": lambda: conv((5, 4, 1, 1)),
    "conv_7x7_s2": lambda: conv((8, 3, 7, 7), x_shape=(1, 3, 16, 16), strides=[2, 2],
                                pads=[3, 3, 3, 3]),
    "conv_batch2_rect": lambda: conv((3, 4, 3, 1), x_shape=(2, 4, 6, 5), pads=[1, 0, 1, 0]),
    # -- BatchNormalization
    "bn_alone": lambda: batch_norm(),
    "bn_2d": lambda: batch_norm(shape=(3, 4)),
    "bn_after_conv": lambda: batch_norm(after_conv=True),
    # -- activations
    "relu": lambda: unary("Relu"),
    "sigmoid": lambda: unary("Sigmoid"),
    "clip6": lambda: unary("Clip", opset=6, min=-0.5, max=0.25),
    "clip6_min_only": lambda: unary("Clip", opset=6, min=0.0),
    "clip13": lambda: clip13(-0.5, 0.25),
    "clip13_min_only": lambda: clip13(-0.2, None),
    "clip13_max_only": lambda: clip13(None, 0.3),
    "clip13_no_bounds": lambda: unary("Clip"),
    # -- binary with broadcasting
    "add_c11": lambda: binary("Add", (1, 4, 5, 5), (4, 1, 1)),
    "add_c11_const": lambda: binary("Add", (1, 4, 5, 5), (4, 1, 1), b_const=True),
    "add_scalar1": lambda: binary("Add", (1, 4, 5, 5), (1,)),
    "add_small_first": lambda: binary("Add", (4, 1, 1), (1, 4, 5, 5)),
    "add_both_broadcast": lambda: binary("Add", (3, 1), (1, 4)),
    "sub_row": lambda: binary("Sub", (2, 3), (3,)),
    "sub_scalar_const": lambda: binary("Sub", (2, 3, 4), (1,), b_const=True),
    "mul_same": lambda: binary("Mul", (1, 4, 5, 5), (1, 4, 5, 5)),
    "mul_c11_const": lambda: binary("Mul", (1, 4, 5, 5), (4, 1, 1), b_const=True),
    "div_c11": lambda: binary("Div", (1, 4, 5, 5), (4, 1, 1)),
    "div_scalar_const": lambda: binary("Div", (2, 3), (1,), b_const=True),
    "sum3": lambda: multi_input("Sum", [(2, 3, 4), (3, 4), (1,)]),
    "sum3_same": lambda: multi_input("Sum", [(2, 3), (2, 3), (2, 3)]),
    # -- pooling
    "maxpool_k3s2p1": lambda: unary("MaxPool", X4, kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1]),
    "maxpool_k2s2": lambda: unary("MaxPool", X4, kernel_shape=[2, 2], strides=[2, 2]),
    "maxpool_ceil": lambda: unary("MaxPool", X4, kernel_shape=[3, 3], strides=[2, 2],
                                  ceil_mode=1),
    "maxpool_ceil_pads": lambda: unary("MaxPool", (1, 2, 7, 7), kernel_shape=[3, 3],
                                       strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "maxpool_dilation2": lambda: unary("MaxPool", X4, kernel_shape=[2, 2], dilations=[2, 2]),
    "maxpool_same_upper": lambda: unary("MaxPool", (1, 2, 7, 7), kernel_shape=[2, 2],
                                        strides=[2, 2], auto_pad="SAME_UPPER"),
    "avgpool_pads_excl": lambda: unary("AveragePool", X4, kernel_shape=[3, 3],
                                       strides=[2, 2], pads=[1, 1, 1, 1]),
    "avgpool_pads_incl": lambda: unary("AveragePool", X4, kernel_shape=[3, 3],
                                       strides=[2, 2], pads=[1, 1, 1, 1],
                                       count_include_pad=1),
    "avgpool_asym_pads_incl": lambda: unary("AveragePool", X4, kernel_shape=[3, 2],
                                            pads=[0, 1, 2, 0], count_include_pad=1),
    "avgpool_ceil": lambda: unary("AveragePool", X4, kernel_shape=[3, 3], strides=[2, 2],
                                  ceil_mode=1),
    "avgpool_ceil_pads_excl": lambda: unary("AveragePool", (1, 2, 7, 7), kernel_shape=[3, 3],
                                            strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "avgpool_ceil_pads_incl": lambda: unary("AveragePool", (1, 2, 7, 7), kernel_shape=[3, 3],
                                            strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                                            count_include_pad=1),
    "global_avgpool": lambda: unary("GlobalAveragePool", (2, 4, 5, 7)),
    # -- Gemm / MatMul
    "gemm_transb0": lambda: gemm((2, 8), (8, 6)),
    "gemm_transb1": lambda: gemm((2, 8), (6, 8), transB=1),
    "gemm_alpha_beta_c_n": lambda: gemm((2, 8), (6, 8), (6,), transB=1, alpha=0.5, beta=2.0),
    "gemm_c_1n": lambda: gemm((2, 8), (8, 6), (1, 6), beta=0.5),
    "gemm_c_scalar": lambda: gemm((2, 8), (8, 6), (1,), alpha=2.0),
    "gemm_c_mn": lambda: gemm((2, 8), (8, 6), (2, 6)),
    "gemm_c_m1": lambda: gemm((3, 8), (8, 3), (3, 1)),
    "matmul_const_b": lambda: multi_input("MatMul", [(2, 8), (8, 6)],
                                          inits={"x1": rand(8, 6, seed=4)}),
    "matmul_const_b_3d_a": lambda: multi_input("MatMul", [(2, 3, 8), (8, 6)],
                                               inits={"x1": rand(8, 6, seed=4)}),
    "matmul_batched": lambda: multi_input("MatMul", [(2, 3, 4), (2, 4, 5)]),
    "matmul_broadcast_b": lambda: multi_input("MatMul", [(2, 3, 4), (4, 5)]),
    "matmul_broadcast_a": lambda: multi_input("MatMul", [(3, 4), (2, 4, 5)]),
    # -- shape ops
    "flatten_axis0": lambda: unary("Flatten", axis=0),
    "flatten_axis1": lambda: unary("Flatten", axis=1),
    "flatten_axis2": lambda: unary("Flatten", axis=2),
    "flatten_axis_neg1": lambda: unary("Flatten", axis=-1),
    "reshape_0_neg1": lambda: reshape((2, 3, 4), [0, -1]),
    "reshape_neg1_first": lambda: reshape((2, 3, 4), [-1, 4]),
    "reshape_0_0_split": lambda: reshape((2, 3, 4), [0, 0, 2, 2]),
    "softmax11_axis1_flatten": lambda: unary("Softmax", (2, 3, 4), opset=11, axis=1),
    "softmax11_default": lambda: unary("Softmax", (2, 3, 4), opset=11),
    "softmax13_axis1": lambda: unary("Softmax", (2, 3, 4), axis=1),
    "softmax13_axis_neg1": lambda: unary("Softmax", (2, 3, 4), axis=-1),
    "softmax13_default": lambda: unary("Softmax", (2, 3, 4)),
    "concat_axis1": lambda: multi_input("Concat", [(2, 3, 4), (2, 1, 4), (2, 2, 4)], axis=1),
    "concat_empty_input": lambda: multi_input("Concat", [(2, 3, 4), (2, 0, 4), (2, 2, 4)],
                                              axis=1),
    "concat_axis_neg1": lambda: multi_input("Concat", [(2, 3, 1), (2, 3, 2), (2, 3, 4)],
                                            axis=-1),
    "concat_const_input": lambda: multi_input("Concat", [(2, 3), (2, 2), (2, 1)], axis=1,
                                              inits={"x1": rand(2, 2, seed=8)}),
    # -- no-ops at inference
    "dropout13": lambda: chain("Dropout"),
    "dropout_ratio_opset10": lambda: chain("Dropout", opset=10, ratio=0.3),
    "identity": lambda: chain("Identity"),
    "identity_as_output": lambda: unary("Identity"),
    # -- fusion: epilogues on every anchor kind
    "fuse_conv_mul_relu": lambda: epilogue("Conv", X4, (1, 4, 1, 1), "Mul",
                                           {"w": rand(4, 4, 3, 3)}, pads=[1, 1, 1, 1]),
    # [C,1,1,1] is not per-channel: it broadcasts [1,C,H,W] up to [C,C,H,W]
    "conv_mul_c111_not_folded": lambda: epilogue("Conv", X4, (4, 1, 1, 1), "Mul",
                                                 {"w": rand(4, 4, 3, 3)}, pads=[1, 1, 1, 1]),
    "fuse_dense3d_add_relu": lambda: epilogue("MatMul", (2, 3, 8), (6,),
                                              inits={"w": rand(8, 6)}),
    "fuse_batched_matmul_add_relu": lambda: epilogue("MatMul", (2, 3, 4), (3, 1),
                                                     inits={"w": rand(2, 4, 5)}),
    "fuse_maxpool_sub_relu": lambda: epilogue("MaxPool", X4, (4, 1, 1), "Sub",
                                              kernel_shape=[2, 2], strides=[2, 2]),
    "fuse_gap_mul_relu": lambda: epilogue("GlobalAveragePool", X4, (1, 4, 1, 1), "Mul"),
    "fuse_sigmoid_div_relu": lambda: epilogue("Sigmoid", (2, 3, 4), (3, 1), "Div"),
    # -- fusion
    "residual_conv_bn_add_relu": residual_block,
}


# -- float64: dtype-generic families (linalg, reductions, softmax, data movement) ------------

def doubles(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape) + 1e-9


def double_model(nodes, shapes: dict, inits=None, out=TensorProto.DOUBLE, opset=13):
    """A model whose inputs (name -> shape) and initializers are float64; output y."""
    feeds = {k: doubles(*s, seed=n) for n, (k, s) in enumerate(shapes.items())}
    inputs = [helper.make_tensor_value_info(k, TensorProto.DOUBLE, s) for k, s in shapes.items()]
    model = make_model(nodes, inputs, [helper.make_tensor_value_info("y", out, None)],
                       inits or {}, opset)
    return model, feeds


def double_op(op_type, shapes: dict, inits=None, out=TensorProto.DOUBLE, opset=13, **attrs):
    return double_model([node(op_type, [*shapes, *(inits or {})], ["y"], **attrs)], shapes,
                        inits, out, opset)


I64 = TensorProto.INT64
DOUBLE_CASES = {
    "matmul_const_b": lambda: double_op("MatMul", {"x": (5, 40)}, {"w": doubles(40, 20)}),
    "matmul_batched": lambda: double_op("MatMul", {"a": (2, 5, 7), "b": (2, 7, 18)}),
    "gemm_const": lambda: double_op("Gemm", {"a": (5, 7)}, {"b": doubles(18, 7, seed=3),
                                                            "c": doubles(18, seed=4)},
                                    transB=1, alpha=0.5, beta=2.0),
    "gemm_runtime": lambda: double_op("Gemm", {"a": (7, 5), "b": (7, 17), "c": (5, 17)},
                                      transA=1, alpha=1.5, beta=0.5),
    "matmul_add_relu": lambda: double_model(
        [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "bias"], ["s"]),
         node("Relu", ["s"], ["y"])], {"x": (3, 16)},
        {"w": doubles(16, 24, seed=5), "bias": doubles(24, seed=6)}),
    "reduce_sum": lambda: double_op("ReduceSum", {"x": (3, 4, 5)},
                                    {"axes": np.array([1], np.int64)}, keepdims=1),
    "reduce_mean": lambda: double_op("ReduceMean", {"x": (3, 4, 5)}, axes=[0, 2], keepdims=0),
    "reduce_max": lambda: double_op("ReduceMax", {"x": (3, 4, 5)}, axes=[2]),
    "reduce_l2": lambda: double_op("ReduceL2", {"x": (3, 4, 5)}, axes=[1]),
    "reduce_log_sum_exp": lambda: double_op("ReduceLogSumExp", {"x": (3, 4, 5)}, axes=[1, 2]),
    "argmax": lambda: double_op("ArgMax", {"x": (3, 4, 5)}, out=I64, axis=1),
    "softmax_last": lambda: double_op("Softmax", {"x": (3, 4, 5)}),
    "softmax_axis1": lambda: double_op("Softmax", {"x": (3, 4, 5)}, axis=1),
    "log_softmax": lambda: double_op("LogSoftmax", {"x": (3, 4, 5)}),
    "hardmax": lambda: double_op("Hardmax", {"x": (3, 4, 5)}, axis=1),
    "concat": lambda: double_op("Concat", {"a": (2, 3), "b": (2, 5)}, axis=1),
    "transpose": lambda: double_op("Transpose", {"x": (2, 3, 4)}, perm=[2, 0, 1]),
    "slice": lambda: double_op("Slice", {"x": (4, 6)}, {"s": np.array([1, 0]),
                                                        "e": np.array([4, 6]),
                                                        "ax": np.array([0, 1]),
                                                        "st": np.array([1, 2])}),
    "pad": lambda: double_op("Pad", {"x": (2, 3)}, {"p": np.array([0, 1, 1, 2]),
                                                    "v": np.array(0.25)}),
    "gather": lambda: double_op("Gather", {"x": (5, 3)}, {"i": np.array([4, 0, 2])}),
    "reshape_expand_tile": lambda: double_model(
        [node("Reshape", ["x", "s"], ["r"]), node("Expand", ["r", "e"], ["t"]),
         node("Tile", ["t", "k"], ["y"])], {"x": (2, 3)},
        {"s": np.array([3, 1, 2]), "e": np.array([3, 4, 2]), "k": np.array([1, 1, 2])}),
}
