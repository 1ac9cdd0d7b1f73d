"""One side of one benchmark round, in a fresh process (`doit bench` starts it):

    python -m pipeline.tools.bench_runner ours LIB.so INPUTS.npz --threads 2 --runs 10
    python -m pipeline.tools.bench_runner onnxruntime MODEL.onnx INPUTS.npz --threads 2
    python -m pipeline.tools.bench_runner openvino MODEL.onnx INPUTS.npz --threads 2

loads our library (pipeline.runtime only: no compiler, no onnx), an onnxruntime
CPU session or an OpenVINO CPU model (the peers, PEERS), sets the thread count,
feeds the inputs of INPUTS.npz (an array per input name), runs `--warmup` untimed
and `--runs` timed inferences back to back, and prints one JSON object on stdout:

    {"side", "threads", "pid", "times_ms": [...],
     "runs_alone": timed runs our executor ran on one thread (it measures both ways
                   and runs the faster; 0 for the peers),
     "runtime": {"version": the peer's version; OpenVINO's also "precision", the
                 inference precision the compiled model reports, "threads",
                 "streams" and "cpu_pinning" as it reports them},
     "base_rss_bytes": RSS once Python, numpy and the side's runtime are imported,
     "peak_rss_bytes": this program's peak RSS (VmHWM), all it ever held}

OpenVINO reads the same ONNX file and compiles it for its CPU plugin with f32
inference precision forced (it would pick bf16 on CPUs that have it), the latency
hint (one stream) and INFERENCE_NUM_THREADS = the thread count; inputs are shared,
not copied, and outputs stay in the request's tensors, as our executor's do.
A process per side means each side's peak RSS is its own, and neither shares its
cores with the other's idle threads, which spin for a while after a run.
Errors: one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

PEERS = ("onnxruntime", "openvino")  # the runtimes we are timed against
SIDES = ("ours", *PEERS)


def _status(key: str) -> int:
    """A byte count of /proc/self/status (VmRSS: resident now, VmHWM: peak resident
    since this program started); 0 where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _peak_rss() -> int:
    """This program's own peak RSS in bytes. Not ru_maxrss where /proc has VmHWM: Linux
    keeps ru_maxrss across exec, so a child forked from a big parent (doit, having
    read the model) would report the parent's peak when it is the larger."""
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# What a side's loader returns: a callable running one inference, one counting the
# runs so far that ran on one thread, and facts about the runtime for the report.
Loaded = tuple[Callable[[], object], Callable[[], int], dict]


def _ours(lib_path: str, feeds: dict, threads: int) -> Loaded:
    """Our library with `threads` threads on `feeds`; runs alone: pl_runs_alone. A VM
    library (`executor: vm`) runs in the VM, each run returning its outputs as
    onnxruntime's does (runs alone: 0, the VM has no one-thread choice)."""
    from pipeline.runtime import GraphModule, load_module
    from pipeline.runtime.vm import VirtualMachine, is_vm_library

    if is_vm_library(lib_path):
        vm = VirtualMachine(lib_path)
        vm.set_num_threads(threads)
        vm.set_input("main", **feeds)
        return vm.invoke, lambda: 0, {"executor": "vm"}
    gm = GraphModule(load_module(lib_path)["default"](), num_threads=threads)
    gm.set_input(**feeds)
    return gm.run, lambda: gm.module.runs_alone, {}


def _onnxruntime(model_path: str, feeds: dict, threads: int) -> Loaded:
    """An onnxruntime CPU session (intra-op `threads`) on `feeds` (runs alone: 0,
    onnxruntime always uses its threads)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    return (lambda: sess.run(None, feeds)), lambda: 0, {"version": ort.__version__}


def _openvino(model_path: str, feeds: dict, threads: int) -> Loaded:
    """An OpenVINO CPU model compiled with f32 precision, the latency hint and
    `threads` inference threads, on `feeds` (runs alone: 0)."""
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    core = ov.Core()
    compiled = core.compile_model(core.read_model(model_path), "CPU", {
        hints.inference_precision: ov.Type.f32,
        hints.performance_mode: hints.PerformanceMode.LATENCY,
        props.inference_num_threads: threads})
    request = compiled.create_infer_request()
    about = {"version": ov.get_version(),
             "precision": compiled.get_property(hints.inference_precision).get_type_name(),
             "threads": int(compiled.get_property(props.inference_num_threads)),
             "streams": int(compiled.get_property(props.num_streams)),
             # its default, kept: OpenVINO pins its threads to cores, ours does not
             "cpu_pinning": bool(compiled.get_property(hints.enable_cpu_pinning))}
    return (lambda: request.infer(feeds, share_inputs=True, share_outputs=True)), \
        lambda: 0, about


def measure(side: str, path: str, inputs: str, threads: int, runs: int,
            warmup: int) -> dict:
    """Load `path` on `side`, run it warmup + runs times; the JSON report (module doc)."""
    with np.load(inputs) as z:
        feeds = {name: z[name] for name in z.files}
    if side == "ours":
        import pipeline.runtime  # noqa: F401 - its import is part of the base RSS
    elif side == "onnxruntime":
        import onnxruntime  # noqa: F401
    else:
        import openvino  # noqa: F401
    base = _status("VmRSS")
    load = {"ours": _ours, "onnxruntime": _onnxruntime, "openvino": _openvino}[side]
    run, runs_alone, about = load(path, feeds, threads)
    for _ in range(warmup):
        run()
    alone_before = runs_alone()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    peak = _peak_rss()
    return {"side": side, "threads": threads, "pid": os.getpid(),
            "times_ms": [round(t, 4) for t in times],
            "runs_alone": runs_alone() - alone_before, "runtime": about,
            "base_rss_bytes": base, "peak_rss_bytes": peak}


# The source-location lines OpenVINO's errors open with ("Exception from
# src/inference/src/cpp/core.cpp:84:", "Check 'false' failed at src/...cpp:151:").
_LOCATION = re.compile(r"^(Exception from |Check '.*' failed at )\S+:\d+:$")


def _one_line(err: Exception) -> str:
    """The error's first line; for OpenVINO's, which open with source locations, the
    lines after them joined (where the reason is: "... No conversion rule found for
    operations: com.microsoft.QGemm"), at most 300 characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines or not _LOCATION.match(lines[0]):
        return lines[0] if lines else ""
    return " ".join(line for line in lines if not _LOCATION.match(line))[:300]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.bench_runner",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=SIDES)
    parser.add_argument("path", help="our .so (ours) or the ONNX file (a peer)")
    parser.add_argument("inputs", help=".npz with one array per graph input")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        report = measure(args.side, args.path, args.inputs, args.threads, args.runs,
                         args.warmup)
    except Exception as err:  # noqa: BLE001 - the parent shows this one line
        print(f"bench_runner {args.side} {args.path}: {type(err).__name__}: "
              f"{_one_line(err)}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
