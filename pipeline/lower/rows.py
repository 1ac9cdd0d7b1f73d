"""Kernels over symbolic rows: which kernels with symbolic dimensions the VM runs, and
the static kernels that compute them (docs/vm.md, "Symbolic dimensions").

A kernel whose output's leading dimensions are symbolic (its *row prefix*: batch, or
batch and sequence), every other dimension static, is computed row by row: each
value of the flattened prefix is independent of the others when every input either
has the same prefix or none of its symbols (a weight, a bias), and the operator
works along none of the prefix axes (a softmax over the last axis, a matmul whose
second operand is a weight, a transpose that keeps the prefix in place). Such a
kernel is the same static kernel, instantiated for a block of rows, called over the
runtime row count: its vectorised inner loops are today's, the row count alone is
runtime (pipeline/codegen/rows.py renders the loop). Anything else with a symbol is
refused in one line naming the kernel.
"""

from __future__ import annotations

import math
from dataclasses import replace

from pipeline.errors import GraphError
from pipeline.ir.dims import is_symbol, substitute
from pipeline.ir.graph import Node, TensorType
from pipeline.lower.kernel import KernelSpec
from pipeline.ops import OpKind, get

__all__ = ["ROW_BLOCKS", "at_rows", "at_values", "row_blocks", "row_prefix"]

# Rows per call of the static kernels a rows kernel is made of, largest first: whole
# blocks of 32 (a dense layer reads its weights once per call), then of 8, then the
# rest in one call of 1, 4 or 8 rows padded (codegen/rows.py PADDED_TAIL), or, when
# rows are too large to copy, 4 and then one at a time (at most 3 single rows).
ROW_BLOCKS = (32, 8, 4, 1)
# matmul_nbits dequantizes its weights once per call (kernels/nbits.py, from 16 rows):
# a prefill's 128 rows in one call, not four (its columns split over the team).
NBITS_ROW_BLOCKS = (128, *ROW_BLOCKS)

# Operators (besides elementwise ones) that compute each row of a leading prefix
# alone, given the axis checks of _axes_outside.
_ROW_OPS = {"matmul", "dense", "dense_packed", "matmul_nbits", "softmax", "log_softmax", "hardmax",
            "layer_norm", "rms_norm", "transpose", "reshape", "gather", "gather_nbits", "concat",
            "attention", "cumsum", "cumprod", "argmax", "argmin", "slice",
            "conv1d", "conv2d", "conv3d", "conv2d_nchwc", "conv2d_pointwise",
            "depthwise_conv2d_nchwc", "max_pool2d", "avg_pool2d", "global_avg_pool",
            "global_max_pool", "batch_norm", "instance_norm", "group_norm",
            *(f"reduce_{k}" for k in ("sum", "mean", "max", "min", "prod", "l1", "l2",
                                      "sum_square", "log_sum", "log_sum_exp"))}


def _axes_outside(node: Node, rank: int, k: int, inputs: list[TensorType]) -> bool:
    """Whether `node` (the kernel's anchor, input rank `rank`) works along no axis of
    the k-dimension prefix."""
    axes = [node.attr(a) for a in ("axis",) if node.attr(a) is not None]
    axes += list(node.attr("axes") or ())
    if node.op in ("gather", "gather_nbits"):  # the prefix comes from the indices; data
        # is a table (gather_nbits': always, along axis 0)
        return (node.op == "gather_nbits" or node.attr("axis") == 0) and not inputs[0].symbolic
    if node.op == "transpose":
        return tuple(node.attr("perm")[:k]) == tuple(range(k))
    if node.op == "slice":  # the rows kept whole
        return all(s == 0 for s in node.attr("starts")[:k]) and all(
            s == 1 for s in node.attr("steps")[:k])
    if node.op == "matmul":
        a, b = inputs
        return (not node.attr("trans_a") or k <= len(a.shape) - 2) and (
            not b.symbolic or k <= len(b.shape) - 2)
    if node.op == "attention":
        return k == 1 and all(node.attr(f"{n}_perm")[0] == 0 for n in ("q", "k", "v", "out"))
    if node.op.startswith(("conv", "depthwise", "max_pool", "avg_pool", "global", "batch_n",
                           "instance_n", "group_n")):
        return k == 1  # the batch dim only
    return all(a % rank >= k for a in axes)


