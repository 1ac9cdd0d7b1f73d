"""Small models for the AOT executor's tests: a float CNN, the same CNN quantized by
onnxruntime's quantizer (QDQ, int8 weights, uint8 activations), and a keyword-spotting
CNN in the DS-CNN style (MFCC frames in, 12 classes out), float or quantized."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _conv(nodes: list, inits: list, rng, x: str, name: str, cin: int, cout: int,
          kernel: tuple[int, int], stride: int = 1, group: int = 1, relu: bool = True) -> str:
    w = rng.standard_normal((cout, cin // group, *kernel)).astype(np.float32)
    w *= np.sqrt(2.0 / (cin // group * kernel[0] * kernel[1]))
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")]
    pads = [kernel[0] // 2, kernel[1] // 2] * 2
    nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], pads=pads,
                                  strides=[stride, stride], group=group))
    if not relu:
        return name
    nodes.append(helper.make_node("Relu", [name], [f"{name}.relu"]))
    return f"{name}.relu"


def _model(nodes: list, inits: list, x_shape: list[int], y: str, classes: int,
           name: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [x_shape[0], classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def tiny_cnn(seed: int = 0) -> onnx.ModelProto:
    """1x1x8x8 -> conv 3x3 (8) -> relu -> maxpool 2 -> conv 3x3 (8) -> flatten -> gemm
    (10) -> softmax."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    h = _conv(nodes, inits, rng, "x", "c1", 1, 8, (3, 3))
    nodes.append(helper.make_node("MaxPool", [h], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    h = _conv(nodes, inits, rng, "p", "c2", 8, 8, (3, 3))
    nodes.append(helper.make_node("Flatten", [h], ["f"]))
    inits.append(numpy_helper.from_array(
        (0.1 * rng.standard_normal((10, 128))).astype(np.float32), "fc.w"))
    nodes += [helper.make_node("Gemm", ["f", "fc.w"], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["y"], axis=1)]
    return _model(nodes, inits, [1, 1, 8, 8], "y", 10, "tiny_cnn")


def kws_cnn(seed: int = 0, pool: str = "global") -> onnx.ModelProto:
    """DS-CNN (keyword spotting): 1x1x49x10 MFCC -> conv 9x3 stride 2 (64) -> four
    depthwise 3x3 + pointwise (64) blocks -> average pool over the whole 25x5 map
    (pool "global": GlobalAveragePool; "average": AveragePool 25x5, as ARM's DS-CNN)
    -> gemm (12)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    h = _conv(nodes, inits, rng, "x", "c0", 1, 64, (9, 3), stride=2)
    for k in range(4):
        h = _conv(nodes, inits, rng, h, f"dw{k}", 64, 64, (3, 3), group=64)
        h = _conv(nodes, inits, rng, h, f"pw{k}", 64, 64, (1, 1))
    nodes += [helper.make_node("GlobalAveragePool", [h], ["gap"]) if pool == "global" else
              helper.make_node("AveragePool", [h], ["gap"], kernel_shape=[25, 5]),
              helper.make_node("Flatten", ["gap"], ["f"])]
    inits.append(numpy_helper.from_array(
        (0.2 * rng.standard_normal((12, 64))).astype(np.float32), "fc.w"))
    nodes.append(helper.make_node("Gemm", ["f", "fc.w"], ["y"], transB=1))
    return _model(nodes, inits, [1, 1, 49, 10], "y", 12, "kws_cnn")


def quantized(model: onnx.ModelProto, samples: int = 4, seed: int = 1234, fmt: str = "QDQ",
              activations: str = "uint8") -> onnx.ModelProto:
    """`model` quantized statically by onnxruntime's quantizer in `fmt` (QDQ, or
    QOperator: QLinearConv, QGemm, ...), per-channel int8 weights and `activations`
    (uint8 or int8), calibrated on seeded inputs."""
    from onnxruntime import quantization as q

    vi = model.graph.input[0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    feeds = iter([{vi.name: rng.standard_normal(shape, dtype=np.float32)}
                  for _ in range(samples)])

    class Reader(q.CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "float.onnx"), Path(tmp, "int8.onnx")
        onnx.save(model, src)
        act = {"uint8": q.QuantType.QUInt8, "int8": q.QuantType.QInt8}[activations]
        q.quantize_static(str(src), str(out), Reader(), quant_format=getattr(q.QuantFormat, fmt),
                          per_channel=True, activation_type=act,
                          weight_type=q.QuantType.QInt8)
        return onnx.load(str(out))
