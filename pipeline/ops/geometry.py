"""Helpers shared by shape rules, converters and kernels (no numpy reference here:
kernels import this module, so what it holds enters their version).

Window geometry of convolution and pooling (NCHW, 1-D as H=1): graph ops keep
2-D attributes (strides, dilations as (h, w); pads as (top, left, bottom,
right)). A 1-D ONNX node (input N, C, W) becomes the same op family with H=1:
`lift_1d` turns its attributes into that form and `infer_1d` its shape rule;
pipeline/kernels/nn.py's `lower_1d` lets a 2-D lowering run on 3-D buffers,
which have the same memory layout. Also: attention's logical operand shapes,
the blocked layouts' names, matmul's operand shapes, the quantized types.
"""

from __future__ import annotations

import re

from pipeline.errors import GraphError, ModelError
from pipeline.ir.graph import TensorType


def logical_shapes(shapes: list[tuple], node) -> tuple[tuple, tuple, tuple]:
    """Q, Kᵀ, V as the kernel sees them (each operand's shape through its perm)."""
    return tuple(tuple(s[p] for p in node.attr(f"{name}_perm"))
                 for s, name in zip(shapes, ("q", "k", "v"), strict=False))


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


def window_out(size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dil: int,
               ceil_mode: bool = False) -> int:
    """Number of windows of `k` taps (dilation `dil`) over a padded axis."""
    span = size + pad_lo + pad_hi - dil * (k - 1) - 1
    out = (ceil_div(span, stride) if ceil_mode else span // stride) + 1
    # A last window that would start inside the end padding is dropped (ONNX, PyTorch).
    if ceil_mode and (out - 1) * stride >= size + pad_lo:
        out -= 1
    return out


def auto_pad_of(n) -> str:
    return n.text("auto_pad", "NOTSET") or "NOTSET"


def spatial_attrs(n, in_shape: tuple[int, ...], kernel: tuple[int, ...],
                  ceil_mode: bool = False) -> dict:
    """strides, dilations and explicit pads (all begins, then all ends) of an ONNX
    Conv/pool node over `in_shape` (N, C, spatial...) with window `kernel`.

    Raises ModelError naming the node for a wrong rank, attribute length or
    auto_pad value. 1-D, 2-D and 3-D windows are supported.
    """
    d = len(kernel)
    if d not in (1, 2, 3) or len(in_shape) != d + 2:
        raise ModelError(f"node {n.name!r} ({n.op_type}): only 1-D, 2-D and 3-D windows "
                         f"are supported, got input shape {list(in_shape)} and kernel "
                         f"{list(kernel)}")
    strides = tuple(int(s) for s in n.attrs.get("strides", (1,) * d))
    dilations = tuple(int(s) for s in n.attrs.get("dilations", (1,) * d))
    for key, value, want in (("strides", strides, d), ("dilations", dilations, d)):
        if len(value) != want or min(value) < 1:
            raise ModelError(f"node {n.name!r} ({n.op_type}): {key} {list(value)} must be "
                             f"{want} positive integers")
    auto_pad = auto_pad_of(n)
    if auto_pad == "NOTSET":
        pads = tuple(int(p) for p in n.attrs.get("pads", (0,) * (2 * d)))
        if len(pads) != 2 * d or min(pads) < 0:
            raise ModelError(f"node {n.name!r} ({n.op_type}): pads {list(pads)} must be "
                             f"{2 * d} non-negative integers")
    elif auto_pad == "VALID":
        pads = (0,) * (2 * d)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for size, k, s, dil in zip(in_shape[2:], kernel, strides, dilations, strict=True):
            # Output size is ceil(size / stride); pad just enough for it.
            total = max(0, (ceil_div(size, s) - 1) * s + (k - 1) * dil + 1 - size)
            small, big = total // 2, total - total // 2
            lo.append(small if auto_pad == "SAME_UPPER" else big)
            hi.append(big if auto_pad == "SAME_UPPER" else small)
        pads = (*lo, *hi)
    else:
        raise ModelError(f"node {n.name!r} ({n.op_type}): unknown auto_pad {auto_pad!r} "
                         "(NOTSET, SAME_UPPER, SAME_LOWER, VALID are valid)")
    return {"strides": strides, "dilations": dilations, "pads": pads}


def lift_1d(attrs: dict) -> dict:
    """1-D window attributes as their 2-D form with H=1 (other keys unchanged)."""
    out = dict(attrs)
    for key in ("strides", "dilations", "kernel", "output_padding"):
        if key in attrs and len(attrs[key]) == 1:
            out[key] = (1, attrs[key][0])
    if "pads" in attrs and len(attrs["pads"]) == 2:
        out["pads"] = (0, attrs["pads"][0], 0, attrs["pads"][1])
    return out


def lift_type(t: TensorType) -> TensorType:
    """(N, C, W) as (N, C, 1, W)."""
    return TensorType(t.shape[:2] + (1,) + t.shape[2:], t.dtype)


QTYPES = {"uint8": (0, 255), "int8": (-128, 127)}


# QuantizeLinear / DequantizeLinear alone also take the 16-bit types (computed in i32
# like the 8-bit ones); the integer kernels stay 8-bit (QTYPES).
LINEAR_QTYPES = {**QTYPES, "uint16": (0, 65535), "int16": (-32768, 32767)}


FLOAT_DTYPES = ("float32", "float64", "float16")


def infer_1d(infer):
    """The shape rule of a 2-D window op, made to work on (N, C, W) tensors."""
    def infer_1d(types, node):
        (out,) = infer([lift_type(t) if len(t.shape) == 3 else t for t in types], node)
        return [TensorType(out.shape[:2] + out.shape[3:], out.dtype)]

    return infer_1d
