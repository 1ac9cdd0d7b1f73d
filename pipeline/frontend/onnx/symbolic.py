"""Shape values with symbolic dimensions at import (the VM's, pipeline/ir/dims.py).

Exporters compute a Reshape's target from the input's shape: Shape -> Gather ->
Unsqueeze -> Concat (torch.onnx's `x.view(x.size(0), x.size(1), heads, d)`). When the
shape has symbols, Shape's output is a *symbolic value*: a 1-D object array of ints
and symbol names, which the few operators that shuffle shape vectors evaluate at
build time (gather, reshape, concat, slice, transpose, an integer cast, and mul, div,
add, sub in the expression type of dims.py). Only Reshape takes such a value
(ImportContext.const(..., symbolic=True)); every other consumer sees an unknown
value, refused as any runtime shape is, in one line.
"""

from __future__ import annotations

import numpy as np

from pipeline.ir.dims import dim_product, dim_quotient
from pipeline.ir.graph import Node
from pipeline.ops import get

__all__ = ["symbolic_numpy"]

_MOVES = ("gather", "reshape", "concat", "slice", "transpose")


def _arith(op: str):
    """The element function of a binary op on dims; ValueError outside the type."""
    def apply(a, b):
        if op == "mul":
            return dim_product([a, b])
        if op == "div":
            q = dim_quotient(a, b)
            if q is None:
                raise ValueError(f"{a} / {b}")
            return q
        if isinstance(a, str) or isinstance(b, str):
            raise ValueError(f"{op} of a symbolic dimension")
        return a + b if op == "add" else a - b
    return np.frompyfunc(apply, 2, 1)


def symbolic_numpy(node: Node, args: list[np.ndarray]) -> list[np.ndarray] | None:
    """`node`'s outputs for inputs some of which are symbolic values (object arrays),
    or None when it is not a shape computation this module evaluates."""
    if node.op in _MOVES:
        return [np.array(v, dtype=object) for v in get(node.op).numpy(args, node)]
    if node.op == "cast" and node.attr("to") in ("int64", "int32"):
        return [args[0]]
    if node.op in ("mul", "div", "add", "sub"):
        try:
            return [np.asarray(_arith(node.op)(*(a.astype(object) for a in args)),
                               dtype=object)]
        except ValueError:
            return None
    return None
