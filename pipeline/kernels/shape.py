"""Shape operators: Reshape, Flatten, Squeeze, Unsqueeze, Concat, Expand; and
Shape, Size, ConstantOfShape, Range, EyeLike and the window functions (HannWindow,
HammingWindow, BlackmanWindow), whose values are known at build time.

Shape arguments must be known at build time (initializers, or values the
frontend computes from constants: ImportContext.const); a data-dependent
shape is a clear ModelError. Data movement (Transpose, Tile...) is in
pipeline/ops/movement.py, indexing (Gather, Slice, Pad) in pipeline/ops/index.py.
"""

from __future__ import annotations

import math

from pipeline.dsl.dims import dim_value
from pipeline.dsl.vector import ELEMENT_WORK, parallel_for
from pipeline.kernels.registry import lowering
from pipeline.kernels.runtime_dims import concat_dims


def _copy_lower(kb, node, ins, out, epilogue):
    """A reshape moves no data in a row-major layout: copy element by element."""
    with kb.loop(0, out.type.size, "i") as i:
        kb.store(out, i, kb.load(ins[0], i))


lowering("reshape", lower=_copy_lower)


CONCAT_PIECE = 1 << 14


def _concat_lower(kb, node, ins, out, epilogue):
    axis = node.attr("axis")
    shape = out.type.shape
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    offset = 0
    for k, x in enumerate(ins):
        width = x.type.shape[axis] * inner
        if not width:  # an empty input adds nothing
            continue
        # Each row of `width` in pieces of at most CONCAT_PIECE elements, the pieces
        # split over threads (a concat of one image has one row per input).
        pieces = -(-width // CONCAT_PIECE)
        step = -(-width // pieces)
        work = outer * width * ELEMENT_WORK
        with parallel_for(kb, outer * pieces, f"copy{k}", work=work) as item:
            o, start = item // pieces, item % pieces * step
            stop = width if pieces == 1 else kb.smin(start + step, width)
            with kb.loop(start, stop, "j") as j:
                src = o * width + j
                dst = o * (shape[axis] * inner) + (j + offset)
                kb.store(out, dst, kb.load(x, src))
        offset += width


lowering("concat", lower=_concat_lower, lower_dims=concat_dims)

lowering("expand", scalar=lambda kb, a, node: a[0])


def _iota_lower(kb, node, ins, out, epilogue, shapes=None):
    start, delta = dim_value(kb, node.attr("dims")[0]), node.attr("delta")
    with kb.loop(0, out.type.shape[0], "i") as i:
        value = kb.cast((start + i * delta).value, out.type.dtype)
        kb.store(out, i, epilogue(value, [i]) if epilogue is not None else value)


def _dim_values_lower(kb, node, ins, out, epilogue, shapes=None):
    for k, d in enumerate(node.attr("dims")):
        value = kb.cast(dim_value(kb, d).value, out.type.dtype)
        kb.store(out, k, epilogue(value, [k]) if epilogue is not None else value)


lowering("iota", lower=_iota_lower, lower_dims=_iota_lower)
lowering("dim_values", lower=_dim_values_lower, lower_dims=_dim_values_lower)
