"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp,
ArgMax, ArgMin.

Graph ops reduce_<kind> (attrs: axes, sorted and non-negative; keepdims) and
argmax/argmin (axis, keepdims, select_last_index; int64 output). Axes come
from an attribute (older opsets) or a constant input (ReduceSum from 13, the
others from 18); an empty axes list reduces everything unless
noop_with_empty_axes is set, in which case the node is an identity.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.dsl.builder import FLOATS
from pipeline.kernels.registry import lowering
from pipeline.kernels.softmax import COLUMNS, column_blocks, max_and_exp_sum
from pipeline.ops.geometry import FLOAT_DTYPES

# kind -> (identity, map applied to each x, combine, finalize(acc, count))
_KINDS = {
    "sum": (0.0, None, "add", None),
    "mean": (0.0, None, "add", "mean"),
    "max": (-math.inf, None, "max", None),
    "min": (math.inf, None, "min", None),
    "prod": (1.0, None, "mul", None),
    "l1": (0.0, "abs", "add", None),
    "l2": (0.0, "square", "add", "sqrt"),
    "sum_square": (0.0, "square", "add", None),
    "log_sum": (0.0, None, "add", "log"),
    "log_sum_exp": (-math.inf, None, "logaddexp", None),
}


def _identity(kind: str, dtype: str):
    """The start value of a `kind` reduction in `dtype` (ints: the type's extremes)."""
    if dtype in FLOAT_DTYPES:
        return _KINDS[kind][0]
    if dtype == "bool" or dtype.startswith("uint"):
        low, high = 0, 1 if dtype == "bool" else 2 ** (8 * np.dtype(dtype).itemsize) - 1
    else:
        bits = np.dtype(dtype).itemsize * 8
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return {"sum": 0, "prod": 1, "max": low, "min": high}[kind]


def _combine(kb, how: str, acc, v):
    if acc.type not in FLOATS:  # integers and bool (0/1): signed arithmetic
        return kb.arith(how, acc, v)
    if how == "add":
        return kb.fadd(acc, v)
    if how == "mul":
        return kb.fmul(acc, v)
    if how == "max":
        return kb.fmax(acc, v)
    if how == "min":
        return kb.fmin(acc, v)
    # logaddexp, stable: max(a, b) + log(1 + exp(-|a - b|)); -inf is the identity.
    hi, lo = kb.fmax(acc, v), kb.fmin(acc, v)
    tail = kb.intrinsic("log", kb.fadd(kb.fconst(1.0, lo), kb.exp(kb.fsub(lo, hi))))
    empty = kb.compare("==", lo, kb.fconst(-math.inf, lo))
    return kb.select(empty, hi, kb.fadd(hi, tail))


