"""dense_packed: y = a @ W.T (+ bias) with W packed at build time as [ceil(N/b), K, b].

b is the target's vector width: row k of a packed block holds the weights of b
consecutive outputs. The blocks are stored a register tile's group at a time, the
group's G blocks side by side per k (pack_dense_weight): a tile streams one run of
memory (G runs before: a batch-1 decoder's float32 decode step took 1.15x longer).

The kernel is register-tiled: a micro-kernel keeps the
outputs of R rows x G blocks in R*G vector registers and, per k, loads the G
weight vectors once and broadcasts a[m, k] of each of the R rows into them, so
every weight load feeds R FMAs and every broadcast G (one row at a time, as
before, was bound by the latency of one FMA chain and by reloading each weight
vector from L2 for every row: a quarter of peak on the encoder's layers).
The weight is zero-padded to whole blocks; the outputs of a last partial block
are computed as one vector and stored lane by lane. The fused epilogue (residual
add, Gelu, ...) then runs over the tile just stored, still in L1, a row at a time
(its code once per block, not once per accumulator), lane by lane in a partial block.
Work items (a tile of R rows, a group of G blocks) are split over threads, row
tiles inner, so consecutive items reuse one group's weights from cache.
"""

from __future__ import annotations

import numpy as np

from pipeline.dsl.vector import apply_epilogue, fma, parallel_for, prefetch, zeros
from pipeline.kernels.conv_blocked import PREFETCH_BYTES
from pipeline.kernels.registry import lowering


def pack_dense_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """[N, K] -> [ceil(N/block), K, block], zero-padded, stored group by group: the
    G blocks of a register tile (tile_shape) side by side per k, [K, G, block], so a
    tile reads one contiguous stream (G streams a tile, each read once from memory at
    batch 1, kept the hardware prefetcher a step behind)."""
    n, k = weight.shape
    nb = -(-n // block)
    group = tile_shape(1, nb, block)[1]
    padded = np.zeros((nb * block, k), weight.dtype)
    padded[:n] = weight
    blocks = padded.reshape(nb, block, k).transpose(0, 2, 1)  # [nb, K, block]
    groups = [blocks[g:g + group].transpose(1, 0, 2).reshape(-1)  # [K, G, block]
              for g in range(0, nb, group)]
    return np.concatenate(groups).reshape(nb, k, block)


def tile_shape(m_n: int, n_blocks: int, vb: int) -> tuple[int, int]:
    """(rows R, blocks G) of the register tile: R*G accumulators plus G weight
    vectors and one broadcast fill the vector registers (32 with AVX-512's 16
    lanes: 6 x 4; else 16: 4 x 3), R at most 8 and the rows there are (one row, a
    classifier: G chains). Measured (one thread, M 32..128, K and N 128..1024):
    with AVX-512 any tile of 16..24 accumulators runs at the FMA peak; with AVX2
    4 x 3 and 6 x 2 do, 2 x 3 reaches two thirds of it."""
    regs, g = (32, 4) if vb >= 16 else (16, 3)
    g = min(g, n_blocks)
    return max(1, min((regs - g - 1) // g, 8, m_n)), g


def _lower(kb, node, ins, out, epilogue):
    a, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    nb_n, k_n, vb = w.type.shape
    n_n = out.type.shape[-1]
    m_n = a.type.size // k_n
    rows, group = tile_shape(m_n, nb_n, vb)
    m_tiles, n_groups = -(-m_n // rows), -(-nb_n // group)
    m_tail, last_group = m_n - rows * (m_tiles - 1), nb_n - group * (n_groups - 1)
    stream = m_tiles == 1  # each weight is read once: it comes from memory, prefetch it

    def tile(m0, nb0, n_rows: int, n_blocks: int, partial_last: bool) -> None:
        """Outputs of rows m0.. (n_rows) x blocks nb0.. (n_blocks) in registers."""
        accs = [[kb.local(zeros(vb)) for _ in range(n_blocks)] for _ in range(n_rows)]
        with kb.loop(0, k_n, "k") as k:
            ws = []
            for g in range(n_blocks):  # the group's blocks side by side (pack_dense_weight)
                at = nb0 * (k_n * vb) + (k * n_blocks + g) * vb
                if stream:
                    prefetch(kb, w, at + PREFETCH_BYTES // 4)
                ws.append(kb.vload(w, at, vb))
            for r in range(n_rows):
                av = kb.splat(kb.load(a, (m0 + r) * k_n + k), vb)
                for g in range(n_blocks):
                    kb.set(accs[r][g], fma(kb, av, ws[g], kb.get(accs[r][g])))
        whole = n_blocks - 1 if partial_last else n_blocks
        count = n_n - (nb_n - 1) * vb  # outputs in a partial last block
        for r in range(n_rows):
            m = m0 + r
            for g in range(n_blocks):
                n0 = (nb0 + g) * vb
                value = kb.get(accs[r][g])
                if g == whole:  # the partial last block: its lanes (no vector fits)
                    for lane in range(count):
                        x = kb.lane(value, lane)
                        if bias is not None:
                            x = kb.fadd(x, kb.load(bias, n0 + lane))
                        kb.store(out, m * n_n + n0 + lane, x)
                    continue
                if bias is not None:
                    value = kb.fadd(value, kb.vload(bias, n0, vb))
                kb.vstore(out, m * n_n + n0, value)
        if epilogue is None:
            return
        # The epilogue over the tile just stored (in L1), one row at a time: its code
        # once per block, not R * G times (a Gelu is ~60 instructions a vector).
        with kb.loop(0, n_rows, "er") as r:
            m = m0 + r
            lead = kb.unflatten(m, out.type.shape[:-1])
            for g in range(n_blocks):
                n0, at = (nb0 + g) * vb, m * n_n + (nb0 + g) * vb
                if g < whole:
                    kb.vstore(out, at, apply_epilogue(kb, epilogue, kb.vload(out, at, vb),
                                                      lead + [n0]))
                    continue
                for lane in range(count):
                    kb.store(out, at + lane, epilogue(kb.load(out, at + lane),
                                                      lead + [n0 + lane]))

    partial = n_n % vb != 0
    variants = {}  # (tail row tile?, last group?) -> tile shape
    for tail_rows in (False, True):
        for last in (False, True):
            n_rows = m_tail if tail_rows else rows
            n_blocks = last_group if last else group
            variants[tail_rows, last] = (n_rows, n_blocks, partial and last)
    with parallel_for(kb, m_tiles * n_groups, "tiles", work=m_n * n_n * k_n) as item:
        mt, ng = item % m_tiles, item // m_tiles
        m0, nb0 = mt * rows, ng * group
        is_tail = mt >= m_tiles - 1 if m_tail != rows else None
        is_last = ng >= n_groups - 1 if variants[False, True] != variants[False, False] \
            else None
        _dispatch(kb, is_tail, is_last,
                  lambda t, last: tile(m0, nb0, *variants[t, last]))


def _dispatch(kb, is_tail, is_last, emit) -> None:
    """emit(tail, last) under the runtime flags (None: that flag is always false)."""
    def by_last(t):
        if is_last is None:
            emit(t, False)
            return
        with kb.b.if_else(is_last) as (then, otherwise):
            with then:
                emit(t, True)
            with otherwise:
                emit(t, False)
    if is_tail is None:
        by_last(False)
        return
    with kb.b.if_else(is_tail) as (then, otherwise):
        with then:
            by_last(True)
        with otherwise:
            by_last(False)


lowering("dense_packed", lower=_lower)
