"""OpenVINO as the second bench peer (pipeline.tools.bench_runner's openvino side):
compiled for its CPU plugin with f32 precision forced and our thread count, timed in
its own processes in turn with ours and onnxruntime's, and marked, not dropped, when
it cannot load a model. Skipped without openvino, a failure under CI=true (.ci/run
installs the `openvino` extra). Tiny model, few runs: no timing assertions."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from pipeline.tools import bench
from pipeline.tools.bench import bench_library
from pipeline.tools.bench_table import summarize
from tests.support import REPO
from tests.support.onnx_models import tiny_bench_model


def require_openvino() -> None:
    """Skip the calling test without openvino; under CI=true fail (as toolchains.py)."""
    if importlib.util.find_spec("openvino") is not None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI=true but missing: openvino (pip install -e .[openvino])")
    pytest.skip("missing: openvino (pip install -e .[openvino])")


@pytest.fixture(scope="module")
def tiny_lib(tmp_path_factory):
    """(ONNX path, .so path) of test_bench's tiny model, built once."""
    from pipeline import build
    from pipeline.frontend import from_onnx

    folder = tmp_path_factory.mktemp("ov")
    onnx.save(tiny_bench_model(), folder / "tiny.onnx")
    graph, params = from_onnx(folder / "tiny.onnx")
    factory = build(graph, target="llvm -mcpu=native", params=params)
    return str(folder / "tiny.onnx"), str(factory.export_library(folder / "tiny.so"))


def test_openvino_side_forces_f32_and_the_thread_count(tiny_lib, tmp_path):
    require_openvino()
    np.savez(tmp_path / "in.npz", x=np.ones((1, 16, 12, 12), np.float32))
    proc = subprocess.run([sys.executable, "-m", "pipeline.tools.bench_runner", "openvino",
                           tiny_lib[0], str(tmp_path / "in.npz"), "--threads=2", "--runs=2",
                           "--warmup=1"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["side"] == "openvino" and len(report["times_ms"]) == 2
    about = report["runtime"]
    assert (about["precision"], about["threads"], about["streams"]) == ("f32", 2, 1)
    assert about["version"].startswith("20")


def test_bench_times_openvino_beside_onnxruntime(tiny_lib, tmp_path):
    require_openvino()
    report = bench_library(tiny_lib[1], tiny_lib[0], {}, "tiny", "llvm",
                           str(tmp_path / "b.json"), str(tmp_path / "peak.json"),
                           threads="1,2", rounds="2", runs="2", warmup="1", profile="1",
                           peers="onnxruntime,openvino")
    assert report["peers"]["openvino"]["precision"] == "f32"
    for row in report["threads"].values():
        assert [list(r) for r in row["rounds"]] == [["ours", "onnxruntime", "openvino"]] * 2
        # Ratios are kept to 3 decimals: a small one is off by up to 0.0005.
        assert row["ratio_openvino"] == pytest.approx(row["ours_ms"] / row["openvino_ms"],
                                                      rel=0.01, abs=1e-3)
        faster = min(row["onnxruntime_ms"], row["openvino_ms"])
        assert row["ratio_best"] == pytest.approx(row["ours_ms"] / faster, rel=0.01, abs=1e-3)
        assert row["best_peer"] in ("onnxruntime", "openvino")
        assert row["openvino_peak_rss_bytes"] >= row["openvino_base_rss_bytes"] > 0
    assert report["memory"]["openvino_peak_rss_bytes"] > 0
    assert all("gbps" in n for n in report["profile"]["nodes"] if n["kernel"] != "__copy")
    summary = summarize([str(tmp_path / "b.json")], str(tmp_path / "peak.json"),
                        str(tmp_path / "s.md"), str(tmp_path / "s.json"))
    for s in summary.values():
        assert s["openvino"]["models"] == 1 and s["best"]["models"] == 1
    assert "ratio vs better peer" in (tmp_path / "s.md").read_text()


def test_a_model_openvino_cannot_load_is_marked(tiny_lib, tmp_path, monkeypatch):
    """OpenVINO given a file it cannot read: the reason is kept, it is not tried
    again, and onnxruntime's figures and the better-peer ratio stand."""
    require_openvino()
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    run_side, calls = bench.run_side, []

    def broken_openvino(side, path, *args):
        calls.append(side)
        return run_side(side, str(tmp_path / "broken.onnx") if side == "openvino" else path,
                        *args)

    monkeypatch.setattr(bench, "run_side", broken_openvino)
    report = bench_library(tiny_lib[1], tiny_lib[0], {}, "tiny", "llvm",
                           str(tmp_path / "b.json"), str(tmp_path / "peak.json"),
                           threads="1,2", rounds="1", runs="1", warmup="0",
                           peers="onnxruntime,openvino")
    assert calls == ["ours", "onnxruntime", "openvino", "ours", "onnxruntime"]
    why = report["peers"]["openvino"]["failed"]
    assert why.startswith("RuntimeError: Unable to read the model")
    for row in report["threads"].values():
        assert row["openvino_failed"] == why and "openvino_ms" not in row
        assert row["best_peer"] == "onnxruntime" and row["ratio_best"] == row["ratio"]
    out = bench.format_report(report)
    assert f"✗ openvino could not run tiny: {why}" in out
