"""Tests for the ONNX model generators in models/."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, shape_inference

import models
from models import GENERATORS, generate, source_files
from models._onnx import IR_VERSION, OPSET, GraphBuilder, with_initializers_as_inputs

# Trainable parameter counts (running stats excluded), as torchvision reports them
# for resnet18 / resnet50: a match means every layer has the right shape.
EXPECTED = {
    # 150528 -> 64 -> 64 -> 10, weights and biases
    "mlp": {"output": [1, 10], "params": 150528 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10,
            "bn": 0, "conv": 0},
    "resnet18": {"output": [1, 1000], "params": 11_689_512, "bn": 20, "conv": 20},
    "resnet50": {"output": [1, 1000], "params": 25_557_032, "bn": 53, "conv": 53},
}
RESNETS = ["resnet18", "resnet50"]


@functools.cache
def built(name: str) -> onnx.ModelProto:
    """Each model is built once per test session; tests must not mutate it."""
    return GENERATORS[name]()


def seeded_input() -> np.ndarray:
    return np.random.default_rng(1234).standard_normal((1, 3, 224, 224)).astype(np.float32)


def shape_of(vi: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value for d in vi.type.tensor_type.shape.dim]


def run_ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["output"], {"data": x})[0]


def tiny_model() -> onnx.ModelProto:
    """A one-node model, so the file-writing tests stay fast."""
    g = GraphBuilder("tiny")
    g.output(g.node("Relu", [g.input("data", (1, 4))], "relu", output="output"), (1, 4))
    return g.build()


def test_registered_names() -> None:
    assert set(GENERATORS) == set(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_model_is_valid(name: str) -> None:
    model = built(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == IR_VERSION == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    assert OPSET == 13


@pytest.mark.parametrize("name", list(EXPECTED))
def test_inputs_and_outputs(name: str) -> None:
    graph = built(name).graph
    assert [i.name for i in graph.input] == ["data"]
    assert shape_of(graph.input[0]) == [1, 3, 224, 224]
    assert [o.name for o in graph.output] == ["output"]
    assert shape_of(graph.output[0]) == EXPECTED[name]["output"]
    for vi in [*graph.input, *graph.output]:
        assert vi.type.tensor_type.elem_type == TensorProto.FLOAT
    # Inferred shape must agree with the declared one.
    inferred = shape_inference.infer_shapes(built(name), strict_mode=True).graph.output[0]
    assert shape_of(inferred) == EXPECTED[name]["output"]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameters(name: str) -> None:
    graph = built(name).graph
    assert all(t.data_type == TensorProto.FLOAT for t in graph.initializer)
    trainable = [
        t for t in graph.initializer if not t.name.endswith(("running_mean", "running_var"))
    ]
    assert sum(int(np.prod(t.dims)) for t in trainable) == EXPECTED[name]["params"]


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
        attr = next(a for a in nodes[node_name].attribute if a.name == "strides")
        return list(attr.ints)

    assert strides("layer2.0.conv1") == [1, 1]
    assert strides("layer2.0.conv2") == [2, 2]
    assert strides("layer2.0.downsample.0") == [2, 2]
    # layer1 changes width (64 -> 256) but not resolution.
    assert strides("layer1.0.downsample.0") == [1, 1]


def test_generation_is_deterministic() -> None:
    assert GENERATORS["resnet18"]().SerializeToString() == built("resnet18").SerializeToString()


def check_output(y: np.ndarray, name: str) -> None:
    assert y.shape == tuple(EXPECTED[name]["output"])
    assert np.isfinite(y).all()
    assert 0.1 < float(y.std()) < 100.0


@pytest.mark.parametrize(
    "name", ["mlp", "resnet18", pytest.param("resnet50", marks=pytest.mark.slow)]
)
def test_runs_in_onnxruntime(name: str) -> None:
    check_output(run_ort(built(name), seeded_input()), name)


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


def test_generate_overwrites_with_umask_permissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(GENERATORS, "tiny", tiny_model)
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
    monkeypatch.setitem(GENERATORS, "tiny", tiny_model)
    out = tmp_path / "tiny.onnx"
    out.write_bytes(b"old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk went away")

    monkeypatch.setattr(models.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk went away"):
        generate("tiny", out)
    assert out.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["tiny.onnx"]


def test_generate_rejects_invalid_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def invalid() -> onnx.ModelProto:
        model = tiny_model()
        model.graph.node[0].op_type = "NoSuchOp"
        return model

    monkeypatch.setitem(GENERATORS, "invalid", invalid)
    with pytest.raises(onnx.checker.ValidationError):
        generate("invalid", tmp_path / "invalid.onnx")
    assert os.listdir(tmp_path) == []


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="mlp, resnet18, resnet50"):
        generate("vgg16", "unused.onnx")
    with pytest.raises(ValueError, match="allowed"):
        source_files("vgg16")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_source_files(name: str) -> None:
    files = source_files(name)
    assert all(p.is_absolute() and p.suffix == ".py" and p.is_file() for p in files)
    stems = {p.stem for p in files}
    own = "mlp" if name == "mlp" else "resnet"
    assert {"__init__", "_onnx", own} == stems
