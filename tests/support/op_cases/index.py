"""The operator cases of tests/ops/test_ops_index.py: CASES maps a name to a function
returning (model, feeds). tests/cross/test_cpu_sweep.py compiles them for every CPU."""

from __future__ import annotations

import numpy as np
from onnx import helper

from tests.support.onnx_models import make_model, rand
from tests.support.op_cases.elementwise import doubles, ints, typed
from tests.support.op_cases.shape import i64

node = helper.make_node
X = rand(3, 4, 5)


def graph(op_type, feeds: dict, inits=None, outputs=("y",), opset=18, order=None, **attrs):
    """One `op_type` node on the runtime `feeds` then the constant `inits` (or the
    input names in `order`); outputs typed by ONNX shape inference."""
    names = order or [*feeds, *(inits or {})]
    model = make_model([node(op_type, names, list(outputs), **attrs)],
                       [typed(k, v) for k, v in feeds.items()],
                       [helper.make_empty_tensor_value_info(o) for o in outputs],
                       inits or {}, opset)
    return model, feeds


def nll(x, target, weight=None, opset=13, **attrs):
    feeds = {"x": x, "t": target} | ({"w": weight} if weight is not None else {})
    return graph("NegativeLogLikelihoodLoss", feeds, opset=opset, **attrs)


def sce(scores, labels, weight=None, log_prob=False, **attrs):
    feeds = {"s": scores, "t": labels} | ({"w": weight} if weight is not None else {})
    return graph("SoftmaxCrossEntropyLoss", feeds, opset=13,
                 outputs=("y", "lp") if log_prob else ("y",), **attrs)


LABELS = ints(3, 5, low=0, high=4)  # classes of a [3, 4, 5] input: N=3, C=4, d1=5
SCATTER = ["x", "i", "u"]
MIXED = np.array([[2, 1, 3, -1], [0, -4, 3, 1], [4, 0, -5, 2]], np.int64)  # for axis 1 of 5

