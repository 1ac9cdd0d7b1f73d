"""Benchmark a built library against onnxruntime (`doit bench`): bench.json + a table.

For each thread count, `rounds` rounds alternate the two sides (ours, onnxruntime,
ours, ...), each side in a fresh process (pipeline.tools.bench_runner) that loads
the library or an onnxruntime CPU session with that intra-op thread count, runs
`warmup` untimed and `runs` timed inferences on the same seeded inputs and reports
its times and its own peak RSS. A round's figure is the median of its runs; the
report gives the median of the rounds and their spread (min and max, and the range
of the per-round ratios, each round's two sides having run one after the other).
Ten warm-up runs by default: our executor times its first seven runs both ways, with
its threads and alone (runtime/c/executor.c). Both sides run with
OPENBLAS_NUM_THREADS=1: numpy (which only loads the inputs there) would otherwise
start OpenBLAS threads that spin for ~60 ms after the import, on the cores the
first runs use.
onnxruntime is an optional extra (`pip install -e .[ort]`).

bench.json holds per thread count: ours_ms, onnxruntime_ms, ratio (ours / theirs),
their spread, GFLOP/s of both (FLOPs of the model's Conv, Gemm and MatMul nodes)
and as % of the host's measured FMA peak (the best seen: pipeline.tools.peak), each
side's peak RSS (VmHWM of its own process) and its RSS before loading the model, the
round figures with each process's pid; the planned activation bytes of our memory
plan against the sum of all intermediate tensors; with profile, our slowest nodes
(timed in this process after the rounds); at more than one thread, the core-to-core
round trip before and after the rounds (pipeline.tools.peak core_to_core_ns).
summarize() turns the bench.json files of a suite into one table with, per target
and thread count, the geometric-mean ratio and the worst model.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from pipeline.errors import PipelineError
from pipeline.files import atomic_write
from pipeline.frontend.onnx.importer import load_model
from pipeline.frontend.onnx.shapes import with_input_shapes
from pipeline.runtime import GraphModule, load_module
from pipeline.runtime.profile import format_profile, profile_nodes
from pipeline.tools.bench_runner import SIDES
from pipeline.tools.on_target import require_run, run_on_target
from pipeline.tools.peak import best_peak_gflops, core_to_core_ns
from pipeline.tools.validate import random_inputs

_ROOT = str(Path(__file__).resolve().parents[2])  # holds pipeline/: the runner's code


class BenchError(PipelineError):
    """The benchmark cannot run (onnxruntime missing, bad options)."""


def model_flops(model: onnx.ModelProto) -> int:
    """2 x multiply-adds of the model's Conv, ConvTranspose, Gemm, MatMul, LSTM, GRU and
    RNN nodes and of their int8 forms (ConvInteger, QLinearConv, MatMulInteger,
    QLinearMatMul, QGemm; shapes from ONNX shape inference; elementwise work is not
    counted)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        shapes[vi.name] = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    for init in model.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    total = 0
    # int8 operators count their multiply-adds the same way (the weight's input position)
    conv_weight = {"Conv": 1, "ConvTranspose": 1, "ConvInteger": 1, "QLinearConv": 3}
    for node in model.graph.node:
        if node.op_type in conv_weight:
            w, y = shapes.get(node.input[conv_weight[node.op_type]]), shapes.get(node.output[0])
            x = shapes.get(node.input[0])
            if not (w and y and x):
                continue
            # every output (Conv) or input (ConvTranspose) element: C/groups * taps MACs
            per = w[1] * math.prod(w[2:]) if node.op_type == "ConvTranspose" else \
                math.prod(w[1:])
            total += 2 * math.prod(x if node.op_type == "ConvTranspose" else y) * per
        elif node.op_type in ("Gemm", "MatMul", "MatMulInteger", "QLinearMatMul", "QGemm"):
            a, y = shapes.get(node.input[0]), shapes.get(node.output[0])
            if not (a and y):
                continue
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[-2] if trans_a else a[-1]
            total += 2 * math.prod(y) * k
        elif node.op_type in ("LSTM", "GRU", "RNN"):
            x, w, r = (shapes.get(node.input[i]) for i in range(3))
            if not (x and w and r):
                continue
            # every step and direction: the gate columns times the input and hidden sizes
            total += 2 * x[0] * x[1] * w[0] * w[1] * (w[2] + r[2])
    return total


