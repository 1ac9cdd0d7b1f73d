"""Sequence and optional graph inputs for the ONNX backend (pipeline/tools/backend.py).

The VM's `main` takes tensors only; the backend compiles a model per distinct input
structure anyway (shapes, build-time values), so a sequence input given as a list of
k arrays becomes k tensor inputs and a SequenceConstruct (SequenceEmpty for none),
an optional input given None an empty Optional node, and one given a value that
value's inputs and an Optional of them. The outputs are unchanged: the VM returns
sequences as lists and empty optionals as None.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

__all__ = ["expand_value_inputs", "has_value_inputs"]


def has_value_inputs(inputs) -> bool:
    """Whether a graph input (ValueInfoProto) is a sequence or an optional."""
    return any(vi.type.WhichOneof("value") in ("sequence_type", "optional_type")
               for vi in inputs)


def _structure(value: Any) -> Any:
    """What a compiled library depends on in a feed: shapes and dtypes, nesting."""
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(_structure(v) for v in value)
    a = np.asarray(value)
    return (a.shape, a.dtype.str)


def _expand(name: str, tp: onnx.TypeProto, value: Any, nodes: list, inputs: list,
            feeds: dict) -> None:
    """Make `name` from feed `value` of type `tp`: new inputs, feeds and nodes."""
    kind = tp.WhichOneof("value")
    if kind == "optional_type":
        inner = tp.optional_type.elem_type
        if value is None:
            nodes.append(helper.make_node("Optional", [], [name], type=inner))
            return
        _expand(f"{name}.value", inner, value, nodes, inputs, feeds)
        nodes.append(helper.make_node("Optional", [f"{name}.value"], [name]))
        return
    if kind == "sequence_type":
        elem = tp.sequence_type.elem_type.tensor_type.elem_type
        parts = [f"{name}.{j}" for j in range(len(value))]
        for part, v in zip(parts, value, strict=True):
            _expand(part, tp.sequence_type.elem_type, v, nodes, inputs, feeds)
        nodes.append(helper.make_node("SequenceConstruct", parts, [name]) if parts else
                     helper.make_node("SequenceEmpty", [], [name], dtype=elem))
        return
    a = np.asarray(value)
    inputs.append(helper.make_tensor_value_info(name, tp.tensor_type.elem_type, a.shape))
    feeds[name] = a


def expand_value_inputs(model: onnx.ModelProto, feeds: dict[str, Any]
                        ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], tuple]:
    """(model with tensor inputs only, its feeds, the key of the feeds' structure)."""
    inits = {i.name for i in model.graph.initializer}
    nodes: list = []
    inputs: list = []
    flat: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            inputs.append(vi)
        elif vi.type.WhichOneof("value") in ("sequence_type", "optional_type"):
            _expand(vi.name, vi.type, feeds[vi.name], nodes, inputs, flat)
        else:
            inputs.append(vi)
            flat[vi.name] = np.asarray(feeds[vi.name])
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    graph_nodes = list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend([*nodes, *graph_nodes])
    key = tuple((n, _structure(feeds[n])) for n in sorted(feeds))
    return out, flat, key
