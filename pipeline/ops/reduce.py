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
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import onnx_op, register
from pipeline.ops.softmax import COLUMNS, column_blocks, max_and_exp_sum

_INT_DTYPES = ("int64", "int32", "int8", "uint8")
_FLOAT_DTYPES = ("float32", "float64", "float16")
# kind -> (identity, map applied to each x, combine, finalize(acc, count), numpy)
_KINDS = {
    "sum": (0.0, None, "add", None, lambda x, ax, kd: np.sum(x, ax, keepdims=kd)),
    "mean": (0.0, None, "add", "mean", lambda x, ax, kd: np.mean(x, ax, keepdims=kd)),
    "max": (-math.inf, None, "max", None, lambda x, ax, kd: np.max(x, ax, keepdims=kd)),
    "min": (math.inf, None, "min", None, lambda x, ax, kd: np.min(x, ax, keepdims=kd)),
    "prod": (1.0, None, "mul", None, lambda x, ax, kd: np.prod(x, ax, keepdims=kd)),
    "l1": (0.0, "abs", "add", None, lambda x, ax, kd: np.sum(np.abs(x), ax, keepdims=kd)),
    "l2": (0.0, "square", "add", "sqrt",
           lambda x, ax, kd: np.sqrt(np.sum(np.square(x), ax, keepdims=kd))),
    "sum_square": (0.0, "square", "add", None,
                   lambda x, ax, kd: np.sum(np.square(x), ax, keepdims=kd)),
    "log_sum": (0.0, None, "add", "log", lambda x, ax, kd: np.log(np.sum(x, ax, keepdims=kd))),
    "log_sum_exp": (-math.inf, None, "logaddexp", None,
                    lambda x, ax, kd: np.logaddexp.reduce(x, axis=ax, keepdims=kd)),
}


def _reduce_infer(types, node):
    x = types[0]
    kind = node.op[len("reduce_"):]
    allowed = _FLOAT_DTYPES + (_INT_DTYPES if kind in ("sum", "prod", "max", "min") else ()) \
        + (("bool",) if kind in ("max", "min") else ())
    if x.dtype not in allowed:
        raise ModelError(f"node {node.name!r} ({node.op}): dtype {x.dtype} is not supported "
                         f"({', '.join(allowed)} are)")
    axes = set(node.attr("axes"))
    keep = node.attr("keepdims")
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape)
                  if keep or d not in axes)
    return [TensorType(shape, x.dtype)]


def _identity(kind: str, dtype: str):
    """The start value of a `kind` reduction in `dtype` (ints: the type's extremes)."""
    if dtype in _FLOAT_DTYPES:
        return _KINDS[kind][0]
    if dtype in ("bool", "uint8"):
        low, high = 0, 1 if dtype == "bool" else 255
    else:
        bits = {"int64": 64, "int32": 32, "int8": 8}[dtype]
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


def _reduce_lower(kb, node, ins, out, epilogue):
    """Accumulate into the output in the input's own loop order, so every read
    is contiguous whichever axes are reduced.

    The trailing run of reduced dims (contiguous in memory) is reduced into a
    register first; each partial result is then combined into its output slot.
    LogSumExp reduces that run in two passes (max, then sum of exp(x - max)).
    """
    x = ins[0]
    shape = x.type.shape
    kind = node.op[len("reduce_"):]
    _, mapping, how, finish, _ = _KINDS[kind]
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
        if finish == "mean":
            v = kb.fmul(v, kb.fconst(1.0 / count, v))
        elif finish is not None:
            v = kb.intrinsic(finish, v)
        if epilogue is not None:
            v = epilogue(v, index)
        kb.store(out, o, v)


def _reduce_numpy(kind: str):
    impl = _KINDS[kind][4]
    return lambda xs, node: [np.asarray(impl(xs[0], tuple(node.attr("axes")),
                                             bool(node.attr("keepdims"))))]


for _kind in _KINDS:
    register(f"reduce_{_kind}", "anchor", _reduce_infer, lower=_reduce_lower,
             numpy=_reduce_numpy(_kind), float64=True, sample=lambda rng, dtype, k=_kind: (
                 [rng.uniform(0.1 if k == "log_sum" else -2, 2, (2, 3, 4)).astype(dtype)],
                 {"axes": (0, 2), "keepdims": 1}))


