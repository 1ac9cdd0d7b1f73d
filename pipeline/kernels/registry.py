"""The lowering table: how each graph operator becomes LLVM code.

An elementwise operator has a `scalar` function (kb, args: list[ir.Value], node)
-> ir.Value; an anchor or opaque one a `lower` function (kb, node, ins: list[Buffer],
out: Buffer, epilogue) that writes loops with a KernelBuilder. Each entry records
the kernels module that registered it: that module, with what it imports, is what
a kernel's version hashes (pipeline/lower/kernel.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import GraphError


@dataclass(frozen=True)
class Lowering:
    op: str
    module: str                     # the pipeline.kernels module that registered it
    lower: Callable | None = None   # (kb, node, ins: list[Buffer], out: Buffer, epilogue)
    scalar: Callable | None = None  # (kb, args: list[ir.Value], node) -> ir.Value
    # (kb, node, ins, out, epilogue, shapes): the kernel with runtime dimensions (shapes
    # hold Index values where the spec has symbols; shapes() gives them again inside a
    # parallel_for body, dsl/dims.py), for what rows kernels cannot do
    lower_dims: Callable | None = None


LOWERINGS: dict[str, Lowering] = {}


def lowering(op: str, *, lower: Callable | None = None,
             scalar: Callable | None = None, lower_dims: Callable | None = None) -> Lowering:
    """Register graph operator `op`'s lowering (exactly one of `lower`, `scalar`),
    recorded with the module calling this (the caller's frame: the one place that
    knows it without every family repeating `__name__`)."""
    assert (lower is None) != (scalar is None), op
    assert op not in LOWERINGS, f"lowering of {op} registered twice"
    module = sys._getframe(1).f_globals["__name__"]
    LOWERINGS[op] = Lowering(op, module, lower, scalar, lower_dims)
    return LOWERINGS[op]


def lowering_of(op: str) -> Lowering:
    """The Lowering of graph operator `op`; GraphError if none is registered."""
    try:
        return LOWERINGS[op]
    except KeyError:
        raise GraphError(f"no lowering for graph operator {op!r}") from None
