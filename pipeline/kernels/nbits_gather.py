"""gather_nbits (pipeline/ops/nbits.py): rows of a table of 4- or 8-bit values, packed as
onnxruntime's GatherBlockQuantized stores them, dequantized as they are gathered.

The table stays packed in the library (a 4-bit embedding table is an eighth of its
float32 bytes); a call reads only the rows its indices pick: a decode step one row,
a prefill one per token. Per gathered row: the index is loaded and checked once (a
negative one counts from the end; one outside the table makes the kernel return an
error, as Gather does), then per block its scale and zero point, then the block's
values one by one, each less the zero point times the scale (the fused epilogue,
e.g. the position embeddings' Add, applied to it).
"""

from __future__ import annotations

from pipeline.kernels.nbits import packed_value, zero_point
from pipeline.kernels.registry import lowering


def _lower(kb, node, ins, out, epilogue):
    data, indices, scales = ins[:3]
    zp = ins[3] if node.attr("zero_points") != "none" else None
    bits, block, cols = node.attr("bits"), node.attr("block"), node.attr("cols")
    rows, nb = scales.type.shape
    row_bytes = data.type.shape[1]
    whole = cols // block

    def dequantize(g, k, blk, start, count: int) -> None:
        """Values start .. start + count of table row k, block blk, to output row g."""
        scale = kb.load(scales, k * nb + blk)
        zero = zero_point(kb, node, zp, k, blk, nb)
        with kb.loop(0, count, "c") as c:
            col = c + start
            value = packed_value(kb, data, k * row_bytes, col, bits)
            value = kb.fmul(kb.fsub(value, zero), scale)
            at = g * cols + col
            if epilogue is not None:
                value = epilogue(value, kb.unflatten(at, out.type.shape))
            kb.store(out, at, value)

    with kb.loop(0, indices.type.size, "g") as g:
        k = kb.checked_index(kb.load(indices, g), rows)
        if whole:
            with kb.loop(0, whole, "blk") as blk:
                dequantize(g, k, blk, blk * block, block)
        if cols % block:  # a last partial block
            dequantize(g, k, whole, whole * block, cols % block)


lowering("gather_nbits", lower=_lower)
