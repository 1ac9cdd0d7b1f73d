"""Seeded random weights for an ONNX file whose own weights cannot tell a wrong
kernel from a right one.

The light model zoo the onnx wheel ships (onnx/backend/test/data/light/) stores each
convolution and fully connected weight as its shape and a ConstantOfShape that fills
it with one value: every output channel of a layer then computes the same thing,
and a kernel that mixes up channels, pixels or groups still gives the reference's
output (validation of those models saw errors of 0.0). `random_weights` turns each
such weight, and each float initializer of rank >= 2, into an initializer of
He-normal values (models/_onnx.py); 1-D tensors (biases, batch-norm statistics) keep
their values. The timing is the same; what changes is that the numbers mean
something. A model entry asks for it with `random_weights: <seed>`
(pipeline/tasks/config.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from models._onnx import he_normal


def randomize(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy of `model` with seeded He-normal weights (module doc); the graph's
    inputs, outputs and every other node stay as they are."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    rng = np.random.default_rng(seed)
    for t in graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 2:
            t.CopyFrom(numpy_helper.from_array(he_normal(rng, list(t.dims)), t.name))
    shapes = {t.name: t for t in graph.initializer if t.data_type == onnx.TensorProto.INT64}
    filled = []  # (node, dims): float ConstantOfShape of a constant shape of rank >= 2
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in shapes:
            continue
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        dims = [int(d) for d in numpy_helper.to_array(shapes[node.input[0]])]
        if (value is None or value.data_type == onnx.TensorProto.FLOAT) and len(dims) >= 2:
            filled.append((node, dims))
            graph.initializer.append(numpy_helper.from_array(he_normal(rng, dims),
                                                             node.output[0]))
    for node, dims in filled:
        graph.node.remove(node)
        if out.ir_version < 4:  # before IR 4 an initializer must be a graph input too
            graph.input.append(onnx.helper.make_tensor_value_info(
                node.output[0], onnx.TensorProto.FLOAT, dims))
    # the shapes only those nodes read go too (onnxruntime warns of each)
    used = {name for node in graph.node for name in node.input}
    unused = {node.input[0] for node, _ in filled} - used
    for container in (graph.initializer, graph.input):
        for item in [x for x in container if x.name in unused]:
            container.remove(item)
    return out


def random_weights(src: str | Path, dst: str | Path, seed: int) -> None:
    """Read the ONNX file `src`, randomize its weights (seed `seed`), check the result
    and write it to `dst` atomically (a file already holding the same bytes is left
    as it is)."""
    from pipeline.files import atomic_write

    data = randomize(onnx.load(str(src)), seed).SerializeToString()
    onnx.checker.check_model(data)
    atomic_write(dst, data)
