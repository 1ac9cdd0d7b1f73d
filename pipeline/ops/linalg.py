"""Linear algebra: dense (Gemm, MatMul by a constant) and batched matmul.

`dense` keeps its weight as [N, K]; the ONNX converters transpose and scale
constant weights at import time. Both ops compute their products with the
register-tiled engine in gemm_tile.
"""

from __future__ import annotations

import numpy as np

from pipeline.dsl.gemm_tile import tiled_gemm
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import broadcast_shape, onnx_op, register


def _check_float(node, types) -> None:
    """ModelError naming the node unless its operands all have one float dtype."""
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1 or not dtypes <= {"float32", "float64", "float16"}:
        raise ModelError(f"node {node.name!r} ({node.op}): operand dtypes "
                         f"{[t.dtype for t in types]} are not supported (all float32, all "
                         "float64 or all float16 are)")


def _dense_infer(types, node):
    _check_float(node, types)
    a, w = types[0], types[1]
    if a.shape[-1] != w.shape[1]:
        raise ModelError(f"node {node.name!r} (dense): input {list(a.shape)} does not "
                         f"match weight {list(w.shape)} (expects [N, K])")
    return [TensorType(a.shape[:-1] + (w.shape[0],), a.dtype)]


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


def _dense_numpy(xs, node):
    """a [..., K] @ w[N, K]^T (+ bias[N])."""
    y = np.matmul(xs[0], xs[1].T)
    return [(y + xs[2] if len(xs) > 2 else y).astype(xs[0].dtype)]


register("dense", "anchor", _dense_infer, lower=_dense_lower, float64=True, numpy=_dense_numpy,
         sample=lambda rng, dtype: ([rng.uniform(-1, 1, s).astype(dtype)
                                     for s in ((2, 3, 5), (4, 5), (4,))], {}))


def _matrix_shapes(a: tuple, b: tuple, node) -> tuple[tuple, tuple]:
    """(a, b) as matrices (a 1-D operand becomes one row / one column), then
    transposed as the node's trans_a / trans_b say."""
    a = (1,) + a if len(a) == 1 else a
    b = b + (1,) if len(b) == 1 else b
    if node.attr("trans_a"):
        a = a[:-2] + (a[-1], a[-2])
    if node.attr("trans_b"):
        b = b[:-2] + (b[-1], b[-2])
    return a, b


def _matmul_infer(types, node):
    """numpy.matmul shape rule, batch dims broadcast; 1-D operands lose their
    inserted dim again in the output."""
    _check_float(node, types)
    sa, sb = types[0].shape, types[1].shape
    if not sa or not sb:
        raise ModelError(f"node {node.name!r} (matmul): scalar operands do not multiply")
    a, b = _matrix_shapes(sa, sb, node)
    if a[-1] != b[-2]:
        raise ModelError(f"node {node.name!r} (matmul): shapes {list(sa)} and {list(sb)} "
                         "do not multiply")
    batch = broadcast_shape(a[:-2], b[:-2], where=f"node {node.name!r}")
    rows = (a[-2],) if len(sa) > 1 else ()
    cols = (b[-1],) if len(sb) > 1 else ()
    return [TensorType(batch + rows + cols, types[0].dtype)]


def _matmul_lower(kb, node, ins, out, epilogue):
    """Per batch index, a tiled product (gemm_tile) reading a and b through
    their transposes and broadcast batch dims, then the epilogue over the result."""
    x, y = ins
    a_shape, b_shape = _matrix_shapes(x.type.shape, y.type.shape, node)
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


def _matmul_numpy(xs, node):
    a, b = xs
    if node.attr("trans_a"):
        a = np.swapaxes(a, -1, -2)
    if node.attr("trans_b"):
        b = np.swapaxes(b, -1, -2)
    return [np.matmul(a, b)]


register("matmul", "anchor", _matmul_infer, lower=_matmul_lower, numpy=_matmul_numpy,
         float64=True, sample=lambda rng, dtype: (
             [rng.uniform(-1, 1, s).astype(dtype) for s in ((2, 3, 5), (4, 5))],
             {"trans_a": 0, "trans_b": 1}))


