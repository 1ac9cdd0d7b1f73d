"""ONNX converters to the shape operators (defined in pipeline/ops/shape.py)."""

from __future__ import annotations

import math

import numpy as np

from pipeline.errors import GraphError, ModelError
from pipeline.frontend.onnx.registry import onnx_converter, onnx_op
from pipeline.frontend.onnx.symbolic import symbolic_dims, symbolic_range
from pipeline.ir.dims import dim_product, dim_quotient, is_symbolic
from pipeline.ir.graph import ONNX_DTYPES, Node


def need_const(ctx, n, pos: int, what: str, symbolic: bool = False) -> np.ndarray | None:
    """Input `pos` of ONNX node `n` as a build-time value (None if absent);
    ModelError naming the node if it is present but not constant. GraphError if the
    converter does not declare `pos` in its onnx_op(build_time_inputs=...): the
    backend would not freeze such an input when a model feeds it. symbolic: a shape
    value with symbolic dimensions is accepted (an object array; Reshape's)."""
    if pos not in onnx_converter(n.op_type, n.opset).build_time_inputs:
        raise GraphError(f"node {n.name!r} ({n.op_type}): the converter reads input {pos} at "
                         "build time but its onnx_op(build_time_inputs=...) does not list it")
    if len(n.inputs) <= pos or not n.inputs[pos]:
        return None
    value = ctx.const(n.inputs[pos], symbolic)
    if value is None:
        dynamic = " (it depends on a symbolic dimension)" if ctx.const(
            n.inputs[pos], True) is not None else ""
        raise ModelError(f"node {n.name!r} ({n.op_type}): {what} {n.inputs[pos]!r} must be "
                         f"known at build time{dynamic}")
    return value


def const_or_runtime(ctx, name: str, n) -> np.ndarray | None:
    """Tensor `name` (an input of ONNX node `n`) as a build-time value, or None when
    only a run knows it (the VM's data-dependent shapes: pipeline/ops/dynamic.py).
    ModelError naming the node if its value holds symbolic dimensions: only Reshape
    takes those (frontend/onnx/symbolic.py)."""
    value = ctx.const(name)
    if value is None and ctx.const(name, True) is not None:
        raise ModelError(f"node {n.name!r} ({n.op_type}): input {name!r} depends on a "
                         "symbolic dimension; only Reshape reads such a shape value")
    return value


def norm_axis(n, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"node {n.name!r} ({n.op_type}): axis {axis} out of range for "
                         f"rank {rank}")
    return axis % rank


def reshape(n, shape) -> list[Node]:
    return [Node.make("reshape", n.name, n.inputs[:1], n.outputs[:1],
                      shape=tuple(d if isinstance(d, str) else int(d) for d in shape))]


