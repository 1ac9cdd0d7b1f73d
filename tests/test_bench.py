"""`doit bench` end to end on a tiny model in a temporary folder, and the benchmark's
helpers (FLOP count, memory figures, option errors). No timing assertions: speed
claims live in bench output only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_model, rand
from onnx import helper

from pipeline.tools.bench import BenchError, bench_library, memory_plan, model_flops

pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parent.parent
node = helper.make_node


def tiny_model() -> onnx.ModelProto:
    """conv(16->32, 3x3) -> relu -> global pool -> flatten -> gemm(10)."""
    inits = {"w": rand(32, 16, 3, 3, seed=1) * np.float32(0.1), "fc": rand(10, 32, seed=2),
             "fcb": rand(10, seed=3)}
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"]),
             node("GlobalAveragePool", ["r"], ["g"]), node("Flatten", ["g"], ["f"]),
             node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1)]
    return make_model(nodes, [("x", (1, 16, 12, 12))], [("y", None)], inits)


def test_model_flops_counts_conv_and_gemm():
    assert model_flops(tiny_model()) == 2 * 32 * 12 * 12 * 16 * 9 + 2 * 10 * 32


def test_doit_bench_writes_report(tmp_path):
    onnx.save(tiny_model(), tmp_path / "tiny.onnx")
    (tmp_path / "cfg.yaml").write_text(textwrap.dedent("""\
        models:
          tiny: {path: tiny.onnx}
        targets:
          llvm: {target: "llvm -mcpu=native", opt_level: 3}
        """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PIPELINE_KERNEL_CACHE", None)

    def doit(*args):
        return subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"),
                               "-d", str(tmp_path), "config=cfg.yaml", *args],
                              capture_output=True, text=True, env=env, timeout=900)

    proc = doit("build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report_path = tmp_path / "out" / "tiny" / "llvm" / "bench.json"
    assert not report_path.exists()  # bench is not part of build
    proc = doit("bench", "runs=3", "warmup=1", "threads=1,2,3", "profile=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    assert set(report["threads"]) == {"1", "2", "3"}
    for row in report["threads"].values():
        assert row["ours_ms"] > 0 and row["onnxruntime_ms"] > 0
        assert row["ratio"] == pytest.approx(row["ours_ms"] / row["onnxruntime_ms"], rel=0.01)
    assert report["gflop"] == pytest.approx(model_flops(tiny_model()) / 1e9, abs=1e-4)
    mem = report["memory"]
    assert 0 < mem["planned_activation_bytes"] <= mem["intermediate_bytes"]
    assert mem["peak_rss_bytes_ours"] > 0
    kernels = {row["kernel"] for row in report["profile"]["nodes"]}
    assert any(k.startswith("conv2d_nchwc") for k in kernels), kernels
    assert "ours ms" in proc.stdout and "conv2d_nchwc" in proc.stdout
    first = report_path.stat().st_mtime_ns
    proc = doit("bench", "runs=1", "warmup=0", "threads=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report_path.stat().st_mtime_ns != first  # always runs when asked
    proc = doit("bench", "runs=zero")
    assert proc.returncode != 0 and "runs must be integers >= 1" in proc.stdout + proc.stderr


def test_memory_plan_reads_graph_json():
    doc = {"nodes": [{"op": "null", "name": "x", "inputs": []},
                     {"op": "tvm_op", "name": "a", "inputs": [[0, 0, 0]], "attrs": {}},
                     {"op": "tvm_op", "name": "b", "inputs": [[1, 0, 0]], "attrs": {}},
                     {"op": "tvm_op", "name": "c", "inputs": [[2, 0, 0]], "attrs": {}}],
           "node_row_ptr": [0, 1, 2, 3, 4],
           "attrs": {"shape": ["list_shape", [[4], [8], [2], [8]]],
                     "dltype": ["list_str", ["float32"] * 4],
                     "storage_id": ["list_int", [0, 1, 2, 1]]}}
    assert memory_plan(json.dumps(doc)) == {"planned_activation_bytes": 40,
                                            "intermediate_bytes": 72}


def test_missing_onnxruntime_is_one_clear_error(tmp_path):
    script = textwrap.dedent("""\
        import sys
        sys.modules["onnxruntime"] = None  # as if not installed
        from pipeline.tools.bench import BenchError, _session
        try:
            _session(None, 1)
        except BenchError as err:
            print(err)
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert "pip install -e .[ort]" in proc.stdout, proc.stdout + proc.stderr


def test_bad_thread_list_is_refused(tmp_path):
    with pytest.raises(BenchError, match="threads"):
        bench_library("x.so", "x.onnx", {}, "m", "t", str(tmp_path / "b.json"), threads="0")
