"""ONNX converters to the linalg operators (defined in pipeline/ops/linalg.py)."""

from __future__ import annotations

import string
from collections import Counter

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.nbits import from_dequantized
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.ir.graph import Node


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


@onnx_op("MatMul", 1, emits=("dense", "matmul", "matmul_nbits"))
def _matmul(ctx, n):
    a, b = n.inputs[:2]
    packed = from_dequantized(ctx, n.name, a, b, n.outputs[0])  # 4-bit weights stay so
    if packed is not None:
        return packed
    w = ctx.const(b)
    if w is not None and w.ndim == 2 and len(ctx.type(a).shape) >= 2:
        weight = ctx.add_param(f"{b}_nk", np.ascontiguousarray(w.T))
        return [Node.make("dense", n.name, (a, weight), n.outputs[:1])]
    return [Node.make("matmul", n.name, (a, b), n.outputs[:1], trans_a=0, trans_b=0)]


def _einsum_terms(n, ranks: list[int]) -> tuple[tuple[str, ...], str]:
    """The equation's input terms and output term, letters only: an ellipsis becomes
    letters the equation does not use (right-aligned: an operand with fewer ellipsis
    dims takes the last ones), the implicit output (no "->") the ellipsis then the
    letters that occur once, in ASCII order."""
    equation = n.text("equation", "").replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    given = lhs.split(",")
    if len(given) != len(ranks):
        raise ModelError(f"node {n.name!r} (Einsum): equation {equation!r} has {len(given)} "
                         f"terms for {len(ranks)} inputs")
    spare = [c for c in string.ascii_letters if c not in equation]
    width = max((r - len(t) + 3 for t, r in zip(given, ranks, strict=True) if "..." in t),
                default=0)
    ellipsis = "".join(spare[:width])
    terms = tuple(t.replace("...", ellipsis[width - (r - len(t) + 3):]) if "..." in t else t
                  for t, r in zip(given, ranks, strict=True))
    counts = Counter("".join(given).replace(".", ""))
    output = rhs.replace("...", ellipsis) if arrow else \
        ellipsis + "".join(sorted(c for c, k in counts.items() if k == 1))
    for term in (*terms, output):
        if not all(c in string.ascii_letters for c in term):
            raise ModelError(f"node {n.name!r} (Einsum): equation {equation!r} is not "
                             "letters, commas, one '->' and ellipses")
    return terms, output


@onnx_op("Einsum", 12, emits=("einsum",))
def _einsum(ctx, n):
    """Opset 28 only adds bfloat16 (computed in float32: frontend/onnx/widen.py)."""
    terms, output = _einsum_terms(n, [len(ctx.type(i).shape) for i in n.inputs])
    return [Node.make("einsum", n.name, n.inputs, n.outputs[:1], terms=terms, output=output)]


onnx_op("Det", 11, emits=("det",))(
    lambda ctx, n: [Node.make("det", n.name, n.inputs[:1], n.outputs[:1])])
