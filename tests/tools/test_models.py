"""Tests for the ONNX model generators in models/."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, shape_inference

import models
from models import GENERATORS, build, generate, source_files
from models._onnx import IR_VERSION, OPSET, GraphBuilder, with_initializers_as_inputs

IMAGE = ("data", [1, 3, 224, 224], TensorProto.FLOAT)
# Trainable parameter counts (every "*.weight" and "*.bias" initializer; running stats,
# shapes and other constants excluded), as torchvision reports them for resnet18 /
# resnet50 / mobilenet_v2: a match means every layer has the right shape.
EXPECTED = {
    # 150528 -> 64 -> 64 -> 10, weights and biases
    "mlp": {"input": IMAGE, "output": [1, 10], "opset": 13,
            "params": 150528 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10},
    "resnet18": {"input": IMAGE, "output": [1, 1000], "opset": 13, "params": 11_689_512,
                 "bn": 20, "conv": 20},
    "resnet50": {"input": IMAGE, "output": [1, 1000], "opset": 13, "params": 25_557_032,
                 "bn": 53, "conv": 53},
    # resnet18's graph and weights in float16, float32 I/O through two Casts
    "resnet18_fp16": {"input": IMAGE, "output": [1, 1000], "opset": 13,
                      "params": 11_689_512, "weights": TensorProto.FLOAT16},
    "mobilenet_v2": {"input": IMAGE, "output": [1, 1000], "opset": 13, "params": 3_504_872,
                     "bn": 52, "conv": 52},
    # Embeddings 1000x128 + 64x128 and their LayerNorm; per layer 4 (128x128 + 128),
    # 128x512 + 512, 512x128 + 128 and two LayerNorms (2 x 256).
    "bert_encoder": {"input": ("input_ids", [1, 32], TensorProto.INT64),
                     "output": [1, 32, 128], "opset": 17,
                     "params": 1064 * 128 + 256
                     + 2 * (4 * 128 * 129 + 128 * 512 + 512 + 512 * 128 + 128 + 512)},
    # DoubleConvs 3-16-16, 16-32-32, 32-64-64, 64-32-32, 48-16-16 (3x3, bias-free, BN),
    # ConvTranspose 64->32 k2 with bias, 1x1 conv 16->2 with bias.
    "unet": {"input": ("data", [1, 3, 64, 64], TensorProto.FLOAT), "output": [1, 2, 64, 64],
             "opset": 13, "bn": 10, "conv": 11,
             "params": 9 * (3 * 16 + 16 * 16 + 16 * 32 + 32 * 32 + 32 * 64 + 64 * 64
                            + 64 * 32 + 32 * 32 + 48 * 16 + 16 * 16)
             + 2 * (16 + 16 + 32 + 32 + 64 + 64 + 32 + 32 + 16 + 16)
             + 64 * 32 * 4 + 32 + 16 * 2 + 2},
    # Bidirectional LSTM 64->128 (W, R, both biases), GRU 256->128, head 128->20.
    "lstm_gru_seq": {"input": ("features", [1, 32, 64], TensorProto.FLOAT),
                     "output": [1, 32, 20], "opset": 13,
                     "params": 2 * (512 * 64 + 512 * 128 + 1024)
                     + 384 * 256 + 384 * 128 + 768 + 128 * 20 + 20},
}
RESNETS = ["resnet18", "resnet50"]


@functools.cache
def built(name: str) -> onnx.ModelProto:
    """Each model is built once per test session; tests must not mutate it."""
    return build(name)


def seeded_input() -> np.ndarray:
    return np.random.default_rng(1234).standard_normal((1, 3, 224, 224)).astype(np.float32)


def seeded_feeds(name: str) -> dict[str, np.ndarray]:
    """Standard-normal images, or token ids anywhere in the vocabulary."""
    input_name, shape, elem_type = EXPECTED[name]["input"]
    rng = np.random.default_rng(1234)
    if elem_type == TensorProto.INT64:
        return {input_name: rng.integers(0, 1000, shape)}
    return {input_name: rng.standard_normal(shape).astype(np.float32)}


def shape_of(vi: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value for d in vi.type.tensor_type.shape.dim]


def attr(node: onnx.NodeProto, name: str) -> object:
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def run_ort(model: onnx.ModelProto, x: np.ndarray | dict[str, np.ndarray]) -> np.ndarray:
    """Output "output" of `model` in onnxruntime; `x` is the "data" input or all feeds."""
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["output"], x if isinstance(x, dict) else {"data": x})[0]


def tiny_model() -> onnx.ModelProto:
    """A one-node model, so the file-writing tests stay fast."""
    g = GraphBuilder("tiny")
    g.output(g.node("Relu", [g.input("data", (1, 4))], "relu", output="output"), (1, 4))
    return g.build()


def test_registered_names() -> None:
    # the int8 generators are tested in tests/tools/test_quant_models.py
    assert set(GENERATORS) == set(EXPECTED) | {"resnet18_qdq", "mobilenet_v2_qop",
                                               "bert_encoder_dyn"}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_model_is_valid(name: str) -> None:
    model = built(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == IR_VERSION == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", EXPECTED[name]["opset"])]
    assert OPSET == 13


@pytest.mark.parametrize("name", list(EXPECTED))
def test_inputs_and_outputs(name: str) -> None:
    graph = built(name).graph
    input_name, shape, elem_type = EXPECTED[name]["input"]
    assert [i.name for i in graph.input] == [input_name]
    assert shape_of(graph.input[0]) == shape
    assert graph.input[0].type.tensor_type.elem_type == elem_type
    assert [o.name for o in graph.output] == ["output"]
    assert shape_of(graph.output[0]) == EXPECTED[name]["output"]
    assert graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    # Inferred shape must agree with the declared one.
    inferred = shape_inference.infer_shapes(built(name), strict_mode=True).graph.output[0]
    assert shape_of(inferred) == EXPECTED[name]["output"]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameters(name: str) -> None:
    graph = built(name).graph
    trainable = [t for t in graph.initializer if t.name.endswith((".weight", ".bias"))]
    assert all(t.data_type == EXPECTED[name].get("weights", TensorProto.FLOAT)
               for t in trainable)
    assert sum(int(np.prod(t.dims)) for t in trainable) == EXPECTED[name]["params"]
    # Everything else is a BN running statistic or a small constant (a Clip bound, a
    # shape, the position ids, Resize scales).
    for t in graph.initializer:
        if t not in trainable:
            assert t.name.endswith(("running_mean", "running_var")) or np.prod(t.dims) <= 32


@pytest.mark.parametrize("name", list(EXPECTED))
def test_node_names_unique_and_set(name: str) -> None:
    names = [n.name for n in built(name).graph.node]
    assert all(names)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("name", RESNETS)
def test_resnet_batchnorm_is_separate(name: str) -> None:
    graph = built(name).graph
    producers = {n.output[0]: n for n in graph.node}
    inits = {t.name for t in graph.initializer}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    bns = [n for n in graph.node if n.op_type == "BatchNormalization"]
    assert len(convs) == EXPECTED[name]["conv"]
    assert len(bns) == EXPECTED[name]["bn"]
    # Bias-free convs, each followed by its own BN with four private initializers.
    assert all(len(c.input) == 2 for c in convs)
    bn_params = [p for bn in bns for p in bn.input[1:]]
    assert len(bn_params) == 4 * len(bns) == len(set(bn_params))
    assert set(bn_params) <= inits
    for bn in bns:
        assert producers[bn.input[0]].op_type == "Conv"
        assert bn.input[1] == f"{bn.name}.weight"
        assert bn.input[4] == f"{bn.name}.running_var"


def test_mobilenet_v2_blocks() -> None:
    """17 inverted residuals: depthwise 3x3 convs, ReLU6 as Clip(0, 6), 10 residual Adds."""
    model = built("mobilenet_v2")
    graph = model.graph
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    shapes = {vi.name: shape_of(vi) for vi in
              shape_inference.infer_shapes(model, strict_mode=True).graph.value_info}
    depthwise = [n for n in graph.node if n.op_type == "Conv" and attr(n, "group") > 1]
    assert len(depthwise) == 17
    for n in depthwise:
        channels = inits[n.input[1]].shape[0]
        assert attr(n, "group") == channels and inits[n.input[1]].shape[1:] == (1, 3, 3)
    clips = [n for n in graph.node if n.op_type == "Clip"]
    assert len(clips) == 35
    for n in clips:
        assert float(inits[n.input[1]]) == 0.0 and float(inits[n.input[2]]) == 6.0
    assert len([n for n in graph.node if n.op_type == "Add"]) == 10
    assert shapes["features.1.conv.2"] == [1, 16, 112, 112]
    assert shapes["features.17.conv.3"] == [1, 320, 7, 7]
    assert shapes["features.18.2"] == [1, 1280, 7, 7]


def test_bert_encoder_attention() -> None:
    """Per layer: 6 MatMuls with weights, 2 between activations, Softmax on the last axis,
    Erf GELU; the attention scores are [1, heads, seq, seq]."""
    model = built("bert_encoder")
    graph = model.graph
    ops = [n.op_type for n in graph.node]
    for op, count in [("Gather", 2), ("LayerNormalization", 5), ("MatMul", 16),
                      ("Softmax", 2), ("Erf", 2), ("Reshape", 8), ("Transpose", 8)]:
        assert ops.count(op) == count, op
    assert all(attr(n, "axis") == -1 for n in graph.node if n.op_type == "Softmax")
    shapes = {vi.name: shape_of(vi) for vi in
              shape_inference.infer_shapes(model, strict_mode=True).graph.value_info}
    assert shapes["encoder.layer.0.attention.self.Softmax"] == [1, 4, 32, 32]
    assert shapes["encoder.layer.1.intermediate.gelu.Mul_1"] == [1, 32, 512]


def test_unet_up_paths() -> None:
    """One ConvTranspose and one Resize up step, each concatenated with its skip."""
    model = built("unet")
    graph = model.graph
    shapes = {vi.name: shape_of(vi) for vi in
              shape_inference.infer_shapes(model, strict_mode=True).graph.value_info}
    ops = [n.op_type for n in graph.node]
    assert ops.count("ConvTranspose") == 1 and ops.count("Resize") == 1
    assert ops.count("MaxPool") == 2
    assert shapes["down2.conv.double_conv.5"] == [1, 64, 16, 16]
    assert shapes["up1.up"] == [1, 32, 32, 32]
    assert shapes["up1.concat"] == [1, 64, 32, 32]
    assert shapes["up2.up"] == [1, 32, 64, 64]
    assert shapes["up2.concat"] == [1, 48, 64, 64]


@pytest.mark.parametrize("name, expansion", [("resnet18", 1), ("resnet50", 4)])
def test_resnet_stage_shapes(name: str, expansion: int) -> None:
    inferred = shape_inference.infer_shapes(built(name), strict_mode=True).graph
    shapes = {vi.name: shape_of(vi) for vi in inferred.value_info}
    assert shapes["maxpool"] == [1, 64, 56, 56]
    for stage, (c, hw) in enumerate([(64, 56), (128, 28), (256, 14), (512, 7)], start=1):
        assert shapes[f"layer{stage}.0.add"] == [1, c * expansion, hw, hw]
    assert shapes["flatten"] == [1, 512 * expansion]


def test_resnet50_stride_on_3x3() -> None:
    """torchvision v1.5: the bottleneck's 3x3 conv carries the stride, not the first 1x1."""
    nodes = {n.name: n for n in built("resnet50").graph.node}

    def strides(node_name: str) -> list[int]:
        return list(attr(nodes[node_name], "strides"))

    assert strides("layer2.0.conv1") == [1, 1]
    assert strides("layer2.0.conv2") == [2, 2]
    assert strides("layer2.0.downsample.0") == [2, 2]
    # layer1 changes width (64 -> 256) but not resolution.
    assert strides("layer1.0.downsample.0") == [1, 1]