def _reduce_lower(kb, node, ins, out, epilogue, shapes=None):
    """Accumulate into the output in the input's own loop order, so every read
    is contiguous whichever axes are reduced.

    The trailing run of reduced dims (contiguous in memory) is reduced into a
    register first; each partial result is then combined into its output slot.
    LogSumExp reduces that run in two passes (max, then sum of exp(x - max)).
    """
    x = ins[0]
    shape = x.type.shape
    kind = node.op[len("reduce_"):]
    _, mapping, how, finish = _KINDS[kind]
    start = kb.const(_identity(kind, x.type.dtype), x.elem)
    axes = set(node.attr("axes"))
    t = len(shape)
    while t > 0 and t - 1 in axes:
        t -= 1
    run = math.prod(shape[t:])
    # Output offset of an input index: reduced dims do not move it.
    out_strides, acc = [], 1
    for d in reversed(range(len(shape))):
        out_strides.append(0 if d in axes else acc)
        acc *= 1 if d in axes else shape[d]
    out_strides.reverse()

    def mapped(v):
        if mapping == "abs":
            return kb.intrinsic("fabs", v)
        return kb.fmul(v, v) if mapping == "square" else v

    with kb.loop(0, out.type.size, "z") as z:
        kb.store(out, z, start)
    with kb.nest(shape[:t], "d") as index:
        base = kb.dot(index, x.strides[:t])
        if kind == "log_sum_exp":
            peak, total = max_and_exp_sum(kb, x, base, run)
            partial = kb.fadd(peak, kb.intrinsic("log", total))
            # An all -inf run: exp(-inf - -inf) is NaN; the answer is -inf.
            partial = kb.select(kb.compare("==", peak, kb.fconst(-math.inf, peak)),
                                  peak, partial)
        else:
            slot = kb.local(start)
            with kb.loop(0, run, "k") as k:
                v = mapped(kb.load(x, base + k))
                kb.set(slot, _combine(kb, how, kb.get(slot), v))
            partial = kb.get(slot)
        o = kb.dot(index, out_strides[:t])
        kb.store(out, o, _combine(kb, how, kb.load(out, o), partial))
    count = math.prod(s for d, s in enumerate(shape) if d in axes)
    if finish is None and epilogue is None:
        return
    with kb.nest(out.type.shape, "e") as index:
        o = kb.dot(index, out.strides)
        v = kb.load(out, o)
        if finish == "mean" and not isinstance(count, int):  # a runtime count (VM)
            v = kb.fdiv(v, kb.b.sitofp(count.value, v.type))
        elif finish == "mean":
            v = kb.fmul(v, kb.fconst(1.0 / count, v))
        elif finish is not None:
            v = kb.intrinsic(finish, v)
        if epilogue is not None:
            v = epilogue(v, index)
        kb.store(out, o, v)


for _kind in _KINDS:
    # (the same loops serve runtime shapes: docs/vm.md, "Symbolic dimensions")
    lowering(f"reduce_{_kind}", lower=_reduce_lower, lower_dims=_reduce_lower)


def _arg_lower(kb, node, ins, out, epilogue):
    """For each output: scan the axis keeping the best value and its index;
    ties keep the first index unless select_last_index."""
    x = ins[0]
    shape = x.type.shape
    axis = node.attr("axis")
    length, inner = shape[axis], math.prod(shape[axis + 1:])
    pred = ">" if node.op == "argmax" else "<"
    if node.attr("select_last_index"):
        pred += "="
    if inner > 1 and x.type.dtype in FLOAT_DTYPES:
        _arg_columns(kb, x, out, pred, math.prod(shape[:axis]), length, inner)
        return
    with kb.loop(0, math.prod(shape[:axis]), "r") as r, kb.loop(0, inner, "q") as q:
        base = r * (length * inner) + q
        best = kb.local(kb.load(x, base))
        where = kb.local(kb.i64(0))
        with kb.loop(1, length, "k") as k:
            v = kb.load(x, base + k * inner)
            better = kb.compare(pred, v, kb.get(best))
            kb.set(best, kb.select(better, v, kb.get(best)))
            kb.set(where, kb.select(better, k, kb.get(where)))
        kb.store(out, r * inner + q, kb.get(where))


def _arg_columns(kb, x, out, pred: str, outer: int, length: int, inner: int):
    """The scan of _arg_lower for x[r, k, q], blocks of columns q at a time so
    every loop runs along contiguous memory: the best values in a stack buffer,
    their indices in the output itself."""
    best = kb.scratch(min(inner, COLUMNS), x.type.dtype)
    with column_blocks(kb, outer, inner) as (r, q0, cols):
        base = r * (length * inner) + q0
        dst = r * inner + q0
        with kb.loop(0, cols, "q") as q:
            kb.store(best, q, kb.load(x, base + q))
            kb.store(out, dst + q, kb.i64(0))
        with kb.loop(1, length, "k") as k, kb.loop(0, cols, "q") as q:
            v = kb.load(x, base + k * inner + q)
            better = kb.compare(pred, v, kb.load(best, q))
            kb.store(best, q, kb.select(better, v, kb.load(best, q)))
            o = dst + q
            kb.store(out, o, kb.select(better, k, kb.load(out, o)))


lowering("argmax", lower=_arg_lower)

lowering("argmin", lower=_arg_lower)
