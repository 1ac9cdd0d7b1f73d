"""layout_transform: NCHW <-> NCHW{b}c, where plain and channel-blocked tensors meet.

A blocked tensor [N, C/b, H, W, b] keeps b consecutive channels of one pixel
together, so one vector register holds them (transform/layout.py decides where
tensors are blocked). The transform is a pure permutation: no arithmetic. A blocked
tensor may carry padding channels past the plain tensor's C (a convolution whose
filters are not a multiple of b, padded with zero filters): going to NCHW, the
attribute `channels` (the plain C) drops them. Going to NCHW{b}c, a C that is no
multiple of b gets padding channels of zeros in the last block (a depthwise
convolution of 136 channels runs blocked on 144).
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from pipeline.dsl.vector import ELEMENT_WORK, parallel_for
from pipeline.kernels.registry import lowering
from pipeline.ops.geometry import layout_blocks


def layout_name(block: int) -> str:
    return f"NCHW{block}c" if block else "NCHW"


def _transpose(kb, rows: list) -> list:
    """The b x b transpose of `rows` (b vectors of b lanes, b a power of two) in
    log2(b) rounds of interleaving row k with row k + b/2 (shuffles in registers)."""
    b = len(rows)
    halves = [[x for k in range(lo, lo + b // 2) for x in (k, b + k)] for lo in (0, b // 2)]
    masks = [ir.Constant(ir.VectorType(ir.IntType(32), b), m) for m in halves]
    for _ in range(b.bit_length() - 1):
        rows = [kb.b.shuffle_vector(rows[k], rows[k + b // 2], mask)
                for k in range(b // 2) for mask in masks]
    return rows


def _lower(kb, node, ins, out, epilogue):
    """Walk the blocked side in order; each (image, channel block) is one work item.
    With a block of 8 or 16, b pixels at a time go through a b x b transpose in
    registers (whole-vector loads and stores on both sides; in a last block with
    padding channels, the rows past the plain channels are zeros going to blocked,
    not stored going to plain); the pixels left over, and the other blocks, go
    element by element. Padding channels of a blocked output are written as zeros."""
    src, dst = layout_blocks(node)
    plain, blocked = (out, ins[0]) if src else (ins[0], out)
    n_n, cb_n, h, w, b = blocked.type.shape
    channels = plain.type.shape[1]
    with parallel_for(kb, n_n * cb_n, "blocks",
                      work=blocked.type.size * ELEMENT_WORK) as item:
        base = item * (h * w * b)            # blocked offset of (n, cb, 0, 0, 0)
        n, cb = item // cb_n, item % cb_n
        pbase = (n * channels + cb * b) * (h * w)  # plain offset of (n, cb*b, 0, 0)
        # the padding channels of the last block (channels < cb_n * b) are dropped
        width = b if channels == cb_n * b else \
            min(channels - cb * b, b) if isinstance(cb, int) else kb.smin(channels - cb * b, b)
        padded = channels != cb_n * b

        def real(c: int):
            """i1: row c of this block is a plain channel (not padding)."""
            return kb.i64(c) < width

        done = 0
        if b in (8, 16):
            done = h * w // b * b
            with kb.loop(0, h * w // b, "q") as q:
                p0 = q * b
                if src:  # pixel rows of b channels -> channel rows of b pixels
                    rows = [kb.vload(ins[0], base + (p0 + j) * b, b) for j in range(b)]
                    for c, v in enumerate(_transpose(kb, rows)):
                        if padded:
                            with kb.if_(real(c)):
                                kb.vstore(out, pbase + c * (h * w) + p0, v)
                        else:
                            kb.vstore(out, pbase + c * (h * w) + p0, v)
                else:  # a padding row reads a real one (in bounds), then is zeroed
                    rows = [kb.vload(ins[0], pbase + (kb.smin(c, width - 1) if padded else c)
                                     * (h * w) + p0, b) for c in range(b)]
                    if padded:
                        rows = [kb.select(real(c), v, ir.Constant(v.type, None))
                                for c, v in enumerate(rows)]
                    for j, v in enumerate(_transpose(kb, rows)):
                        kb.vstore(out, base + (p0 + j) * b, v)
        if done < h * w:
            with kb.loop(done, h * w, "p") as p, kb.loop(0, width, "c") as c:
                bo = base + (p * b + c)
                po = pbase + (c * (h * w) + p)
                if src:
                    kb.store(out, po, kb.load(ins[0], bo))
                else:
                    kb.store(out, bo, kb.load(ins[0], po))
        if not src and padded:  # zeros: the storage holds an earlier tensor
            zero = kb.const(0, out.elem)
            with kb.loop(done, h * w, "z") as p, kb.loop(width, b, "zc") as c:
                kb.store(out, base + (p * b + c), zero)


lowering("layout_transform", lower=_lower)


def to_blocked(value: np.ndarray, block: int) -> np.ndarray:
    """A constant broadcastable to [N, C, H, W] in the layout of an NCHW{block}c tensor.

    Its channel dim (size C or 1) is split; a size-1 channel dim stays size 1 in both
    block dims, so it still broadcasts. Lower-rank constants are first given the
    leading 1s numpy broadcasting would add.
    """
    v = value.reshape((1,) * (4 - value.ndim) + value.shape)
    n, c, h, w = v.shape
    if c == 1:
        return v.reshape(n, 1, h, w, 1)
    return v.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2).copy()
