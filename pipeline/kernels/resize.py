"""Resize and Upsample: nearest (all rounding modes), n-linear and cubic
interpolation with the ONNX coordinate transformation modes, from scales or sizes.

Per output axis the source coordinate of every output index is computed here,
in float32 as onnxruntime does, and turned into taps: (input offset, weight)
tables, one tap per axis for nearest (an index remap), two for linear, four for
cubic. An output element is the weighted sum over every combination of one tap
per axis; axes that need no blending (batch, channels) have a single tap.
"""

from __future__ import annotations

import itertools

from pipeline.dsl.builder import F32
from pipeline.dsl.vector import ELEMENT_WORK, parallel_nest
from pipeline.kernels.movement import axis_term
from pipeline.kernels.registry import lowering
from pipeline.ops.resize_taps import taps_of


def _resize_lower(kb, node, ins, out, epilogue):
    """Sum over every combination of one tap per axis of weight product x input."""
    taps = taps_of(node, ins[0].type, out.type)
    work = out.type.size * ELEMENT_WORK * 2
    with parallel_nest(kb, out.type.shape, "o", work=work) as index:
        axes = [[(axis_term(kb, offsets, i),
                  None if w is None else kb.load_table(kb.table(w.tolist(), F32), i))
                 for offsets, w in axis] for i, axis in zip(index, taps, strict=True)]
        value = None
        for combo in itertools.product(*axes):
            offset, weight = 0, None
            for term, w in combo:
                offset = offset + term
                if w is not None:
                    weight = w if weight is None else kb.fmul(weight, w)
            term = kb.load(ins[0], offset)
            term = term if weight is None else kb.fmul(weight, term)
            value = term if value is None else kb.fadd(value, term)
        if epilogue is not None:
            value = epilogue(value, index)
        kb.store(out, kb.dot(index, out.strides), value)


lowering("resize", lower=_resize_lower)