@pytest.mark.parametrize("name", ["resnet18", "bert_encoder", "unet"])
def test_generation_is_deterministic(name: str) -> None:
    assert build(name).SerializeToString() == built(name).SerializeToString()


def test_import_needs_no_onnx_or_numpy() -> None:
    """Every doit run imports models; onnx and numpy load only when a model is built."""
    code = ("import sys, models; models.source_files('resnet18'); "
            "print(sorted(m for m in ('onnx', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(models.__file__).parent.parent)
    assert out.stdout.strip() == "[]"


def check_output(y: np.ndarray, name: str) -> None:
    assert y.shape == tuple(EXPECTED[name]["output"])
    assert np.isfinite(y).all()
    assert 0.1 < float(y.std()) < 100.0


@pytest.mark.parametrize(
    "name",
    ["mlp", "resnet18", pytest.param("resnet50", marks=pytest.mark.slow), "mobilenet_v2",
     "bert_encoder", "unet"],
)
def test_runs_in_onnxruntime(name: str) -> None:
    check_output(run_ort(built(name), seeded_feeds(name)), name)


def test_resnet18_fp16_is_resnet18_in_half_precision() -> None:
    """Same nodes between the two Casts, every float32 weight rounded to float16, and
    in onnxruntime outputs as close to resnet18's as float16 compute allows."""
    half, full = built("resnet18_fp16"), built("resnet18")
    ops = [n.op_type for n in half.graph.node]
    assert ops == ["Cast", *(n.op_type for n in full.graph.node), "Cast"]
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in full.graph.initializer}
    for t in half.graph.initializer:
        assert t.data_type == TensorProto.FLOAT16
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(t),
                                      weights[t.name].astype(np.float16))
    x = seeded_input()
    y16, y32 = run_ort(half, x), run_ort(full, x)
    assert y16.dtype == np.float32
    np.testing.assert_allclose(y16, y32, rtol=1e-2, atol=2e-2)


