"""int8 models as onnxruntime's own quantizer makes them from our float generators.

- `resnet18_qdq`: ResNet-18 with BatchNormalization folded into the convolutions,
  quantized statically in QDQ format (QuantizeLinear/DequantizeLinear pairs around
  every Conv, Add, pool and the classifier Gemm): uint8 activations, per-channel
  symmetric int8 weights.
- `mobilenet_v2_qop`: MobileNetV2 (BN folded) quantized statically in QOperator
  format (QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm...): uint8
  activations, per-tensor int8 weights.
- `bert_encoder_dyn`: the BERT-style encoder quantized dynamically (its MatMuls
  become DynamicQuantizeLinear + MatMulInteger; the embeddings int8 + DequantizeLinear).

Static quantization calibrates MinMax ranges on a few seeded standard-normal inputs,
so the files are deterministic. Needs onnxruntime (`pip install -e .[ort]`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

CALIBRATION_SAMPLES = 4
SEED = 1234


def _quantization():
    """onnxruntime.quantization, or one line saying how to get it."""
    try:
        from onnxruntime import quantization
    except ImportError:
        raise RuntimeError("the quantized model generators need onnxruntime "
                           "(pip install -e .[ort])") from None
    return quantization


def fold_batch_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with every BatchNormalization that follows a Conv (its only
    consumer) folded into the Conv's weight and bias, as an exporter's
    eval-mode optimisation would (the quantizer then sees Conv -> Relu)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    users: dict[str, int] = {}
    for node in g.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    producer = {out: node for node in g.node for out in node.output}
    kept = []
    for node in g.node:
        conv = producer.get(node.input[0]) if node.op_type == "BatchNormalization" else None
        if conv is None or conv.op_type != "Conv" or users[node.input[0]] != 1:
            kept.append(node)
            continue
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        scale, bias, mean, var = (numpy_helper.to_array(inits[n]) for n in node.input[1:5])
        w = numpy_helper.to_array(inits[conv.input[1]])
        b = (numpy_helper.to_array(inits[conv.input[2]]) if len(conv.input) > 2
             else np.zeros(w.shape[0], np.float32))
        factor = scale / np.sqrt(var + eps)
        inits[conv.input[1]].CopyFrom(numpy_helper.from_array(
            (w * factor.reshape(-1, 1, 1, 1)).astype(np.float32), conv.input[1]))
        bias_name = f"{conv.name}.bias"
        g.initializer.append(numpy_helper.from_array(
            ((b - mean) * factor + bias).astype(np.float32), bias_name))
        del conv.input[2:]
        conv.input.append(bias_name)
        conv.output[0] = node.output[0]
    del g.node[:]
    g.node.extend(kept)
    used = {n for node in g.node for n in node.input}
    survivors = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(survivors)
    return model


def _reader(model: onnx.ModelProto):
    """A calibration data reader giving CALIBRATION_SAMPLES seeded inputs."""
    q = _quantization()
    rng = np.random.default_rng(SEED)
    vi = model.graph.input[0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    samples = [{vi.name: rng.standard_normal(shape, dtype=np.float32)}
               for _ in range(CALIBRATION_SAMPLES)]

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    return Reader()


def _static(model: onnx.ModelProto, fmt: str, per_channel: bool) -> onnx.ModelProto:
    q = _quantization()
    model = fold_batch_norm(model)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.onnx"
        q.quantize_static(model, out, _reader(model),
                          quant_format=getattr(q.QuantFormat, fmt), per_channel=per_channel,
                          activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                          calibrate_method=q.CalibrationMethod.MinMax)
        return onnx.load(str(out))


def resnet18_qdq(batch: int = 1) -> onnx.ModelProto:
    """QDQ ResNet-18 (per-channel weights); data [batch,3,224,224] -> [batch,1000] float32
    (calibrated on inputs of that batch)."""
    from models.resnet import resnet18
    return _static(resnet18(batch), "QDQ", per_channel=True)


def mobilenet_v2_qop(batch: int = 1) -> onnx.ModelProto:
    """QOperator MobileNetV2 (per-tensor weights); data [batch,3,224,224] -> [batch,1000]."""
    from models.mobilenet import mobilenet_v2
    return _static(mobilenet_v2(batch), "QOperator", per_channel=False)


def bert_encoder_dyn(batch: int = 1) -> onnx.ModelProto:
    """The dynamically quantized encoder; input_ids int64 [batch,32] -> [batch,32,128]."""
    from models.bert import bert_encoder
    q = _quantization()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.onnx"
        q.quantize_dynamic(bert_encoder(batch), out, weight_type=q.QuantType.QInt8)
        return onnx.load(str(out))
