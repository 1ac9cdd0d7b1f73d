"""A register-tiled matrix product, the inner engine of `matmul`, `dense` and
the generic `conv2d` (as an implicit GEMM).

    tiled_gemm(kb, shape, load_a, load_b, out, c_base)

computes C[m, n] = sum_k A[m, k] * B[k, n] into the row-major block of `out`
at `c_base` (row stride N), for static (M, N, K) and loaders `load_a(m, k)`,
`load_b(k, n)` returning scalars, so any operand layout (transposed, batched,
broadcast) works. B is packed per block of _NB columns into a stack panel
([k][_NB], _KC rows of k at a time) so the micro-kernel streams it; each
micro-kernel keeps _MR x _NB outputs in vector registers over a k chunk. Rows
that do not fill a tile use a one-row tile, columns that do not fill a block
a scalar loop. A caller may pack panels itself (a convolution's patches).
"""

from __future__ import annotations

from pipeline.dsl.builder import Buffer
from pipeline.dsl.vector import fma, zeros

# 8 lanes on every target, not its vector width: one AVX2 vector, two SSE/NEON
# ones, half an AVX-512 one. Tried with the target's width instead (one thread,
# MatMul 64x512x512, 196x1152x128, 8x2048x1000): 4 lanes on x86-64 (SSE2) took
# the same CPU time, 16 on znver5 was no faster (and doubles the scalar tail of
# an N that is no multiple of 32).
_LANES = 8
_NB = 2 * _LANES  # columns per block (two vectors)
_MR = 4           # rows per micro-kernel tile
_KC = 512         # k rows per packed panel


PANEL_COLUMNS = _NB


def tiled_gemm(kb, shape: tuple[int, int, int], load_a, load_b, out: Buffer, c_base,
               by_column: bool = False, pack_b=None, k_chunk: int = _KC) -> None:
    """C = A @ B for (M, N, K) = `shape` into out[c_base + m * N + n]; see module doc.

    `by_column`: B is contiguous along k (a transposed matrix), so panels are
    packed column by column. `pack_b(panel, k0, k_len, n0)`, if given, packs
    panel[k * PANEL_COLUMNS + j] = B[k0 + k, n0 + j] itself (k0 and k_len are
    multiples of `k_chunk`'s factors the caller chose: a convolution packs whole
    input channels); load_b then only serves the columns that fill no block."""
    m_n, n_n, k_n = shape
    kc_n = min(k_n, k_chunk)
    panel = kb.scratch(kc_n * _NB, out.type.dtype)  # float32 or float64, as C
    full_chunks, rest = divmod(k_n, kc_n)

    def chunk(n0, k0, k_len: int, first: bool) -> None:
        if pack_b is not None:
            pack_b(panel, k0, k_len, n0)
        else:
            _pack(kb, panel, load_b, k0, k_len, n0, by_column)
        full = m_n - m_n % _MR
        if full:
            with kb.loop(0, full // _MR, "mt") as mt:
                _micro(kb, _MR, mt * _MR, n0, k0, k_len, load_a, panel, out, c_base,
                       n_n, first)
        for m in range(full, m_n):
            _micro(kb, 1, m, n0, k0, k_len, load_a, panel, out, c_base, n_n, first)

    with kb.loop(0, n_n // _NB, "nb") as nb:
        n0 = nb * _NB
        chunk(n0, 0, kc_n, True)  # the first chunk starts C from zero
        # Middle chunks loop at run time (a dense layer's K can be 150k: one
        # chunk's code each would be megabytes of IR); a caller's pack_b
        # gets static offsets, as it packs whole input channels.
        if pack_b is None and full_chunks > 2:
            with kb.loop(1, full_chunks, "kc") as kc:
                chunk(n0, kc * kc_n, kc_n, False)
        else:
            for k0 in range(kc_n, full_chunks * kc_n, kc_n):
                chunk(n0, k0, kc_n, False)
        if rest and full_chunks:
            chunk(n0, full_chunks * kc_n, rest, False)
    if n_n % _NB:
        with kb.loop(0, m_n, "tm") as m, kb.loop(n_n - n_n % _NB, n_n, "tn") as n:
            acc = kb.local(kb.const(0.0, out.elem))
            with kb.loop(0, k_n, "tk") as k:
                kb.set(acc, kb.fadd(kb.get(acc), kb.fmul(load_a(m, k), load_b(k, n))))
            kb.store(out, c_base + (m * n_n + n), kb.get(acc))


def _pack(kb, panel, load_b, k0: int, k_len: int, n0, by_column: bool) -> None:
    """panel[k][j] = B[k0 + k, n0 + j], walking B along its contiguous direction."""
    order = (("pj", _NB), ("pk", k_len)) if by_column else (("pk", k_len), ("pj", _NB))
    with kb.loop(0, order[0][1], order[0][0]) as i0, kb.loop(0, order[1][1], order[1][0]) as i1:
        j, k = (i0, i1) if by_column else (i1, i0)
        kb.store(panel, k * _NB + j, load_b(k + k0, n0 + j))


def _micro(kb, rows: int, m0, n0, k0, k_len: int, load_a, panel, out, c_base, n_n,
           first: bool):
    """C[m0:m0+rows, n0:n0+_NB] (+)= A[m0:m0+rows, k0:k0+k_len] @ panel, in registers;
    the first k chunk starts from zero, later ones from what C holds."""
    units = _NB // _LANES
    c_at = [[c_base + ((m0 + r) * n_n + (n0 + u * _LANES))
             for u in range(units)] for r in range(rows)]
    accs = [[kb.local(zeros(_LANES, out.elem) if first else kb.vload(out, c_at[r][u], _LANES))
             for u in range(units)] for r in range(rows)]
    with kb.loop(0, k_len, "mk") as k:
        bs = [kb.vload(panel, k * _NB + u * _LANES, _LANES)
              for u in range(units)]
        for r in range(rows):
            a = kb.splat(load_a(m0 + r, k + k0), _LANES)
            for u in range(units):
                kb.set(accs[r][u], fma(kb, a, bs[u], kb.get(accs[r][u])))
    for r in range(rows):
        for u in range(units):
            kb.vstore(out, c_at[r][u], kb.get(accs[r][u]))
