"""Softmax, LogSoftmax and Hardmax along one axis (opset >= 13) or over the
input flattened to 2-D at the axis (older opsets).

Graph ops softmax, log_softmax, hardmax with attrs axis (non-negative) and
flatten (1: rows are everything from `axis` on). Softmax subtracts the row
maximum before exponentiating; the exponential is KernelBuilder.exp, which
vectorises.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

from pipeline.dsl.vector import reduce_lanes, vconst, vmax, zeros
from pipeline.kernels.registry import lowering
from pipeline.kernels.runtime_dims import softmax_dims

# Softmax (and ArgMax/ArgMin) along a non-last axis keep per-column state for
# this many columns at a time in stack buffers.
COLUMNS = 1024


@contextmanager
def column_blocks(kb, outer: int, inner: int):
    """Loops over the rows r < outer and the blocks of at most COLUMNS of the
    `inner` contiguous columns of an x[r, k, q] view, so every inner loop runs
    along contiguous memory. Yields (r, q0, cols): the block's first column and
    its width (a runtime value, as the last block may be narrower)."""
    width = min(inner, COLUMNS)
    with kb.loop(0, outer, "r") as r, kb.loop(0, -(-inner // width), "qb") as qb:
        q0 = qb * width
        yield r, q0, kb.smin(inner - q0, width)


def max_and_exp_sum(kb, x, base, length, store=None):
    """(max, sum of exp(x - max)) over the contiguous run x[base:base+length]; with
    `store`, each exp(x - max) is also written there at the same offset. For float16
    x - max and exp are rounded to half, as ONNX's op-by-op definition has them; the
    sum stays float32."""
    half = x.type.dtype
    slot = kb.local(kb.const(-math.inf, x.elem))
    with kb.loop(0, length, "k") as k:
        kb.set(slot, kb.fmax(kb.get(slot), kb.load(x, base + k)))
    peak = kb.get(slot)
    kb.set(slot, kb.const(0.0, x.elem))
    with kb.loop(0, length, "k") as k:
        e = kb.narrow(kb.exp(kb.narrow(kb.fsub(kb.load(x, base + k), peak), half)), half)
        if store is not None:
            kb.store(store, base + k, e)
        kb.set(slot, kb.fadd(kb.get(slot), e))
    return peak, kb.get(slot)


def _softmax_lower(kb, node, ins, out, epilogue):
    """Rows of length L with stride `inner`: max, sum of exp(x - max), then scale
    (softmax) or x - max - log(sum) (log_softmax). With inner > 1 the columns
    are processed COLUMNS at a time, their statistics in stack buffers, so
    every loop runs along contiguous memory."""
    shape = ins[0].type.shape
    axis = node.attr("axis")
    outer = math.prod(shape[:axis])
    if node.attr("flatten"):
        length, inner = math.prod(shape[axis:]), 1
    else:
        length, inner = shape[axis], math.prod(shape[axis + 1:])
    if inner > 1:
        _softmax_columns(kb, node, ins[0], out, outer, length, inner)
        return
    x = ins[0]
    if x.type.dtype == "float32" and length >= 8:
        _softmax_rows_vector(kb, node.op, x, out, outer, length)
        return
    with kb.loop(0, outer, "r") as r:
        base = r * length
        store = out if node.op == "softmax" else None
        peak, total = max_and_exp_sum(kb, x, base, length, store)
        half = x.type.dtype == "float16"  # divide by the half sum, as op by op
        if node.op == "log_softmax":
            shift = kb.fadd(peak, kb.intrinsic("log", total))
        elif half:
            total = kb.narrow(total, "float16")
        else:
            scale = kb.fdiv(kb.fconst(1.0, total), total)
        with kb.loop(0, length, "k") as k:
            o = base + k
            y = kb.fsub(kb.load(x, o), shift) if node.op == "log_softmax" else \
                kb.fdiv(kb.load(out, o), total) if half else kb.fmul(kb.load(out, o), scale)
            kb.store(out, o, y)


def _softmax_rows_vector(kb, op, x, out, outer, length):
    """float32 rows in explicit vectors of 16 (or 8) lanes and a scalar tail: the
    scalar loops' max and sum reductions do not vectorise (strict float order)."""
    lanes = 16 if length >= 16 else 8
    full = length - length % lanes

    def splat(v):
        return kb.splat(v, lanes)

    with kb.loop(0, outer, "r") as r:
        base = r * length
        # max: lane-wise, then across lanes and the tail (NaN ignored in both, as fmax)
        acc = kb.local(vconst(-math.inf, lanes))
        with kb.loop(0, full // lanes, "k") as k:
            kb.set(acc, vmax(kb, kb.get(acc), kb.vload(x, base + k * lanes, lanes)))
        peak = reduce_lanes(kb, kb.get(acc), lambda p, q: vmax(kb, p, q))
        for t in range(full, length):
            peak = kb.fmax(peak, kb.load(x, base + t))
        # sum of exp(x - max), storing the exponentials for softmax
        kb.set(acc, zeros(lanes))
        with kb.loop(0, full // lanes, "k") as k:
            o = base + k * lanes
            e = kb.exp(kb.fsub(kb.vload(x, o, lanes), splat(peak)))
            if op == "softmax":
                kb.vstore(out, o, e)
            kb.set(acc, kb.fadd(kb.get(acc), e))
        total = reduce_lanes(kb, kb.get(acc), kb.fadd)
        for t in range(full, length):
            e = kb.exp(kb.fsub(kb.load(x, base + t), peak))
            if op == "softmax":
                kb.store(out, base + t, e)
            total = kb.fadd(total, e)
        if op == "log_softmax":  # (x - max) - log(sum): x - (max + log(sum)) would
            log_total = kb.intrinsic("log", total)  # round max + log(sum) to max's ulp
        else:
            scale = kb.fdiv(kb.fconst(1.0, total), total)
        with kb.loop(0, full // lanes, "k") as k:
            o = base + k * lanes
            y = kb.fsub(kb.fsub(kb.vload(x, o, lanes), splat(peak), fast=False),
                        splat(log_total), fast=False) \
                if op == "log_softmax" else \
                kb.fmul(kb.vload(out, o, lanes), splat(scale))
            kb.vstore(out, o, y)
        for t in range(full, length):
            y = kb.fsub(kb.fsub(kb.load(x, base + t), peak, fast=False), log_total,
                        fast=False) \
                if op == "log_softmax" else \
                kb.fmul(kb.load(out, base + t), scale)
            kb.store(out, base + t, y)


def _softmax_columns(kb, node, x, out, outer, length, inner):
    """Softmax over k of x[r, k, q] for blocks of columns q (see _softmax_lower)."""
    width = min(inner, COLUMNS)
    half = x.type.dtype == "float16"  # statistics in float32, rounded as op by op
    stats = "float32" if half else x.type.dtype
    peak, total = kb.scratch(width, stats), kb.scratch(width, stats)
    one, zero, low = (kb.const(v, x.elem) for v in (1.0, 0.0, -math.inf))
    with column_blocks(kb, outer, inner) as (r, q0, cols):
        base = r * (length * inner) + q0
        with kb.loop(0, cols, "q") as q:
            kb.store(peak, q, low)
            kb.store(total, q, zero)
        with kb.loop(0, length, "k") as k, kb.loop(0, cols, "q") as q:
            v = kb.load(x, base + k * inner + q)
            kb.store(peak, q, kb.fmax(kb.load(peak, q), v))
        with kb.loop(0, length, "k") as k, kb.loop(0, cols, "q") as q:
            o = base + k * inner + q
            e = kb.narrow(kb.exp(kb.narrow(kb.fsub(kb.load(x, o), kb.load(peak, q)),
                                           x.type.dtype)), x.type.dtype)
            if node.op == "softmax":
                kb.store(out, o, e)
            kb.store(total, q, kb.fadd(kb.load(total, q), e))
        with kb.loop(0, cols, "q") as q:
            if node.op == "log_softmax":  # peak becomes the shift max + log(sum)
                kb.store(peak, q, kb.fadd(kb.load(peak, q),
                                          kb.intrinsic("log", kb.load(total, q))))
            elif half:
                kb.store(total, q, kb.narrow(kb.load(total, q), "float16"))
            else:
                kb.store(total, q, kb.fdiv(one, kb.load(total, q)))
        with kb.loop(0, length, "k") as k, kb.loop(0, cols, "q") as q:
            o = base + k * inner + q
            y = kb.fsub(kb.load(x, o), kb.load(peak, q)) if node.op == "log_softmax" else \
                kb.fdiv(kb.load(out, o), kb.load(total, q)) if half else \
                kb.fmul(kb.load(out, o), kb.load(total, q))
            kb.store(out, o, y)


lowering("softmax", lower=_softmax_lower, lower_dims=softmax_dims)

lowering("log_softmax", lower=_softmax_lower, lower_dims=softmax_dims)


def _hardmax_lower(kb, node, ins, out, epilogue):
    """1.0 at the first maximum of each row (length L, stride `inner`), 0.0 elsewhere."""
    x = ins[0]
    shape = x.type.shape
    axis = node.attr("axis")
    if node.attr("flatten"):
        length, inner = math.prod(shape[axis:]), 1
    else:
        length, inner = shape[axis], math.prod(shape[axis + 1:])
    with kb.loop(0, math.prod(shape[:axis]), "r") as r, kb.loop(0, inner, "q") as q:
        base = r * (length * inner) + q
        best, where = kb.local(kb.load(x, base)), kb.local(kb.i64(0))
        with kb.loop(1, length, "k") as k:
            v = kb.load(x, base + k * inner)
            better = kb.compare(">", v, kb.get(best))
            kb.set(best, kb.select(better, v, kb.get(best)))
            kb.set(where, kb.select(better, k, kb.get(where)))
        with kb.loop(0, length, "k") as k:
            hit = kb.compare("==", k, kb.get(where))
            kb.store(out, base + k * inner,
                     kb.select(hit, kb.const(1.0, out.elem), kb.const(0.0, out.elem)))


lowering("hardmax", lower=_hardmax_lower)
