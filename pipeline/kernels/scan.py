"""Operators that depend on an element's position along axes: CumSum, CumProd, TopK,
Trilu.

Graph ops (all dtype-generic over float32/64 and the integers; TopK compares uint64
unsigned by its node's `unsigned` attribute, kernels/elementwise.py):
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

from pipeline.dsl.dims import dim_value
from pipeline.kernels.registry import lowering


def _axis_split(shape, axis: int) -> tuple[int, int, int]:
    """(outer, length, inner) of `shape` around `axis`."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


# op -> (how totals combine, the identity an exclusive scan starts from)
_CUMULATIVE = {"cumsum": ("add", 0), "cumprod": ("mul", 1)}


def _cumulative_lower(kb, node, ins, out, epilogue):
    x = ins[0]
    how, start = _CUMULATIVE[node.op]
    outer, length, inner = _axis_split(x.type.shape, node.attr("axis"))
    reverse, exclusive = node.attr("reverse"), node.attr("exclusive")
    with kb.loop(0, outer, "r") as r, kb.loop(0, inner, "q") as q:
        acc = kb.local(kb.const(start, x.elem))
        with kb.loop(0, length, "k") as k:
            at = (length - 1) - k if reverse else k
            o = r * (length * inner) + at * inner + q
            # each running total rounded (float16) or wrapped (narrow ints) like the
            # output element it is, as an op-by-op definition has it
            total = kb.narrow(kb.arith(how, kb.get(acc), kb.load(x, o)), x.type.dtype)
            kb.store(out, o, kb.get(acc) if exclusive else total)
            kb.set(acc, total)


for _op in _CUMULATIVE:
    lowering(_op, lower=_cumulative_lower)


def _topk_lower(kb, node, ins, out, epilogue):
    """Each element's rank is the number of elements that precede it in the order
    (better value, or an equal value at a lower index); ranks below k are written
    at their rank. O(length^2) per row, no scratch memory, stable by construction."""
    x = ins[0]
    outer, length, inner = _axis_split(x.type.shape, node.attr("axis"))
    k_n = node.attr("k")
    if len(ins) > 1:  # a runtime k: written at its runtime shape, [outer, k, inner]
        k_n = kb.index(kb.load(ins[1], 0))
        kb.fail_unless(kb.inside(k_n, 0, length + 1))
    better = ">" if node.attr("largest") else "<"
    with kb.loop(0, outer, "r") as r, kb.loop(0, inner, "q") as q:
        base = r * (length * inner) + q
        out_base = r * (k_n * inner) + q
        with kb.loop(0, length, "i") as i:
            v = kb.load(x, base + i * inner)
            rank = kb.local(kb.i64(0))
            with kb.loop(0, length, "j") as j:
                w = kb.load(x, base + j * inner)
                ahead = kb.or_(kb.compare(better, w, v, unsigned=bool(node.attr("unsigned"))),
                               kb.and_(kb.compare("==", w, v), j < i))
                kb.set(rank, kb.index(kb.get(rank)) + kb.as_index(ahead))
            with kb.if_(kb.index(kb.get(rank)) < k_n):
                o = out_base + kb.index(kb.get(rank)) * inner
                kb.store(out, o, v if node.op == "topk_values" else i)
    if len(ins) > 1:  # past the runtime result: zeros (valid indices for row-wise readers)
        with kb.loop(outer * k_n * inner, out.type.size, "z") as z:
            kb.store(out, z, kb.const(0, out.elem))


for _op in ("topk_values", "topk_indices"):
    lowering(_op, lower=_topk_lower)


def _trilu_lower(kb, node, ins, out, epilogue, shapes=None):
    x = ins[0]
    # k over symbolic dimensions (torch's triu(past + 1)): dims, frontend/onnx/scan.py
    k = dim_value(kb, node.attr("dims")[0]) if "dims" in dict(node.attrs) else node.attr("k")
    upper = node.attr("upper")
    with kb.nest(out.type.shape, "o") as index:
        o = kb.dot(index, out.strides)
        diagonal = index[-1] - index[-2]  # column - row
        keep = kb.compare(">=" if upper else "<=", diagonal, k)
        kb.store(out, o, kb.select(keep, kb.load(x, o), kb.const(0, x.elem)))


lowering("trilu", lower=_trilu_lower, lower_dims=_trilu_lower)
