"""Linear algebra: dense (Gemm, MatMul by a constant), batched matmul, einsum and det.

`dense` keeps its weight as [N, K]; the ONNX converters transpose and scale
constant weights at import time. Both ops compute their products with the
register-tiled engine in gemm_tile.
"""

from __future__ import annotations

from pipeline.dsl.gemm_tile import tiled_gemm
from pipeline.kernels.registry import lowering
from pipeline.kernels.runtime_dims import matmul_dims
from pipeline.ops.geometry import einsum_sizes, matrix_shapes
from pipeline.ops.registry import broadcast_shape


def _dense_lower(kb, node, ins, out, epilogue):
    """y[m, n] = sum_k a[m, k] * w[n, k] (tiled), then + bias[n] and the epilogue."""
    a, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    k_n = a.type.shape[-1]
    m_n = a.type.size // k_n
    n_n = w.type.shape[0]
    tiled_gemm(kb, (m_n, n_n, k_n), lambda m, k: kb.load(a, m * k_n + k),
               lambda k, n: kb.load(w, n * k_n + k), out, 0,
               by_column=True)
    if bias is None and epilogue is None:
        return
    with kb.loop(0, m_n, "m") as m, kb.loop(0, n_n, "j") as j:
        o = m * n_n + j
        value = kb.load(out, o)
        if bias:
            value = kb.fadd(value, kb.load(bias, j))
        if epilogue is not None:
            # Leading dims of a multi-dim input were flattened into m.
            index = [m, j] if len(out.type.shape) == 2 else \
                kb.unflatten(m, out.type.shape[:-1]) + [j]
            value = epilogue(value, index)
        kb.store(out, o, value)


lowering("dense", lower=_dense_lower)


def _matmul_lower(kb, node, ins, out, epilogue):
    """Per batch index, a tiled product (gemm_tile) reading a and b through
    their transposes and broadcast batch dims, then the epilogue over the result."""
    x, y = ins
    a_shape, b_shape = matrix_shapes(x.type.shape, y.type.shape, node)
    m_n, k_n = a_shape[-2:]
    n_n = b_shape[-1]
    batch = broadcast_shape(a_shape[:-2], b_shape[:-2])
    trans_a, trans_b = node.attr("trans_a"), node.attr("trans_b")
    out_strides = _dense_strides(batch + (m_n, n_n))
    squeeze = [d for d, keep in ((len(batch), len(x.type.shape) > 1),
                                 (len(batch) + 1, len(y.type.shape) > 1)) if not keep]
    with kb.nest(batch, "b") as bidx:
        a_base = _batch_offset(kb, x, a_shape, bidx)
        b_base = _batch_offset(kb, y, b_shape, bidx)
        c_base = kb.dot(bidx, out_strides[:-2])

        def load_a(m, k):
            return kb.load(x, a_base + (k * m_n + m if trans_a
                                     else m * k_n + k))

        def load_b(k, n):
            return kb.load(y, b_base + (n * k_n + k if trans_b
                                     else k * n_n + n))

        tiled_gemm(kb, (m_n, n_n, k_n), load_a, load_b, out, c_base, by_column=trans_b)
        if epilogue is not None:
            with kb.loop(0, m_n, "m") as m, kb.loop(0, n_n, "e") as n:
                o = c_base + (m * n_n + n)
                index = [i for d, i in enumerate([*bidx, m, n]) if d not in squeeze]
                kb.store(out, o, epilogue(kb.load(out, o), index))


def _dense_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _batch_offset(kb, buf, matrix_shape, bidx):
    """Offset of the matrix at batch index `bidx` in `buf` (whose shape as a
    stack of matrices is `matrix_shape`), broadcasting batch dims."""
    shape = matrix_shape[:-2]
    lead = len(bidx) - len(shape)
    size = matrix_shape[-2] * matrix_shape[-1]
    strides = [0 if d == 1 else s * size for d, s in zip(shape, _dense_strides(shape),
                                                            strict=True)]
    return kb.dot(bidx[lead:], strides)


lowering("matmul", lower=_matmul_lower, lower_dims=matmul_dims)


def _einsum_lower(kb, node, ins, out, epilogue):
    """Per output element, the sum over the contracted letters of the operands'
    product: a plain loop nest (a letter of size 1 in an operand broadcasts)."""
    terms, output = node.attr("terms"), node.attr("output")
    sizes = einsum_sizes(terms, [b.type.shape for b in ins], node)
    summed = tuple(c for c in dict.fromkeys("".join(terms)) if c not in output)
    with kb.nest(tuple(sizes[c] for c in output), "o") as out_index:
        total = kb.local(kb.const(0, out.elem))
        with kb.nest(tuple(sizes[c] for c in summed), "s") as sum_index:
            at = dict(zip(output + "".join(summed), [*out_index, *sum_index], strict=True))
            product = None
            for buf, term in zip(ins, terms, strict=True):
                index = [at[c] if d > 1 else 0 for c, d in zip(term, buf.type.shape,
                                                                strict=True)]
                value = kb.load(buf, kb.dot(index, buf.strides))
                product = value if product is None else kb.arith("mul", product, value)
            kb.set(total, kb.arith("add", kb.get(total), product))
        kb.store(out, kb.dot(out_index, out.strides), kb.get(total))


lowering("einsum", lower=_einsum_lower)


def _det_lower(kb, node, ins, out, epilogue):
    """Per matrix: Gaussian elimination with partial pivoting in float64 on a scratch
    copy, the determinant the product of the pivots, negated per row swap (0 as soon
    as a column has no non-zero pivot, whose elimination is skipped: no 0/0)."""
    x = ins[0]
    m = x.type.shape[-1]
    a = kb.scratch(m * m, "float64")
    one = kb.const(1.0, a.elem)

    def at(r, c):
        return r * m + c

    with kb.loop(0, out.type.size, "b") as mat:
        with kb.loop(0, m * m, "i") as i:
            kb.store(a, i, kb.cast(kb.load(x, mat * (m * m) + i), "float64"))
        det = kb.local(one)
        with kb.loop(0, m, "k") as k:
            pivot = kb.local(k)
            with kb.loop(k + 1, m, "r") as r:
                p = kb.index(kb.get(pivot))
                larger = kb.compare(">", kb.intrinsic("fabs", kb.load(a, at(r, k))),
                                    kb.intrinsic("fabs", kb.load(a, at(p, k))))
                kb.set(pivot, kb.select(larger, r, p))
            p = kb.index(kb.get(pivot))
            with kb.loop(0, m, "c") as c:  # swap rows k and p (p == k: no change)
                top, low = kb.load(a, at(k, c)), kb.load(a, at(p, c))
                kb.store(a, at(k, c), low)
                kb.store(a, at(p, c), top)
            d = kb.load(a, at(k, k))
            signed = kb.select(kb.compare("!=", p, k), kb.neg(kb.get(det)), kb.get(det))
            kb.set(det, kb.fmul(signed, d, fast=False))
            with kb.if_(kb.compare("!=", d, kb.const(0.0, a.elem), ordered=True)), \
                    kb.loop(k + 1, m, "r") as r:
                f = kb.fdiv(kb.load(a, at(r, k)), d, fast=False)
                with kb.loop(k + 1, m, "c") as c:
                    kb.store(a, at(r, c), kb.fsub(kb.load(a, at(r, c)),
                                                  kb.fmul(f, kb.load(a, at(k, c)))))
        kb.store(out, mat, kb.cast(kb.get(det), out.type.dtype))


lowering("det", lower=_det_lower)
