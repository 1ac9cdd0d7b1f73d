"""Benchmark a built library against its peers (`doit bench`): bench.json + a table.

The peers are onnxruntime (required) and OpenVINO (when installed; both optional
extras: `pip install -e .[ort,openvino]`). For each thread count, `rounds` rounds
alternate the sides (ours, onnxruntime, openvino, ours, ...), each side in a fresh
process (pipeline.tools.bench_runner) that loads the library, an onnxruntime CPU
session or an OpenVINO CPU model (f32 precision forced) with that thread count, runs
`warmup` untimed and `runs` timed inferences on the same seeded inputs and reports
its times and its own peak RSS. A round's figure is the median of its runs; the
report gives the median of the rounds and their spread (min and max, and the range
of the per-round ratios, each round's sides having run one after the other). A peer
that cannot load or run the model is recorded with its reason ("<peer>_failed")
and not tried again for that model; the bench goes on with the others.
Ten warm-up runs by default: our executor times its first seven runs both ways, with
its threads and alone (runtime/c/executor.c). Both sides run with
OPENBLAS_NUM_THREADS=1: numpy (which only loads the inputs there) would otherwise
start OpenBLAS threads that spin for ~60 ms after the import, on the cores the
first runs use.

bench.json holds per thread count: ours_ms, onnxruntime_ms, ratio (ours /
onnxruntime), their spread; openvino_ms and ratio_openvino the same way; best_peer
and ratio_best (ours / the faster peer); GFLOP/s of every side (FLOPs of the model's
Conv, Gemm and MatMul nodes) and as % of the host's measured FMA peak, and the
host's streaming read bandwidth (read_gbps; both the best seen: pipeline.tools.peak),
each side's peak RSS (VmHWM of its own process) and its RSS before loading the model,
the round figures with each process's pid; per peer its version (OpenVINO's also the
inference precision it compiled with); the planned activation bytes of our memory
plan against the sum of all intermediate tensors; with profile, our slowest nodes
(timed in this process after the rounds) with their GFLOP/s, GB/s and the roof
bounding each (pipeline.runtime.profile); at more than one thread, the core-to-core
round trip before and after the rounds (pipeline.tools.peak core_to_core_ns).
summarize() (pipeline.tools.bench_table) turns the bench.json files of a suite into
one table with, per target and thread count, the geometric-mean ratio against each
peer and against the better of them, and the worst model.
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
from pipeline.runtime.metadata import memory_plan
from pipeline.runtime.profile import format_profile, profile_nodes
from pipeline.runtime.vm import Executable as VMExecutable
from pipeline.runtime.vm import is_vm_library
from pipeline.tools.bench_runner import PEERS
from pipeline.tools.bench_table import format_report
from pipeline.tools.on_target import require_run, run_on_target
from pipeline.tools.peak import best_peak_gflops, best_read_gbps, core_to_core_ns
from pipeline.tools.validate import random_inputs
from pipeline.vm import bytecode
from pipeline.vm.bytecode import DTYPES
from pipeline.vm.compile import Executable

_ROOT = str(Path(__file__).resolve().parents[2])  # holds pipeline/: the runner's code


__all__ = ["BenchError", "bench_library", "bench_emulated", "memory_plan", "model_flops",
           "vm_memory_plan"]


class BenchError(PipelineError):
    """The benchmark cannot run (onnxruntime missing, bad options)."""


class SideFailed(BenchError):
    """One side of a round could not load or run the model; `why` is its runner's line."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


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


def vm_memory_plan(exe: Executable) -> dict:
    """memory_plan of a VM executable: the bytes its AllocStorage instructions take
    from the pool vs the sum of the tensors its AllocTensor(Dims) instructions place
    (a tensor of runtime shape counted at its symbols' highs, as the pool is sized)."""
    total = 0
    for fn in exe.functions:
        high: dict[int, int] = {}  # register -> its dimension's value at the highs
        for ins in fn.code:
            if isinstance(ins, bytecode.ShapeOf) and ins.src < len(fn.params):
                d = fn.params[ins.src].shape[ins.axis]
                high[ins.dst] = exe.dims[d][1] if isinstance(d, str) else d
            elif isinstance(ins, (bytecode.MulDim, bytecode.AddDim)):
                a, b = (x if x >= 0 else high.get(-1 - x, 0) for x in (ins.a, ins.b))
                high[ins.dst] = a * b if isinstance(ins, bytecode.MulDim) else a + b
            elif isinstance(ins, (bytecode.AllocTensor, bytecode.AllocTensorDims)):
                shape = [x if x >= 0 else high.get(-1 - x, 0) for x in ins.shape]
                total += math.prod(shape) * np.dtype(DTYPES[ins.dtype]).itemsize
    return {"planned_activation_bytes": sum(i.nbytes for fn in exe.functions for i in fn.code
                                            if isinstance(i, bytecode.AllocStorage)),
            "intermediate_bytes": total}


