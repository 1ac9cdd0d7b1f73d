"""Lowerings with runtime dimensions inside (docs/vm.md, "Symbolic dimensions"): for
kernels a symbol reaches off their leading rows (a batched matmul, softmax or
transpose over a symbolic sequence length when FuseAttention did not fuse them).
Shapes hold i64 Index values where the spec has symbols (pipeline/dsl/dims.py), so
these are plain scalar loop nests, correct for every shape within bounds; the fast
paths are the rows kernels and attention_dims.py. A thread team's outlined body re-reads
the runtime dimensions (`shapes()`: dsl/dims.py reload_shapes).
"""

from __future__ import annotations

import itertools
from functools import reduce

import llvmlite.ir as ir
import numpy as np

from pipeline.dsl.index import raw
from pipeline.dsl.nibbles import SUB_BYTE
from pipeline.dsl.vector import MIN_WORK_PER_THREAD, memcpy, parallel_for
from pipeline.errors import GraphError


def _prod(dims):
    return reduce(lambda a, b: a * b, dims, 1)


def _batch_offset(index, shape, strides, rank: int):
    """The offset of the batch dims of an operand of `shape` (numpy broadcasting
    against an output of `rank` dims, its two matrix dims last) for output `index`."""
    lead = rank - len(shape)
    total = 0
    for d in range(len(shape) - 2):
        if not (isinstance(shape[d], int) and shape[d] == 1):
            total = total + index[lead + d] * strides[d]
    return total


def matmul_dims(kb, node, ins, out, epilogue, shapes=None) -> None:
    """out[..., i, j] = sum_k a[..., i, k] b[..., k, j] (trans_a, trans_b swap a
    matrix's dims), batch dims broadcast."""
    a, b = ins
    sa, sb, rank = a.type.shape, b.type.shape, len(out.type.shape)
    if len(sa) < 2 or len(sb) < 2 or a.type.dtype != "float32":
        raise GraphError(f"node {node.name!r} (matmul): runtime dimensions need float32 "
                         "operands of rank 2 or more")
    ta, tb = node.attr("trans_a"), node.attr("trans_b")
    k_n = sa[-2] if ta else sa[-1]
    ra, ka = (a.strides[-1], a.strides[-2]) if ta else (a.strides[-2], a.strides[-1])
    kb_, cb = (b.strides[-1], b.strides[-2]) if tb else (b.strides[-2], b.strides[-1])
    acc = kb.local(kb.f32(0.0))
    with kb.nest(out.type.shape) as index:
        i, j = index[-2], index[-1]
        a0 = _batch_offset(index, sa, a.strides, rank) + i * ra
        b0 = _batch_offset(index, sb, b.strides, rank) + j * cb
        kb.set(acc, kb.f32(0.0))
        with kb.loop(0, k_n, "k") as k:
            kb.set(acc, kb.fadd(kb.get(acc), kb.fmul(kb.load(a, a0 + k * ka),
                                                     kb.load(b, b0 + k * kb_))))
        value = kb.get(acc)
        kb.store(out, kb.dot(index, out.strides),
                 epilogue(value, index) if epilogue is not None else value)


def softmax_dims(kb, node, ins, out, epilogue, shapes=None) -> None:
    """softmax / log_softmax along `axis` (with `flatten`: over everything from it)."""
    x = ins[0]
    shape, axis = x.type.shape, node.attr("axis")
    if epilogue is not None or x.type.dtype != "float32":
        raise GraphError(f"node {node.name!r} ({node.op}): runtime dimensions need a float32 "
                         "input and no fused epilogue")
    outer = _prod(shape[:axis])
    length = _prod(shape[axis:]) if node.attr("flatten") else shape[axis]
    inner = 1 if node.attr("flatten") else _prod(shape[axis + 1:])
    top, total = kb.local(kb.f32(0.0)), kb.local(kb.f32(0.0))
    with kb.loop(0, outer, "o") as o, kb.loop(0, inner, "c") as c:
        base = o * length * inner + c
        kb.set(top, kb.f32(-3.0e38))
        kb.set(total, kb.f32(0.0))
        with kb.loop(0, length, "j") as j:
            kb.set(top, kb.fmax(kb.get(top), kb.load(x, base + j * inner)))
        with kb.loop(0, length, "j") as j:
            shifted = kb.fsub(kb.load(x, base + j * inner), kb.get(top))
            kb.set(total, kb.fadd(kb.get(total), kb.exp(shifted)))
        log_total = kb.intrinsic("log", kb.get(total))
        with kb.loop(0, length, "j") as j:
            shifted = kb.fsub(kb.load(x, base + j * inner), kb.get(top))
            value = (kb.fsub(shifted, log_total) if node.op == "log_softmax"
                     else kb.fdiv(kb.exp(shifted), kb.get(total)))
            kb.store(out, base + j * inner, value)


