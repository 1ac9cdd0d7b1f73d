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


class GraphParts:
    """Nodes and initializers being collected for a model; const() names a new
    initializer c1, c2, ... and rng is seeded for the weights."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.k = [], [], 0

    def const(self, value) -> str:
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name


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


def tiny_loop_if(path: Path, seed: int = 0) -> None:
    """A recurrent cell as an ONNX Loop, then an If on the result (the VM's doit tests).

    x [1, 4] -> Loop 3 times: h = tanh(h @ w + x), each h a scan output -> hs [3, 1, 4];
    y = If sum(h) > 0: h * 2 (a branch constant) else h - c (c an outer initializer).
    `seed` changes the weights only.
    """
    rng = np.random.default_rng(seed)
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "w"], ["hw"], name="cell_matmul"),
         helper.make_node("Add", ["hw", "x"], ["pre"], name="cell_add"),
         helper.make_node("Tanh", ["pre"], ["h_out"], name="cell_tanh"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cell_cond"),
         helper.make_node("Identity", ["h_out"], ["h_row"], name="cell_row")],
        "cell", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h_in", f, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", f, [1, 4]),
         helper.make_tensor_value_info("h_row", f, [1, 4])])
    two = helper.make_node("Constant", [], ["two"], name="two",
                           value=numpy_helper.from_array(np.full(4, 2, np.float32), "two"))
    then = helper.make_graph([two, helper.make_node("Mul", ["h", "two"], ["y_then"])],
                             "then", [], [helper.make_tensor_value_info("y_then", f, [1, 4])])
    orelse = helper.make_graph([helper.make_node("Sub", ["h", "c"], ["y_else"])],
                               "else", [], [helper.make_tensor_value_info("y_else", f, [1, 4])])
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4)) * 0.8).astype(np.float32),
                                     "w"),
             numpy_helper.from_array(rng.uniform(0, 1, 4).astype(np.float32), "c"),
             numpy_helper.from_array(np.array(3, np.int64), "trip"),
             numpy_helper.from_array(np.array(True), "go"),
             numpy_helper.from_array(np.zeros((1, 4), np.float32), "h0"),
             numpy_helper.from_array(np.array(0, np.float32), "zero")]
    nodes = [helper.make_node("Loop", ["trip", "go", "h0"], ["h", "hs"], body=body,
                              name="rnn"),
             helper.make_node("ReduceSum", ["h"], ["total"], keepdims=0, name="total"),
             helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
             helper.make_node("If", ["positive"], ["y"], then_branch=then, else_branch=orelse,
                              name="choose")]
    graph = helper.make_graph(
        nodes, "loop_if", [helper.make_tensor_value_info("x", f, [1, 4])],
        [helper.make_tensor_value_info("y", f, [1, 4]),
         helper.make_tensor_value_info("hs", f, [3, 1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