def _rows_of(shape) -> tuple[tuple[str, ...], int] | None:
    """(its row symbols, the elements of one row) if `shape`'s dims up to its last
    symbol are symbols or 1, else None."""
    k = max((d for d, v in enumerate(shape) if isinstance(v, str)), default=-1) + 1
    if any(d != 1 for d in shape[:k] if not isinstance(d, str)):
        return None
    return tuple(d for d in shape[:k] if isinstance(d, str)), math.prod(shape[k:])


def row_prefix(spec: KernelSpec) -> tuple[str, ...]:
    """The symbols of the output's row prefix (module doc; static 1s may sit between
    them), () for a static kernel; GraphError naming the kernel when it has symbols
    but cannot run by rows."""
    if not spec.symbols:
        return ()
    out = spec.params[-1].shape
    # the rows: the output's dims up to its last symbol ([batch, 1, 1, seq] too: 1s
    # between symbols do not change the bytes)
    k = max((d for d, v in enumerate(out) if isinstance(v, str)), default=-1) + 1
    prefix = tuple(out[:k])
    names = tuple(d for d in prefix if isinstance(d, str))
    anchor = spec.ops[0]

    def why() -> str | None:
        if not names or any(d != 1 for d in prefix if not isinstance(d, str)):
            return "its output's symbolic dimensions are not all leading"
        if not all(is_symbol(d) for d in names) or len(set(names)) != len(names):
            return "its leading dimensions are not distinct symbols"
        for i, t in enumerate(spec.params[:-1]):
            same = (tuple(t.shape[:k]) == prefix
                    and not any(isinstance(d, str) for d in t.shape[k:]))
            if anchor.op == "reshape" and i == 0:  # the same bytes per row, any layout
                same = _rows_of(t.shape) == (names, math.prod(out[k:]))
            if t.symbolic and not same:
                return f"an input {list(t.shape)} does not share the output's leading rows"
        if get(anchor.op).kind != OpKind.ELEMENTWISE and anchor.op not in _ROW_OPS:
            return f"{anchor.op} is not computed row by row"
        inputs = list(spec.params[:len(anchor.inputs)])
        if get(anchor.op).kind != OpKind.ELEMENTWISE and not _axes_outside(
                anchor, len(inputs[0].shape), k, inputs):
            return f"{anchor.op} works along a symbolic dimension"
        return None

    problem = why()
    if problem:
        shapes = [list(t.shape) for t in spec.params]
        raise GraphError(f"kernel {spec.name} {shapes}: symbolic dimensions are supported "
                         f"on leading rows only; {problem}")
    return names


def row_blocks(spec: KernelSpec) -> tuple[int, ...]:
    """The rows per call of `spec`'s static kernels, largest first (ROW_BLOCKS)."""
    return NBITS_ROW_BLOCKS if spec.ops[0].op == "matmul_nbits" else ROW_BLOCKS


def at_rows(spec: KernelSpec, prefix: tuple[str, ...], rows: int) -> KernelSpec:
    """The static kernel computing `rows` consecutive rows of `spec`: its first
    prefix symbol `rows`, the others 1 (the same bytes as `rows` flattened rows)."""
    return at_values(spec, {s: (rows if k == 0 else 1) for k, s in enumerate(prefix)})


def at_values(spec: KernelSpec, values: dict[str, int]) -> KernelSpec:
    """`spec` with each symbol (its s0, s1, ...) given its value in `values`."""

    def typ(t: TensorType) -> TensorType:
        return TensorType(substitute(t.shape, values), t.dtype)

    ops = tuple(Node(n.op, n.name, n.inputs, n.outputs, tuple(
        (key, substitute(v, values) if key == "shape" else v) for key, v in n.attrs))
        for n in spec.ops)
    return replace(spec, ops=ops, params=tuple(typ(t) for t in spec.params))
