"""qdense_packed: matmul_integer by a constant int8 matrix, packed for the dot-product
instructions (AlterOpLayout makes it; kernels/qconv_blocked.py has the dot products).

  a       [..., M, K]          uint8/int8 (run time), K a multiple of 4
  w       [N'/b, K/4, b, 4]    int8: w[k, n] at [n // b, k // 4, n % b, k % 4]
  colsum  [N']                 int32: sum over k of w[k, n]
  a_zp    one element          uint8/int8 (run time: DynamicQuantizeLinear's)
  [bias [N'] int32, multiplier [N'] float32, y_zp]   requantization, as matmul_integer
  out     [..., M, N]          int32, or the requantized type

N' is N rounded up to whole blocks of b (attr units = N; zero weights, sums, bias and
multipliers past N): the outputs of a partial last block are computed as one vector
and stored lane by lane (a batch-1 classifier of 1000 classes was matmul_integer's
plain loops on one thread).

Each step broadcasts four consecutive bytes of a row of `a` against a b x 4 block of
`w`: sum((a - a_zp) * w) = dot(a + offset, w) - (a_zp + offset) * colsum, the offset
being what the dot instruction needs of a's sign (qconv_blocked.offset_of). A tile
is R rows x G column blocks of accumulators.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from pipeline.dsl.builder import I32
from pipeline.dsl.vector import parallel_for
from pipeline.kernels.qconv_blocked import Requantize, broadcast, dot, load_weights
from pipeline.kernels.registry import lowering

_ROWS, _GROUP = 4, 4  # register tile: rows x column blocks


def pack_qdense(w: np.ndarray, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """int8 [K, N] -> ([N/lanes, K/4, lanes, 4] packed, [N] int32 column sums)."""
    k, n = w.shape
    packed = w.reshape(k // 4, 4, n // lanes, lanes).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(packed), w.astype(np.int32).sum(axis=0).astype(np.int32)


def _lower(kb, node, ins, out, epilogue):
    a, w, colsum, azp = ins[:4]
    nb_n, k4_n, lanes, _ = w.type.shape
    k_n, n_n = 4 * k4_n, out.type.shape[-1]
    count = n_n - (nb_n - 1) * lanes  # outputs of the last block
    rows = a.type.size // k_n
    kind, offset = node.attr("dot"), node.attr("offset")
    acc_t = ir.VectorType(I32, lanes)
    # One column block on an M-profile core: its accumulators are scalar registers.
    group = 1 if kind in ("smlad", "mve") else next(g for g in (_GROUP, 2, 1) if nb_n % g == 0)
    row_tiles = -(-rows // _ROWS)
    work = rows * n_n * k_n
    with parallel_for(kb, row_tiles * (nb_n // group), "tiles", work=work) as item:
        rt, gb = item // (nb_n // group), item % (nb_n // group)
        zero_in = kb.b.add(kb.load(azp, 0), ir.Constant(I32, offset))
        correction = kb.splat(zero_in, lanes)
        store = Requantize(kb, node, ins[4], ins[5], ins[6], lanes) if len(ins) > 4 else None

        def tile(m0, rows_n):
            accs = [[ir.Constant(acc_t, [0] * lanes)] * group for _ in range(rows_n)]
            accs = [[kb.local(v) for v in row] for row in accs]
            with kb.loop(0, k4_n, "k4") as k4:
                wv = [load_weights(kb, kind, w, ((gb * group + g) * k4_n + k4) * (4 * lanes),
                                   lanes) for g in range(group)]
                for r in range(rows_n):
                    word = kb.b.load(kb.gep(a, (m0 + r) * k_n + k4 * 4), typ=I32, align=1)
                    if offset:
                        word = kb.b.xor(word, ir.Constant(I32, 0x80808080 - (1 << 32)))
                    av = broadcast(kb, kind, word, lanes)
                    for g in range(group):
                        kb.set(accs[r][g], dot(kb, kind, kb.get(accs[r][g]), av, wv[g],
                                               a.type.dtype == "int8"))
            for r in range(rows_n):
                for g in range(group):
                    n0 = (gb * group + g) * lanes
                    sums = kb.b.load(kb.gep(colsum, n0), typ=acc_t, align=4)
                    acc = kb.b.sub(kb.get(accs[r][g]), kb.b.mul(correction, sums))
                    at = (m0 + r) * n_n + n0
                    if count == lanes or g < group - 1:  # never the partial block
                        _store(kb, store, acc, n0, out, at, lanes)
                        continue
                    if nb_n == group:  # one group: this is the last block
                        _store(kb, store, acc, n0, out, at, count)
                        continue
                    with kb.b.if_else(gb >= nb_n // group - 1) as (last, whole):
                        with last:
                            _store(kb, store, acc, n0, out, at, count)
                        with whole:
                            _store(kb, store, acc, n0, out, at, lanes)

        if rows % _ROWS == 0:
            tile(rt * _ROWS, _ROWS)
        else:  # the last tile is short: its rows one by one
            with kb.loop(0, _ROWS, "r") as r:
                m = rt * _ROWS + r
                with kb.if_(kb.below(m, rows)):
                    tile(m, 1)


def _store(kb, store, acc, n0, out, at, lanes: int) -> None:
    """The first `lanes` outputs of the int32 sums `acc` (columns n0..) at out[at..]:
    as they are, or requantized (`store`); fewer than the vector's lanes one by one."""
    if store is not None:
        store(acc, n0, out, at, lanes)
    elif lanes == acc.type.count:
        kb.b.store(acc, kb.gep(out, at), align=4)
    else:
        for lane in range(lanes):
            kb.b.store(kb.lane(acc, lane), kb.gep(out, at + lane), align=4)


lowering("qdense_packed", lower=_lower)
