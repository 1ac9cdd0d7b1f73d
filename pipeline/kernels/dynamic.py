"""Lowerings of the operators whose output shape depends on values (defined in
pipeline/ops/dynamic.py, which says how the VM holds their results).

A kernel of an op held at its bound writes the result at its runtime shape into the
start of its bound-sized output (it counts first where the layout needs the count);
a kernel of an op allocated at run time takes the runtime shape as its last input.
Each shape op writes the int64 runtime shape the VM views or allocates with. None
needs scratch memory: the counting loops are quadratic (Unique cubic in the worst
case), which suits the few hundred elements of detection heads and masks.
"""

from __future__ import annotations

import math

from pipeline.dsl.types import I64
from pipeline.kernels.registry import lowering


def _counter(kb):
    return kb.local(kb.i64(0))


def _bump(kb, slot) -> None:
    kb.set(slot, kb.index(kb.get(slot)) + 1)


def _unset(kb, slot) -> None:
    """A flag slot (an i64 0/1 local) is 0."""
    return kb.compare("==", kb.get(slot), kb.i64(0))


def _count_nonzero(kb, x):
    n = _counter(kb)
    with kb.loop(0, x.type.size, "i") as i, kb.if_(kb.truth(kb.load(x, i))):
        _bump(kb, n)
    return kb.index(kb.get(n))


def _nonzero_lower(kb, node, ins, out, epilogue):
    """out[d, j] (rows of the runtime length n) = coordinate d of the j-th nonzero."""
    x = ins[0]
    n = _count_nonzero(kb, x)
    j = _counter(kb)
    with kb.loop(0, x.type.size, "i") as i, kb.if_(kb.truth(kb.load(x, i))):
        at = kb.index(kb.get(j))
        for d, coord in enumerate(kb.unflatten(i, x.type.shape) or [0]):
            kb.store(out, d * n + at, coord)
        _bump(kb, j)


def _nonzero_shape_lower(kb, node, ins, out, epilogue):
    kb.store(out, 0, kb.i64(max(len(ins[0].type.shape), 1)))
    kb.store(out, 1, _count_nonzero(kb, ins[0]))


lowering("nonzero", lower=_nonzero_lower)
lowering("nonzero_shape", lower=_nonzero_shape_lower)


def _corners(kb, boxes, at, center: int):
    """(y1, x1, y2, x2) of the box at element `at`, each pair ordered."""
    v = [kb.load(boxes, at + k) for k in range(4)]
    if center:  # [x_center, y_center, width, height]
        half = [kb.fmul(v[k], kb.fconst(0.5, v[k]), fast=False) for k in (2, 3)]
        v = [kb.fsub(v[1], half[1], fast=False), kb.fsub(v[0], half[0], fast=False),
             kb.fadd(v[1], half[1], fast=False), kb.fadd(v[0], half[0], fast=False)]
    return (kb.fmin(v[0], v[2]), kb.fmin(v[1], v[3]), kb.fmax(v[0], v[2]),
            kb.fmax(v[1], v[3]))


def _iou_above(kb, a, b, threshold):
    """i1: the intersection over union of boxes a and b (corners) > threshold."""
    def sub(p, q):
        return kb.fsub(p, q, fast=False)

    zero = kb.fconst(0.0, a[0])
    h = kb.fmax(sub(kb.fmin(a[2], b[2]), kb.fmax(a[0], b[0])), zero)
    w = kb.fmax(sub(kb.fmin(a[3], b[3]), kb.fmax(a[1], b[1])), zero)
    inter = kb.fmul(h, w, fast=False)
    area_a = kb.fmul(sub(a[2], a[0]), sub(a[3], a[1]), fast=False)
    area_b = kb.fmul(sub(b[2], b[0]), sub(b[3], b[1]), fast=False)
    union = sub(kb.fadd(area_a, area_b, fast=False), inter)
    iou = kb.fdiv(inter, union, fast=False)
    return kb.and_(kb.compare(">", union, zero), kb.compare(">", iou, threshold))


