"""The index tables of the data-movement ops (Transpose, Tile, DepthToSpace,
SpaceToDepth): output element (i0, .., ik) reads input element sum_d table_d[i_d],
one table of flat-offset contributions per output axis (OUTSIDE marks a position
outside the input). Both the numpy references (pipeline/ops/movement.py remap_numpy)
and the lowering (pipeline/kernels/movement.py remap_lower) compute from them."""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import row_major_strides

# A table entry this negative marks an output position outside the input
# (constant padding): any sum containing it is negative, whatever the others add.
OUTSIDE = -(1 << 40)


def transpose_tables(node, x, out):
    strides = row_major_strides(x.shape)
    return [np.arange(d, dtype=np.int64) * strides[p]
            for d, p in zip(out.shape, node.attr("perm"), strict=True)]


def tile_tables(node, x, out):
    strides = row_major_strides(x.shape)
    return [np.arange(o, dtype=np.int64) % d * s
            for o, d, s in zip(out.shape, x.shape, strides, strict=True)]


def depth_to_space_tables(node, x, out):
    """DCR: channel (i * b + j) * C' + c; CRD: c * b * b + i * b + j, where (i, j)
    is the position inside the output's b x b block."""
    b, crd = node.attr("blocksize"), node.attr("mode") == "CRD"
    sn, sc, sh, sw = row_major_strides(x.shape)
    _, c_out, h_out, w_out = out.shape
    h, w = np.arange(h_out, dtype=np.int64), np.arange(w_out, dtype=np.int64)
    block_row, block_col = (b * sc, sc) if crd else (b * c_out * sc, c_out * sc)
    return [np.arange(out.shape[0], dtype=np.int64) * sn,
            np.arange(c_out, dtype=np.int64) * ((b * b if crd else 1) * sc),
            h % b * block_row + h // b * sh, w % b * block_col + w // b * sw]


def space_to_depth_tables(node, x, out):
    """Output channel (i * b + j) * C + c (DCR; CRD: c * b * b + i * b + j) reads
    input channel c at row offset i, column offset j of the block."""
    b = node.attr("blocksize")
    sn, sc, sh, sw = row_major_strides(x.shape)
    c = x.shape[1]
    oc = np.arange(out.shape[1], dtype=np.int64)
    channel, block = (oc // (b * b), oc % (b * b)) if node.attr("mode") == "CRD" else \
        (oc % c, oc // c)
    return [np.arange(out.shape[0], dtype=np.int64) * sn,
            channel * sc + block // b * sh + block % b * sw,
            np.arange(out.shape[2], dtype=np.int64) * b * sh,
            np.arange(out.shape[3], dtype=np.int64) * b * sw]