CASES = {
    # -- GatherElements
    "gather_elements_axis0": lambda: graph("GatherElements", {"x": X},
                                           {"i": ints(2, 4, 5, low=-3, high=3)}, axis=0),
    "gather_elements_axis_neg1": lambda: graph(
        "GatherElements", {"x": X, "i": MIXED.reshape(3, 2, 2)}, axis=-1),
    "gather_elements_double": lambda: graph("GatherElements", {"x": doubles(4, 5)},
                                            {"i": MIXED[:, :4].T % 4}, axis=0),
    # -- ScatterElements, ScatterND
    "scatter_elements_axis1": lambda: graph(
        "ScatterElements", {"x": X[0], "u": rand(4, 2, seed=1)},
        {"i": np.array([[1, 4], [0, -1], [3, 2], [2, 0]], np.int64)}, axis=1, order=SCATTER),
    "scatter_elements_add": lambda: graph(
        "ScatterElements", {"x": X[0], "u": rand(3, 5, seed=1)},
        {"i": np.array([[1, 0, 3, 3, 2], [1, 1, 0, 3, 2], [0, 0, 0, 0, 0]], np.int64)},
        axis=0, reduction="add", order=SCATTER),
    "scatter_elements_max_double": lambda: graph(
        "ScatterElements", {"x": doubles(4, 3), "u": doubles(2, 3, seed=1)},
        {"i": np.array([[1, 3, 3], [1, 0, 3]], np.int64)}, axis=0, reduction="max",
        order=SCATTER),
    "scatter_nd_rows": lambda: graph("ScatterND", {"x": X, "u": rand(2, 4, 5, seed=1)},
                                     {"i": np.array([[2], [0]], np.int64)}, order=SCATTER),
    "scatter_nd_elements_mul": lambda: graph(
        "ScatterND", {"x": X, "u": rand(2, 2, seed=1)},
        {"i": np.array([[[0, 1, 2], [2, 3, 4]], [[1, 0, 0], [0, 1, 2]]], np.int64)},
        reduction="mul", order=SCATTER),
    "scatter_nd_int64": lambda: graph("ScatterND", {"x": ints(4, 3), "u": ints(2, 3, seed=1)},
                                      {"i": np.array([[3], [1]], np.int64)}, order=SCATTER),
    # -- GatherND: whole elements with negative indices, rows, batch_dims 1 and 2
    "gather_nd_elements": lambda: graph("GatherND", {"x": X},
                                        {"i": np.array([[[0, -1, 2]], [[2, 3, -5]]], np.int64)}),
    "gather_nd_rows_int64": lambda: graph("GatherND", {"x": ints(3, 4, 5)},
                                          {"i": np.array([[1, 2], [-1, 0]], np.int64)}),
    "gather_nd_batch1": lambda: graph("GatherND", {"x": X},
                                      {"i": np.array([[[1], [3]], [[0], [-2]], [[2], [2]]])},
                                      batch_dims=1),
    "gather_nd_batch2_double": lambda: graph(
        "GatherND", {"x": doubles(2, 3, 4)},
        {"i": np.array([[[1], [3], [0]], [[2], [-1], [0]]], np.int64)}, batch_dims=2),
    # -- TensorScatter: a KV cache write at each batch entry's index, wrapping if circular
    "tensor_scatter_linear": lambda: graph(
        "TensorScatter", {"c": rand(2, 3, 6, 4), "u": rand(2, 3, 2, 4, seed=1)},
        {"w": np.array([4, 1], np.int64)}, opset=24),
    "tensor_scatter_circular_last_axis": lambda: graph(
        "TensorScatter", {"c": rand(3, 2, 5), "u": rand(3, 2, 3, seed=1)},
        {"w": np.array([0, 3, 4], np.int64)}, opset=24, mode="circular", axis=-1),
    "tensor_scatter_prefill_double": lambda: graph(
        "TensorScatter", {"c": doubles(2, 5, 3), "u": doubles(2, 2, 3, seed=1)}, opset=24,
        axis=1),
    # -- TopK (values and indices; ties go to the lower index)
    "topk_largest": lambda: graph("TopK", {"x": X}, {"k": i64(3)}, outputs=("v", "i"),
                                  axis=1),
    "topk_smallest_ties": lambda: graph("TopK", {"x": np.round(X * 2)}, {"k": i64(4)},
                                        outputs=("v", "i"), largest=0),
    "topk_int64_axis0": lambda: graph("TopK", {"x": ints(5, 3, low=0, high=4)}, {"k": i64(2)},
                                      outputs=("v", "i"), axis=0),
    "topk_double": lambda: graph("TopK", {"x": doubles(3, 6)}, {"k": i64(6)},
                                 outputs=("v", "i")),
    # -- CumSum
    "cumsum_axis1": lambda: graph("CumSum", {"x": X}, {"a": i64(1)}),
    "cumsum_exclusive_reverse": lambda: graph("CumSum", {"x": X}, {"a": i64(-1)},
                                              exclusive=1, reverse=1),
    "cumsum_int32_exclusive": lambda: graph("CumSum", {"x": ints(4, 5, dtype=np.int32)},
                                            {"a": np.array(0, np.int32)}, exclusive=1),
    "cumsum_double_reverse": lambda: graph("CumSum", {"x": doubles(3, 7)}, {"a": i64(1)},
                                           reverse=1),
    "cumprod_exclusive_reverse": lambda: graph("CumProd", {"x": X + 1}, {"a": np.array(1)},
                                               exclusive=1, reverse=1, opset=26),
    "cumprod_int64": lambda: graph("CumProd", {"x": ints(3, 4, low=-3, high=4)},
                                   {"a": np.array(0)}, opset=26),
    # -- Trilu
    "triu": lambda: graph("Trilu", {"x": X}),
    "tril_k_neg1": lambda: graph("Trilu", {"x": X}, {"k": i64(-1)}, upper=0),
    "triu_k2_int64": lambda: graph("Trilu", {"x": ints(2, 3, 6)}, {"k": i64(2)}),
    "tril_double_k_large": lambda: graph("Trilu", {"x": doubles(4, 3)}, {"k": i64(7)},
                                         upper=0),
    # -- NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
    "nll_mean_2d": lambda: nll(rand(3, 4), LABELS[:, 0]),
    "nll_none_3d": lambda: nll(X, LABELS, reduction="none"),
    "nll_sum_weight": lambda: nll(X, LABELS, rand(4, seed=2, low=0.2, high=2), reduction="sum"),
    "nll_mean_weight_ignore": lambda: nll(X, LABELS, rand(4, seed=2, low=0.2, high=2),
                                          ignore_index=1),
    "nll_none_ignore_outside": lambda: nll(rand(3, 4), np.array([1, -100, 3]),
                                           reduction="none", ignore_index=-100),
    "nll_double": lambda: nll(doubles(3, 4, 5), LABELS, doubles(4, seed=2) + 2),
    "sce_mean": lambda: sce(X, LABELS),
    "sce_none_log_prob": lambda: sce(X, LABELS, log_prob=True, reduction="none"),
    "sce_sum_weight_ignore": lambda: sce(rand(3, 4), LABELS[:, 0], rand(4, seed=3) + 1,
                                         reduction="sum", ignore_index=2),
    "sce_double_log_prob": lambda: sce(doubles(3, 4, 5), LABELS, log_prob=True),
    # OneHot: negative indices wrap, out-of-range ones (MIXED's -5 for depth 4) are all off
    "onehot_axis1_wrap_out_of_range": lambda: graph(
        "OneHot", {"i": MIXED}, {"d": np.array(4, np.int64),
                                 "v": np.array([-1.5, 2.0], np.float32)}, axis=1),
    "onehot_float_indices_int32_values": lambda: graph(
        "OneHot", {"i": rand(2, 3, low=-3, high=3).round()}, {
            "d": np.array(3.0, np.float32), "v": np.array([0, 7], np.int32)}, axis=-3),
    # CenterCropPad: axis 2 cropped 5 -> 2 (odd: the extra one off the end), axis 0
    # padded 3 -> 6
    "center_crop_pad": lambda: graph("CenterCropPad", {"x": X}, {"s": np.array([2, 6])},
                                     axes=[-1, 0]),
    "compress_axis": lambda: graph("Compress", {"x": X}, {"c": np.array([1, 0, 1, 1])},
                                   axis=1),
    "compress_flat_short_condition": lambda: graph(
        "Compress", {"x": X}, {"c": np.array([0, 1, 1, 0, 0, 1], bool)}, opset=11),
    # ReverseSequence: batch-major, lengths 4 (all), 1 (none moves) and 2
    "reverse_sequence_batch_major": lambda: graph(
        "ReverseSequence", {"x": X}, {"l": np.array([4, 1, 2], np.int64)}, opset=10,
        time_axis=1, batch_axis=0),
}

# onnxruntime's CPU provider lacks these (dtype, reduction) combinations, CumProd, and
# OneHot with out-of-range indices (onnx.reference: all off); CenterCropPad and
# Compress and ReverseSequence are checked against onnx.reference too.
NOT_IN_ONNXRUNTIME = {"scatter_nd_int64", "scatter_elements_max_double", "nll_double",
                      "sce_double_log_prob", "cumprod_exclusive_reverse", "cumprod_int64",
                      "onehot_axis1_wrap_out_of_range", "onehot_float_indices_int32_values",
                      "center_crop_pad", "compress_axis", "compress_flat_short_condition",
                      "reverse_sequence_batch_major"}