def memory_plan(graph_json: str) -> dict:
    """Bytes of the storages holding kernel outputs vs the sum of those outputs."""
    doc = json.loads(graph_json)
    attrs, row_ptr = doc["attrs"], doc["node_row_ptr"]
    shapes, dtypes, sids = attrs["shape"][1], attrs["dltype"][1], attrs["storage_id"][1]
    offsets = attrs.get("storage_offset", ["list_int", [0] * len(sids)])[1]
    storage: dict[int, int] = {}
    total = 0
    for nid, node in enumerate(doc["nodes"]):
        if node["op"] == "null":
            continue
        for eid in range(row_ptr[nid], row_ptr[nid + 1]):
            size = math.prod(shapes[eid]) * np.dtype(dtypes[eid]).itemsize
            total += size
            storage[sids[eid]] = max(storage.get(sids[eid], 0), offsets[eid] + size)
    return {"planned_activation_bytes": sum(storage.values()), "intermediate_bytes": total}


def _require_onnxruntime() -> None:
    if importlib.util.find_spec("onnxruntime") is None:
        raise BenchError("bench needs onnxruntime, an optional extra: "
                         "pip install -e .[ort]")


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


def _run_side(side: str, path: str, inputs: str, threads: int, runs: int,
              warmup: int, model: str) -> dict:
    """One side's round in a fresh process (bench_runner); its JSON report."""
    env = dict(os.environ)
    # The runner runs the code of this checkout, wherever doit's folder is.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    # The runner uses numpy only to load the inputs; its OpenBLAS threads would spin
    # for ~60 ms after the import and take a core from either side's first runs.
    env["OPENBLAS_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "pipeline.tools.bench_runner", side, path,
                           inputs, f"--threads={threads}", f"--runs={runs}",
                           f"--warmup={warmup}"], capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise BenchError(f"bench {model}: the {side} side at {threads} threads failed: {why}")
    return json.loads(lines[-1])


def _row(rounds: list[dict], flops: int, peak_gflops: float) -> dict:
    """The figures of one thread count from its rounds ({side: runner report})."""
    row = {}
    med = {side: [statistics.median(r[side]["times_ms"]) for r in rounds] for side in SIDES}
    for side in SIDES:
        ms = statistics.median(med[side])
        row.update({f"{side}_ms": round(ms, 4), f"{side}_min_ms": round(min(med[side]), 4),
                    f"{side}_max_ms": round(max(med[side]), 4),
                    f"{side}_gflops": round(flops / ms / 1e6, 2),
                    f"{side}_peak_pct": round(100 * flops / ms / 1e6 / peak_gflops, 1),
                    f"{side}_peak_rss_bytes": max(r[side]["peak_rss_bytes"] for r in rounds),
                    f"{side}_base_rss_bytes": max(r[side]["base_rss_bytes"] for r in rounds)})
    ratios = [o / t for o, t in zip(med["ours"], med["onnxruntime"], strict=True)]
    row.update({"ratio": round(row["ours_ms"] / row["onnxruntime_ms"], 3),
                "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
                "peak_gflops": round(peak_gflops, 1),
                "ours_runs_alone": sum(r["ours"].get("runs_alone", 0) for r in rounds),
                "ours_runs": sum(len(r["ours"]["times_ms"]) for r in rounds),
                "rounds": [{side: {"ms": round(m, 4), "pid": r[side]["pid"],
                                   "peak_rss_bytes": r[side]["peak_rss_bytes"]}
                            for side, m in ((s, med[s][i]) for s in SIDES)}
                           for i, r in enumerate(rounds)]})
    return row