def test_initializers_as_inputs() -> None:
    model = built("resnet18")
    before = model.SerializeToString()
    listed = with_initializers_as_inputs(model)
    assert model.SerializeToString() == before  # the input model is left alone
    names = [i.name for i in listed.graph.input]
    assert names == ["data"] + [t.name for t in model.graph.initializer]
    onnx.checker.check_model(listed, full_check=True)
    # Applying it again must not list anything twice.
    assert len(with_initializers_as_inputs(listed).graph.input) == len(names)

    x = seeded_input()
    np.testing.assert_allclose(run_ort(listed, x), run_ort(model, x), rtol=1e-4, atol=1e-4)


def test_build_with_initializers_as_inputs() -> None:
    g = GraphBuilder("tiny")
    w = g.initializer("w", np.ones((1, 4), np.float32))
    g.output(g.node("Add", [g.input("data", (1, 4)), w], "add", output="output"), (1, 4))
    model = g.build(initializers_as_inputs=True)
    assert [i.name for i in model.graph.input] == ["data", "w"]
    y = run_ort(model, np.zeros((1, 4), np.float32))
    np.testing.assert_array_equal(y, np.ones((1, 4), np.float32))


def test_builder_rejects_bad_names() -> None:
    g = GraphBuilder("bad")
    x = g.input("data", (1, 4))
    g.node("Relu", [x], "relu")
    with pytest.raises(ValueError, match="node name 'relu' used twice"):
        g.node("Relu", [x], "relu", output="other")
    with pytest.raises(ValueError, match="undefined"):
        g.node("Relu", ["nope"], "relu2")
    with pytest.raises(ValueError, match="defined twice"):
        g.initializer("data", np.zeros(1))


