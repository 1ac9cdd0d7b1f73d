"""The operator cases of tests/ops/test_ops_nn.py: CASES maps a name to a function
returning (model, feeds). tests/cross/test_cpu_sweep.py compiles them for every CPU."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from tests.support.nn_cases import model, one
from tests.support.onnx_models import make_model, rand

node = helper.make_node
# -- normalisation ------------------------------------------------------------------------

def layer_norm(shape, axis=-1, bias=True, scale_shape=None, opset=17, **attrs):
    norm_shape = shape[axis:] if axis != 0 else shape
    scale_shape = scale_shape or norm_shape
    inits = {"s": rand(*scale_shape, seed=1, low=0.5, high=1.5)}
    if bias:
        inits["b"] = rand(*scale_shape, seed=2)
    return model([node("LayerNormalization", ["x", "s", *(["b"] if bias else [])], ["y"],
                       axis=axis, **attrs)], {"x": rand(*shape, low=-2, high=3)}, inits, opset)


def layer_norm_residual():
    """BERT: LayerNorm(x + residual) then a Gemm-free MatMul, Add: fused epilogues."""
    d = 16
    inits = {"s": rand(d, seed=1), "b": rand(d, seed=2), "w": rand(d, 8, seed=3),
             "wb": rand(8, seed=4)}
    nodes = [node("Add", ["x", "r"], ["a"]),
             node("LayerNormalization", ["a", "s", "b"], ["n"], axis=-1, epsilon=1e-12),
             node("MatMul", ["n", "w"], ["m"]), node("Add", ["m", "wb"], ["y"])]
    return model(nodes, {"x": rand(2, 5, d), "r": rand(2, 5, d, seed=7)}, inits, 17)


def decomposed_layer_norm():
    """LayerNorm as exported by older PyTorch: ReduceMean, Sub, Pow, Sqrt, Div..."""
    d = 12
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
             "s": rand(d, seed=1), "b": rand(d, seed=2)}
    nodes = [node("ReduceMean", ["x"], ["mu"], axes=[-1]),
             node("Sub", ["x", "mu"], ["d"]),
             node("Pow", ["d", "two"], ["sq"]),
             node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             node("Add", ["var", "eps"], ["ve"]),
             node("Sqrt", ["ve"], ["sd"]),
             node("Div", ["d", "sd"], ["nrm"]),
             node("Mul", ["nrm", "s"], ["sc"]),
             node("Add", ["sc", "b"], ["y"])]
    return model(nodes, {"x": rand(3, 4, d, low=-2, high=3)}, inits, 13)


def instance_norm(shape):
    c = shape[1]
    return one("InstanceNormalization", shape, {"s": rand(c, seed=1), "b": rand(c, seed=2)},
               ["s", "b"], low=-2, high=3, epsilon=1e-3)


def layer_norm_stats(axis):
    """LayerNormalization with its optional Mean and InvStdDev outputs."""
    shape = (2, 3, 4)
    inits = {"s": rand(*shape[axis:], seed=1), "b": rand(*shape[axis:], seed=2)}
    stats = shape[:axis] + (1,) * (len(shape) - axis)
    return model([node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "istd"],
                       axis=axis, epsilon=1e-3)], {"x": rand(*shape, low=-2, high=3)}, inits,
                 17, outputs=(("y", shape), ("mean", stats), ("istd", stats)))


def batch_norm_runtime(shape):
    """BatchNormalization whose statistics are graph inputs: lowered, not folded."""
    c = shape[1]
    stats = {"s": rand(c, seed=1), "o": rand(c, seed=2), "mu": rand(c, seed=3),
             "v": rand(c, seed=4, low=0.5, high=2.0)}
    return model([node("BatchNormalization", ["x", *stats], ["t"], epsilon=1e-3),
                  node("Relu", ["t"], ["y"])], {"x": rand(*shape), **stats})


def group_norm(shape, groups, opset, per_channel):
    """GroupNormalization; scale and bias per group (opset 18) or per channel (21)."""
    k = shape[1] if per_channel else groups
    inits = {"s": rand(k, seed=1, low=0.5, high=1.5), "b": rand(k, seed=2)}
    x = rand(*shape, low=-2, high=3)
    n = node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=1e-3)
    if opset < 21:  # ONNX's checker rejects the deprecated opset-18 form: build it raw
        graph = helper.make_graph([n], "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, shape)],
            [helper.make_tensor(k, TensorProto.FLOAT, v.shape, v) for k, v in inits.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), {"x": x}
    # A function op ONNX shape inference does not type: Y's shape is given here.
    return model([n], {"x": x}, inits, opset, outputs=(("y", shape),))


def rms_norm(shape, axis):
    return one("RMSNormalization", shape, {"s": rand(*shape[axis:], seed=1)}, ["s"], 23,
               low=-2, high=3, axis=axis)


NORM = {
    "groupnorm21_per_channel": lambda: group_norm((2, 6, 4, 5), 3, 21, True),
    "groupnorm18_per_group": lambda: group_norm((2, 6, 7), 2, 18, False),
    "groupnorm21_one_group": lambda: group_norm((1, 4, 3, 3), 1, 21, True),
    "rmsnorm_last": lambda: rms_norm((2, 5, 16), -1),
    "rmsnorm_axis1": lambda: rms_norm((2, 3, 4), 1),
    "layernorm_mean_invstd_axis1": lambda: layer_norm_stats(1),
    "layernorm_mean_invstd_axis2": lambda: layer_norm_stats(2),
    "batchnorm_runtime_stats_4d": lambda: batch_norm_runtime((2, 3, 4, 5)),
    "batchnorm_runtime_stats_2d": lambda: batch_norm_runtime((4, 3)),
    "layernorm_last": lambda: layer_norm((2, 5, 16)),
    "layernorm_axis1": lambda: layer_norm((2, 3, 4), axis=1),
    "layernorm_axis_neg2_nobias": lambda: layer_norm((2, 3, 4), axis=-2, bias=False,
                                                     epsilon=1e-3),
    "layernorm_axis0": lambda: layer_norm((3, 4), axis=0),
    "layernorm_scale_broadcast": lambda: layer_norm((2, 3, 4), axis=1, scale_shape=(1, 4)),
    "layernorm_residual_bert": layer_norm_residual,
    "layernorm_decomposed": decomposed_layer_norm,
    "instancenorm_4d": lambda: instance_norm((2, 3, 5, 4)),
    "instancenorm_3d": lambda: instance_norm((2, 4, 7)),
    # The default axes written out: onnx 1.23's strict shape inference fails on the
    # function body when `axes` is absent (the import reports that, one line).
    "mvn_nhw_axes": lambda: one("MeanVarianceNormalization", (2, 3, 4, 5), low=-2, high=3,
                                axes=[0, 2, 3]),
    "mvn_axes_last2": lambda: one("MeanVarianceNormalization", (2, 3, 4), axes=[1, 2]),
    "lpnorm_p2_last": lambda: one("LpNormalization", (3, 4, 5)),
    "lpnorm_p1_axis0": lambda: one("LpNormalization", (3, 4), axis=0, p=1),
    "lpnorm_zero_slice": lambda: model([node("Mul", ["x", "z"], ["t"]),
                                        node("LpNormalization", ["t"], ["y"], axis=1)],
                                       {"x": rand(3, 4)}, {"z": np.array([[1], [0], [1]],
                                                                         np.float32)}),
    "lrn_size5": lambda: one("LRN", (2, 7, 3, 3), size=5, alpha=1e-2, beta=0.75, bias=2.0),
    "lrn_size2": lambda: one("LRN", (1, 4, 3, 2), size=2),
    "lrn_beta_half": lambda: one("LRN", (1, 6, 4, 5), size=3, beta=0.5, bias=1.5),
    "lrn_beta_powf": lambda: one("LRN", (2, 5, 3, 7), size=3, alpha=0.5, beta=0.6),
    "batchnorm_3d": lambda: one("BatchNormalization", (2, 3, 5),
                                {k: rand(3, seed=k_, low=0.5, high=1.5) for k_, k in
                                 enumerate(["s", "b", "m", "v"])}, ["s", "b", "m", "v"]),
}


# -- Gemm / MatMul ------------------------------------------------------------------------

def gemm(a_shape, b_shape, c_shape=None, b_input=False, c_input=False, **attrs):
    inputs = {"a": rand(*a_shape)}
    inits = {}
    (inputs if b_input else inits)["b"] = rand(*b_shape, seed=5)
    if c_shape is not None:
        (inputs if c_input else inits)["c"] = rand(*c_shape, seed=6)
    ins = ["a", "b", *(["c"] if c_shape is not None else [])]
    return model([node("Gemm", ins, ["y"], **attrs)], inputs, inits)


def matmul(a_shape, b_shape, b_const=False):
    inputs = {"a": rand(*a_shape)}
    inits = {}
    (inits if b_const else inputs)["b"] = rand(*b_shape, seed=4)
    return model([node("MatMul", ["a", "b"], ["y"])], inputs, inits)


def attention():
    """BERT self-attention core: softmax(Q K^T / sqrt(d) + mask) V, runtime Q, K, V."""
    b, h, s, d = 2, 3, 5, 4
    inits = {"scale": np.array(np.sqrt(d), np.float32),
             "mask": np.where(rand(b, 1, 1, s, seed=9) > 0.5, -10000.0, 0.0).astype(np.float32)}
    nodes = [node("MatMul", ["q", "kt"], ["qk"]), node("Div", ["qk", "scale"], ["sc"]),
             node("Add", ["sc", "mask"], ["ms"]), node("Softmax", ["ms"], ["p"], axis=-1),
             node("MatMul", ["p", "v"], ["y"])]
    return model(nodes, {"q": rand(b, h, s, d, seed=1), "kt": rand(b, h, d, s, seed=2),
                         "v": rand(b, h, s, d, seed=3)}, inits)


def einsum(equation, *shapes):
    names = "abcd"[:len(shapes)]
    feeds = {n: rand(*s, seed=k) for k, (n, s) in enumerate(zip(names, shapes, strict=True))}
    return model([node("Einsum", list(names), ["y"], equation=equation)], feeds, {})


def det(x):
    return model([node("Det", ["x"], ["y"])], {"x": x}, {})


_PIVOT = np.array([[0, 2, 1], [1, 1, 0], [3, 0, 2]], np.float32)  # row swaps needed


LINALG = {
    "det_batch": lambda: det(rand(2, 3, 5, 5)),
    "det_pivot_singular": lambda: det(np.stack([_PIVOT, _PIVOT * np.float32([1, 0, 1])])),
    "det_1x1": lambda: det(rand(4, 1, 1)),
    # ellipsis dims broadcast (1 against 5 and 2 against 1), spaces in the equation
    "einsum_ellipsis_broadcast": lambda: einsum("...ij, ...jk -> ...ik", (2, 1, 3, 4),
                                                (1, 5, 4, 2)),
    "einsum_implicit_chain": lambda: einsum("ij,jk,kl", (3, 4), (4, 2), (2, 5)),
    "einsum_trace_to_scalar": lambda: einsum("ii", (4, 4)),
    "einsum_attention_scores": lambda: einsum("bhqd,bhkd->bhqk", (2, 3, 5, 4), (2, 3, 6, 4)),
    "gemm_transa": lambda: gemm((8, 3), (8, 6), transA=1),
    "gemm_transa_transb_alpha": lambda: gemm((8, 3), (6, 8), (6,), transA=1, transB=1,
                                             alpha=0.5, beta=2.0),
    "gemm_runtime_b": lambda: gemm((3, 8), (8, 6), (3, 6), b_input=True),
    "gemm_runtime_b_transb_alpha": lambda: gemm((3, 8), (6, 8), (1, 6), b_input=True,
                                                transB=1, alpha=1.5, beta=0.5),
    "gemm_runtime_c_beta": lambda: gemm((3, 8), (8, 6), (3, 1), c_input=True, beta=3.0),
    "gemm_runtime_all_transa": lambda: gemm((8, 3), (8, 6), (6,), b_input=True,
                                            c_input=True, transA=1, alpha=2.0, beta=-1.0),
    "gemm_beta0": lambda: gemm((3, 8), (8, 6), (3, 6), beta=0.0),
    "gemm_no_c_alpha": lambda: gemm((3, 8), (6, 8), transB=1, alpha=0.25),
    "matmul_1d_2d": lambda: matmul((4,), (4, 5)),
    "matmul_2d_1d": lambda: matmul((3, 4), (4,)),
    "matmul_1d_1d": lambda: matmul((4,), (4,)),
    "matmul_1d_3d": lambda: matmul((4,), (2, 4, 5)),
    "matmul_3d_1d_const": lambda: matmul((2, 3, 4), (4,), b_const=True),
    "matmul_4d_broadcast": lambda: matmul((2, 1, 3, 4), (1, 5, 4, 6)),
    "matmul_4d_const_b": lambda: matmul((2, 3, 3, 4), (3, 4, 6), b_const=True),
    "bert_attention": attention,
    # Tile edges of gemm_tile: M % 4, N % 16 and K beyond one packed panel (512).
    "matmul_tile_edges": lambda: matmul((2, 7, 600), (2, 600, 37)),
    # k chunks: the first, two run-time ones and a remainder (gemm_tile's k loop)
    "matmul_long_k": lambda: matmul((5, 1800), (1800, 33)),
    "matmul_tile_edges_const_b": lambda: matmul((5, 530), (530, 33), b_const=True),
    "gemm_tile_edges_transb": lambda: gemm((9, 520), (40, 520), (40,), b_input=True,
                                           transB=1),
    "gemm_tile_edges_transa": lambda: gemm((530, 6), (530, 20), transA=1, alpha=0.5),
}


# -- Softmax, LogSoftmax ----------------------------------------------------------------

SOFTMAX = {
    "softmax11_axis2_4d": lambda: one("Softmax", (2, 3, 4, 5), opset=11, axis=2),
    "softmax13_axis1_4d": lambda: one("Softmax", (2, 3, 4, 5), axis=1),
    "softmax13_large_values": lambda: one("Softmax", (3, 7), low=-300, high=300),
    # Masked attention scores: -inf entries must come out exactly 0.
    "softmax13_neg_inf_mask": lambda: model(
        [node("Add", ["x", "mask"], ["t"]), node("Softmax", ["t"], ["y"], axis=-1)],
        {"x": rand(2, 3, 9, low=-20, high=20)},
        {"mask": np.where(rand(3, 9, seed=4) > 0.3, 0.0, -np.inf).astype(np.float32)}),
    # float32 rows of >= 8 in explicit vectors (16 or 8 lanes) plus a scalar tail
    "softmax13_vector_rows_tail": lambda: one("Softmax", (3, 4, 37), low=-30, high=30),
    "softmax13_vector_rows_8": lambda: one("Softmax", (5, 12), low=-300, high=300),
    "logsoftmax13_vector_rows": lambda: one("LogSoftmax", (2, 3, 32), low=-300, high=300),
    "softmax13_vector_neg_inf_mask": lambda: model(
        [node("Add", ["x", "mask"], ["t"]), node("Softmax", ["t"], ["y"], axis=-1)],
        {"x": rand(2, 3, 40, low=-20, high=20)},
        {"mask": np.where(rand(3, 40, seed=4) > 0.3, 0.0, -np.inf).astype(np.float32)}),
    # Along a non-last axis: column blocks of 1024 and a tail.
    "softmax13_axis1_column_blocks": lambda: one("Softmax", (2, 5, 40, 30), axis=1, low=-9,
                                                 high=9),
    "logsoftmax13_axis1_column_blocks": lambda: one("LogSoftmax", (1, 4, 35, 31), axis=1),
    "hardmax11_axis1_flatten": lambda: arg("Hardmax", ties(2, 3, 4), axis=1, opset=11,
                                           out_type=TensorProto.FLOAT),
    "hardmax13_axis1_ties": lambda: arg("Hardmax", ties(2, 5, 3), axis=1,
                                        out_type=TensorProto.FLOAT),
    "hardmax13_last": lambda: one("Hardmax", (4, 7)),
    "logsoftmax11_default": lambda: one("LogSoftmax", (2, 3, 4), opset=11),
    "logsoftmax11_axis0": lambda: one("LogSoftmax", (2, 3, 4), opset=11, axis=0),
    "logsoftmax13_axis1": lambda: one("LogSoftmax", (2, 3, 4), axis=1),
    "logsoftmax13_large_values": lambda: one("LogSoftmax", (3, 7), low=-300, high=300),
}


# -- reductions -----------------------------------------------------------------------------

def reduce(op_type, shape=(2, 3, 4, 5), axes=None, as_input=False, opset=None, low=-1.0,
           **attrs):
    """`op_type` with axes as attribute (opset 13 / 11) or input (opset 18)."""
    opset = opset or (18 if as_input else (11 if op_type == "ReduceSum" else 13))
    inits, extra = {}, []
    if axes is not None and as_input:
        inits["axes"] = np.array(axes, np.int64)
        extra = ["axes"]
    elif axes is not None:
        attrs["axes"] = axes
    return one(op_type, shape, inits, extra, opset, low=low, high=2.0, **attrs)


REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
REDUCE = {}
for _op in REDUCE_OPS:
    _low = 0.5 if _op == "ReduceLogSum" else -1.0
    REDUCE |= {
        f"{_op}_last_attr": lambda op=_op, lo=_low: reduce(op, axes=[-1], low=lo),
        f"{_op}_middle_input": lambda op=_op, lo=_low: reduce(op, axes=[1, 2], as_input=True,
                                                            low=lo, keepdims=0),
        f"{_op}_all": lambda op=_op, lo=_low: reduce(op, low=lo, keepdims=0),
    }
REDUCE |= {
    "reducemean_spatial_keep": lambda: reduce("ReduceMean", axes=[2, 3]),
    "reducesum_axis0_13": lambda: reduce("ReduceSum", axes=[0, -1], as_input=True, opset=13),
    "reducesum_noop_empty": lambda: reduce("ReduceSum", as_input=True, opset=13,
                                           noop_with_empty_axes=1),
    "reducemax_first_and_last": lambda: reduce("ReduceMax", axes=[0, 3], keepdims=0),
    "reducel2_axis1_keep": lambda: reduce("ReduceL2", axes=[1], as_input=True),
    "reducemean_then_add_relu": lambda: model(
        [node("ReduceMean", ["x"], ["m"], axes=[1]), node("Add", ["m", "k"], ["a"]),
         node("Relu", ["a"], ["y"])], {"x": rand(2, 6, 3)}, {"k": rand(1, 3, seed=3)}),
}


def reduce_typed(op_type, x, axes, opset=13, keepdims=1):
    """`op_type` over an int64/int32/bool tensor; axes an attribute, or from opset 18
    a constant input (bool needs opset 20)."""
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    as_input = opset >= 18
    n = node(op_type, ["x", *(["axes"] if as_input else [])], ["y"], keepdims=keepdims,
             **({} if as_input else {"axes": axes}))
    inits = {"axes": np.array(axes, np.int64)} if as_input else {}
    return make_model([n], [helper.make_tensor_value_info("x", elem, x.shape)],
                      [helper.make_tensor_value_info("y", elem, None)], inits, opset), {"x": x}


def ints(*shape, dtype=np.int64):
    return np.random.default_rng(5).integers(-50, 50, size=shape).astype(dtype)


REDUCE |= {
    "reducesum_int64_middle": lambda: reduce_typed("ReduceSum", ints(2, 3, 4), [1], opset=11),
    "reducemax_int32_last": lambda: reduce_typed("ReduceMax", ints(3, 5, dtype=np.int32),
                                                 [1], keepdims=0),
    "reducemin_int64_all": lambda: reduce_typed("ReduceMin", ints(3, 4), [0, 1]),
    "reduceprod_int64": lambda: reduce_typed("ReduceProd", ints(3, 4) % 3 + 1, [0]),
    "reducemax_bool_v20": lambda: reduce_typed("ReduceMax", ints(3, 4) > 30, [1], opset=20),
    "reducemin_bool_v20": lambda: reduce_typed("ReduceMin", ints(3, 4) > -30, [0],
                                               opset=20, keepdims=0),
}


def arg(op_type, x, opset=13, out_type=TensorProto.INT64, **attrs):
    return model([node(op_type, ["x"], ["y"], **attrs)], {"x": x}, opset=opset,
                 outputs=[helper.make_tensor_value_info("y", out_type, None)])


def ties(*shape):
    """Few distinct values, so ArgMax/ArgMin must break ties the ONNX way."""
    return np.random.default_rng(3).integers(0, 3, size=shape).astype(np.float32)


ARG = {
    "argmax_default": lambda: arg("ArgMax", rand(3, 4, 5)),
    "argmax_axis_neg1_nokeep": lambda: arg("ArgMax", rand(3, 4, 5), axis=-1, keepdims=0),
    "argmin_axis1": lambda: arg("ArgMin", rand(3, 4, 5), axis=1),
    "argmax_ties_first": lambda: arg("ArgMax", ties(4, 6), axis=1),
    "argmax_ties_last": lambda: arg("ArgMax", ties(4, 6), axis=1, select_last_index=1),
    "argmin_ties_last_axis0": lambda: arg("ArgMin", ties(5, 3), axis=0, keepdims=0,
                                          select_last_index=1),
    # Segmentation-style: over channels of a large map (column blocks and a tail).
    "argmax_axis1_column_blocks": lambda: arg("ArgMax", rand(2, 5, 33, 37), axis=1),
    "argmin_axis1_ties_last_blocks": lambda: arg("ArgMin", ties(1, 4, 40, 30), axis=1,
                                                 keepdims=0, select_last_index=1),
    "argmax_int64_input": lambda: model([node("ArgMax", ["x"], ["y"], axis=1)],
                                        {"x": ints(3, 4)}, outputs=[helper.make_tensor_value_info(
                                            "y", TensorProto.INT64, None)]),
}

CASES = NORM | LINALG | SOFTMAX | REDUCE | ARG
# ONNX that onnxruntime refuses (an even LRN size, deprecated opset-18
# GroupNormalization): compared with onnx.reference instead.
REFERENCE_ONLY = {"lrn_size2", "groupnorm18_per_group"}