def bench_library(lib_path: str, onnx_path: str, shapes: dict, model: str, target: str,
                  report_path: str, peak_path: str, threads="1,2", rounds="3", runs="10",
                  warmup="10", profile="0", on_target: dict | None = None) -> dict:
    """Time `lib_path` against onnxruntime on `onnx_path`; write and return the report.

    shapes: input-name -> shape overrides (as the config's `inputs`). peak_path: the
    file keeping the best FMA peak measured on this CPU (pipeline.tools.peak). threads,
    rounds, runs, warmup and profile may be given as the strings of doit's command line
    (threads=1,2 rounds=3 runs=10 warmup=10 profile=1). on_target: for a target with a
    `run` prefix, {"run", "pipeline_run", "config", "arch"}: the emulated time instead
    (bench_emulated).
    """
    threads = _counts(threads, "threads", 1)
    (rounds,), (runs,) = _counts(rounds, "rounds", 1)[:1], _counts(runs, "runs", 1)[:1]
    (warmup,) = _counts(warmup, "warmup", 0)[:1]
    profile = str(profile).lower() in ("1", "true", "yes")
    if on_target is not None:
        return bench_emulated(lib_path, onnx_path, shapes, model, target, report_path,
                              threads, rounds, runs, on_target)
    _require_onnxruntime()
    shapes = {k: tuple(v) for k, v in shapes.items()}
    original = load_model(onnx_path)
    onnx_model = with_input_shapes(original, shapes)  # at the library's input shapes
    feeds = random_inputs(onnx_model, shapes, seed=0)
    flops = model_flops(onnx_model)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        inputs = os.path.join(tmp, "inputs.npz")
        np.savez(inputs, **feeds)
        paths = {"ours": os.path.abspath(lib_path), "onnxruntime": os.path.abspath(onnx_path)}
        if onnx_model is not original:  # onnxruntime holds inputs to the declared shapes
            paths["onnxruntime"] = os.path.join(tmp, "model.onnx")
            onnx.save(onnx_model, paths["onnxruntime"])
        del onnx_model, original
        for t in threads:
            peak = best_peak_gflops(t, peak_path)  # nothing of ours is running now
            trips = [core_to_core_ns()] if t > 1 else []
            done = [{side: _run_side(side, paths[side], inputs, t, runs, warmup, model)
                     for side in SIDES} for _ in range(rounds)]  # dicts keep SIDES' order
            rows[str(t)] = _row(done, flops, peak)
            if trips and trips[0] is not None:  # the VM's state around these rounds
                rows[str(t)]["core_to_core_ns"] = [*trips, core_to_core_ns()]
    lib = load_module(lib_path)
    report = {"model": model, "target": target, "library_target": lib.target,
              "gflop": round(flops / 1e9, 4), "rounds": rounds, "runs": runs,
              "warmup": warmup, "threads": rows,
              "memory": {**memory_plan(lib.graph_json),
                         **{f"{side}_peak_rss_bytes": max(r[f"{side}_peak_rss_bytes"]
                                                          for r in rows.values())
                            for side in SIDES}}}
    top = []
    if profile:
        gm = GraphModule(lib["default"](), num_threads=threads[0])
        gm.set_input(**feeds)
        top = profile_nodes(gm, runs=max(3, min(runs, 10)))
        report["profile"] = {"threads": threads[0], "nodes": [r.to_dict() for r in top[:10]]}
    atomic_write(report_path, json.dumps(report, indent=1).encode())
    print(format_report(report))
    if profile:
        print(format_profile(top, top=10))
    return report


def bench_emulated(lib_path: str, onnx_path: str, shapes: dict, model: str, target: str,
                   report_path: str, threads: list[int], rounds: int, runs: int,
                   on_target: dict) -> dict:
    """The time of `lib_path` run by the target's pipeline-run through its `run` prefix
    (an emulator, so labelled emulated, and never set against onnxruntime, which runs
    natively here): per thread count, `rounds` processes each printing the median of
    `runs` runs after one untimed one; the report's figure is the median of those."""
    prefix = require_run(on_target["run"], on_target["config"], target, on_target["arch"])
    onnx_model = load_model(onnx_path)
    feeds = random_inputs(onnx_model, {k: tuple(v) for k, v in shapes.items()}, seed=0)
    n_outputs = len(onnx_model.graph.output)
    rows = {}
    for t in threads:
        ms = [run_on_target(prefix, on_target["pipeline_run"], lib_path, feeds, n_outputs,
                            threads=t, repeat=runs)[1] for _ in range(rounds)]
        rows[str(t)] = {"emulated_ms": round(statistics.median(ms), 4),
                        "emulated_min_ms": round(min(ms), 4),
                        "emulated_max_ms": round(max(ms), 4)}
    report = {"model": model, "target": target, "emulated": True, "run": on_target["run"],
              "gflop": round(model_flops(onnx_model) / 1e9, 4), "rounds": rounds,
              "runs": runs, "threads": rows}
    atomic_write(report_path, json.dumps(report, indent=1).encode())
    print(format_report(report))
    return report


