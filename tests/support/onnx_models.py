"""Small ONNX models for the tests: a checked model from nodes, deterministic data,
and the tiny conv-net the doit-level tests build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def rand(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """Deterministic float32 data of `shape`."""
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=shape).astype(np.float32)


def value_info(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 13) -> onnx.ModelProto:
    """A checked ModelProto. `inputs`/`outputs` are ValueInfoProtos or (name, shape)
    pairs (float32; an output shape may be None); `initializers` are TensorProtos
    or a {name: array} dict."""
    def vi(item):
        return value_info(*item) if isinstance(item, tuple) else item

    if isinstance(initializers, dict):
        initializers = [numpy_helper.from_array(np.asarray(v), k)
                        for k, v in initializers.items()]
    graph = helper.make_graph(list(nodes), "test", [vi(i) for i in inputs],
                              [vi(o) for o in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8, producer_name="pipeline-tests")
    # Outputs given without a shape get the one ONNX shape inference finds.
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model


def tiny_convnet(path: Path, seed: int = 0, classes: int = 4) -> None:
    """conv -> bn -> relu -> conv -> add(residual) -> relu -> gap -> flatten -> gemm.

    `classes` changes the last layer's shape only.
    """
    rng = np.random.default_rng(seed)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [init("w1", 8, 3, 3, 3), init("w2", 8, 8, 3, 3), init("fc", classes, 8),
             init("fcb", classes), init("g", 8), init("b", 8), init("m", 8),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "v")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["b1"], name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["a2"], name="add"),
        helper.make_node("Relu", ["a2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def tiny_bench_model() -> onnx.ModelProto:
    """conv(16->32, 3x3) -> relu -> global pool -> flatten -> gemm(10): what the bench
    tests time."""
    inits = {"w": rand(32, 16, 3, 3, seed=1) * np.float32(0.1), "fc": rand(10, 32, seed=2),
             "fcb": rand(10, seed=3)}
    node = helper.make_node
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"]),
             node("GlobalAveragePool", ["r"], ["g"]), node("Flatten", ["g"], ["f"]),
             node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1)]
    return make_model(nodes, [("x", (1, 16, 12, 12))], [("y", None)], inits)
