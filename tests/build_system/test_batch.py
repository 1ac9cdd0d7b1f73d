"""Any batch: input shape overrides replace the shapes an ONNX file declares for
its outputs and intermediates; generators take a batch argument (also through
doit's config); a symbolic batch builds at the batch asked for, and is named when
none is; a library built for one batch says so when given another."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import models
from pipeline.errors import ConfigError, ModelError
from pipeline.frontend import from_onnx
from pipeline.frontend.onnx import with_input_shapes
from pipeline.tasks.config import load_config
from tests.support import REPO
from tests.support.compare import build_and_load, run_ort
from tests.support.doit_runner import doit


def resnetish(batch=1) -> onnx.ModelProto:
    """conv -> bn -> relu -> conv -> residual add -> relu -> gap -> flatten -> gemm,
    declaring `batch` (an int or a dim_param name) on its input, its output and
    every intermediate (value_info, as exporters write them)."""
    rng = np.random.default_rng(7)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale
                                        ).astype(np.float32), name)

    inits = [init("w1", 8, 3, 3, 3), init("w2", 8, 8, 3, 3), init("fc", 5, 8), init("fcb", 5),
             init("g", 8), init("b", 8), init("m", 8),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "v")]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["b1"]),
             node("Relu", ["b1"], ["r1"]),
             node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             node("Add", ["c2", "r1"], ["a"]), node("Relu", ["a"], ["r2"]),
             node("GlobalAveragePool", ["r2"], ["p"]), node("Flatten", ["p"], ["f"]),
             node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1)]
    vi = helper.make_tensor_value_info
    f32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "resnetish", [vi("x", f32, [batch, 3, 8, 8])], [vi("y", f32, [batch, 5])],
        inits, value_info=[vi(n, f32, [batch, 8, 8, 8]) for n in ("c1", "b1", "r1", "c2",
                                                                  "a", "r2")]
        + [vi("p", f32, [batch, 8, 1, 1]), vi("f", f32, [batch, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("batch", [2, 3])
def test_batch_override_of_a_batch_1_model_matches_onnxruntime(batch):
    pytest.importorskip("onnxruntime")
    model = resnetish(1)
    graph, params = from_onnx(model, shape={"x": (batch, 3, 8, 8)})
    assert graph.types["y"].shape == (batch, 5)
    gm, _ = build_and_load(graph, params)
    x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
    gm.run(x=x)
    # onnxruntime checks inputs against the declared shapes: give it the model
    # at the new batch, as validate and bench do.
    want = run_ort(with_input_shapes(model, {"x": (batch, 3, 8, 8)}), {"x": x})[0]
    np.testing.assert_allclose(gm.get_output(0), want, rtol=1e-4, atol=1e-5)
    # A library is built for one batch: the wrong one is refused, saying which.
    with pytest.raises(ValueError, match=rf"'x'.*built for shape \[{batch}, 3, 8, 8\]"):
        gm.set_input("x", np.zeros((1, 3, 8, 8), np.float32))


def test_with_input_shapes_leaves_an_unchanged_model_alone():
    model = resnetish(1)
    assert with_input_shapes(model, {"x": (1, 3, 8, 8)}) is model
    changed = with_input_shapes(model, {"x": (4, 3, 8, 8)})
    assert not changed.graph.value_info and not changed.graph.output[0].type.tensor_type.\
        HasField("shape")
    assert model.graph.value_info  # the caller's model is not touched


def test_symbolic_batch_builds_at_the_batch_given_and_names_the_dim_without_one():
    pytest.importorskip("onnxruntime")
    model = resnetish("N")
    with pytest.raises(ModelError) as info:
        from_onnx(model, source="net.onnx")
    msg = str(info.value)
    assert "\n" not in msg and "net.onnx" in msg and "'x'" in msg and "'N'" in msg
    graph, params = from_onnx(model, shape={"x": (2, 3, 8, 8)})
    gm, _ = build_and_load(graph, params)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    gm.run(x=x)
    np.testing.assert_allclose(gm.get_output(0), run_ort(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)


def test_c_set_input_of_the_wrong_size_says_the_shape_it_was_built_for():
    """pl_set_input, the C API a C program calls (here through the ctypes binding)."""
    graph, params = from_onnx(resnetish(1), shape={"x": (2, 3, 8, 8)})
    gm, _ = build_and_load(graph, params)
    executor = gm.module
    api, handle = executor._api, executor._h
    wrong = np.zeros((1, 3, 8, 8), np.float32)
    assert api["pl_set_input"](handle, 0, wrong.ctypes.data, wrong.nbytes) != 0
    msg = api["pl_last_error"](handle).decode()
    assert "'x'" in msg and "[2,3,8,8]" in msg.replace(" ", ""), msg


def test_every_generator_takes_the_arguments_configs_may_give():
    for name, where in models.GENERATORS.items():
        module, _, function = where.partition(":")
        params = inspect.signature(getattr(importlib.import_module(module), function)).parameters
        assert set(models.ARGUMENTS) <= set(params), name


# The others' weights take seconds to draw; mlp at batch 2 goes through doit below.
@pytest.mark.parametrize("name", ["bert_encoder", "mobilenet_v2", "unet", "lstm_gru_seq"])
def test_a_generator_at_batch_3(name):
    model = models.build(name, {"batch": 3})
    inputs = [vi for vi in model.graph.input
              if vi.name not in {i.name for i in model.graph.initializer}]
    assert [vi.type.tensor_type.shape.dim[0].dim_value for vi in inputs] == [3] * len(inputs)
    assert all(o.type.tensor_type.shape.dim[0].dim_value == 3 for o in model.graph.output)


def test_generator_args_are_checked_with_the_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    for args, key in (("{batchsize: 2}", "models.m.args.batchsize"),
                      ("{batch: 0}", "models.m.args.batch"),
                      ("{batch: two}", "models.m.args.batch")):
        cfg.write_text(f"models: {{m: {{generator: mlp, args: {args}}}}}\n"
                       "targets: {llvm: {target: llvm}}\n")
        with pytest.raises(ConfigError, match=rf"c.yaml: {key}: "):
            load_config(cfg)
    cfg.write_text("models: {m: {path: x.onnx, args: {batch: 2}}}\n"
                   "targets: {llvm: {target: llvm}}\n")
    (tmp_path / "x.onnx").write_bytes(resnetish().SerializeToString())
    with pytest.raises(ConfigError, match="models.m.args: only a model built by a generator"):
        load_config(cfg)


@pytest.mark.slow
def test_generator_with_a_batch_through_doit(tmp_path):
    """mlp at batch 2 through doit build + validate (the reference at batch 2); then
    `pipeline compile` of its ONNX file reuses doit's kernels."""
    (tmp_path / "pipeline.yaml").write_text(textwrap.dedent("""\
        models:
          mlp_b2: {generator: mlp, args: {batch: 2}}
        targets:
          llvm: {target: "llvm -mcpu=native", opt_level: 3}
        """))
    code, executed, out = doit(tmp_path, "validate", "config=pipeline.yaml")
    assert code == 0, out
    assert {"model:mlp_b2", "export:mlp_b2@llvm", "validate:mlp_b2@llvm"} <= executed
    report = (tmp_path / "out" / "mlp_b2" / "llvm" / "validation.json").read_text()
    assert '"passed": true' in report
    graph = onnx.load(str(tmp_path / "out" / "models" / "mlp_b2.onnx")).graph
    assert graph.output[0].type.tensor_type.shape.dim[0].dim_value == 2
    # `pipeline compile` of the same model finds every kernel in doit's cache.
    proc = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "compile",
                           "out/models/mlp_b2.onnx", "-o", "mlp_b2.so"], cwd=tmp_path,
                          capture_output=True, text=True, env=_env_without_cache())
    assert proc.returncode == 0, proc.stderr
    assert "(0 compiled, " in proc.stdout and "reused from out/kernels)" in proc.stdout


def _env_without_cache() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_KERNEL_CACHE"}
    return {**env, "PYTHONPATH": str(REPO)}
