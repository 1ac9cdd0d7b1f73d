"""`doit bench` end to end on a tiny model in a temporary folder (each side in its own
processes, the suite summary), and the benchmark's helpers (FLOP count, memory
figures, option and runner errors, the light-zoo config spelling). No timing
assertions: speed claims live in bench output only."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from pipeline.errors import ConfigError
from pipeline.tasks.config import load_config
from pipeline.tools.bench import BenchError, bench_library, memory_plan, model_flops
from pipeline.tools.peak import _cpu_name, best_peak_gflops, core_to_core_ns
from tests.support import REPO
from tests.support.doit_runner import doit
from tests.support.onnx_models import rand, tiny_bench_model

pytest.importorskip("onnxruntime")


def test_model_flops_counts_conv_and_gemm():
    assert model_flops(tiny_bench_model()) == 2 * 32 * 12 * 12 * 16 * 9 + 2 * 10 * 32


def test_doit_bench_writes_report(tmp_path):
    onnx.save(tiny_bench_model(), tmp_path / "tiny.onnx")
    (tmp_path / "cfg.yaml").write_text(textwrap.dedent("""\
        models:
          tiny: {path: tiny.onnx}
          tiny2: {path: tiny.onnx}
        targets:
          llvm: {target: "llvm -mcpu=native", opt_level: 3}
        """))

    def run(*args):
        return doit(tmp_path, "config=cfg.yaml", *args, timeout=900)

    code, _, out = run("build")
    assert code == 0, out
    report_path = tmp_path / "out" / "tiny" / "llvm" / "bench.json"
    assert not report_path.exists()  # bench is not part of build
    code, _, out = run("bench", "rounds=2", "runs=3", "warmup=1", "threads=1,2", "profile=1")
    assert code == 0, out
    report = json.loads(report_path.read_text())
    # OpenVINO joins as a third side when installed (tests/tools/test_bench_openvino.py).
    sides = ["ours", "onnxruntime", *(["openvino"] if importlib.util.find_spec("openvino")
                                      else [])]
    assert (report["rounds"], report["runs"], report["warmup"]) == (2, 3, 1)
    assert set(report["threads"]) == {"1", "2"}
    pids = set()
    for row in report["threads"].values():
        for side in ("ours", "onnxruntime"):
            assert row[f"{side}_min_ms"] <= row[f"{side}_ms"] <= row[f"{side}_max_ms"]
            assert row[f"{side}_peak_rss_bytes"] >= row[f"{side}_base_rss_bytes"] > 0
        assert row["ratio"] == pytest.approx(row["ours_ms"] / row["onnxruntime_ms"], rel=0.01)
        assert row["ratio_min"] <= row["ratio_max"] and row["peak_gflops"] > 0
        assert len(row["rounds"]) == 2
        for rnd in row["rounds"]:
            assert list(rnd) == sides  # ours first, then theirs
            pids |= {rnd[side]["pid"] for side in sides}
            assert min(rnd[side]["peak_rss_bytes"] for side in rnd) > 0
    # a fresh process per side and round
    assert len(pids) == 4 * len(sides) and os.getpid() not in pids
    if len(os.sched_getaffinity(0)) > 1:  # the VM's state around the two-thread rounds
        assert "core_to_core_ns" not in report["threads"]["1"]
        assert all(1 < ns < 1e6 for ns in report["threads"]["2"]["core_to_core_ns"])
        assert "round trip between two cores" in out
    # Each side's own peak: onnxruntime's library and session are not in ours, and
    # neither holds what the doit process (fork parent) had read.
    mem = report["memory"]
    assert mem["ours_peak_rss_bytes"] != mem["onnxruntime_peak_rss_bytes"]
    assert report["gflop"] == pytest.approx(model_flops(tiny_bench_model()) / 1e9, abs=1e-4)
    assert 0 < mem["planned_activation_bytes"] <= mem["intermediate_bytes"]
    kernels = {row["kernel"] for row in report["profile"]["nodes"]}
    convs = ("conv2d_nchwc", "conv2d_winograd_nchwc")  # AlterOpLayout picks one of them
    assert any(k.startswith(convs) for k in kernels), kernels
    assert "ours ms" in out and any(c in out for c in convs)
    summary = json.loads((tmp_path / "out" / "bench-summary.json").read_text())["summary"]
    assert set(summary) == {"llvm@1", "llvm@2"}
    for s in summary.values():
        assert s["models"] == 2 and s["worst_model"] in ("tiny", "tiny2")
        assert s["geomean_ratio"] > 0
    assert "geometric-mean ratio (ours / onnxruntime)" in out
    summary_md = (tmp_path / "out" / "bench-summary.md").read_text()
    assert "| tiny2 | llvm | 2 |" in summary_md
    assert ("Core-to-core round trip" in summary_md) == (len(os.sched_getaffinity(0)) > 1)
    first = report_path.stat().st_mtime_ns
    code, _, out = run("bench", "rounds=1", "runs=1", "warmup=0", "threads=1", "model=tiny",
                       "peers=onnxruntime")
    assert code == 0, out
    assert report_path.stat().st_mtime_ns != first  # always runs when asked
    assert set(json.loads(report_path.read_text())["peers"]) == {"onnxruntime"}
    code, _, out = run("bench", "peers=tensorrt", "model=tiny")
    assert code != 0 and "peers must be some of onnxruntime, openvino, got 'tensorrt'" in out
    code, _, out = run("bench", "runs=zero")
    assert code != 0 and "runs must be integers >= 1" in out


def test_runner_failure_is_one_line(tmp_path):
    """A side that cannot load its model fails the bench with the runner's last line."""
    onnx.save(tiny_bench_model(), tmp_path / "tiny.onnx")
    (tmp_path / "broken.so").write_bytes(b"not a library")
    with pytest.raises(BenchError, match=r"bench tiny: the ours side at 1 threads failed: "
                       r"bench_runner ours .*broken.so"):
        bench_library(str(tmp_path / "broken.so"), str(tmp_path / "tiny.onnx"), {}, "tiny",
                      "llvm", str(tmp_path / "b.json"), str(tmp_path / "peak.json"), threads="1",
                      rounds="1", runs="1")