def _nms_lower(kb, node, ins, out, epilogue):
    """Per (batch, class): candidates in descending score order (ties to the lower
    index; each found by a scan for the next one), kept unless one kept before has
    an IoU above the threshold; rows [batch, class, box], the unused rows -1."""
    boxes, scores, limit_buf, iou_buf, thr_buf = ins
    n_batch, n_class, n_box = scores.type.shape
    center = node.attr("center_point_box")
    limit = kb.index(kb.load(limit_buf, 0))
    iou_t, thr = kb.load(iou_buf, 0), kb.load(thr_buf, 0)
    rows = _counter(kb)
    with kb.loop(0, n_batch, "b") as b, kb.loop(0, n_class, "c") as c:
        base, first = (b * n_class + c) * n_box, kb.index(kb.get(rows))
        prev = kb.local(kb.i64(-1))      # the candidate taken last (-1: none yet)
        done = kb.local(kb.as_index(limit <= 0))
        with kb.loop(0, n_box, "step"), kb.if_(_unset(kb, done)):
            best = kb.local(kb.i64(-1))
            p = kb.index(kb.get(prev))
            p_score = kb.load(scores, base + kb.smax(p, 0))
            with kb.loop(0, n_box, "i") as i:
                s = kb.load(scores, base + i)
                after = kb.or_(p < 0, kb.or_(kb.compare("<", s, p_score),
                                             kb.and_(kb.compare("==", s, p_score), i > p)))
                q = kb.index(kb.get(best))
                better = kb.or_(q < 0, kb.compare(">", s, kb.load(scores, base + kb.smax(q, 0))))
                with kb.if_(kb.and_(after, better)):
                    kb.set(best, i)
            q = kb.index(kb.get(best))
            stop = kb.or_(q < 0, kb.compare("<=", kb.load(scores, base + kb.smax(q, 0)), thr))
            with kb.if_(stop):
                kb.set(done, kb.i64(1))
            with kb.if_(kb.b.not_(stop)):
                kb.set(prev, q)
                box = _corners(kb, boxes, (b * n_box + q) * 4, center)
                hit = _counter(kb)
                with kb.loop(first, kb.index(kb.get(rows)), "k") as k:
                    other = kb.index(kb.load(out, k * 3 + 2))
                    kept = _corners(kb, boxes, (b * n_box + other) * 4, center)
                    with kb.if_(_iou_above(kb, box, kept, iou_t)):
                        kb.set(hit, kb.i64(1))
                with kb.if_(_unset(kb, hit)):
                    r = kb.index(kb.get(rows))
                    for col, v in enumerate((b, c, q)):
                        kb.store(out, r * 3 + col, v)
                    _bump(kb, rows)
                    with kb.if_(kb.index(kb.get(rows)) - first >= limit):
                        kb.set(done, kb.i64(1))
    with kb.loop(kb.index(kb.get(rows)) * 3, out.type.size, "u") as u:
        kb.store(out, u, kb.i64(-1))


def _nms_shape_lower(kb, node, ins, out, epilogue):
    n = _counter(kb)
    with kb.loop(0, ins[0].type.shape[0], "r") as r:
        with kb.if_(kb.index(kb.load(ins[0], r * 3)) >= 0):
            _bump(kb, n)
    kb.store(out, 0, kb.index(kb.get(n)))
    kb.store(out, 1, kb.i64(3))


lowering("nms", lower=_nms_lower)
lowering("nms_shape", lower=_nms_shape_lower)