def test_generate_writes_loadable_file(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "resnet18.onnx"
    generate("resnet18", out)
    assert os.listdir(out.parent) == ["resnet18.onnx"]  # no temp file left behind
    assert out.read_bytes() == built("resnet18").SerializeToString()
    onnx.checker.check_model(onnx.load(out))


def register(monkeypatch: pytest.MonkeyPatch, name: str, function: object) -> None:
    """Make `function` generator `name` for this test, through a throwaway module."""
    module = types.ModuleType(f"generator_{name}")
    module.make = function
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(GENERATORS, name, f"{module.__name__}:make")


def test_generate_overwrites_with_umask_permissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(monkeypatch, "tiny", tiny_model)
    out = tmp_path / "tiny.onnx"
    out.write_bytes(b"old")
    umask = os.umask(0o022)
    try:
        generate("tiny", str(out))
    finally:
        os.umask(umask)
    assert onnx.load(out).graph.name == "tiny"
    assert out.stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["tiny.onnx"]


def test_generate_failure_leaves_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    register(monkeypatch, "tiny", tiny_model)
    out = tmp_path / "tiny.onnx"
    out.write_bytes(b"old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk went away")

    monkeypatch.setattr(os, "replace", broken_replace)  # the rename that publishes it
    with pytest.raises(OSError, match="disk went away"):
        generate("tiny", out)
    assert out.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["tiny.onnx"]


def test_generate_rejects_invalid_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def invalid() -> onnx.ModelProto:
        model = tiny_model()
        model.graph.node[0].op_type = "NoSuchOp"
        return model

    register(monkeypatch, "invalid", invalid)
    with pytest.raises(onnx.checker.ValidationError):
        generate("invalid", tmp_path / "invalid.onnx")
    assert os.listdir(tmp_path) == []


def test_unknown_name() -> None:
    allowed = ", ".join(sorted(GENERATORS))  # every generator, in order
    assert "resnet18_qdq" in allowed and allowed.startswith("bert_encoder, ")
    assert "resnet18, resnet18_fp16" in allowed
    with pytest.raises(ValueError, match=allowed):
        generate("vgg16", "unused.onnx")
    with pytest.raises(ValueError, match="allowed"):
        source_files("vgg16")
    with pytest.raises(ValueError, match="allowed"):
        build("vgg16")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_source_files(name: str) -> None:
    files = source_files(name)
    assert all(p.is_absolute() and p.suffix == ".py" and p.is_file() for p in files)
    stems = {p.stem for p in files}
    own = GENERATORS[name].split(":")[0].removeprefix("models.")
    assert {"__init__", "_onnx", own} == stems
