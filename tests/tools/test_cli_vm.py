"""The `pipeline` command on VM libraries (docs/vm.md): a Loop/If model compiled by
`pipeline compile --executor vm` through the kernel cache, described by `pipeline
info`, checked by `pipeline validate` against onnxruntime and timed by `pipeline
bench` against it, each command a subprocess as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.runtime.vm import Executable
from pipeline.vm import bytecode
from tests.support.cli_runner import pipeline
from tests.support.onnx_models import tiny_loop_if


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """nets/loop.onnx compiled twice for the VM into one kernel cache: (folder, runs)."""
    tmp = tmp_path_factory.mktemp("cli_vm")
    tiny_loop_if(tmp / "loop.onnx")
    runs = [pipeline("compile", "loop.onnx", "-o", name, "--executor", "vm", "--cache",
                     "kcache", cwd=tmp) for name in ("loop.so", "again.so")]
    return tmp, runs


def test_compile_takes_the_control_flow_kernels_from_the_cache(compiled):
    tmp, (first, second) = compiled
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    n = int(first.stdout.split(": ")[1].split()[0])
    assert n >= 5 and f"({n} compiled, 0 reused" in first.stdout
    assert f"(0 compiled, {n} reused" in second.stdout
    assert len(list((tmp / "kcache").glob("*.o"))) == n
    assert (tmp / "loop.so").read_bytes() == (tmp / "again.so").read_bytes()


def test_info_shows_the_executor_functions_constants_and_kernels(compiled):
    tmp = compiled[0]
    proc = pipeline("info", "loop.so", "--json", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    exe = Executable.load(tmp / "loop.so").content
    assert info["executor"] == "vm" and info["machine"] == "x86_64"
    assert len(info["build_id"]) == 40 and info["ro_version"] == 3
    assert info["inputs"] == [{"name": "x", "shape": [1, 4], "dtype": "float32"}]
    assert [(o["name"], o["shape"]) for o in info["outputs"]] == [("y", [1, 4]),
                                                                  ("hs", [3, 1, 4])]
    names = [f["name"] for f in info["functions"]]
    assert names[0] == "main" and any(n.endswith("rnn.body") for n in names)
    assert any(n.endswith("then_branch") for n in names) and \
        any(n.endswith("else_branch") for n in names)
    assert [f["instructions"] for f in info["functions"]] == [len(f.code) for f in exe.functions]
    assert info["constants"]["count"] == len(exe.constants) > 0
    assert [k["symbol"] for k in info["kernels"]] == list(exe.kernels)
    assert sum(k["calls"] for k in info["kernels"]) == sum(
        isinstance(i, bytecode.InvokePacked) for f in exe.functions for i in f.code)
    assert info["memory"]["planned_activation_bytes"] > 0
    proc = pipeline("info", "loop.so", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert "executor  vm (machine x86_64)" in proc.stdout
    assert "output 1  hs  [3, 1, 4]  float32" in proc.stdout
    assert f"functions {len(exe.functions)}, " in proc.stdout


def test_validate_compares_with_onnxruntime(compiled):
    pytest.importorskip("onnxruntime")
    tmp = compiled[0]
    proc = pipeline("validate", "loop.onnx", "loop.so", "--reference", "onnxruntime", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert "hs: max abs error" in proc.stdout and "matches onnxruntime" in proc.stdout
    # onnx.reference too: its Loop corrected (plain onnx 1.23 makes hs [3, 4]).
    proc = pipeline("validate", "loop.onnx", "loop.so", "--reference", "onnx", cwd=tmp)
    assert proc.returncode == 0 and "matches onnx on" in proc.stdout, proc.stdout + proc.stderr
    # Other weights, same shapes: the library no longer matches.
    tiny_loop_if(tmp / "other.onnx", seed=1)
    proc = pipeline("validate", "other.onnx", "loop.so", "--reference", "onnxruntime", cwd=tmp)
    assert proc.returncode == 1 and "MISMATCH" in proc.stdout
    assert proc.stderr.count("\n") == 1 and "differs from onnxruntime" in proc.stderr


def test_bench_times_the_vm_against_onnxruntime(compiled):
    pytest.importorskip("onnxruntime")
    tmp = compiled[0]
    proc = pipeline("bench", "loop.onnx", "loop.so", "--threads", "1", "--rounds", "1",
                    "--runs", "2", "--warmup", "0", "--peers", "onnxruntime", "--report",
                    "bench.json", "--peak-file", "peak.json", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp / "bench.json").read_text())
    row = report["threads"]["1"]
    assert row["ours_ms"] > 0 and row["onnxruntime_ms"] > 0 and row["ratio"] > 0
    assert report["library_target"] == "vm" and report["memory"]["planned_activation_bytes"] > 0
    assert row["ours_peak_rss_bytes"] > 0  # measured in a process of its own
    proc = pipeline("bench", "loop.onnx", "loop.so", "--profile", cwd=Path(tmp))
    assert proc.returncode == 1 and "a VM library" in proc.stderr


@pytest.mark.parametrize("row", [(), (4,), (1, 4), (2, 1, 3)])
def test_the_onnx_reference_stacks_loop_scan_outputs_as_onnxruntime(row):
    """validate's onnx.reference (with its Loop correction) runs a Loop without a
    condition input and gives its scan outputs the shape and values onnxruntime
    gives: (iterations, *row)."""
    ort = pytest.importorskip("onnxruntime")
    import numpy as np
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from pipeline.tools.validate import reference_outputs

    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "x"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Identity", ["v_out"], ["row"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", f, list(row))],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", f, list(row)),
         helper.make_tensor_value_info("row", f, list(row))])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["m", "", "v0"], ["v", "rows"], body=body)], "g",
        [helper.make_tensor_value_info("x", f, list(row)),
         helper.make_tensor_value_info("v0", f, list(row))],
        [helper.make_tensor_value_info("v", f, list(row)),
         helper.make_tensor_value_info("rows", f, [3, *row])],
        [helper.make_tensor("m", TensorProto.INT64, [], [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(row).astype(np.float32) for n in ("x", "v0")}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = reference_outputs(model, feeds, "onnx")
    assert [np.shape(g) for g in got] == [w.shape for w in want] == [row, (3, *row)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    with pytest.raises(ValueError):  # onnx's own: no iteration without a condition input
        ReferenceEvaluator(model).run(None, feeds)


def test_info_validate_and_bench_of_a_symbolic_library(tmp_path):
    """A library with symbolic dimensions: info shows the .ro's dims table with the
    bounds, validate and bench run it at the bounds' highs."""
    pytest.importorskip("onnxruntime")
    import onnx

    from tests.runtime.dims_models import token_mlp

    onnx.save(token_mlp(), tmp_path / "mlp.onnx")
    proc = pipeline("compile", "mlp.onnx", "-o", "mlp.so", "--executor", "vm", "--dims",
                    "batch=1:2", "--dims", "seq=1:5", "--cache", "kcache", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = pipeline("info", "mlp.so", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["dims"] == [{"name": "batch", "low": 1, "high": 2},
                            {"name": "seq", "low": 1, "high": 5}]
    assert info["inputs"][0]["shape"] == ["batch", "seq"]
    assert info["memory"]["intermediate_bytes"] > 0
    assert sum(k["calls"] for k in info["kernels"]) > 0  # InvokePackedDims count too
    proc = pipeline("info", "mlp.so", cwd=tmp_path)
    assert proc.returncode == 0 and "dims      batch 1..2, seq 1..5" in proc.stdout
    proc = pipeline("validate", "mlp.onnx", "mlp.so", "--reference", "onnxruntime",
                    cwd=tmp_path)
    assert proc.returncode == 0 and "matches onnxruntime" in proc.stdout, proc.stderr
    proc = pipeline("bench", "mlp.onnx", "mlp.so", "--threads", "1", "--rounds", "1",
                    "--runs", "2", "--warmup", "0", "--peers", "onnxruntime", "--report",
                    "bench.json", "--peak-file", "peak.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "bench.json").read_text())["threads"]["1"]["ours_ms"] > 0