def resolve_reshape(name: str, in_shape: tuple[int, ...], target, allowzero: bool = False):
    """ONNX Reshape semantics: 0 copies the input dim (unless allowzero), -1 is inferred."""
    out = [in_shape[i] if (not isinstance(d, str) and d == 0 and not allowzero)
           else d if isinstance(d, str) else int(d) for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise ModelError(f"node {name!r} (Reshape): more than one -1 in {list(target)}")
    if -1 in out and is_symbolic([*in_shape, *out]):
        rest = dim_quotient(dim_product(in_shape), dim_product(d for d in out if d != -1))
        if rest is None:
            raise ModelError(f"node {name!r} (Reshape): cannot reshape {list(in_shape)} "
                             f"to {list(target)} (symbolic dimensions)")
        out[out.index(-1)] = rest
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(in_shape)
        if known == 0 or total % known:
            raise ModelError(f"node {name!r} (Reshape): cannot reshape {list(in_shape)} "
                             f"to {list(target)}")
        out[out.index(-1)] = total // known
    return tuple(out)


@onnx_op("Reshape", 1, emits=("reshape",))
def _reshape_v1(ctx, n):
    return reshape(n, resolve_reshape(n.name, ctx.type(n.inputs[0]).shape, n.attrs["shape"]))


@onnx_op("Reshape", 5, emits=("reshape", "reshape_to"), build_time_inputs=(1,))
def _reshape_v5(ctx, n):
    if ctx.const(n.inputs[1], True) is None:  # a runtime shape: only the VM runs it
        return [Node.make("reshape_to", n.name, n.inputs[:2], n.outputs[:1],
                          allowzero=int(n.attrs.get("allowzero", 0)))]
    target = need_const(ctx, n, 1, "the shape input", symbolic=True)
    return reshape(n, resolve_reshape(n.name, ctx.type(n.inputs[0]).shape, target.tolist(),
                                      bool(n.attrs.get("allowzero", 0))))


@onnx_op("Flatten", 1, emits=("reshape",))
def _flatten(ctx, n):
    in_shape = ctx.type(n.inputs[0]).shape
    axis = int(n.attrs.get("axis", 1))
    axis = axis + len(in_shape) if axis < 0 else axis  # ONNX: axis in [-rank, rank]
    return reshape(n, (dim_product(in_shape[:axis]), dim_product(in_shape[axis:])))


def _axes(ctx, n, since_input: int):
    """Squeeze/Unsqueeze axes: an attribute before opset 13, an input from 13."""
    if n.opset < since_input:
        return n.attrs.get("axes")
    value = need_const(ctx, n, 1, "the axes input")
    return None if value is None else np.atleast_1d(value).tolist()  # a scalar is one axis


@onnx_op("Squeeze", 1, emits=("reshape",), build_time_inputs=(1,))
def _squeeze(ctx, n):
    shape = ctx.type(n.inputs[0]).shape
    axes = _axes(ctx, n, 13)
    if axes is None:
        return reshape(n, [d for d in shape if d != 1])
    axes = {norm_axis(n, int(a), len(shape)) for a in axes}
    if any(shape[a] != 1 for a in axes):
        raise ModelError(f"node {n.name!r} (Squeeze): axes {sorted(axes)} of shape "
                         f"{list(shape)} are not all 1")
    return reshape(n, [d for k, d in enumerate(shape) if k not in axes])


@onnx_op("Unsqueeze", 1, emits=("reshape",), build_time_inputs=(1,))
def _unsqueeze(ctx, n):
    shape = list(ctx.type(n.inputs[0]).shape)
    axes = _axes(ctx, n, 13)
    if axes is None:
        raise ModelError(f"node {n.name!r} (Unsqueeze): axes are required")
    rank = len(shape) + len(axes)
    for a in sorted(norm_axis(n, int(a), rank) for a in axes):
        shape.insert(a, 1)
    return reshape(n, shape)


@onnx_op("Concat", 1, emits=("concat",))
def _concat(ctx, n):
    inputs = [i for i in n.inputs if i]
    rank = len(ctx.type(inputs[0]).shape)
    axis = norm_axis(n, int(n.attrs.get("axis", 1)), rank)
    return [Node.make("concat", n.name, inputs, n.outputs, axis=axis)]


@onnx_op("Expand", 8, emits=("expand", "expand_to"), build_time_inputs=(1,))
def _expand(ctx, n):
    shape = ctx.const(n.inputs[1], True)
    if shape is not None and shape.dtype == object:  # symbolic.py
        return [Node.make("expand", n.name, n.inputs[:1], n.outputs[:1],
                          shape=symbolic_dims(shape))]
    shape = const_or_runtime(ctx, n.inputs[1], n)
    if shape is None:  # a runtime shape: only the VM runs it (ops/dynamic.py)
        return [Node.make("expand_to", n.name, n.inputs[:2], n.outputs[:1])]
    return [Node.make("expand", n.name, n.inputs[:1], n.outputs[:1],
                      shape=tuple(int(d) for d in shape))]


@onnx_op("Shape", 1, emits=())
def _shape(ctx, n):
    shape = ctx.type(n.inputs[0]).shape
    rank = len(shape)
    start, end = int(n.attrs.get("start", 0)), int(n.attrs.get("end", rank))
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    if is_symbolic(shape[start:end]):  # a value of symbols: frontend/onnx/symbolic.py
        ctx.set_symbolic(n.outputs[0], shape[start:end])
        return []
    ctx.set_const(n.outputs[0], np.array(shape[start:end], np.int64))
    return []


@onnx_op("Size", 1, emits=())
def _size(ctx, n):
    ctx.set_const(n.outputs[0], np.array(ctx.type(n.inputs[0]).size, np.int64))
    return []


@onnx_op("ConstantOfShape", 9, emits=("fill", "expand"), build_time_inputs=(0,))
def _constant_of_shape(ctx, n):
    from onnx import numpy_helper  # converters run at import, where onnx is loaded

    value = n.attrs.get("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else \
        np.zeros(1, np.float32)
    shape = ctx.const(n.inputs[0], True)
    if shape is not None and shape.dtype == object:  # symbolic.py: the value expanded
        scalar = ctx.add_param(f"{n.outputs[0]}.value", fill[:1].reshape(()))
        return [Node.make("expand", n.name, (scalar,), n.outputs[:1],
                          shape=symbolic_dims(shape))]
    shape = const_or_runtime(ctx, n.inputs[0], n)
    if shape is None:  # a runtime shape: only the VM runs it (ops/dynamic.py)
        return [Node.make("fill", n.name, n.inputs[:1], n.outputs[:1],
                          value=fill[0].item(), dtype=str(fill.dtype))]
    ctx.set_const(n.outputs[0], np.full(tuple(int(d) for d in shape), fill[0], fill.dtype))
    return []


@onnx_op("Range", 11, emits=("range", "iota"), build_time_inputs=(0, 1, 2))
def _range(ctx, n):
    values = [ctx.const(i, True) for i in n.inputs[:3]]
    if all(v is not None for v in values) and any(v.dtype == object for v in values):
        return [symbolic_range(n, *values, ctx.type(n.inputs[0]).dtype)]
    start, limit, delta = (const_or_runtime(ctx, i, n) for i in n.inputs[:3])
    if start is None or limit is None or delta is None:  # only the VM runs it
        return [Node.make("range", n.name, n.inputs[:3], n.outputs[:1])]
    count = max(math.ceil((limit.item() - start.item()) / delta.item()), 0)
    ctx.set_const(n.outputs[0], (start + np.arange(count) * delta).astype(start.dtype))
    return []


def _dtype_attr(n, key: str, default: str) -> str:
    """The dtype an ONNX TensorProto code attribute names (`default` if absent);
    ModelError naming the node if the IR lacks it."""
    if key not in n.attrs:
        return default
    dtype = ONNX_DTYPES.get(int(n.attrs[key]))
    if dtype is None:
        raise ModelError(f"node {n.name!r} ({n.op_type}): {key} {n.attrs[key]} is not a "
                         f"supported dtype ({', '.join(ONNX_DTYPES.values())} are)")
    return dtype


@onnx_op("EyeLike", 9, emits=())
def _eye_like(ctx, n):
    """Ones on diagonal k of a 2-D zero tensor the input's shape (only its shape is read)."""
    x = ctx.type(n.inputs[0])
    if len(x.shape) != 2:
        raise ModelError(f"node {n.name!r} (EyeLike): input must be 2-D, got "
                         f"{list(x.shape)}")
    dtype = _dtype_attr(n, "dtype", x.dtype)
    ctx.set_const(n.outputs[0], np.eye(*x.shape, k=int(n.attrs.get("k", 0)), dtype=dtype))
    return []


# Window functions (opset 17): w[j] = sum_m a_m cos(2 pi m j / N), N = size if
# periodic (the default) else size - 1; coefficients a_m by window.
_WINDOWS = {"HannWindow": (0.5, -0.5), "HammingWindow": (25 / 46, -21 / 46),
            "BlackmanWindow": (0.42, -0.5, 0.08)}


def _window(coefficients: tuple[float, ...]):
    def convert(ctx, n):
        size = int(need_const(ctx, n, 0, "size").reshape(()))
        periods = size if int(n.attrs.get("periodic", 1)) else size - 1
        j = np.arange(size, dtype=np.float64)
        w = sum(a * np.cos(2 * np.pi * m * j / periods) for m, a in enumerate(coefficients))
        ctx.set_const(n.outputs[0], np.asarray(w).astype(
            _dtype_attr(n, "output_datatype", "float32")))
        return []
    return convert


for _op_type, _coefficients in _WINDOWS.items():
    onnx_op(_op_type, 17, emits=(), build_time_inputs=(0,))(_window(_coefficients))
