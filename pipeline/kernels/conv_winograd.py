"""conv2d_winograd_nchwc: 3x3 stride-1 convolution by Winograd F(m x m, 3 x 3).

Each m x m block of outputs (a "tile") is computed from an (m+2) x (m+2) input
patch d and the 3x3 filter g as  Y = Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A  (Lavin & Gray,
"Fast Algorithms for Convolutional Neural Networks", 2015): the P = (m+2)²
elementwise products, summed over input channels, are P independent GEMMs
(tiles x C) @ (C x OC) with 9m²/P times fewer multiply-adds than direct
convolution (4x for m = 4, 2.25x for m = 2).

Layouts (b = vector width, K = output blocks per register tile):
  x    [N, C/b, H, W, b]        (NCHW{b}c)
  u    [P, OC/(K*b), C, K*b]    (G g Gᵀ, transformed at build time: pack_weight)
  bias [OC]                     (optional)
  out  [N, OC/b, OH, OW, b]     (NCHW{b}c)

Vector lanes are channels, so both transforms are plain vector adds and
multiply-adds of whole NCHW{b}c vectors. The tiles of an image are numbered
row-major; a work item is a run of S*T consecutive tiles (T per register tile):
  1. input transform of its tiles into V [P][S*T][C] (stack), out-of-image
     taps (padding, and past the last tile) read as zeros;
  2. for each position p and output group: for each of the S register tiles,
     T tiles x K blocks of accumulators over C (weights u[p] stay in cache
     across the S register tiles), into M [P][S*T][OC] (stack);
  3. output transform of each tile and block, the epilogue (bias, residual, relu)
     applied before the store of each output vector inside the image.
"""

from __future__ import annotations

import numpy as np

from pipeline.dsl.vector import apply_epilogue, fma, parallel_for, prefetch, vconst, zeros
from pipeline.errors import ModelError
from pipeline.kernels.conv_blocked import PREFETCH_BYTES, choose_k, tile_width
from pipeline.kernels.registry import lowering

# The transform matrices (Lavin & Gray 2015) for F(2, 3) and F(4, 3): Bᵀ, G, Aᵀ.
MATRICES = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], float)),
}


# The tile size AlterOpLayout uses: F(4x4, 3x3).
TILE = 4


# Transformed-weight bytes per output tile above which the direct blocked conv is
# faster. Measured on the 2-core AVX-512 build machine, one thread, conv + relu,
# time Winograd / direct: 64ch 56x56 0.57, 128ch 28x28 0.37, 256ch 14x14 0.66,
# 256ch 12x12 0.45, 64ch 12x12 0.56, 32ch 16x16 0.66 (all <= 0.6 MiB per tile);
# 512ch 14x14 0.94 (2.4 MiB per tile), 512ch 7x7 1.28 (9.4 MiB per tile).
MAX_WEIGHT_BYTES_PER_TILE = 2 << 20


# Bytes of stack scratch (V and M) a work item may use; S is the largest that fits.
SCRATCH_BYTES = 1 << 20


# Transformed-weight bytes from which a conv whose tiles fit one work item splits its
# channel groups over two threads rather than its tiles (plan). Node minimum, 1 / 2
# threads, tiles -> channel groups: alexnet's 12x12 256->384 (13.5 MiB) 1.78 / 1.48
# -> 1.29 / 0.71 ms, zfnet512's 256->512 (18 MiB) 2.40 / 1.27 -> 1.39 / 1.01; but
# inception_v1's 13x13 144->288 (5.7 MiB) 0.53 / 0.55 -> 0.62 / 0.42, squeezenet's
# 64->256 (2.25 MiB) 0.34 / 0.33 -> 0.37 / 0.24: with smaller weights the larger
# item's scratch (all its tiles) and the input transformed twice cost more at one
# thread than reading the weights twice did, so these keep their plan.
SPLIT_WEIGHT_BYTES = 8 << 20


