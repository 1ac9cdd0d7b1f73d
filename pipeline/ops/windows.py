"""Shape rules of the window ops (convolution, pooling; NCHW, 1-D as H=1): graph ops
keep 2-D attributes (strides, dilations as (h, w); pads as (top, left, bottom,
right)). A 1-D node (input N, C, W) is the same op family with H=1: `infer_1d`
makes a 2-D shape rule work on it (pipeline/kernels/windows.py `lower_1d` does the
same for a lowering; pipeline/frontend/onnx/windows.py `lift_1d` for attributes).
"""

from __future__ import annotations

from pipeline.errors import GraphError
from pipeline.ir.dims import dim_sum
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import ceil_div, lift_type


def window_out(size: int | str, k: int, stride: int, pad_lo: int, pad_hi: int, dil: int,
               ceil_mode: bool = False) -> int | str:
    """Number of windows of `k` taps (dilation `dil`) over a padded axis. Over a
    symbolic size (the VM's, pipeline/ir/dims.py) only stride 1 with at least
    dil * (k - 1) padding in all: `size + extra` (the expression type has no
    subtraction or division); GraphError otherwise."""
    if isinstance(size, str):
        extra = pad_lo + pad_hi - dil * (k - 1)
        if stride != 1 or extra < 0:
            raise GraphError(f"a window of {k} taps, stride {stride}, pads {pad_lo}+{pad_hi} "
                             f"over the symbolic size {size!r}: only stride 1 with padding "
                             "keeping the size or growing it is supported")
        return dim_sum([size, extra])
    span = size + pad_lo + pad_hi - dil * (k - 1) - 1
    out = (ceil_div(span, stride) if ceil_mode else span // stride) + 1
    # A last window that would start inside the end padding is dropped (ONNX, PyTorch).
    if ceil_mode and (out - 1) * stride >= size + pad_lo:
        out -= 1
    return out


def infer_1d(infer):
    """The shape rule of a 2-D window op, made to work on (N, C, W) tensors."""
    def infer_1d(types, node):
        (out,) = infer([lift_type(t) if len(t.shape) == 3 else t for t in types], node)
        return [TensorType(out.shape[:2] + out.shape[3:], out.dtype)]

    return infer_1d
