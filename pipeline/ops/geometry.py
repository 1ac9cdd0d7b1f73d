"""What kernels share with shape rules (and converters): attention's logical
operand shapes and appended keys (`split_appended`), the blocked layouts' names,
matmul's operand shapes, einsum's index sizes, the quantized and float dtypes, a
window op's 1-D type seen as 2-D (`lift_type`), CausalConvWithState's operands
(`causal_parts`).

No numpy reference and nothing only shape rules or converters use: kernels import
this module, so what it holds enters their version.
"""

from __future__ import annotations

import re

from pipeline.errors import GraphError, ModelError
from pipeline.ir.graph import TensorType


def logical_shapes(shapes: list[tuple], node) -> tuple[tuple, tuple, tuple]:
    """Q, Kᵀ, V as the kernel sees them (each operand's shape through its perm)."""
    return tuple(tuple(s[p] for p in node.attr(f"{name}_perm"))
                 for s, name in zip(shapes, ("q", "k", "v"), strict=False))


def split_appended(items: list, node) -> tuple[list, list]:
    """An attention node's inputs (or their types, or arrays) as [q, k, v(, mask)] and
    the keys and values appended after K and V ([k_new, v_new] with attribute
    `appended`, else [])."""
    if node.attr("appended", False):
        return list(items[:-2]), list(items[-2:])
    return list(items), []


# The attention kernel's vectors (floats) and the largest stack panels (floats) one
# of its work items may use: Kᵀ, V and R rows of scores.
ATTENTION_LANES = 16
MAX_PANEL_FLOATS = 1 << 16  # 256 KiB of a thread's stack


def attention_rows(sq: int) -> int:
    """Query rows per attention tile: 4 x 2 vectors of accumulators (AVX2's 16
    registers too)."""
    return next(r for r in (4, 2, 1) if sq % r == 0)


def panel_floats(sq: int, d: int, sk: int, dv: int) -> int:
    """Stack floats one attention work item uses (see MAX_PANEL_FLOATS)."""
    lanes = ATTENTION_LANES
    skp, dvp = -(-sk // lanes) * lanes, -(-dv // lanes) * lanes
    return d * skp + sk * dvp + attention_rows(sq) * skp


def parse_layout(text: str) -> int:
    """The channel block of "NCHW" (0) or "NCHW{b}c" (b)."""
    if text == "NCHW":
        return 0
    m = re.fullmatch(r"NCHW(\d+)c", text)
    if not m or int(m.group(1)) < 1:
        raise GraphError(f"layout_transform: unknown layout {text!r} (NCHW or NCHW<b>c)")
    return int(m.group(1))


def layout_blocks(node) -> tuple[int, int]:
    return parse_layout(node.attr("src_layout")), parse_layout(node.attr("dst_layout"))


def matrix_shapes(a: tuple, b: tuple, node) -> tuple[tuple, tuple]:
    """(a, b) as matrices (a 1-D operand becomes one row / one column), then
    transposed as the node's trans_a / trans_b say."""
    a = (1,) + a if len(a) == 1 else a
    b = b + (1,) if len(b) == 1 else b
    if node.attr("trans_a"):
        a = a[:-2] + (a[-1], a[-2])
    if node.attr("trans_b"):
        b = b[:-2] + (b[-1], b[-2])
    return a, b


def ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def lift_type(t: TensorType) -> TensorType:
    """(N, C, W) as (N, C, 1, W)."""
    return TensorType(t.shape[:2] + (1,) + t.shape[2:], t.dtype)


QTYPES = {"uint8": (0, 255), "int8": (-128, 127)}


# QuantizeLinear / DequantizeLinear alone also take the 16-, 4- and 2-bit types (computed
# in i32 like the 8-bit ones); the integer kernels stay 8-bit (QTYPES).
LINEAR_QTYPES = {**QTYPES, "uint16": (0, 65535), "int16": (-32768, 32767), "uint4": (0, 15),
                 "int4": (-8, 7), "uint2": (0, 3), "int2": (-2, 1)}


FLOAT_DTYPES = ("float32", "float64", "float16")


def causal_parts(xs, node):
    """(x, weight, bias or None, past state or None) of a causal_conv /
    causal_conv_state node's inputs: x and weight, then the bias if attr bias, then
    the past state if attr past (causal_conv_state: x, then the past state if past)."""
    x, *rest = xs
    weight = rest.pop(0) if node.op == "causal_conv" else None
    bias = rest.pop(0) if node.attr("bias") else None
    past = rest.pop(0) if node.attr("past") else None
    return x, weight, bias, past


def einsum_sizes(terms: tuple[str, ...], shapes: list[tuple[int, ...]], node) -> dict:
    """letter -> its size: the one size of that letter's dims other than 1 (a 1
    broadcasts, as ellipsis dims do); ModelError naming the node when they differ."""
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        if len(term) != len(shape):
            raise ModelError(f"node {node.name!r} (einsum): term {term!r} does not match "
                             f"operand shape {list(shape)}")
        for letter, d in zip(term, shape, strict=True):
            if sizes.get(letter, 1) not in (1, d) and d != 1:
                raise ModelError(f"node {node.name!r} (einsum): index {letter!r} has sizes "
                                 f"{sizes[letter]} and {d}")
            sizes[letter] = max(sizes.get(letter, 1), d)
    return sizes
