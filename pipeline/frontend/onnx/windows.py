"""ONNX window attributes (Conv, ConvTranspose, the pools) as graph-op attributes:
strides, dilations and explicit pads (`spatial_attrs`), 1-D ones in their 2-D form
with H=1 (`lift_1d`; see pipeline/ops/windows.py)."""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ops.geometry import ceil_div


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
            total = ((k - 1) * dil if isinstance(size, str) and s == 1 else  # symbolic size
                     max(0, (ceil_div(size, s) - 1) * s + (k - 1) * dil + 1 - size))
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
