"""Window geometry shared by convolution and pooling (NCHW, 1-D as H=1), and
the per-plane epilogue of the direct convolutions.

Graph ops keep 2-D attributes (strides, dilations as (h, w); pads as
(top, left, bottom, right)). A 1-D ONNX node (input N, C, W) becomes the same
op family with H=1: `lift_1d` turns its attributes into that form, and
`view_4d` / `squeeze_index` let a 2-D lowering run on 3-D buffers, which have
the same memory layout.
"""

from __future__ import annotations

import dataclasses

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType


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


def view_4d(buf):
    """The same memory seen as (N, C, 1, W): a 1-D buffer for a 2-D lowering."""
    if len(buf.type.shape) != 3:
        return buf
    return dataclasses.replace(buf, type=lift_type(buf.type))


def squeeze_index(epilogue):
    """An epilogue over (N, C, W) called with 2-D lowering indices (n, c, 0, w)."""
    if epilogue is None:
        return None
    return lambda value, index: epilogue(value, [index[0], index[1], index[3]])


def as_1d(infer, lower):
    """(infer, lower) of a 2-D window op, made to work on (N, C, W) tensors."""
    def infer_1d(types, node):
        (out,) = infer([lift_type(t) if len(t.shape) == 3 else t for t in types], node)
        return [TensorType(out.shape[:2] + out.shape[3:], out.dtype)]

    def lower_1d(kb, node, ins, out, epilogue):
        lower(kb, node, [view_4d(b) for b in ins], view_4d(out), squeeze_index(epilogue))

    return infer_1d, lower_1d


def plane_epilogue(kb, out, plane, n, oc, epilogue) -> None:
    """Apply `epilogue` to the finished (n, oc) output plane at offset `plane`."""
    if epilogue is None:
        return
    _, _, oh_n, ow_n = out.type.shape
    with kb.loop(0, oh_n, "eh") as oh, kb.loop(0, ow_n, "ew") as ow:
        o = plane + (oh * ow_n + ow)
        kb.store(out, o, epilogue(kb.load(out, o), [n, oc, oh, ow]))
