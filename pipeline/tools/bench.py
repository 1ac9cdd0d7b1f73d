"""Benchmark a built library against onnxruntime (`doit bench`): bench.json + a table.

For each thread count, our GraphModule and an onnxruntime CPU session with the
same intra-op thread count run the same seeded inputs, interleaved run by run in
this one process (so both see the same machine load), after warm-up runs; the
medians are compared. Each timed run starts after a short pause, so neither side
shares its cores with the other's still-spinning idle threads. onnxruntime is an
optional extra (`pip install -e .[ort]`).

bench.json holds per thread count: ours_ms, onnxruntime_ms, ratio (ours / theirs)
and GFLOP/s of both (FLOPs of the model's Conv, Gemm and MatMul nodes); the
planned activation bytes of our memory plan against the sum of all intermediate
tensors; the peak RSS while each side ran; and with profile, our slowest nodes.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import onnx

from pipeline.errors import PipelineError
from pipeline.frontend.onnx import load_model
from pipeline.link.files import atomic_write
from pipeline.runtime import GraphModule, load_module
from pipeline.runtime.profile import format_profile, profile_nodes
from pipeline.tools.validate import random_inputs

# Pause before each timed run. After a run onnxruntime's idle workers spin for tens
# of ms (libgomp's, as the runtime configures it, for under 1 ms); a run started
# meanwhile would share its cores with them.
SETTLE_S = 0.06


class BenchError(PipelineError):
    """The benchmark cannot run (onnxruntime missing, bad options)."""


def model_flops(model: onnx.ModelProto) -> int:
    """2 x multiply-adds of the model's Conv, ConvTranspose, Gemm and MatMul nodes
    (shapes from ONNX shape inference; elementwise work is not counted)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        shapes[vi.name] = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    for init in model.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    total = 0
    for node in model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose"):
            w, y = shapes.get(node.input[1]), shapes.get(node.output[0])
            x = shapes.get(node.input[0])
            if not (w and y and x):
                continue
            # every output (Conv) or input (ConvTranspose) element: C/groups * taps MACs
            per = math.prod(w[1:]) if node.op_type == "Conv" else w[1] * math.prod(w[2:])
            total += 2 * math.prod(y if node.op_type == "Conv" else x) * per
        elif node.op_type in ("Gemm", "MatMul"):
            a, y = shapes.get(node.input[0]), shapes.get(node.output[0])
            if not (a and y):
                continue
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[-2] if trans_a else a[-1]
            total += 2 * math.prod(y) * k
    return total