def test_light_zoo_config_spelling(tmp_path):
    """`path: onnx-light:<name>` is the onnx wheel's light-zoo file; an unknown one says
    what the wheel ships."""
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    (tmp_path / "c.yaml").write_text('models:\n  s: {path: "onnx-light:squeezenet"}\n'
                                     'targets:\n  llvm: {target: llvm}\n')
    assert load_config(tmp_path / "c.yaml").models["s"].path == light / "light_squeezenet.onnx"
    (tmp_path / "c.yaml").write_text('models:\n  s: {path: "onnx-light:squeezenut"}\n'
                                     'targets:\n  llvm: {target: llvm}\n')
    with pytest.raises(ConfigError, match=r"c.yaml: models.s.path: onnx-light:squeezenut: .*"
                       r"light_squeezenut.onnx .* ships: .*squeezenet"):
        load_config(tmp_path / "c.yaml")


def test_light_zoo_with_random_weights_validates_real_numbers(tmp_path):
    """The light zoo fills each weight with one value (ConstantOfShape), so every
    channel computes the same and validation cannot see a kernel mix channels up
    (its output spread is ~1e-10). `random_weights: <seed>` makes the model task
    write the file with seeded He-normal weights (models/reweight.py); doit builds
    and validates that against onnxruntime; the same seed rebuilds nothing, another
    rewrites the model; a generator entry cannot take the key."""
    import onnxruntime as ort

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    (tmp_path / "cfg.yaml").write_text(textwrap.dedent("""\
        models:
          s: {path: "onnx-light:squeezenet", random_weights: 3}
        targets:
          llvm: {target: "llvm -mcpu=native", opt_level: 3}
        validate: {reference: onnxruntime, rtol: 1.0e-4, atol: 1.0e-4}
        """))

    def run(*args):  # with the user's PIPELINE_KERNEL_CACHE, if any
        cache = os.environ.get("PIPELINE_KERNEL_CACHE")
        return doit(tmp_path, "config=cfg.yaml", *args, timeout=900,
                    env={"PIPELINE_KERNEL_CACHE": cache})

    code, _, out = run("build", "validate")
    assert code == 0, out
    made = tmp_path / "out" / "models" / "s.onnx"
    model = onnx.load(made)
    fills = [n for n in model.graph.node if n.op_type == "ConstantOfShape"
             and n.output[0].endswith("_w_0")]
    assert not fills and not any(i.name.endswith("_w_0__SHAPE") for i in model.graph.initializer)
    x = {"data_0": rand(1, 3, 224, 224, seed=4)}
    spread = [float(ort.InferenceSession(str(f)).run(None, x)[0].std())
              for f in (light / "light_squeezenet.onnx", made)]
    assert spread[0] < 1e-8 and spread[1] > 1e-4, spread
    report = json.loads((tmp_path / "out" / "s" / "llvm" / "validation.json").read_text())
    assert report["passed"] and report["reference"] == "onnxruntime"

    before = made.read_bytes()
    code, executed, out = run("build")
    assert code == 0 and "model:s" not in executed, out
    (tmp_path / "cfg.yaml").write_text(
        (tmp_path / "cfg.yaml").read_text().replace("random_weights: 3", "random_weights: 4"))
    code, executed, out = run("build")
    assert code == 0, out
    assert "model:s" in executed and made.read_bytes() != before

    (tmp_path / "g.yaml").write_text("models:\n  m: {generator: mlp, random_weights: 1}\n"
                                     "targets:\n  llvm: {target: llvm}\n")
    with pytest.raises(ConfigError, match=r"g.yaml: models.m.random_weights: only a model "
                       r"read from a path"):
        load_config(tmp_path / "g.yaml")
    (tmp_path / "g.yaml").write_text('models:\n  m: {path: "onnx-light:squeezenet", '
                                     'random_weights: -1}\ntargets:\n  llvm: {target: llvm}\n')
    with pytest.raises(ConfigError, match=r"models.m.random_weights: must be a seed"):
        load_config(tmp_path / "g.yaml")


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
        from pipeline.tools.bench import BenchError, _require_onnxruntime
        try:
            _require_onnxruntime()
        except BenchError as err:
            print(err)
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert "pip install -e .[ort]" in proc.stdout, proc.stdout + proc.stderr