MIB = 2**20
# A round trip this slow means the two cores share no cache (pipeline.tools.peak).
SLOW_CORE_TO_CORE_NS = 250


def _spread(row: dict, side: str) -> float:
    """(max - min) / median of a side's round figures, in percent."""
    return 100 * (row[f"{side}_max_ms"] - row[f"{side}_min_ms"]) / row[f"{side}_ms"]


def format_report(report: dict) -> str:
    """The bench table of one model: one line per thread count, then its memory."""
    if report.get("emulated"):
        return "\n".join(
            [f"{report['model']} @ {report['target']}: EMULATED under {report['run']!r} "
             f"(median of {report['rounds']} rounds of {report['runs']} runs; not a device "
             "time, no onnxruntime ratio)", f"{'threads':>7} {'emulated ms':>12} {'range':>19}"]
            + [f"{t:>7} {r['emulated_ms']:12.2f} {r['emulated_min_ms']:9.2f}-"
               f"{r['emulated_max_ms']:<9.2f}" for t, r in report["threads"].items()])
    lines = [f"{report['model']} @ {report['target']} ({report['gflop']} GFLOP; median of "
             f"{report['rounds']} rounds of {report['runs']} runs, each side in its own "
             "process)",
             f"{'threads':>7} {'ours ms':>9} {'ort ms':>9} {'ratio':>6} {'range':>11} "
             f"{'spread':>11} {'ours GF/s':>10} {'% peak':>7} {'RSS ours':>9} {'RSS ort':>8}"]
    for t, r in report["threads"].items():
        lines.append(
            f"{t:>7} {r['ours_ms']:9.2f} {r['onnxruntime_ms']:9.2f} {r['ratio']:6.2f} "
            f"{r['ratio_min']:5.2f}-{r['ratio_max']:<5.2f} "
            f"{_spread(r, 'ours'):4.0f}%/{_spread(r, 'onnxruntime'):4.0f}% "
            f"{r['ours_gflops']:10.1f} {r['ours_peak_pct']:6.0f}% "
            f"{r['ours_peak_rss_bytes'] / MIB:6.0f}MiB "
            f"{r['onnxruntime_peak_rss_bytes'] / MIB:5.0f}MiB")
    lines += [f"{t:>7} threads: a cache line's round trip between two cores "
              f"{r['core_to_core_ns'][0]:.0f} ns before the rounds, "
              f"{r['core_to_core_ns'][1]:.0f} ns after"
              for t, r in report["threads"].items() if "core_to_core_ns" in r]
    mem = report["memory"]
    lines.append(f"activations: planned {mem['planned_activation_bytes'] / MIB:.1f} MiB of "
                 f"{mem['intermediate_bytes'] / MIB:.1f} MiB (range: per-round ratios; "
                 "spread: (max - min) / median of the rounds, ours/ort)")
    return "\n".join(lines)