class _Slices:
    """x seen as `n` slices to compare (ONNX Unique): its elements (axis -1), or its
    slices along `axis`, each [outer, inner] in row-major order."""

    def __init__(self, kb, x, axis: int):
        shape = x.type.shape
        self.kb, self.x = kb, x
        if axis == -1:
            self.outer, self.n, self.inner = 1, x.type.size, 1
        else:
            self.outer, self.n = math.prod(shape[:axis]), shape[axis]
            self.inner = math.prod(shape[axis + 1:])
        self.size = self.outer * self.inner

    def at(self, i, t):
        """Element t of slice i's flat offset in x."""
        if self.size == 1:
            return i
        return ((t // self.inner) * self.n + i) * self.inner + t % self.inner

    def compare(self, i, j):
        """An i64 slot: -1, 0 or 1 as slice i is below, equal to or above slice j
        (lexicographically: the first element that differs decides)."""
        kb, x = self.kb, self.x
        order = _counter(kb)
        with kb.loop(0, self.size, "t") as t, kb.if_(_unset(kb, order)):
            a, b = kb.load(x, self.at(i, t)), kb.load(x, self.at(j, t))
            with kb.if_(kb.compare("<", a, b)):
                kb.set(order, kb.i64(-1))
            with kb.if_(kb.compare(">", a, b)):
                kb.set(order, kb.i64(1))
        return order

    def equal(self, i, j):
        return _unset(self.kb, self.compare(i, j))

    def is_first(self, i):
        """i1: no slice before slice i equals it."""
        kb = self.kb
        seen = _counter(kb)
        with kb.loop(0, i, "f") as j, kb.if_(self.equal(j, i)):
            kb.set(seen, kb.i64(1))
        return _unset(kb, seen)

    def position(self, i, sorted_: int):
        """The slot of slice i among the unique ones: the distinct slices below it
        (sorted) or the first occurrences before it (i a first occurrence)."""
        kb = self.kb
        pos = _counter(kb)
        with kb.loop(0, self.n if sorted_ else i, "p") as j:
            below = kb.compare("<", kb.get(self.compare(j, i)), kb.i64(0)) if sorted_ \
                else j >= 0
            with kb.if_(below), kb.if_(self.is_first(j)):
                _bump(kb, pos)
        return kb.index(kb.get(pos))

    def count(self):
        """The number of distinct slices."""
        kb = self.kb
        u = _counter(kb)
        with kb.loop(0, self.n, "i") as i, kb.if_(self.is_first(i)):
            _bump(kb, u)
        return kb.index(kb.get(u))


def _unique_lower(kb, node, ins, out, epilogue):
    """Each first occurrence writes its value slice (at the runtime layout, u slices
    along the axis), its index or its count at its position; zeros past the u
    results (valid indices for row-wise kernels run over the bound)."""
    x, what = ins[0], node.attr("output")
    sl = _Slices(kb, x, node.attr("axis"))
    u = sl.count()
    with kb.loop(0, sl.n, "i") as i, kb.if_(sl.is_first(i)):
        pos = sl.position(i, node.attr("sorted"))
        if what == 0:
            with kb.loop(0, sl.size, "t") as t:
                o, q = (t // sl.inner, t % sl.inner) if sl.size > 1 else (0, 0)
                kb.store(out, (o * u + pos) * sl.inner + q, kb.load(x, sl.at(i, t)))
        elif what == 1:
            kb.store(out, pos, i)
        else:
            count = _counter(kb)
            with kb.loop(0, sl.n, "k") as k, kb.if_(sl.equal(k, i)):
                _bump(kb, count)
            kb.store(out, pos, kb.index(kb.get(count)))
    written = u * sl.size if what == 0 else u
    with kb.loop(written, out.type.size, "z") as z:
        kb.store(out, z, kb.const(0, out.elem))


def _unique_inverse_lower(kb, node, ins, out, epilogue):
    sl = _Slices(kb, ins[0], node.attr("axis"))
    with kb.loop(0, sl.n, "i") as i:
        first = kb.local(i)  # the first slice equal to slice i
        with kb.loop(0, i, "f") as j, kb.if_(sl.equal(j, i)):
            with kb.if_(kb.compare("==", kb.get(first), i)):
                kb.set(first, j)
        kb.store(out, i, sl.position(kb.index(kb.get(first)), node.attr("sorted")))


def _unique_shape_lower(kb, node, ins, out, epilogue):
    x, axis = ins[0], node.attr("axis")
    u = _Slices(kb, x, axis).count()
    if axis == -1 or node.attr("output") != 0:  # a 1-d result
        kb.store(out, 0, u)
        return
    for d, size in enumerate(x.type.shape):
        kb.store(out, d, u if d == axis else kb.i64(size))


lowering("unique", lower=_unique_lower)
lowering("unique_inverse", lower=_unique_inverse_lower)
lowering("unique_shape", lower=_unique_shape_lower)


def _topk_shape_lower(kb, node, ins, out, epilogue):
    x, axis = ins[0], node.attr("axis")
    k = kb.index(kb.load(ins[1], 0))
    kb.fail_unless(kb.inside(k, 0, x.type.shape[axis] + 1))
    for d, size in enumerate(x.type.shape):
        kb.store(out, d, k if d == axis else kb.i64(size))


lowering("topk_shape", lower=_topk_shape_lower)


def _as_f64(kb, buf):
    return kb.cast(kb.load(buf, 0), "float64")


def _range_shape_lower(kb, node, ins, out, epilogue):
    start, limit, delta = (_as_f64(kb, b) for b in ins)
    steps = kb.intrinsic("ceil", kb.fdiv(kb.fsub(limit, start, fast=False), delta, fast=False))
    kb.store(out, 0, kb.index(kb.b.fptosi(kb.fmax(steps, kb.fconst(0.0, steps)), I64)))


def _range_lower(kb, node, ins, out, epilogue):
    n = kb.index(kb.load(ins[3], 0))
    if out.type.dtype in ("float32", "float64", "float16"):
        start, delta = _as_f64(kb, ins[0]), _as_f64(kb, ins[2])
        with kb.loop(0, n, "i") as i:
            v = kb.fadd(start, kb.fmul(kb.cast(i.value, "float64"), delta, fast=False),
                        fast=False)
            kb.store(out, i, kb.cast(v, out.type.dtype))
        return
    start, delta = kb.load(ins[0], 0), kb.load(ins[2], 0)
    with kb.loop(0, n, "i") as i:
        step = kb.cast(i.value, out.type.dtype)
        kb.store(out, i, kb.arith("add", start, kb.arith("mul", step, delta)))


lowering("range", lower=_range_lower)
lowering("range_shape", lower=_range_shape_lower)


def _runtime_count(kb, shape_buf):
    """The element count of the shape held by the int64 vector `shape_buf`."""
    count = kb.local(kb.i64(1))
    for d in range(shape_buf.type.size):
        kb.set(count, kb.index(kb.get(count)) * kb.index(kb.load(shape_buf, d)))
    return kb.index(kb.get(count))


def _fill_lower(kb, node, ins, out, epilogue):
    value = kb.const(node.attr("value"), out.elem) if out.type.dtype != "float16" else \
        kb.cast(kb.const(node.attr("value"), kb.f32(0).type), "float16")
    with kb.loop(0, _runtime_count(kb, ins[-1]), "i") as i:
        kb.store(out, i, value)


def _fill_shape_lower(kb, node, ins, out, epilogue):
    for d in range(ins[0].type.size):
        v = kb.index(kb.load(ins[0], d))
        kb.fail_unless(v >= 0)
        kb.store(out, d, v)


lowering("fill", lower=_fill_lower)
lowering("fill_shape", lower=_fill_shape_lower)


def _expand_to_shape_lower(kb, node, ins, out, epilogue):
    """Dimension d of the result: the shape's, or x's where the shape has 1; a
    dimension of x other than 1 must equal the shape's (or it has 1), else fail."""
    x, s = ins
    rank = out.type.size
    xs = (1,) * (rank - len(x.type.shape)) + tuple(x.type.shape)
    for d in range(rank):
        k = d - (rank - s.type.size)
        want = kb.index(kb.load(s, k)) if k >= 0 else kb.i64(1)
        if xs[d] == 1:
            kb.fail_unless(want >= 0)
            kb.store(out, d, want)
        else:
            kb.fail_unless(kb.or_(kb.compare("==", want, kb.i64(1)),
                                  kb.compare("==", want, kb.i64(xs[d]))))
            kb.store(out, d, kb.i64(xs[d]))


def _expand_to_lower(kb, node, ins, out, epilogue):
    x, shape = ins[0], ins[-1]
    rank = shape.type.size
    xs = (1,) * (rank - len(x.type.shape)) + tuple(x.type.shape)
    strides = [math.prod(xs[d + 1:]) if xs[d] != 1 else 0 for d in range(rank)]
    dims = [kb.index(kb.load(shape, d)) for d in range(rank)]
    with kb.loop(0, _runtime_count(kb, shape), "i") as i:
        rest, at = i, 0
        for d in reversed(range(rank)):
            if strides[d]:
                at = at + (rest % dims[d]) * strides[d]
            rest = rest // dims[d]
        kb.store(out, i, kb.load(x, at))


lowering("expand_to", lower=_expand_to_lower)
lowering("expand_to_shape", lower=_expand_to_shape_lower)
