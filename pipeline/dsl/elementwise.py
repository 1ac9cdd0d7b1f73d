"""An elementwise kernel (an elementwise anchor and its fused chain) as a parallel
loop over rows of explicit vectors.

The output's trailing dimensions merge into one row as long as every argument is
either whole along them or broadcast over all of them (a per-channel scale of a
blocked [N, C/16, H, W, 16] tensor is whole along the 16 lanes only: rows of 16; a
residual of the output's own shape: one row); the rows split over the thread team,
each row is a loop of `lanes`-wide vectors and one narrower vector for what is left.
Before, these kernels were a scalar loop nest left to LLVM's vectoriser, on one
thread: densenet121's 62 batch-norm + ReLU kernels took a quarter of its run.
"""

from __future__ import annotations

import contextlib
import math

from pipeline.dsl.builder import Buffer, KernelBuilder
from pipeline.dsl.vector import (
    BANDS,
    ELEMENT_WORK,
    LANE_GENERIC_OPS,
    VECTOR_OPS,
    apply_chain,
    band_items,
    band_plane_row,
    int8_operands,
    parallel_for,
)
from pipeline.ir.graph import TensorType


def vectorizable(nodes: list, dtypes: dict) -> bool:
    """Whether vector_elementwise can run `nodes`: float32 throughout (but the int8
    sides of quantize ops) and every op one with a vector form (others stay a scalar
    loop nest, exact for any op)."""
    ints = int8_operands(nodes)
    return all(d == "float32" or (name in ints and d in ("int8", "uint8"))
               for name, d in dtypes.items()) and all(
        node.op in VECTOR_OPS or (node.op in LANE_GENERIC_OPS and
                                  LANE_GENERIC_OPS[node.op](node)) for node in nodes)


def row_split(out_shape: tuple, arg_shapes: list[tuple]) -> int:
    """The first output dimension of the row: the smallest k such that every argument
    (its shape aligned right to the output's) is whole or all ones over dims k..."""
    rank = len(out_shape)
    aligned = [(1,) * (rank - len(s)) + tuple(s) for s in arg_shapes]
    k = rank - 1
    while k > 0 and all(a[k - 1:] == out_shape[k - 1:] or all(d == 1 for d in a[k - 1:])
                        for a in aligned):
        k -= 1
    return k


def _banded(shape: tuple, outer: tuple) -> bool:
    """Whether the rows of a kernel with output `shape` go band by band: a
    channel-blocked [N, C/b, H, W, b] output whose rows split H."""
    return len(shape) == 5 and len(outer) >= 3 and outer[2] >= BANDS


def _row_items(shape: tuple, outer: tuple) -> int:
    """parallel_for's item count for the rows `outer` (_row_index)."""
    if not _banded(shape, outer):
        return math.prod(outer)
    return band_items(*outer[:3])


@contextlib.contextmanager
def _row_index(kb: KernelBuilder, r, shape: tuple, outer: tuple):
    """The index in `outer` of row item r. Over a channel-blocked output (_banded) the
    items go band by band (BANDS parts of H outermost, as the blocked convs split
    them: each thread reads what it wrote), an item one (n, cb, h) whose rows over
    the dims after H are a loop; the body runs only for rows inside H (a last band
    may reach past it)."""
    if not _banded(shape, outer):
        yield kb.unflatten(r, outer)
        return
    with band_plane_row(kb, r, *outer[:3]) as (n, cb, h), kb.nest(outer[3:], "t") as t:
        yield [n, cb, h, *t]


def vector_elementwise(kb: KernelBuilder, nodes: list, args: dict, out: Buffer,
                       scalar_of, dtypes: dict, lanes: int) -> None:
    """Store the value of the chain `nodes` (its first op reads only `args`) into `out`."""
    shape = out.type.shape
    k = row_split(shape, [b.type.shape for b in args.values()])
    # Rows enough for the thread team (parallel_nest's 16): a tensor whose operands are
    # all whole or scalars is one row else, on one thread (the int8 models' input
    # QuantizeLinear; any later k splits the same way, row_split's k being the least).
    while k < len(shape) - 1 and math.prod(shape[:k]) < 16:
        k += 1
    row, outer = math.prod(shape[k:]), shape[:k]

    def view(buf: Buffer) -> Buffer:
        """buf as [outer dims..., row] (or 1 where it is broadcast over the row)."""
        s = (1,) * (len(shape) - len(buf.type.shape)) + tuple(buf.type.shape)
        tail = row if s[k:] == shape[k:] else 1
        return Buffer(buf.ptr, TensorType((*s[:k], tail), buf.type.dtype))

    work = out.type.size * len(nodes) * ELEMENT_WORK
    with parallel_for(kb, _row_items(shape, outer), "rows", work=work) as r, \
            _row_index(kb, r, shape, outer) as index:
        views = {name: view(b) for name, b in args.items()}  # pointers as re-read here
        target = view(out)
        base = kb.dot(index, target.strides[:-1]) if index else 0

        def vector(col, n: int) -> None:
            value = apply_chain(kb, nodes, views, scalar_of, dtypes, {}, [*index, col], n)
            kb.vstore(target, base + col, value)

        whole = row // lanes * lanes
        if whole:
            with kb.loop(0, row // lanes, "v") as v:
                vector(v * lanes, lanes)
        if row > whole:
            vector(whole, row - whole)