def summarize(report_paths: list[str], peak_path: str, md_path: str, json_path: str) -> dict:
    """The suite table of several bench.json files, with per target and thread count the
    geometric-mean ratio and the worst model; written as Markdown and JSON, printed.
    "% of peak" is against the best peak in `peak_path` now, the same for every row
    (a report measured earlier may have known a lower one)."""
    reports = [json.loads(Path(p).read_text()) for p in report_paths]
    emulated = [r for r in reports if r.get("emulated")]
    reports = [r for r in reports if not r.get("emulated")]
    # No native report measured the peak when every entry was emulated.
    best = json.loads(Path(peak_path).read_text())["gflops"] if reports else {}
    head = ("| model | target | threads | ours ms | onnxruntime ms | ratio | ratio range | "
            "spread ours / ort | ours GFLOP/s | % of peak | peak RSS ours / ort MiB |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    groups: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for rep in reports:
        for t, r in rep["threads"].items():
            groups.setdefault((rep["target"], t), []).append((r["ratio"], rep["model"]))
            lines.append(
                f"| {rep['model']} | {rep['target']} | {t} | {r['ours_ms']:.2f} | "
                f"{r['onnxruntime_ms']:.2f} | {r['ratio']:.2f} | {r['ratio_min']:.2f}–"
                f"{r['ratio_max']:.2f} | {_spread(r, 'ours'):.0f}% / "
                f"{_spread(r, 'onnxruntime'):.0f}% | {r['ours_gflops']:.1f} | "
                f"{100 * r['ours_gflops'] / best[t]:.0f}% | "
                f"{r['ours_peak_rss_bytes'] / MIB:.0f} / "
                f"{r['onnxruntime_peak_rss_bytes'] / MIB:.0f} |")
    if not reports:  # emulated entries only: no native table, no peak
        lines = []
    else:
        lines.append("\nPeak: " + ", ".join(f"{g:.0f} GFLOP/s at {t} thread{'s' * (t != '1')}"
                                            for t, g in sorted(best.items()))
                     + " (the best FMA-loop rate measured on this CPU so far)")
    alone = [f"{rep['model']} {r['ours_runs_alone']}/{r['ours_runs']}"
             for rep in reports for t, r in rep["threads"].items()
             if int(t) > 1 and r.get("ours_runs_alone")]
    if alone:  # the executor's own choice (runtime/c/executor.c, run_alone): said openly
        lines.append("Timed runs at more than one thread that our executor ran on one "
                     "(it measured that faster): " + ", ".join(alone))
    trips = [(ns, rep["model"]) for rep in reports for r in rep["threads"].values()
             for ns in r.get("core_to_core_ns", ())]
    if trips:  # pipeline.tools.peak: the VM's state decides what two threads can gain
        slow = sorted({m for ns, m in trips if ns > SLOW_CORE_TO_CORE_NS})
        lines.append(f"Core-to-core round trip around the multi-thread rounds: "
                     f"{min(trips)[0]:.0f}-{max(trips)[0]:.0f} ns"
                     + (f"; over {SLOW_CORE_TO_CORE_NS} ns (two threads gain little) at "
                        + ", ".join(slow) if slow else ""))
    summary = {}
    for (target, t), ratios in sorted(groups.items()):
        geo = math.exp(statistics.fmean(math.log(r) for r, _ in ratios))
        worst = max(ratios)
        summary[f"{target}@{t}"] = {"target": target, "threads": int(t), "models": len(ratios),
                                    "geomean_ratio": round(geo, 3),
                                    "worst_model": worst[1], "worst_ratio": worst[0]}
        lines.append(f"{target}, {t} thread{'s' * (t != '1')}: geometric-mean ratio "
                     f"(ours / onnxruntime) {geo:.2f} over {len(ratios)} models; worst "
                     f"{worst[1]} {worst[0]:.2f}")
    if emulated:
        lines += [""] * bool(lines) + [
                  "Emulated (the target's `run` prefix on this machine: not device times, "
                  "no onnxruntime ratio):", "", "| model | target | threads | emulated ms |",
                  "|---|---|---|---|"]
        lines += [f"| {rep['model']} | {rep['target']} | {t} | {r['emulated_ms']:.2f} |"
                  for rep in emulated for t, r in rep["threads"].items()]
    text = "\n".join(lines) + "\n"
    atomic_write(md_path, text.encode())
    atomic_write(json_path, json.dumps({"summary": summary, "peak_gflops": best,
                                        "reports": reports, "emulated": emulated},
                                       indent=1).encode())
    print(text, end="")
    return summary