@onnx_op("Gemm", 1, emits=("dense", "matmul", "mul", "add"))
def _gemm(ctx, n):
    """Y = alpha * A' @ B' + beta * C, as a chain product [-> mul alpha] [-> add C].

    A constant B (and no transA) becomes dense(A, W=[N, K]) with alpha folded
    into W and beta * C as its bias when C varies along N only; anything else
    is a matmul with transpose flags. A constant C is pre-scaled by beta, a
    runtime C is multiplied by beta first.
    """
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    trans_a, trans_b = int(n.attrs.get("transA", 0)), int(n.attrs.get("transB", 0))
    a, b = n.inputs[0], n.inputs[1]
    c = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] and beta != 0.0 else None
    if len(ctx.type(a).shape) != 2 or len(ctx.type(b).shape) != 2:
        raise ModelError(f"node {n.name!r} (Gemm): A and B must be 2-D, got "
                         f"{list(ctx.type(a).shape)} and {list(ctx.type(b).shape)}")
    w, c_value = ctx.const(b), ctx.const(c) if c else None
    n_out = ctx.type(b).shape[0 if trans_b else 1]
    ftype = np.dtype(ctx.type(a).dtype).type  # the operands' float type (float32 or 64)
    nodes = []
    if w is not None and not trans_a:
        inputs = [a, b]
        if not trans_b or alpha != 1.0:
            w = (w if trans_b else w.T) * ftype(alpha)
            inputs[1] = ctx.add_param(f"{b}_nk", np.ascontiguousarray(w, dtype=ftype))
        if (c_value is not None and c_value.size in (1, n_out)
                and (c_value.ndim < 2 or c_value.shape[0] == 1)):  # C varies along N only
            bias = np.broadcast_to(c_value.reshape(-1) * ftype(beta), (n_out,))
            inputs.append(ctx.add_param(f"{c}_bias", np.ascontiguousarray(bias, ftype)))
            c = None
        chain = [("dense", n.name, inputs, {})]
    else:
        if w is not None and alpha != 1.0:  # fold alpha into a constant B
            b = ctx.add_param(f"{b}_scaled", (w * ftype(alpha)).astype(ftype))
            alpha = 1.0
        chain = [("matmul", n.name, [a, b], {"trans_a": trans_a, "trans_b": trans_b})]
        if alpha != 1.0:
            k = ctx.add_param(f"{n.name}_alpha", np.array([alpha], ftype))
            chain.append(("mul", f"{n.name}__alpha", [k], {}))
    if c is not None:
        if c_value is not None and beta != 1.0:
            c = ctx.add_param(f"{c}_scaled", (c_value * ftype(beta)).astype(ftype))
        elif beta != 1.0:
            k = ctx.add_param(f"{n.name}_beta", np.array([beta], ftype))
            nodes.append(Node.make("mul", f"{n.name}__beta", (c, k), (f"{n.outputs[0]}__c",)))
            c = f"{n.outputs[0]}__c"
        chain.append(("add", f"{n.name}__bias", [c], {}))
    prev = None
    for k, (op, name, extra, attrs) in enumerate(chain):
        out = n.outputs[0] if k == len(chain) - 1 else f"{n.outputs[0]}__{k}"
        nodes.append(Node.make(op, name, extra if prev is None else [prev, *extra], (out,),
                               **attrs))
        prev = out
    return nodes


@onnx_op("MatMul", 1, emits=("dense", "matmul"))
def _matmul(ctx, n):
    a, b = n.inputs[:2]
    w = ctx.const(b)
    if w is not None and w.ndim == 2 and len(ctx.type(a).shape) >= 2:
        weight = ctx.add_param(f"{b}_nk", np.ascontiguousarray(w.T))
        return [Node.make("dense", n.name, (a, weight), n.outputs[:1])]
    return [Node.make("matmul", n.name, (a, b), n.outputs[:1], trans_a=0, trans_b=0)]
