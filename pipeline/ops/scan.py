"""Operators that depend on an element's position along axes: CumSum, CumProd, TopK,
Trilu.

Graph ops (all dtype-generic over float32/64 and int64/32):
  cumsum(x; axis, exclusive, reverse)      running sums along one axis
  cumprod(x; axis, exclusive, reverse)     running products (exclusive: 1 first)
  topk_values(x; axis, k, largest)         the k largest (smallest) along one axis,
  topk_indices(x; axis, k, largest)        sorted, ties to the lower index (int64)
  trilu(x; k, upper)                       x where column - row >= k (upper) or <= k
                                           (lower) in the last two dims, else 0
CumSum's and CumProd's axis, TopK's K and Trilu's k are build-time constants (their
converters' build_time_inputs). TopK's two outputs are two kernels: the
executor's kernels write one output each.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import onnx_op, register
from pipeline.ops.shape import need_const, norm_axis

_NUMERIC = ("float32", "float64", "int64", "int32", "float16", "int8", "uint8")


def _numeric(types, node):
    if types[0].dtype not in _NUMERIC:
        raise ModelError(f"node {node.name!r} ({node.op}): input dtype {types[0].dtype} is "
                         f"not supported ({', '.join(_NUMERIC)} are)")
    return [types[0]]


def _axis_split(shape, axis: int) -> tuple[int, int, int]:
    """(outer, length, inner) of `shape` around `axis`."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


# -- CumSum, CumProd ------------------------------------------------------------------------

_CUMULATIVE = {"cumsum": ("add", 0, np.cumsum), "cumprod": ("mul", 1, np.cumprod)}


def _cumulative_lower(kb, node, ins, out, epilogue):
    x = ins[0]
    how, start, _ = _CUMULATIVE[node.op]
    outer, length, inner = _axis_split(x.type.shape, node.attr("axis"))
    reverse, exclusive = node.attr("reverse"), node.attr("exclusive")
    with kb.loop(0, outer, "r") as r, kb.loop(0, inner, "q") as q:
        acc = kb.local(kb.const(start, x.elem))
        with kb.loop(0, length, "k") as k:
            at = (length - 1) - k if reverse else k
            o = r * (length * inner) + at * inner + q
            total = kb.arith(how, kb.get(acc), kb.load(x, o))
            kb.store(out, o, kb.get(acc) if exclusive else total)
            kb.set(acc, total)


def _cumulative_np(xs, node):
    x, axis = xs[0], node.attr("axis")
    _, start, fn = _CUMULATIVE[node.op]
    if node.attr("reverse"):
        x = np.flip(x, axis)
    y = fn(x, axis=axis, dtype=x.dtype)
    if node.attr("exclusive") and x.shape[axis]:  # shift by one, the identity in front
        y = np.roll(y, 1, axis)
        first = [slice(None)] * y.ndim
        first[axis] = 0
        y[tuple(first)] = start
    return [np.flip(y, axis) if node.attr("reverse") else y]


def _cumulative_converter(op: str):
    def convert(ctx, n):
        axis = need_const(ctx, n, 1, "the axis input")
        if axis is None:
            raise ModelError(f"node {n.name!r} ({n.op_type}): the axis input is required")
        rank = len(ctx.type(n.inputs[0]).shape)
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1],
                          axis=norm_axis(n, int(axis.reshape(-1)[0]), rank),
                          exclusive=int(n.attrs.get("exclusive", 0)),
                          reverse=int(n.attrs.get("reverse", 0)))]
    return convert


for _op in _CUMULATIVE:
    register(_op, "opaque", _numeric, lower=_cumulative_lower, numpy=_cumulative_np,
             float64=True, sample=lambda rng, dtype: (
                 [rng.uniform(0.5, 1.5, (2, 4, 3)).astype(dtype)],
                 {"axis": 1, "exclusive": 1, "reverse": 1}))
onnx_op("CumSum", 11, emits=("cumsum",), build_time_inputs=(1,))(_cumulative_converter("cumsum"))
onnx_op("CumProd", 26, emits=("cumprod",), build_time_inputs=(1,))(_cumulative_converter("cumprod"))


# -- TopK -----------------------------------------------------------------------------------