def _norm_axes(n, axes, rank: int) -> tuple[int, ...]:
    out = set()
    for a in axes:
        if not -rank <= int(a) < rank:
            raise ModelError(f"node {n.name!r} ({n.op_type}): axis {int(a)} out of range "
                             f"for rank {rank}")
        out.add(int(a) % rank)
    return tuple(sorted(out))


def _reduce_converter(kind: str, axes_input: bool):
    def convert(ctx, n):
        rank = len(ctx.type(n.inputs[0]).shape)
        if axes_input:
            name = n.inputs[1] if len(n.inputs) > 1 else ""
            axes = ctx.const(name) if name else np.zeros(0, np.int64)
            if axes is None:
                raise ModelError(f"node {n.name!r} ({n.op_type}): the axes input {name!r} "
                                 "must be known at build time")
            axes = np.asarray(axes).reshape(-1).tolist()
        else:
            axes = list(n.attrs.get("axes", ()))
        if not axes:
            if n.attrs.get("noop_with_empty_axes", 0):
                return [Node.make("identity", n.name, n.inputs[:1], n.outputs[:1])]
            axes = list(range(rank))
        return [Node.make(f"reduce_{kind}", n.name, n.inputs[:1], n.outputs[:1],
                          axes=_norm_axes(n, axes, rank),
                          keepdims=int(n.attrs.get("keepdims", 1)))]
    return convert


_ONNX_NAMES = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax",
               "min": "ReduceMin", "prod": "ReduceProd", "l1": "ReduceL1", "l2": "ReduceL2",
               "sum_square": "ReduceSumSquare", "log_sum": "ReduceLogSum",
               "log_sum_exp": "ReduceLogSumExp"}
for _kind, _onnx in _ONNX_NAMES.items():
    onnx_op(_onnx, 1, emits=(f"reduce_{_kind}", "identity"))(
        _reduce_converter(_kind, axes_input=False))
    onnx_op(_onnx, 13 if _kind == "sum" else 18, emits=(f"reduce_{_kind}", "identity"),
            build_time_inputs=(1,))(_reduce_converter(_kind, axes_input=True))


# -- ArgMax, ArgMin ---------------------------------------------------------------------

def _arg_infer(types, node):
    x = types[0]
    if x.dtype == "bool":
        raise ModelError(f"node {node.name!r} ({node.op}): bool input is not supported")
    axis = node.attr("axis")
    shape = x.shape[:axis] + ((1,) if node.attr("keepdims") else ()) + x.shape[axis + 1:]
    return [TensorType(shape, "int64")]


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
    if inner > 1 and x.type.dtype in _FLOAT_DTYPES:
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


def _arg_numpy(fn):
    def run(xs, node):
        x, axis = xs[0], node.attr("axis")
        if node.attr("select_last_index"):  # first index of the flipped axis, mirrored
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        if node.attr("keepdims"):
            idx = np.expand_dims(idx, axis)
        return [np.asarray(idx, np.int64)]
    return run


def _arg_sample(rng, dtype):  # small integers: ties, which select_last_index decides
    return [rng.integers(0, 3, (3, 4, 2)).astype(dtype)], {"axis": 1, "keepdims": 0,
                                                           "select_last_index": 1}


register("argmax", "opaque", _arg_infer, lower=_arg_lower, numpy=_arg_numpy(np.argmax),
         float64=True, sample=_arg_sample)
register("argmin", "opaque", _arg_infer, lower=_arg_lower, numpy=_arg_numpy(np.argmin),
         float64=True, sample=_arg_sample)


def _arg_converter(op: str):
    def convert(ctx, n):
        rank = len(ctx.type(n.inputs[0]).shape)
        (axis,) = _norm_axes(n, [n.attrs.get("axis", 0)], rank)
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], axis=axis,
                          keepdims=int(n.attrs.get("keepdims", 1)),
                          select_last_index=int(n.attrs.get("select_last_index", 0)))]
    return convert


onnx_op("ArgMax", 1, emits=("argmax",))(_arg_converter("argmax"))
onnx_op("ArgMin", 1, emits=("argmin",))(_arg_converter("argmin"))