def _require_onnxruntime() -> None:
    if importlib.util.find_spec("onnxruntime") is None:
        raise BenchError("bench needs onnxruntime, an optional extra: "
                         "pip install -e .[ort]")


# The optional extra (pyproject.toml) installing each peer.
EXTRAS = {"onnxruntime": "ort", "openvino": "openvino"}


def _peers(peers) -> list[str]:
    """The peers to time: `peers` ("onnxruntime,openvino", a list, or None for
    onnxruntime and every other peer installed), each checked to be importable."""
    if peers is None:
        _require_onnxruntime()
        return [p for p in PEERS if importlib.util.find_spec(p) is not None]
    chosen = [p.strip() for p in (peers.split(",") if isinstance(peers, str) else peers)]
    unknown = [p for p in chosen if p not in PEERS]
    if not chosen or unknown:
        raise BenchError(f"bench: peers must be some of {', '.join(PEERS)}, got {peers!r}")
    for peer in chosen:
        if importlib.util.find_spec(peer) is None:
            raise BenchError(f"bench: the peer {peer} is not installed, an optional extra: "
                             f"pip install -e .[{EXTRAS[peer]}]")
    return list(dict.fromkeys(chosen))


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


def run_side(side: str, path: str, inputs: str, threads: int, runs: int,
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
        raise SideFailed(f"bench {model}: the {side} side at {threads} threads failed: {why}",
                         why.removeprefix(f"bench_runner {side} {path}: "))
    return json.loads(lines[-1])


def _rounds(sides: list[str], paths: dict, inputs: str, threads: int, rounds: int,
            runs: int, warmup: int, model: str, failed: dict) -> list[dict]:
    """`rounds` rounds of the sides in turn ({side: runner report} each). A peer that
    fails goes into `failed` (side -> reason), is not run again and its rounds are
    dropped; our side failing raises SideFailed."""
    done = []
    for _ in range(rounds):
        done.append({})
        for side in sides:
            if side in failed:
                continue
            try:
                done[-1][side] = run_side(side, paths[side], inputs, threads, runs, warmup,
                                           model)
            except SideFailed as err:
                if side == "ours":
                    raise
                failed[side] = err.why
    return [{side: r for side, r in rnd.items() if side not in failed} for rnd in done]


def _row(rounds: list[dict], flops: int, peak_gflops: float, failed: dict) -> dict:
    """The figures of one thread count from its rounds ({side: runner report}; the
    sides of the first round ran in every one), with `failed`'s peers marked."""
    row = {}
    ran = list(rounds[0])
    med = {side: [statistics.median(r[side]["times_ms"]) for r in rounds] for side in ran}
    for side in ran:
        ms = statistics.median(med[side])
        row.update({f"{side}_ms": round(ms, 4), f"{side}_min_ms": round(min(med[side]), 4),
                    f"{side}_max_ms": round(max(med[side]), 4),
                    f"{side}_gflops": round(flops / ms / 1e6, 2),
                    f"{side}_peak_pct": round(100 * flops / ms / 1e6 / peak_gflops, 1),
                    f"{side}_peak_rss_bytes": max(r[side]["peak_rss_bytes"] for r in rounds),
                    f"{side}_base_rss_bytes": max(r[side]["base_rss_bytes"] for r in rounds)})
    row.update({f"{peer}_failed": why for peer, why in failed.items()})
    peers = [side for side in ran if side != "ours"]
    for peer in peers:
        # "ratio" stays ours / onnxruntime, as before OpenVINO joined.
        key = "ratio" if peer == "onnxruntime" else f"ratio_{peer}"
        ratios = [o / t for o, t in zip(med["ours"], med[peer], strict=True)]
        row.update({key: round(row["ours_ms"] / row[f"{peer}_ms"], 3),
                    f"{key}_min": round(min(ratios), 3), f"{key}_max": round(max(ratios), 3)})
    if peers:  # against the faster peer at this thread count
        best = min(peers, key=lambda p: row[f"{p}_ms"])
        row.update({"best_peer": best, "ratio_best": round(row["ours_ms"] / row[f"{best}_ms"], 3)})
    row.update({"peak_gflops": round(peak_gflops, 1),
                "ours_runs_alone": sum(r["ours"].get("runs_alone", 0) for r in rounds),
                "ours_runs": sum(len(r["ours"]["times_ms"]) for r in rounds),
                "rounds": [{side: {"ms": round(m, 4), "pid": r[side]["pid"],
                                   "peak_rss_bytes": r[side]["peak_rss_bytes"]}
                            for side, m in ((s, med[s][i]) for s in ran)}
                           for i, r in enumerate(rounds)]})
    return row


def _time_sides(paths: dict, inputs: str, flops: int, model: str, peak_path: str,
                threads: list[int], rounds: int, runs: int, warmup: int) -> tuple[dict, dict]:
    """Every thread count's rounds of the sides in `paths` (side -> the file it loads):
    ({threads: row (_row)}, {peer: its runtime facts, or {"failed": reason}})."""
    sides = list(paths)
    rows, failed, about = {}, {}, {}
    for t in threads:
        peak = best_peak_gflops(t, peak_path)  # nothing of ours is running now
        read_gbps = best_read_gbps(t, peak_path)
        trips = [core_to_core_ns()] if t > 1 else []
        done = _rounds(sides, paths, inputs, t, rounds, runs, warmup, model, failed)
        rows[str(t)] = _row(done, flops, peak, failed)  # dicts keep the sides' order
        rows[str(t)]["read_gbps"] = read_gbps
        if trips and trips[0] is not None:  # the VM's state around these rounds
            rows[str(t)]["core_to_core_ns"] = [*trips, core_to_core_ns()]
        for peer in done[0]:
            about.setdefault(peer, done[0][peer].get("runtime", {}))
    about.update({peer: {"failed": why} for peer, why in failed.items()})
    return rows, {peer: about[peer] for peer in sides[1:]}


def bench_library(lib_path: str, onnx_path: str, shapes: dict, model: str, target: str,
                  report_path: str, peak_path: str, threads="1,2", rounds="3", runs="10",
                  warmup="10", profile="0", on_target: dict | None = None,
                  peers=None) -> dict:
    """Time `lib_path` against its peers on `onnx_path`; write and return the report.

    shapes: input-name -> shape overrides (as the config's `inputs`). peak_path: the
    file keeping the best FMA peak and read bandwidth measured on this CPU
    (pipeline.tools.peak). threads, rounds, runs, warmup and profile may be given as
    the strings of doit's command line (threads=1,2 rounds=3 runs=10 warmup=10
    profile=1). on_target: for a target with a `run` prefix, {"run", "pipeline_run",
    "config", "arch"}: the emulated time instead (bench_emulated). peers: which of
    bench_runner.PEERS to time ("onnxruntime,openvino"; default: onnxruntime, which
    must be installed, and every other one installed).
    """
    threads = _counts(threads, "threads", 1)
    (rounds,), (runs,) = _counts(rounds, "rounds", 1)[:1], _counts(runs, "runs", 1)[:1]
    (warmup,) = _counts(warmup, "warmup", 0)[:1]
    profile = str(profile).lower() in ("1", "true", "yes")
    if on_target is not None:
        return bench_emulated(lib_path, onnx_path, shapes, model, target, report_path,
                              threads, rounds, runs, on_target)
    sides = ["ours", *_peers(peers)]  # first: a wrong peer is named before any file is read
    vm = is_vm_library(lib_path)
    if profile and vm:
        raise BenchError("profile=1: per-node profiles come from the graph executor; a VM "
                         f"library ({lib_path}) has none")
    shapes = {k: tuple(v) for k, v in shapes.items()}
    original = load_model(onnx_path)
    onnx_model = with_input_shapes(original, shapes)  # at the library's input shapes
    feeds = random_inputs(onnx_model, shapes, seed=0)
    flops = model_flops(onnx_model)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        inputs = os.path.join(tmp, "inputs.npz")
        np.savez(inputs, **feeds)
        paths = {"ours": os.path.abspath(lib_path),
                 **{peer: os.path.abspath(onnx_path) for peer in sides[1:]}}
        if onnx_model is not original:  # the peers hold inputs to the declared shapes
            onnx.save(onnx_model, os.path.join(tmp, "model.onnx"))
            paths.update({peer: os.path.join(tmp, "model.onnx") for peer in sides[1:]})
        del onnx_model, original
        rows, about = _time_sides(paths, inputs, flops, model, peak_path, threads, rounds,
                                  runs, warmup)
    if vm:  # a VM library records no target string: its executor instead
        lib, library_target = None, "vm"
        memory = vm_memory_plan(VMExecutable.load(lib_path).content)
    else:
        lib = load_module(lib_path)
        library_target, memory = lib.target, memory_plan(lib.graph_json)
    report = {"model": model, "target": target, "library_target": library_target,
              "gflop": round(flops / 1e9, 4), "rounds": rounds, "runs": runs,
              "warmup": warmup, "peers": about, "threads": rows,
              "memory": {**memory,
                         **{f"{side}_peak_rss_bytes": max(r[f"{side}_peak_rss_bytes"]
                                                          for r in rows.values()
                                                          if f"{side}_peak_rss_bytes" in r)
                            for side in sides
                            if any(f"{side}_peak_rss_bytes" in r for r in rows.values())}}}
    top = []
    if profile:
        gm = GraphModule(lib["default"](), num_threads=threads[0])
        gm.set_input(**feeds)
        top = profile_nodes(gm, runs=max(3, min(runs, 10)))
        roofs = (rows[str(threads[0])]["peak_gflops"], rows[str(threads[0])]["read_gbps"])
        report["profile"] = {"threads": threads[0], "peak_gflops": roofs[0],
                             "read_gbps": roofs[1],
                             "nodes": [r.to_dict(*roofs) for r in top[:10]]}
    atomic_write(report_path, json.dumps(report, indent=1).encode())
    print(format_report(report))
    if profile:
        print(format_profile(top, 10, *roofs))
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