def transpose_dims(kb, node, ins, out, epilogue, shapes=None) -> None:
    """out[index] = x[index permuted back]."""
    x, perm = ins[0], node.attr("perm")
    with kb.nest(out.type.shape) as index:
        value = kb.load(x, kb.dot(index, [x.strides[p] for p in perm]))
        kb.store(out, kb.dot(index, out.strides),
                 epilogue(value, index) if epilogue is not None else value)


def concat_dims(kb, node, ins, out, epilogue, shapes=None) -> None:
    """out = the inputs one after another along `axis` (a KV cache growing by a step):
    per outer index, each input's run copied with one memcpy (element by element, the
    decode step's cache copies took 2-5% of a big decoder's step); sub-byte dtypes and
    a fused epilogue element by element. With a static dimension before the axis (a
    KV cache's heads) the copies split over the thread team by it: at two threads one
    thread copying a big decoder's 3.2 MB of cache left the other idle."""
    axis, shape = node.attr("axis"), out.type.shape
    size = np.dtype(out.type.dtype).itemsize if out.type.dtype not in SUB_BYTE else 0
    if size and epilogue is None:
        # x86 only: its non-temporal stores need an sfence before another thread
        # reads them, which the c target (no threads) and the others do not emit
        streamed = node.attr("streamed", False) and getattr(kb, "threads", True) and \
            kb.module.triple.startswith("x86_64")
        heads = shape[axis - 1] if axis else 1
        if shapes is None or not isinstance(heads, int) or heads < 2:
            _copy_runs(kb, ins, out, [x.type.shape for x in ins], shape, axis, size, streamed)
            return
        with parallel_for(kb, heads, "heads", work=heads * MIN_WORK_PER_THREAD) as h:
            types = shapes()
            _copy_runs(kb, ins, out, [types[kb.buffers.index(x)].shape for x in ins],
                       types[kb.buffers.index(out)].shape, axis, size, streamed, h, heads)
        return
    outer, inner = _prod(shape[:axis]), _prod(shape[axis + 1:])
    row, offset = shape[axis] * inner, 0
    for k, x in enumerate(ins):
        width = x.type.shape[axis] * inner
        with kb.loop(0, outer, f"o{k}") as o, kb.loop(0, width, f"j{k}") as j:
            value = kb.load(x, o * width + j)
            kb.store(out, o * row + offset + j, value if epilogue is None else
                     epilogue(value, kb.unflatten(o * row + offset + j, shape)))
        offset = offset + width


def _copy_runs(kb, ins, out, in_shapes, shape, axis: int, size: int, streamed: bool,
               head=None, heads: int = 1) -> None:
    """concat_dims' memcpy (`streamed`: _streamed_copy) per outer index and input
    (`in_shapes`, `shape`: those of the function kb builds); with `head`, only the
    outer indices of that index of the `heads` dimension before the axis."""
    outer = _prod(shape[:axis] if head is None else shape[:axis - 1])
    inner = _prod(shape[axis + 1:])
    row, offset = shape[axis] * inner, 0
    for k, (x, x_shape) in enumerate(zip(ins, in_shapes, strict=True)):
        width = x_shape[axis] * inner
        with kb.loop(0, outer, f"o{k}") as o:
            o = o if head is None else o * heads + head
            dst, src, nbytes = kb.gep(out, o * row + offset), kb.gep(x, o * width), \
                raw(width * size)
            if streamed:
                _streamed_copy(kb, dst, src, nbytes)
            else:
                memcpy(kb.b, dst, src, nbytes)
        offset = offset + width
    if streamed:  # the streamed stores done before the team's join
        sfence = kb.module.globals.get("llvm.x86.sse.sfence") or ir.Function(
            kb.module, ir.FunctionType(ir.VoidType(), []), name="llvm.x86.sse.sfence")
        kb.b.call(sfence, [])