def memory_plan(graph_json: str) -> dict:
    """Bytes of the storages holding kernel outputs vs the sum of those outputs."""
    doc = json.loads(graph_json)
    attrs, row_ptr = doc["attrs"], doc["node_row_ptr"]
    shapes, dtypes, sids = attrs["shape"][1], attrs["dltype"][1], attrs["storage_id"][1]
    storage: dict[int, int] = {}
    total = 0
    for nid, node in enumerate(doc["nodes"]):
        if node["op"] == "null":
            continue
        for eid in range(row_ptr[nid], row_ptr[nid + 1]):
            size = math.prod(shapes[eid]) * np.dtype(dtypes[eid]).itemsize
            total += size
            storage[sids[eid]] = max(storage.get(sids[eid], 0), size)
    return {"planned_activation_bytes": sum(storage.values()), "intermediate_bytes": total}


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux: write 5 to clear_refs); False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status(key: str) -> int:
    """A byte count from /proc/self/status (VmHWM: peak RSS, VmRSS: current)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return 0


def _peak_rss() -> int:
    return _status("VmHWM")


def _session(model: onnx.ModelProto, threads: int):
    try:
        import onnxruntime as ort
    except ImportError:
        raise BenchError("bench needs onnxruntime, an optional extra: "
                         "pip install -e .[ort]") from None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _counts(value, what: str, minimum: int) -> list[int]:
    """"1,2" or 5 or [1, 2] as a list of ints >= minimum; BenchError naming `what`."""
    items = value.split(",") if isinstance(value, str) else \
        list(value) if isinstance(value, (list, tuple)) else [value]
    try:
        counts = [int(v) for v in items]
    except (TypeError, ValueError):
        counts = []
    if not counts or min(counts) < minimum:
        raise BenchError(f"bench: {what} must be integers >= {minimum}, got {value!r}")
    return counts


def bench_library(lib_path: str, onnx_path: str, shapes: dict, model: str, target: str,
                  report_path: str, threads="1,2", runs="20", warmup="3",
                  profile="0") -> dict:
    """Time `lib_path` against onnxruntime on `onnx_path`; write and return the report.

    shapes: input-name -> shape overrides (as the config's `inputs`). threads, runs,
    warmup and profile may be given as the strings of doit's command line
    (threads=1,2 runs=20 warmup=3 profile=1).
    """
    threads = _counts(threads, "threads", 1)
    (runs,), (warmup,) = _counts(runs, "runs", 1)[:1], _counts(warmup, "warmup", 0)[:1]
    profile = str(profile).lower() in ("1", "true", "yes")
    onnx_model = load_model(onnx_path)
    feeds = random_inputs(onnx_model, {k: tuple(v) for k, v in shapes.items()}, seed=0)
    lib = load_module(lib_path)
    gm = GraphModule(lib["default"]())
    gm.set_input(**feeds)
    flops = model_flops(onnx_model)
    rows, peaks, top = {}, {"ours": 0, "onnxruntime": 0}, []
    # With a resettable peak (Linux), each side's peak is measured over its own runs;
    # otherwise both report the process's peak.
    exact = _reset_peak_rss()
    baseline = _status("VmRSS")  # Python, numpy, onnx, both libraries and their weights
    for t in threads:
        gm.set_num_threads(t)
        sess = _session(onnx_model, t)
        for _ in range(warmup):
            gm.run()
            sess.run(None, feeds)
        ours, theirs = [], []
        for _ in range(runs):  # interleaved: both see the same load on the machine
            for side, fn, times in (("ours", gm.run, ours),
                                    ("onnxruntime", lambda s=sess: s.run(None, feeds), theirs)):
                time.sleep(SETTLE_S)  # the other side's idle threads stop spinning
                if exact:
                    _reset_peak_rss()
                times.append(_time(fn))
                peaks[side] = max(peaks[side], _peak_rss())
        ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
        rows[str(t)] = {"ours_ms": round(ours_s * 1e3, 4),
                        "onnxruntime_ms": round(theirs_s * 1e3, 4),
                        "ratio": round(ours_s / theirs_s, 3),
                        "ours_gflops": round(flops / ours_s / 1e9, 2),
                        "onnxruntime_gflops": round(flops / theirs_s / 1e9, 2)}
        if profile and not top:
            top = profile_nodes(gm, runs=max(3, min(runs, 10)))
        del sess
    report = {"model": model, "target": target, "library_target": lib.target,
              "gflop": round(flops / 1e9, 4), "runs": runs, "warmup": warmup,
              "threads": rows,
              "memory": {**memory_plan(lib.graph_json),
                         "peak_rss_bytes_ours": peaks["ours"],
                         "peak_rss_bytes_onnxruntime": peaks["onnxruntime"],
                         "rss_before_runs_bytes": baseline, "peak_rss_per_side": exact}}
    if profile:
        report["profile"] = {"threads": threads[0], "nodes": [r.to_dict() for r in top[:10]]}
    atomic_write(report_path, json.dumps(report, indent=1).encode())
    print(format_report(report))
    if profile:
        print(format_profile(top, top=10))
    return report


def format_report(report: dict) -> str:
    """The bench table: one line per thread count, then the memory figures."""
    lines = [f"{report['model']} @ {report['target']} ({report['gflop']} GFLOP, median of "
             f"{report['runs']} runs)",
             f"{'threads':>7} {'ours ms':>9} {'ort ms':>9} {'ratio':>6} {'ours GF/s':>10} "
             f"{'ort GF/s':>9}"]
    for t, r in report["threads"].items():
        lines.append(f"{t:>7} {r['ours_ms']:9.2f} {r['onnxruntime_ms']:9.2f} {r['ratio']:6.2f} "
                     f"{r['ours_gflops']:10.1f} {r['onnxruntime_gflops']:9.1f}")
    mem = report["memory"]
    lines.append(f"activations: planned {mem['planned_activation_bytes'] / 2**20:.1f} MiB of "
                 f"{mem['intermediate_bytes'] / 2**20:.1f} MiB; peak RSS ours "
                 f"{mem['peak_rss_bytes_ours'] / 2**20:.0f} MiB, onnxruntime "
                 f"{mem['peak_rss_bytes_onnxruntime'] / 2**20:.0f} MiB (process before runs "
                 f"{mem['rss_before_runs_bytes'] / 2**20:.0f} MiB)")
    return "\n".join(lines)