def _topk_infer(types, node):
    _numeric(types, node)
    x, axis, k = types[0], node.attr("axis"), node.attr("k")
    if not 0 <= k <= x.shape[axis]:
        raise ModelError(f"node {node.name!r} ({node.op}): k {k} is outside [0, "
                         f"{x.shape[axis]}] (axis {axis} of {list(x.shape)})")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorType(shape, x.dtype if node.op == "topk_values" else "int64")]


def _topk_lower(kb, node, ins, out, epilogue):
    """Each element's rank is the number of elements that precede it in the order
    (better value, or an equal value at a lower index); ranks below k are written
    at their rank. O(length^2) per row, no scratch memory, stable by construction."""
    x = ins[0]
    outer, length, inner = _axis_split(x.type.shape, node.attr("axis"))
    k_n = node.attr("k")
    better = ">" if node.attr("largest") else "<"
    with kb.loop(0, outer, "r") as r, kb.loop(0, inner, "q") as q:
        base = r * (length * inner) + q
        out_base = r * (k_n * inner) + q
        with kb.loop(0, length, "i") as i:
            v = kb.load(x, base + i * inner)
            rank = kb.local(kb.i64(0))
            with kb.loop(0, length, "j") as j:
                w = kb.load(x, base + j * inner)
                ahead = kb.or_(kb.compare(better, w, v), kb.and_(kb.compare("==", w, v), j < i))
                kb.set(rank, kb.index(kb.get(rank)) + kb.as_index(ahead))
            with kb.if_(kb.index(kb.get(rank)) < k_n):
                o = out_base + kb.index(kb.get(rank)) * inner
                kb.store(out, o, v if node.op == "topk_values" else i)


def _topk_np(xs, node):
    x, axis, k = xs[0], node.attr("axis"), node.attr("k")
    order = np.argsort(-x if node.attr("largest") else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis) if node.op == "topk_values" else
            idx.astype(np.int64)]


for _op in ("topk_values", "topk_indices"):
    register(_op, "opaque", _topk_infer, lower=_topk_lower, numpy=_topk_np, float64=True,
             sample=lambda rng, dtype: ([rng.uniform(-2, 2, (2, 5, 3)).astype(dtype)],
                                        {"axis": 1, "k": 3, "largest": 1}))


@onnx_op("TopK", 1, emits=("topk_values", "topk_indices"), build_time_inputs=(1,))
def _topk(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    if n.opset >= 10:
        k = need_const(ctx, n, 1, "the K input")
        k = int(np.asarray(k).reshape(-1)[0])
    else:
        k = int(n.attrs["k"])
    attrs = {"axis": norm_axis(n, int(n.attrs.get("axis", -1)), rank), "k": k,
             "largest": int(n.attrs.get("largest", 1))}
    return [Node.make(op, f"{n.name}__{op}" if op == "topk_indices" else n.name,
                      n.inputs[:1], (out,), **attrs)
            for op, out in zip(("topk_values", "topk_indices"), n.outputs, strict=False)
            if out]


# -- Trilu ----------------------------------------------------------------------------------

def _trilu_infer(types, node):
    if len(types[0].shape) < 2:
        raise ModelError(f"node {node.name!r} (trilu): input rank {len(types[0].shape)} < 2")
    return _numeric(types, node) if types[0].dtype != "bool" else [types[0]]


def _trilu_lower(kb, node, ins, out, epilogue):
    x = ins[0]
    k, upper = node.attr("k"), node.attr("upper")
    with kb.nest(out.type.shape, "o") as index:
        o = kb.dot(index, out.strides)
        diagonal = index[-1] - index[-2]  # column - row
        keep = kb.compare(">=" if upper else "<=", diagonal, k)
        kb.store(out, o, kb.select(keep, kb.load(x, o), kb.const(0, x.elem)))


def _trilu_np(xs, node):
    fn = np.triu if node.attr("upper") else np.tril
    return [fn(xs[0], node.attr("k"))]


register("trilu", "opaque", _trilu_infer, lower=_trilu_lower, numpy=_trilu_np, float64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (2, 3, 4)).astype(dtype)],
                                    {"k": 1, "upper": 0}))


@onnx_op("Trilu", 14, emits=("trilu",), build_time_inputs=(1,))
def _trilu(ctx, n):
    k = need_const(ctx, n, 1, "the k input")
    return [Node.make("trilu", n.name, n.inputs[:1], n.outputs[:1],
                      k=0 if k is None else int(np.asarray(k).reshape(-1)[0]),
                      upper=int(n.attrs.get("upper", 1)))]
