"""The bench's roofs and tables without OpenVINO: the streaming read bandwidth kept
beside the FMA peak, the profile's GB/s and roof per kernel, a peer that cannot load
a model marked (not dropped), and the suite summary's ratios against each peer and
the better one (from made-up reports: no timing assertions)."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import helper

from pipeline.runtime.profile import NodeTime, format_profile, profile_nodes
from pipeline.tools import bench
from pipeline.tools.bench import BenchError, bench_library
from pipeline.tools.bench_table import summarize
from pipeline.tools.peak import _cpu_name, best_read_gbps, measure_read_gbps
from tests.support.onnx_models import make_model, rand

# The suite table's head before OpenVINO joined: kept, column for column, without it.
ORT_HEAD = ("| model | target | threads | ours ms | onnxruntime ms | ratio | ratio range | "
            "spread ours / ort | ours GFLOP/s | % of peak | peak RSS ours / ort MiB |")


def gemm_model() -> onnx.ModelProto:
    """y = x @ W^T + b at batch 1: a matrix-vector product streaming W."""
    inits = {"w": rand(64, 256, seed=1), "b": rand(64, seed=2)}
    return make_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                      [("x", (1, 256))], [("y", None)], inits)


@pytest.fixture(scope="module")
def gemm_lib(tmp_path_factory):
    """(ONNX path, .so path) of gemm_model, built once."""
    from pipeline import build
    from pipeline.frontend import from_onnx

    folder = tmp_path_factory.mktemp("roofs")
    onnx.save(gemm_model(), folder / "gemm.onnx")
    graph, params = from_onnx(folder / "gemm.onnx")
    factory = build(graph, target="llvm -mcpu=native", params=params)
    return str(folder / "gemm.onnx"), str(factory.export_library(folder / "gemm.so"))


def test_read_bandwidth_is_kept_beside_the_peak(tmp_path):
    assert 0.1 < measure_read_gbps(2, total_bytes=64 * 2**20, repeats=2) < 1e4
    record = tmp_path / "peak.json"
    record.write_text(json.dumps({"cpu": _cpu_name(), "gflops": {"1": 5.0}}))
    measured = best_read_gbps(1, str(record))
    assert json.loads(record.read_text()) == {"cpu": _cpu_name(), "gflops": {"1": 5.0},
                                              "read_gbps": {"1": measured}}
    record.write_text(json.dumps({"cpu": _cpu_name(), "read_gbps": {"1": 1e6}}))
    assert best_read_gbps(1, str(record)) == 1e6  # a better one seen before stays


def test_roof_says_memory_or_compute():
    streaming = NodeTime("fc", "dense", [], [], ms=1.0, flops=2_000_000, bytes_moved=4_000_000)
    assert (streaming.gflops, streaming.gbps) == (2.0, 4.0)
    assert streaming.roof(peak_gflops=100.0, read_gbps=20.0) == ("memory", 20.0)
    conv = NodeTime("c", "conv2d", [], [], ms=1.0, flops=50_000_000, bytes_moved=100_000)
    assert conv.roof(peak_gflops=100.0, read_gbps=20.0) == ("compute", 50.0)
    assert NodeTime("x", "k", [], [], ms=1.0).roof(100.0, 20.0) is None  # no figures
    assert conv.to_dict(100.0, 20.0)["bound"] == "compute"
    text = format_profile([streaming, conv], top=2, peak_gflops=100.0, read_gbps=20.0)
    assert "mem  20%" in text and "fma  50%" in text and "20.0 GB/s streaming read" in text
    assert "mem" not in format_profile([streaming, conv], top=2)  # no roofs given


def test_profile_carries_the_builds_flops_and_bytes(gemm_lib):
    from pipeline.runtime import GraphModule, load_module

    gm = GraphModule(load_module(gemm_lib[1])["default"]())
    gm.set_input(x=rand(1, 256, seed=3))
    (row,) = [r for r in profile_nodes(gm, runs=2) if r.kernel.startswith("dense")]
    assert row.flops == 2 * 64 * 256 + 64
    assert row.bytes_moved >= 4 * (64 * 256 + 256 + 64 + 64)  # W, x, b read; y written


def test_peer_that_cannot_load_is_marked_not_dropped(gemm_lib, tmp_path, monkeypatch):
    """onnxruntime given a file it cannot read: its runner's reason is recorded, it is
    not run again, our side's figures stay, the tables mark it."""
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    run_side, calls = bench.run_side, []

    def broken_peer(side, path, *args):
        calls.append(side)
        return run_side(side, str(tmp_path / "broken.onnx") if side != "ours" else path,
                        *args)

    monkeypatch.setattr(bench, "run_side", broken_peer)
    report = bench_library(gemm_lib[1], gemm_lib[0], {}, "gemm", "llvm",
                           str(tmp_path / "b.json"), str(tmp_path / "peak.json"),
                           threads="1,2", rounds="2", runs="2", warmup="0",
                           peers="onnxruntime")
    assert calls == ["ours", "onnxruntime", "ours", "ours", "ours"]
    for row in report["threads"].values():
        assert row["ours_ms"] > 0 and "onnxruntime_ms" not in row and "ratio" not in row
        assert "best_peer" not in row and row["read_gbps"] > 0
        assert row["onnxruntime_failed"].startswith("InvalidProtobuf: ")  # the runner's line
    assert report["peers"] == {"onnxruntime": {"failed": row["onnxruntime_failed"]}}
    summary = summarize([str(tmp_path / "b.json")], str(tmp_path / "peak.json"),
                        str(tmp_path / "s.md"), str(tmp_path / "s.json"))
    assert "geomean_ratio" not in summary["llvm@1"]
    text = (tmp_path / "s.md").read_text()
    assert text.startswith(ORT_HEAD) and "| gemm | llvm | 1 |" in text
    assert "✗ onnxruntime could not run gemm: " in text and "| ✗ |" in text