def test_bad_thread_list_is_refused(tmp_path):
    with pytest.raises(BenchError, match="threads"):
        bench_library("x.so", "x.onnx", {}, "m", "t", str(tmp_path / "b.json"),
                      str(tmp_path / "peak.json"), threads="0")


def test_peak_keeps_the_best_seen_on_this_cpu(tmp_path):
    record = tmp_path / "peak.json"
    record.write_text(json.dumps({"cpu": "another CPU", "gflops": {"1": 1e9}}))
    measured = best_peak_gflops(1, str(record))  # another CPU's record is not ours
    assert 1 < measured < 1e6
    assert json.loads(record.read_text()) == {"cpu": _cpu_name(), "gflops": {"1": measured}}
    record.write_text(json.dumps({"cpu": _cpu_name(), "gflops": {"1": 1e9}}))
    assert best_peak_gflops(1, str(record)) == 1e9  # a better one seen before stays


def test_core_to_core_round_trip_needs_two_cpus():
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        assert core_to_core_ns() is None
        return
    assert 1 < core_to_core_ns(rounds=500, repeats=3) < 1e6  # ns: a cache line, not a sleep
    os.sched_setaffinity(0, {min(cpus)})
    try:
        assert core_to_core_ns() is None
    finally:
        os.sched_setaffinity(0, cpus)
