"""The linalg operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/linalg.py
Their ONNX converters: pipeline/frontend/onnx/linalg.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import einsum_sizes, matrix_shapes
from pipeline.ops.registry import OpKind, broadcast_shape, register


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


def _dense_numpy(xs, node):
    """a [..., K] @ w[N, K]^T (+ bias[N])."""
    y = np.matmul(xs[0], xs[1].T)
    return [(y + xs[2] if len(xs) > 2 else y).astype(xs[0].dtype)]


register("dense", OpKind.ANCHOR, _dense_infer, float64=True, numpy=_dense_numpy,
         sample=lambda rng, dtype: ([rng.uniform(-1, 1, s).astype(dtype)
                                     for s in ((2, 3, 5), (4, 5), (4,))], {}))


def _matmul_infer(types, node):
    """numpy.matmul shape rule, batch dims broadcast; 1-D operands lose their
    inserted dim again in the output."""
    _check_float(node, types)
    sa, sb = types[0].shape, types[1].shape
    if not sa or not sb:
        raise ModelError(f"node {node.name!r} (matmul): scalar operands do not multiply")
    a, b = matrix_shapes(sa, sb, node)
    if a[-1] != b[-2]:
        raise ModelError(f"node {node.name!r} (matmul): shapes {list(sa)} and {list(sb)} "
                         "do not multiply")
    batch = broadcast_shape(a[:-2], b[:-2], where=f"node {node.name!r}")
    rows = (a[-2],) if len(sa) > 1 else ()
    cols = (b[-1],) if len(sb) > 1 else ()
    return [TensorType(batch + rows + cols, types[0].dtype)]


def _matmul_numpy(xs, node):
    a, b = xs
    if node.attr("trans_a"):
        a = np.swapaxes(a, -1, -2)
    if node.attr("trans_b"):
        b = np.swapaxes(b, -1, -2)
    return [np.matmul(a, b)]


register("matmul", OpKind.ANCHOR, _matmul_infer, numpy=_matmul_numpy,
         float64=True, sample=lambda rng, dtype: (
             [rng.uniform(-1, 1, s).astype(dtype) for s in ((2, 3, 5), (4, 5))],
             {"trans_a": 0, "trans_b": 1}))


_EINSUM_DTYPES = ("float32", "float64", "float16", "int64", "int32")


def _einsum_infer(types, node):
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1 or not dtypes <= set(_EINSUM_DTYPES):
        raise ModelError(f"node {node.name!r} (einsum): operand dtypes "
                         f"{[t.dtype for t in types]} are not supported (one of "
                         f"{', '.join(_EINSUM_DTYPES)} for all)")
    sizes = einsum_sizes(node.attr("terms"), [t.shape for t in types], node)
    return [TensorType(tuple(sizes[c] for c in node.attr("output")), types[0].dtype)]


def _einsum_numpy(xs, node):
    terms, output = node.attr("terms"), node.attr("output")
    sizes = einsum_sizes(terms, [x.shape for x in xs], node)
    full = [np.broadcast_to(x, [sizes[c] for c in t]) for x, t in zip(xs, terms, strict=True)]
    return [np.asarray(np.einsum(f"{','.join(terms)}->{output}", *full)).astype(xs[0].dtype)]


# einsum(x...; terms, output): out[output] = sum over the letters not in `output` of the
# product of x_k[terms[k]] (letters only: the converter spells out ellipses).
register("einsum", OpKind.OPAQUE, _einsum_infer, numpy=_einsum_numpy, float64=True,
         sample=lambda rng, dtype: ([rng.uniform(-1, 1, s).astype(dtype)
                                     for s in ((2, 3, 3), (2, 3, 4), (4,))],
                                    {"terms": ("bii", "bij", "j"), "output": "bi"}))


def _det_infer(types, node):
    _check_float(node, types)
    shape = types[0].shape
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ModelError(f"node {node.name!r} (det): input {list(shape)} is not a stack of "
                         "square matrices [..., M, M]")
    return [TensorType(shape[:-2], types[0].dtype)]


# det(x): the determinant of each [M, M] matrix of x [..., M, M].
register("det", OpKind.OPAQUE, _det_infer, float64=True,
         numpy=lambda xs, node: [np.asarray(np.linalg.det(xs[0])).astype(xs[0].dtype)],
         sample=lambda rng, dtype: ([rng.uniform(-1, 1, (2, 4, 4)).astype(dtype)], {}))