def _made_up(model: str, ours: float, ort: float, ov: float | None) -> dict:
    """A bench.json at one thread with the given medians (ov None: OpenVINO failed)."""
    def side(ms: float) -> dict:
        return {"ms": ms, "min_ms": ms, "max_ms": ms, "gflops": 1.0, "peak_pct": 1.0,
                "peak_rss_bytes": 2**20, "base_rss_bytes": 2**19}

    row = {f"ours_{k}": v for k, v in side(ours).items()}
    row.update({f"onnxruntime_{k}": v for k, v in side(ort).items()})
    row.update({"ratio": ours / ort, "ratio_min": ours / ort, "ratio_max": ours / ort})
    peers = {"onnxruntime": {"version": "1"}, "openvino": {"failed": "no QGemm"}}
    best = ort
    if ov is not None:
        row.update({f"openvino_{k}": v for k, v in side(ov).items()})
        row.update({"ratio_openvino": ours / ov, "ratio_openvino_min": ours / ov,
                    "ratio_openvino_max": ours / ov})
        peers["openvino"], best = {"version": "2026.4.1", "precision": "f32"}, min(ort, ov)
    else:
        row["openvino_failed"] = "no QGemm"
    row.update({"ratio_best": ours / best, "ours_runs": 3, "ours_runs_alone": 0})
    return {"model": model, "target": "llvm", "gflop": 1.0, "rounds": 1, "runs": 3,
            "warmup": 1, "peers": peers, "threads": {"1": row},
            "profile": {"threads": 1, "read_gbps": 20.0, "nodes": [
                {"kernel": "dense_packed", "ms": 2.0, "bytes_moved": 40_000_000,
                 "gbps": 20.0, "bound": "memory", "bound_pct": 100.0},
                {"kernel": "conv2d", "ms": 1.0, "bytes_moved": 1, "gbps": 0.0,
                 "bound": "compute", "bound_pct": 50.0}]}}


def test_summary_against_each_peer_and_the_better(tmp_path):
    paths = []
    for rep in (_made_up("a", 2.0, 4.0, 1.0), _made_up("b", 3.0, 2.0, 6.0),
                _made_up("q", 1.0, 2.0, None)):
        paths.append(tmp_path / f"{rep['model']}.json")
        paths[-1].write_text(json.dumps(rep))
    (tmp_path / "peak.json").write_text(json.dumps(
        {"cpu": "x", "gflops": {"1": 100.0}, "read_gbps": {"1": 25.0}}))
    s = summarize([str(p) for p in paths], str(tmp_path / "peak.json"),
                  str(tmp_path / "s.md"), str(tmp_path / "s.json"))["llvm@1"]
    # onnxruntime: 0.5, 1.5, 0.5; openvino: 2.0, 0.5 (q failed); better: 2.0, 1.5, 0.5
    assert (s["models"], s["geomean_ratio"], s["worst_model"]) == (3, 0.721, "b")
    assert s["openvino"] == {"models": 2, "geomean_ratio": 1.0, "worst_model": "a",
                             "worst_ratio": 2.0, "failed": ["q"]}
    assert (s["best"]["models"], s["best"]["geomean_ratio"]) == (3, 1.145)
    text = (tmp_path / "s.md").read_text()
    assert text.startswith(ORT_HEAD + " openvino ms | ratio vs openvino |")
    assert "| q | llvm | 1 | 1.00 | 2.00 | 0.50 |" in text and "| ✗ | ✗ | ✗ | ✗ | 0.50 |" in text
    assert "✗ openvino could not run q: no QGemm" in text
    assert "(ours / openvino) 1.00 over 2 models; worst a 2.00; ✗ q" in text
    assert "(ours / the better peer) 1.15 over 3 models" in text
    assert "25.0 GB/s at 1 thread" in text
    assert "| a | 1 | dense_packed | 2.000 | 38.1 | 20.0 | 80% |" in text  # of 25 GB/s
    assert "conv2d" not in text  # compute-bound: not in the memory-bound table


def test_unknown_peer_is_refused(tmp_path):
    with pytest.raises(BenchError, match="peers must be some of onnxruntime, openvino"):
        bench_library("x.so", "x.onnx", {}, "m", "t", str(tmp_path / "b.json"),
                      str(tmp_path / "peak.json"), threads="1", peers="tvm")