def tiles(oh: int, ow: int, m: int) -> tuple[int, int]:
    """Tile rows and columns of an oh x ow output."""
    return -(-oh // m), -(-ow // m)


def plan(oh: int, ow: int, c: int, oc: int, m: int, vw: int) -> tuple[int, int, int]:
    """(K, T, S): output blocks and tiles per register tile, register tiles per work item."""
    th, tw = tiles(oh, ow, m)
    count = th * tw
    k = choose_k(count, oc // vw, vw)
    t = tile_width(count, k, vw)
    per_tile = (m + 2) ** 2 * (c + oc) * 4
    register_tiles = -(-count // t)
    most = max(1, SCRATCH_BYTES // (per_tile * t))
    if (register_tiles <= min(most, 2) and oc // (k * vw) > 1
            and (m + 2) ** 2 * c * oc * 4 >= SPLIT_WEIGHT_BYTES):
        # One work item of all the tiles, which _lower splits by output channel
        # groups for two threads: each streams its half of the transformed weights
        # once. (Two items of tiles each streamed them all: alexnet's 12 x 12 layer,
        # 14 MiB of them, ran no faster on two threads than on one.)
        return k, t, register_tiles
    # at least two work items when there are two register tiles (two threads)
    return k, t, max(1, min(-(-register_tiles // 2), most))


def worth_it(node, weight: np.ndarray, oh: int, ow: int, vw: int) -> bool:
    """Whether AlterOpLayout should lower this conv2d (constant OIHW `weight`, an
    oh x ow output) with Winograd: 3x3, stride 1, no dilation, one group, channel
    counts multiples of the vector width, and few enough transformed-weight bytes
    (4x the direct ones) per tile of the image: every work item streams them all."""
    oc, c, kh, kw = weight.shape
    th, tw = tiles(oh, ow, TILE)
    weight_bytes = (TILE + 2) ** 2 * c * oc * 4
    return ((kh, kw) == (3, 3) and tuple(node.attr("strides")) == (1, 1)
            and node.attr("groups") == 1 and tuple(node.attr("dilations")) == (1, 1)
            and c % vw == 0 and oc % vw == 0
            and weight_bytes <= MAX_WEIGHT_BYTES_PER_TILE * th * tw)


def pack_weight(weight: np.ndarray, m: int, ob: int, k: int) -> np.ndarray:
    """OIHW 3x3 weights -> u [P, OC/(k*ob), C, k*ob] with u[p] = (G g Gᵀ) at p."""
    oc, c = weight.shape[:2]
    _, g, _ = MATRICES[m]
    a = m + 2
    # g w gᵀ per (o, c) as two batched matmuls (BLAS; einsum took 7x longer), then
    # the transform's (i, j) first
    u = (g @ weight.astype(np.float64) @ g.T).transpose(2, 3, 0, 1)
    u = u.reshape(a * a, oc // (k * ob), k * ob, c).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(u, dtype=np.float32)


def _matmul(kb, mat: np.ndarray, rows: list) -> list:
    """mat @ rows for rows a list of equal-length lists of vectors: each result is
    a sum of the nonzero-coefficient terms (±1 as adds/subtracts, others as FMAs)."""
    out = []
    for coeffs in mat:
        row = []
        for j in range(len(rows[0])):
            acc = None
            for c, r in zip(coeffs, rows, strict=True):
                if c == 0:
                    continue
                v = r[j]
                if acc is None:
                    acc = v if c == 1 else kb.fmul(v, vconst(c, v.type.count))
                elif c == 1:
                    acc = kb.fadd(acc, v)
                elif c == -1:
                    acc = kb.fsub(acc, v)
                else:
                    acc = fma(kb, v, vconst(c, v.type.count), acc)
            row.append(acc)
        out.append(row)
    return out


def _transform(kb, mat: np.ndarray, d: list) -> list:
    """mat @ d @ matᵀ on a square grid `d` of vectors."""
    def transpose(grid):
        return [list(col) for col in zip(*grid, strict=True)]

    return transpose(_matmul(kb, mat, transpose(_matmul(kb, mat, d))))


def _products(kb, u, v, mm, dims, tiling, ocgs) -> None:
    """Step 2 of `_lower`: the P GEMMs mm[p] = v[p] @ u[p] of one work item (its
    s_end register tiles of T tiles each, K output blocks; the output channel groups
    ocgs[0] <= ocg < ocgs[1]), accumulated in registers."""
    p_n, ocg_n, c_n, kob, ob = dims
    s_end, t_n, k_n, span = tiling
    with kb.loop(0, p_n, "p") as p, kb.loop(*ocgs, "ocg") as ocg, \
            kb.loop(0, s_end, "s_mm") as s:
        accs = [[kb.local(zeros(ob)) for _ in range(t_n)] for _ in range(k_n)]
        u_row = (p * ocg_n + ocg) * (c_n * kob)
        v_row = (p * span + s * t_n) * c_n
        with kb.loop(0, c_n, "c") as c:
            w_c = u_row + c * kob
            wv = [kb.vload(u, w_c + k * ob, ob) for k in range(k_n)]
            for k in range(k_n):
                prefetch(kb, u, w_c + (PREFETCH_BYTES // 4 + k * ob))
            for t in range(t_n):
                xv = kb.splat(kb.load(v, v_row + t * c_n + c), ob)
                for k in range(k_n):
                    kb.set(accs[k][t], fma(kb, xv, wv[k], kb.get(accs[k][t])))
        for t in range(t_n):
            for k in range(k_n):
                off = ((p * span + s * t_n + t) * ocg_n + ocg) * kob + k * ob
                kb.vstore(mm, off, kb.get(accs[k][t]))


def _transform_input(kb, x, v, where: tuple, geometry: tuple) -> None:
    """Step 1 of a work item: Bᵀ d B of every input tile (n, first + tile for tile <
    n_tiles: `where`) and input channel block into the scratch `v`, tiles and blocks
    in run-time loops (one copy of the code). geometry: (m, top pad, left pad, tiles
    per row, tiles per item, channels)."""
    n, first, n_tiles = where
    m, pt, pl, tw_n, span, c_n = geometry
    _, icb_n, h, wd, ib = x.type.shape
    a = m + 2
    bt = MATRICES[m][0]
    with kb.loop(0, n_tiles, "tile_in") as tile, kb.loop(0, icb_n, "icb") as icb:
        plane = (n * icb_n + icb) * (h * wd * ib)
        q = first + tile
        ih0, iw0 = (q // tw_n) * m - pt, (q % tw_n) * m - pl
        rows_ok = [kb.below(ih0 + i, h) for i in range(a)]
        cols_ok = [kb.below(iw0 + j, wd) for j in range(a)]
        d = []
        for i in range(a):
            ih = kb.clamp(ih0 + i, h)
            row = []
            for j in range(a):
                iw = kb.clamp(iw0 + j, wd)
                val = kb.vload(x, plane + (kb.index(ih) * wd + iw) * ib, ib)
                ok = kb.and_(rows_ok[i], cols_ok[j])
                row.append(kb.select(ok, val, zeros(ib)))
            d.append(row)
        for pi, vrow in enumerate(_transform(kb, bt, d)):
            for pj, val in enumerate(vrow):
                kb.vstore(v, ((pi * a + pj) * span + tile) * c_n + icb * ib, val)


def _lower(kb, node, ins, out, epilogue):
    x, u = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    n_n, icb_n, h, wd, ib = x.type.shape
    p_n, ocg_n, c_n, kob = u.type.shape
    _, ocb_n, oh_n, ow_n, ob = out.type.shape
    m = node.attr("winograd_m")
    a = m + 2
    bt, _, at = MATRICES[m]
    pt, pl = node.attr("pads")[:2]
    k_n, t_n, s_n = plan(oh_n, ow_n, c_n, ocg_n * kob, m, ob)
    if k_n * ob != kob:
        raise ModelError(f"node {node.name!r} (conv2d_winograd_nchwc): weights packed for "
                         f"{kob // ob} output blocks per tile, the plan wants {k_n}")
    th_n, tw_n = tiles(oh_n, ow_n, m)
    count = th_n * tw_n                    # tiles per image
    span = s_n * t_n                       # tiles per work item
    items = -(-count // span)
    work = n_n * items * span * p_n * c_n * ocg_n * kob
    # One work item of tiles, or two register tiles in two items (the scratch holds
    # one), with large transformed weights (alexnet's and zfnet512's 12 x 12 outputs,
    # 9 tiles): each thread would stream all the weights. Then the output channel
    # groups split in two halves (outermost), each thread streaming one half (twice
    # with two items of tiles: from L3 the second time) and transforming the input
    # itself, a small part of the work with so few tiles. (With more that part grows:
    # ResNet's 28 x 28 layer, two items of 25 and 24 tiles, took 18% longer at one
    # thread, inception_v1's 13 x 13 ones, 16 tiles, 8-17%.)
    whole = n_n * items
    few = n_n == 1 and count <= 2 * t_n
    parts = 2 if few and ocg_n > 1 and u.type.size * 4 >= SPLIT_WEIGHT_BYTES else 1
    half = -(-ocg_n // parts)
    with parallel_for(kb, whole * parts, "tiles", work=work) as item:
        v = kb.scratch(p_n * span * c_n)
        mm = kb.scratch(p_n * span * ocg_n * kob)
        if parts == 1:
            ocgs = (0, ocg_n)
        else:
            part = item // whole
            ocgs = (part * half, kb.smin(part * half + half, ocg_n))
            item = item % whole if whole > 1 else 0
        n, first = item // items, (item % items) * span
        # register tiles of this item holding a tile of the image (the last item's
        # may be fewer than S)
        left = ((item % items) * -span + (count + t_n - 1)) // t_n
        s_end = min(left, s_n) if isinstance(left, int) else kb.smin(left, s_n)
        # 1. input transform (tiles and blocks in run-time loops: one copy of the code)
        n_tiles = s_end * t_n
        n_tiles = (min(n_tiles, count - first) if isinstance(first, int)
                   else kb.smin(n_tiles, first * -1 + count))
        _transform_input(kb, x, v, (n, first, n_tiles), (m, pt, pl, tw_n, span, c_n))
        # 2. the P GEMMs
        _products(kb, u, v, mm, (p_n, ocg_n, c_n, kob, ob), (s_end, t_n, k_n, span), ocgs)
        # 3. output transform and epilogue, one tile and block at a time
        oc_n = ocg_n * kob
        with kb.loop(0, n_tiles, "tile_out") as tile, \
                kb.loop(ocgs[0] * k_n, ocgs[1] * k_n, "ocb") as ocb:
            q = first + tile
            oh0, ow0 = (q // tw_n) * m, (q % tw_n) * m
            base = tile * oc_n + ocb * ob
            grid = [[kb.vload(mm, (i * a + j) * span * oc_n + base, ob) for j in range(a)]
                    for i in range(a)]
            y = _transform(kb, at, grid)
            b_vec = kb.vload(bias, ocb * ob, ob) if bias else None
            for i in range(m):
                for j in range(m):
                    oh, ow = oh0 + i, ow0 + j
                    with kb.if_(kb.and_(kb.below(oh, oh_n), kb.below(ow, ow_n))):
                        val = y[i][j] if b_vec is None else kb.fadd(y[i][j], b_vec)
                        index = [n, ocb, oh, ow, 0]
                        val = apply_epilogue(kb, epilogue, val, index)
                        kb.vstore(out, kb.dot(index[:4], out.strides[:4]), val)


lowering("conv2d_winograd_nchwc", lower=_lower)
