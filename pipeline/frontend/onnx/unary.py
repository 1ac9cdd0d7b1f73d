"""ONNX converters to the unary operators (defined in pipeline/ops/unary.py)."""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import Limit, onnx_op
from pipeline.ir.graph import BITS, ONNX_DTYPES, Node
from pipeline.ops.unary import ONNX_UNARY


def _converter(op: str, defaults: dict):
    """A converter copying the ONNX attributes in `defaults` (with those defaults)."""
    def convert(ctx, n):
        attrs = {}
        for key, default in defaults.items():
            value = n.attrs.get(key, default)
            attrs[key] = value.decode() if isinstance(value, bytes) else float(value) \
                if isinstance(default, float) else value
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], **attrs)]
    return convert


for _op, _onnx, _since, _defaults in ONNX_UNARY:
    onnx_op(_onnx, _since, emits=(_op,))(_converter(_op, _defaults))


@onnx_op("Clip", 6, emits=("clip",))
def _clip_v6(ctx, n):
    return [Node.make("clip", n.name, n.inputs[:1], n.outputs[:1],
                      min=float(n.attrs.get("min", -3.4028234663852886e38)),
                      max=float(n.attrs.get("max", 3.4028234663852886e38)))]


@onnx_op("Clip", 11, emits=("clip",), build_time_inputs=(1, 2))
def _clip_v11(ctx, n):
    # min and max became optional inputs; we need them as build-time constants.
    dtype = np.dtype(ctx.type(n.inputs[0]).dtype)
    lowest, highest = (-np.inf, np.inf) if dtype.kind == "f" else \
        (np.iinfo(dtype).min, np.iinfo(dtype).max)
    bounds = []
    for pos, default in ((1, lowest), (2, highest)):
        name = n.inputs[pos] if len(n.inputs) > pos else ""
        if not name:
            bounds.append(default)
            continue
        value = ctx.const(name)
        if value is None:
            raise ModelError(f"node {n.name!r} (Clip): bound {name!r} must be a constant")
        bounds.append(value.item())
    return [Node.make("clip", n.name, n.inputs[:1], n.outputs[:1], min=bounds[0],
                      max=bounds[1])]


onnx_op("IsNaN", 9, emits=("isnan",))(_converter("isnan", {}))

onnx_op("IsInf", 10, emits=("isinf",))(
    _converter("isinf", {"detect_negative": 1, "detect_positive": 1}))


@onnx_op("BitCast", 26, emits=("bitcast",),
         limits=(Limit("to bool (bits other than 0 and 1)",
                       lambda n: n.attrs.get("to") == 9 and n.inputs[0] is not None
                       and n.inputs[0][0] != 9),))
def _bitcast(ctx, n):
    to = ONNX_DTYPES.get(int(n.attrs["to"]))
    source = ctx.type(n.inputs[0]).dtype
    if to is None or BITS[source] != BITS[to]:
        raise ModelError(f"node {n.name!r} (BitCast): cannot reinterpret {source} as "
                         f"{to or n.attrs['to']} (same-width {', '.join(ONNX_DTYPES.values())} "
                         "only)")
    if to == "bool" and source != "bool":
        raise ModelError(f"node {n.name!r} (BitCast): to bool is not supported (the bits "
                         "may be other than 0 and 1)")
    return [Node.make("bitcast", n.name, n.inputs[:1], n.outputs[:1], source=source, to=to)]


@onnx_op("SwiGLU", 28, emits=("swish", "mul"))
def _swiglu(ctx, n):
    """Y = Swish_alpha(A) * B: the Swish op then a Mul (one fused elementwise kernel).
    A and B have one shape: SwiGLU does not broadcast."""
    a, b = n.inputs[:2]
    if ctx.type(a).shape != ctx.type(b).shape:
        raise ModelError(f"node {n.name!r} (SwiGLU): A {list(ctx.type(a).shape)} and B "
                         f"{list(ctx.type(b).shape)} differ in shape (no broadcasting)")
    gate = f"{n.outputs[0]}__swish"
    return [Node.make("swish", f"{n.name}__swish", (a,), (gate,),
                      alpha=float(n.attrs.get("alpha", 1.0))),
            Node.make("mul", n.name, (gate, b), n.outputs[:1])]
