"""The int8 models of configs/deploy.yaml (models/quantized.py: onnxruntime's quantizer
applied to our generators), built and compared with onnxruntime on the same file
within the config's tolerance (one step of the output's scale for the statically
quantized ones). Model-sized, so `slow`; the QOperator MobileNetV2 (10 s more) is left
to `doit validate config=configs/deploy.yaml`: its operators are covered on a small
CNN in test_quant.py."""

from __future__ import annotations

import collections
import functools

import numpy as np
import onnx
import pytest

from models import build
from pipeline.tools.validate import output_atols, random_inputs
from tests.support.compare import run_ours

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.slow

OPTIONS = {  # as configs/deploy.yaml says
    "resnet18_qdq": {"quant_steps": 1, "atol": 1e-4, "rtol": 1e-4},
    "bert_encoder_dyn": {"atol": 1e-3, "rtol": 1e-3},
}
OPS = {  # operators each format must contain
    "resnet18_qdq": {"QuantizeLinear", "DequantizeLinear", "Conv", "Add", "MaxPool", "Gemm"},
    "bert_encoder_dyn": {"DynamicQuantizeLinear", "MatMulInteger"},
}


@functools.cache
def model(name: str) -> onnx.ModelProto:
    return build(name)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_quantized_model_matches_onnxruntime(name):
    m = model(name)
    onnx.checker.check_model(m, full_check=True)
    assert OPS[name] <= set(collections.Counter(n.op_type for n in m.graph.node))
    feeds = random_inputs(m, {}, seed=0)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = run_ours(m, feeds)
    atols = output_atols(m, OPTIONS[name])
    for (g, w), out in zip(zip(got, want, strict=True), m.graph.output, strict=True):
        np.testing.assert_allclose(g, w, rtol=OPTIONS[name]["rtol"], atol=atols[out.name])
        if "quant_steps" in OPTIONS[name]:
            assert atols[out.name] > OPTIONS[name]["atol"]  # the step, not the default
