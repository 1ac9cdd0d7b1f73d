"""Linear algebra: dense (Gemm, MatMul by a constant) and batched matmul.

`dense` keeps its weight as [N, K] so every output is a contiguous dot product;
the ONNX converters transpose and scale constant weights at import time.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import broadcast_shape, onnx_op, register


def _dense_infer(types, node):
    a, w = types[0], types[1]
    if a.shape[-1] != w.shape[1]:
        raise ModelError(f"node {node.name!r} (dense): input {list(a.shape)} does not "
                         f"match weight {list(w.shape)} (expects [N, K])")
    return [TensorType(a.shape[:-1] + (w.shape[0],), a.dtype)]


def _dense_lower(kb, node, ins, out, epilogue):
    """y[m, n] = bias[n] + sum_k a[m, k] * w[n, k], then the epilogue."""
    a, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    k_n = a.type.shape[-1]
    m_n = a.type.size // k_n
    n_n = w.type.shape[0]
    with kb.loop(0, m_n, "m") as m, kb.loop(0, n_n, "j") as j:
        acc = kb.local(kb.f32(0.0))
        a_row, w_row = kb.mul(m, k_n), kb.mul(j, k_n)
        with kb.loop(0, k_n, "k") as k:
            prod = kb.fmul(kb.load(a, kb.add(a_row, k)), kb.load(w, kb.add(w_row, k)))
            kb.set(acc, kb.fadd(kb.get(acc), prod))
        value = kb.get(acc)
        if bias:
            value = kb.fadd(value, kb.load(bias, j))
        if epilogue is not None:
            # Leading dims of a multi-dim input were flattened into m.
            index = [m, j] if len(out.type.shape) == 2 else \
                _unflatten(kb, m, out.type.shape[:-1]) + [j]
            value = epilogue(value, index)
        kb.store(out, kb.add(kb.mul(m, n_n), j), value)


def _unflatten(kb, flat, shape):
    index = []
    for d in reversed(shape):
        index.append(kb.b.urem(flat, kb.i64(d)))
        flat = kb.b.udiv(flat, kb.i64(d))
    return list(reversed(index))


register("dense", "anchor", _dense_infer, lower=_dense_lower)


def _matmul_infer(types, node):
    a, b = types[0].shape, types[1].shape
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        raise ModelError(f"node {node.name!r} (matmul): shapes {list(a)} and {list(b)} "
                         "do not multiply")
    batch = broadcast_shape(a[:-2], b[:-2], where=f"node {node.name!r}")
    return [TensorType(batch + (a[-2], b[-1]), types[0].dtype)]


def _matmul_lower(kb, node, ins, out, epilogue):
    """Row by row: out[.., m, :] += a[.., m, k] * b[.., k, :], vectorised over n."""
    a, b = ins
    *batch, m_n, n_n = out.type.shape
    k_n = a.type.shape[-1]
    with kb.nest(tuple(batch), "b") as bidx, kb.loop(0, m_n, "m") as m:
        a_row = kb.add(_batch_offset(kb, a, bidx), kb.mul(m, k_n))
        b_base = _batch_offset(kb, b, bidx)
        o_row = kb.add(kb.dot(bidx, out.strides[:-2]), kb.mul(m, n_n))
        with kb.loop(0, n_n, "z") as n:
            kb.store(out, kb.add(o_row, n), kb.f32(0.0))
        with kb.loop(0, k_n, "k") as k:
            av = kb.load(a, kb.add(a_row, k))
            b_row = kb.add(b_base, kb.mul(k, n_n))
            with kb.loop(0, n_n, "j") as n:
                o = kb.add(o_row, n)
                kb.store(out, o, kb.fadd(kb.load(out, o),
                                         kb.fmul(av, kb.load(b, kb.add(b_row, n)))))
        if epilogue is not None:
            with kb.loop(0, n_n, "e") as n:
                o = kb.add(o_row, n)
                kb.store(out, o, epilogue(kb.load(out, o), [*bidx, m, n]))


def _batch_offset(kb, buf, bidx):
    """Offset of the matrix at batch index `bidx` in `buf`, broadcasting batch dims."""
    shape = buf.type.shape[:-2]
    lead = len(bidx) - len(shape)
    strides = [0 if d == 1 else s for d, s in zip(shape, buf.strides[:-2], strict=True)]
    return kb.dot(bidx[lead:], strides)


register("matmul", "anchor", _matmul_infer, lower=_matmul_lower,
         numpy=lambda xs, node: [np.matmul(xs[0], xs[1])])


@onnx_op("Gemm", 1)
def _gemm(ctx, n):
    """Y = alpha * A' @ B' + beta * C as dense(A, W=[N, K], bias) with constants folded."""
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    a, b = n.inputs[0], n.inputs[1]
    c = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    if n.attrs.get("transA", 0):
        raise ModelError(f"node {n.name!r} (Gemm): transA=1 is not supported")
    w = ctx.const(b)
    if w is None:
        raise ModelError(f"node {n.name!r} (Gemm): B must be a constant (initializer)")
    inputs = [a, b]
    if not n.attrs.get("transB", 0) or alpha != 1.0:
        w = (w if n.attrs.get("transB", 0) else w.T) * np.float32(alpha)
        inputs[1] = ctx.add_param(f"{b}_nk", np.ascontiguousarray(w, dtype=np.float32))
    n_out = w.shape[0]
    nodes = []
    c_value = ctx.const(c) if c else None
    if (c_value is not None and c_value.size in (1, n_out)
            and (c_value.ndim < 2 or c_value.shape[0] == 1)):  # C varies along N only
        bias = np.broadcast_to(c_value.reshape(-1) * np.float32(beta), (n_out,))
        inputs.append(ctx.add_param(f"{c}_bias", np.ascontiguousarray(bias, np.float32)))
    elif c is not None:
        if beta != 1.0:
            raise ModelError(f"node {n.name!r} (Gemm): beta != 1 needs a constant C")
        mid = f"{n.outputs[0]}__gemm"
        nodes.append(Node.make("add", f"{n.name}__bias", (mid, c), n.outputs[:1]))
        return [Node.make("dense", n.name, inputs, (mid,))] + nodes
    return [Node.make("dense", n.name, inputs, n.outputs[:1])]


@onnx_op("MatMul", 1)
def _matmul(ctx, n):
    a, b = n.inputs[:2]
    w = ctx.const(b)
    if w is not None and w.ndim == 2 and len(ctx.type(a).shape) >= 2:
        weight = ctx.add_param(f"{b}_nk", np.ascontiguousarray(w.T, dtype=np.float32))
        return [Node.make("dense", n.name, (a, weight), n.outputs[:1])]
    return [Node.make("matmul", n.name, (a, b), n.outputs[:1])]
