"""ONNX models' declared and inferred shapes: input-shape overrides
(`with_input_shapes`) and ONNX's own shape inference, whose shapes the import
checks ours against."""

from __future__ import annotations

import math
import re

import onnx

from pipeline.errors import ModelError
from pipeline.ir.graph import ONNX_DTYPES, TensorType


def with_input_shapes(model: onnx.ModelProto,
                      shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """`model` with the graph inputs named in `shapes` declared at those shapes, and
    the shapes it declares for its outputs and intermediates (value_info) removed
    when an input changed: they were worked out for the old input shapes (batch 1,
    say), and ONNX shape inference, onnxruntime and the reference evaluator would
    hold the new shapes against them. Returns `model` itself when nothing changes,
    else a copy (element types kept). Used by the import and by the references
    that validate or time a library built with overrides."""
    changed = {}
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            declared = [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                        for d in dims]
            if declared != [d if isinstance(d, str) else int(d) for d in shapes[vi.name]]:
                changed[vi.name] = shapes[vi.name]
    if not changed:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _set_input_shapes(copy, changed)
    return copy


def _set_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """In place: inputs in `shapes` take those dims; every output's and value_info's
    declared shape is cleared (its element type stays) for inference to redo."""
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[vi.name]:
                if isinstance(d, str):  # a symbolic dimension (the VM's)
                    dims.add().dim_param = d
                else:
                    dims.add().dim_value = int(d)
    for vi in model.graph.output:
        if vi.type.tensor_type.HasField("shape"):
            vi.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]


def onnx_shape_inference(model, types, inputs, source) -> dict[str, tuple[int, ...]]:
    """Shapes ONNX infers once our input shapes are set, by tensor name."""
    model = _without_large_initializers(model)  # a copy: changed in place below
    names = {i.name for i in inputs}
    declared = {vi.name: [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                          for d in vi.type.tensor_type.shape.dim]
                for vi in model.graph.input if vi.name in names}
    if any(declared[n] != list(types[n].shape) for n in names):
        # Overridden inputs: the declared output shapes are the old batch's.
        _set_input_shapes(model, {n: types[n].shape for n in names})
    del model.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as err:
        lines = [line for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        # ONNX types no output of some function ops (GroupNormalization in onnx
        # 1.23), so strict mode fails at the next node: ONNX's gap, not the
        # model's. Keep what it can infer; our shape rules check the rest.
        if ("expected to have type but instead is null" not in lines[-1]
                and not _function_op_failed(lines[-1])):
            raise ModelError(f"{source}: ONNX shape inference failed: {lines[-1]}") from None
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    shapes = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(d.dim_value for d in dims)
    return shapes


def _without_large_initializers(model: onnx.ModelProto,
                                limit: int = 1024) -> onnx.ModelProto:
    """A copy of model for shape inference whose initializers of more than `limit`
    elements are typed graph inputs instead.

    ONNX reads initializer values only where they decide a shape (a Reshape's
    shape, Slice's starts: a few integers); serialising a ResNet-50's 100 MB of
    weights into and out of its inference was most of the import time.
    """
    large = {init.name: init for init in model.graph.initializer
             if math.prod(init.dims) > limit}
    copy = onnx.ModelProto(ir_version=model.ir_version)
    copy.opset_import.extend(model.opset_import)
    copy.functions.extend(model.functions)
    g = copy.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.output.extend(model.graph.output)
    g.initializer.extend(i for i in model.graph.initializer if i.name not in large)
    g.sparse_initializer.extend(model.graph.sparse_initializer)
    listed = {vi.name for vi in model.graph.input}
    for vi in model.graph.input:
        init = large.get(vi.name)
        g.input.append(vi if init is None else
                       onnx.helper.make_tensor_value_info(vi.name, init.data_type, init.dims))
    g.input.extend(onnx.helper.make_tensor_value_info(name, init.data_type, init.dims)
                   for name, init in large.items() if name not in listed)
    return copy


def _function_op_failed(message: str) -> bool:
    """Whether ONNX's own inference failed inside a function op's body (e.g. onnx 1.23
    expands MeanVarianceNormalization without its default axes into an invalid
    Constant): the model is fine, ONNX's expansion is not."""
    match = re.match(r".*?\(op_type:(\w+)\)", message)
    return bool(match) and onnx.defs.has(match.group(1)) and \
        onnx.defs.get_schema(match.group(1)).has_function


def input_type(vi, override, source: str, symbolic: bool = False) -> TensorType:
    """The type of graph input `vi`: its declared shape, or `override`; a symbolic
    dimension (dim_param, or a name in the override) kept with `symbolic` (the VM's),
    else a ModelError saying how to fix it."""
    tt = vi.type.tensor_type
    dtype = ONNX_DTYPES.get(tt.elem_type)
    if dtype is None:
        raise ModelError(f"{source}: input {vi.name!r} has unsupported element type "
                         f"{onnx.TensorProto.DataType.Name(tt.elem_type)}")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if override is not None:
        if dims and len(override) != len(dims):
            raise ModelError(f"{source}: shape override {list(override)} for input "
                             f"{vi.name!r} has rank {len(override)}, the model says {len(dims)}")
        if not symbolic and any(isinstance(d, str) for d in override):
            raise ModelError(f"{source}: shape override {list(override)} for input "
                             f"{vi.name!r} names a dimension: only the VM executor keeps "
                             "symbolic dimensions")
        return TensorType(tuple(d if isinstance(d, str) else int(d) for d in override), dtype)
    if symbolic and tt.HasField("shape") and all(
            d.HasField("dim_value") or d.dim_param for d in tt.shape.dim):
        return TensorType(tuple(d.dim_value if d.HasField("dim_value") else d.dim_param
                                for d in tt.shape.dim), dtype)
    if None in dims or not tt.HasField("shape"):
        named = [d.dim_param or "?" if not d.HasField("dim_value") else d.dim_value
                 for d in tt.shape.dim]
        symbols = ", ".join(repr(d) for d in named if isinstance(d, str))
        what = (f"symbolic dimension {symbols} (shape {named})" if tt.HasField("shape")
                else "no declared shape")
        raise ModelError(f"{source}: input {vi.name!r} has {what}: give its shape (config: "
                         f"models.<name>.inputs.{vi.name}; command line: --input "
                         f"{vi.name}=d0,d1,...; Python: from_onnx(shape=...)), or keep "
                         "it symbolic with the VM executor (executor: vm and dims: bounds)")
    return TensorType(tuple(dims), dtype)