# The bytes a streamed store writes: a cache line, an AVX-512 vector.
_LINE = 64


def _streamed_copy(kb, dst: ir.Value, src: ir.Value, nbytes: ir.Value) -> None:
    """memcpy(dst, src, nbytes) past the caches: from a 64-byte-aligned dst, a whole
    number of lines goes by non-temporal vector stores (x86 vmovntps; they need an
    sfence before another thread reads them), anything else by memcpy. For an output
    nothing in the run reads (a present KV cache, attribute streamed: the
    transform/attention_split.py module doc): written through the caches, its lines
    evicted the weights the next kernels read, and each write first read its line."""
    b, i64, i8 = kb.b, ir.IntType(64), ir.IntType(8)
    odd = b.and_(b.or_(b.ptrtoint(dst, i64), nbytes), ir.Constant(i64, _LINE - 1))
    with b.if_else(b.icmp_unsigned("==", odd, ir.Constant(i64, 0)), likely=True) as (
            lines, other):
        with lines:
            vector, hint = ir.VectorType(ir.IntType(32), _LINE // 4), b.module.add_metadata(
                [ir.Constant(ir.IntType(32), 1)])
            count = kb.index(b.udiv(nbytes, ir.Constant(i64, _LINE)))
            with kb.loop(0, count, "line") as k:
                at = raw(k * _LINE)
                line = b.load(b.gep(src, [at], source_etype=i8), typ=vector, align=1)
                b.store(line, b.gep(dst, [at], source_etype=i8), align=_LINE).set_metadata(
                    "nontemporal", hint)
        with other:
            memcpy(b, dst, src, nbytes)


def conv_dims(kb, node, ins, out, epilogue, shapes=None) -> None:
    """conv2d / conv3d over a symbolic spatial size: out[n, oc, o...] = bias[oc] +
    sum over the group's input channels and the taps of x * w, a tap outside the
    input skipped by a select on a clamped load (a scalar nest, one thread)."""
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    if x.type.dtype != "float32":
        raise GraphError(f"node {node.name!r} ({node.op}): runtime dimensions need float32")
    oc_n, icg, *kernel = w.type.shape
    spatial, d = x.type.shape[2:], len(w.type.shape) - 2
    strides, dilations, pads = node.attr("strides"), node.attr("dilations"), node.attr("pads")
    per_group = oc_n // node.attr("groups")
    acc = kb.local(kb.f32(0.0))
    with kb.nest(out.type.shape, "o") as index:
        n, oc, *o = index
        kb.set(acc, kb.load(bias, oc) if bias is not None else kb.f32(0.0))
        first = (oc // per_group) * icg if per_group != oc_n else 0
        taps = []  # per spatial dim: (clamped offset, inside) of each kernel position
        for i in range(d):
            row = []
            for k in range(kernel[i]):
                at = o[i] * strides[i] + (k * dilations[i] - pads[i])
                row.append((kb.clamp(at, spatial[i]) * x.strides[2 + i],
                            kb.inside(at, 0, spatial[i])))
            taps.append(row)
        with kb.loop(0, icg, "ic") as ic:
            x0 = n * x.strides[0] + (first + ic) * x.strides[1]
            w0 = oc * w.strides[0] + ic * w.strides[1]
            for k, tap in enumerate(itertools.product(*taps)):  # weights' order
                at, ok = x0, None
                for offset, inside in tap:
                    at = at + offset
                    ok = inside if ok is None else kb.and_(ok, inside)
                weight = kb.load(w, w0 + k)
                term = kb.fmul(kb.load(x, at), weight)
                kb.set(acc, kb.select(ok, kb.fadd(kb.get(acc), term), kb.get(acc)))
        value = kb.get(acc)
        kb.store(out, kb.dot(index, out.strides),
                 epilogue(value, index) if epilogue is not None else value)
