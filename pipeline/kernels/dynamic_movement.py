"""Lowerings of Reshape, Slice and Tile with runtime shape inputs (defined in
pipeline/ops/dynamic_movement.py): each writes its result at its runtime shape, the
shape operators compute that shape (failing, as a kernel error, on a reshape that
does not keep the element count, a zero step or a negative repeat)."""

from __future__ import annotations

from contextlib import contextmanager

from pipeline.kernels.registry import lowering


def _reshape_to_shape_lower(kb, node, ins, out, epilogue):
    """0 copies x's dimension (unless allowzero), -1 takes what is left; the product
    must be x's element count."""
    x, target = ins
    rank, size = target.type.size, x.type.size
    dims = []
    for d in range(rank):
        v = kb.index(kb.load(target, d))
        if d < len(x.type.shape) and not node.attr("allowzero"):
            v = kb.select(kb.compare("==", v, kb.i64(0)), x.type.shape[d], v)
        dims.append(v)
    known = kb.local(kb.i64(1))
    for v in dims:
        kb.set(known, kb.index(kb.get(known)) * kb.select(kb.compare("==", v, kb.i64(-1)), 1,
                                                          v))
    k = kb.index(kb.get(known))
    rest = kb.select(kb.compare("==", k, kb.i64(0)), 0, kb.i64(size) // kb.smax(k, 1))
    total = kb.local(kb.i64(1))
    for d, v in enumerate(dims):
        v = kb.select(kb.compare("==", v, kb.i64(-1)), rest, v)
        kb.fail_unless(v >= 0)
        kb.store(out, d, v)
        kb.set(total, kb.index(kb.get(total)) * v)
    kb.fail_unless(kb.compare("==", kb.get(total), kb.i64(size)))


def _reshape_to_lower(kb, node, ins, out, epilogue):
    with kb.loop(0, ins[0].type.size, "i") as i:
        kb.store(out, i, kb.load(ins[0], i))


lowering("reshape_to", lower=_reshape_to_lower)
lowering("reshape_to_shape", lower=_reshape_to_shape_lower)


def _clamp(kb, v, lo, hi):
    return kb.smin(kb.smax(v, lo), hi)


def _slice_axes(kb, node, x, starts, ends, axes, steps):
    """Per dimension (start, step, count) of ONNX Slice: the k-th start, end and step
    apply to dimension axes[k] (negative: from the end); negative starts and ends
    count from the end, then clamp ([0, dim] forward, [0, dim - 1] and [-1, dim - 1]
    backward); a zero step or an axis out of range fails the kernel."""
    rank = len(x.type.shape)
    out = [(0, 1, size) for size in x.type.shape]
    for k in range(axes.type.size):
        axis = kb.index(kb.load(axes, k))
        axis = kb.select(axis < 0, axis + rank, axis)
        kb.fail_unless(kb.inside(axis, 0, rank))
        s, e, step = (kb.index(kb.load(b, k)) for b in (starts, ends, steps))
        kb.fail_unless(kb.compare("!=", step, kb.i64(0)))
        forward = step > 0
        for d, dim in enumerate(x.type.shape):
            here = kb.compare("==", axis, kb.i64(d))
            sd = kb.select(s < 0, s + dim, s)
            ed = kb.select(e < 0, e + dim, e)
            sd = kb.select(forward, _clamp(kb, sd, 0, dim), _clamp(kb, sd, 0, dim - 1))
            ed = kb.select(forward, _clamp(kb, ed, 0, dim), _clamp(kb, ed, -1, dim - 1))
            span = kb.select(forward, ed - sd, sd - ed)
            stride = kb.select(forward, step, -step)
            count = kb.select(span > 0, kb.index(kb.b.sdiv((span + stride - 1).value,
                                                           stride.value)), 0)
            old = out[d]
            out[d] = tuple(kb.select(here, new, was) for new, was in
                           zip((sd, step, count), old, strict=True))
    return out


def _slice_to_shape_lower(kb, node, ins, out, epilogue):
    for d, (_, _, count) in enumerate(_slice_axes(kb, node, *ins)):
        kb.store(out, d, count)


@contextmanager
def _runtime_loop(kb, dims, name: str):
    """A loop over every index of the runtime shape `dims` (indices or ints): yields
    (flat index, the row-major index per dimension)."""
    count = kb.i64(1)
    for d in dims:
        count = count * d
    with kb.loop(0, count, name) as i:
        index, rest = [], i
        for d in reversed(dims):
            index.append(rest % d)
            rest = rest // d
        yield i, index[::-1]


def _slice_to_lower(kb, node, ins, out, epilogue):
    x = ins[0]
    axes = _slice_axes(kb, node, *ins)
    with _runtime_loop(kb, [c for _, _, c in axes], "i") as (i, index):
        at = 0
        for (start, step, _), j, stride in zip(axes, index, x.strides, strict=True):
            at = at + (start + j * step) * stride
        kb.store(out, i, kb.load(x, at))


lowering("slice_to", lower=_slice_to_lower)
lowering("slice_to_shape", lower=_slice_to_shape_lower)


def _tile_to_shape_lower(kb, node, ins, out, epilogue):
    x, repeats = ins
    for d, size in enumerate(x.type.shape):
        r = kb.index(kb.load(repeats, d))
        kb.fail_unless(r >= 0)
        kb.store(out, d, r * size)


def _tile_to_lower(kb, node, ins, out, epilogue):
    x, shape = ins[0], ins[-1]
    dims = [kb.index(kb.load(shape, d)) for d in range(len(x.type.shape))]
    with _runtime_loop(kb, dims, "i") as (i, index):
        at = 0
        for j, size, stride in zip(index, x.type.shape, x.strides, strict=True):
            at = at + (j % size) * stride
        kb.store(out, i, kb.load(x, at))


lowering("tile_to", lower=_tile_to_lower)
lowering("tile_to_shape", lower=_tile_to_shape_lower)
