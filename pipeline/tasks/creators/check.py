"""The check family: each library run against the reference (validate), timed
against onnxruntime (bench), and ONNX's backend test suites (conformance)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path

from doit import get_var

from pipeline.ir.target import parse_target
from pipeline.tasks.config import TargetEntry, executor_of
from pipeline.tasks.explain import options_changed
from pipeline.tasks.paths import OUT, artifacts, onnx_path, path, runtime_artifacts
from pipeline.tasks.run import run_stage
from pipeline.tasks.selection import Selection, code_of

_PKG = Path(__file__).resolve().parents[2]  # pipeline/


def _on_target(t: TargetEntry) -> dict:
    """How a library for target t runs there: in the target's pipeline-run through
    its run prefix (tools.on_target)."""
    return {"run": t.run, "pipeline_run": runtime_artifacts(t)["run"], "config": str(t.path),
            "arch": parse_target(t.target).arch}


def task_validate(sel: Selection):
    """Run each built library and compare its outputs with the reference."""
    reference = reference_identity()
    for m, t in sel.entries:
        a = artifacts(m, t)
        opts = m.validate.to_dict()
        shapes = {k: list(v) for k, v in m.inputs.items()}
        aot = executor_of(m, t) == "aot"
        lib = a["program"] if aot else a["so"]
        deps = [lib, onnx_path(m), *code_of("tools.validate:validate_library")]
        # A library for another machine runs there; the host's loads in process.
        on_target = None if parse_target(t.target).is_host else _on_target(t)
        if aot:  # the model's own program, through the run prefix if there is one
            on_target = {"run": t.run, "config": str(t.path), "metadata": a["metadata"],
                         "arch": parse_target(t.target).arch,
                         "host": parse_target(t.target).is_host}
            deps.append(a["metadata"])
        elif on_target and t.run:
            deps.append(on_target["pipeline_run"])
        # Cached like a stage (as Bazel caches a passed test): a failed
        # validation is never stored, so it reruns until it passes.
        yield sel.cached_stage(
            f"{m.name}@{t.name}", "tools.validate:validate_library",
            [lib, onnx_path(m), shapes, opts, m.name, t.name, a["validation"], on_target,
             *([{k: list(v) for k, v in m.dims.items()}] if m.dims else [])],
            deps, [a["validation"]],
            [options_changed({"validate": opts, "inputs": shapes, "run": t.run}, "validation")],
            extra=reference, fetch=(a["validation"],), clean=False)


def task_conformance(sel: Selection):
    """Run ONNX's backend test suites (not part of build): out/conformance.json, .md."""
    report = [path(OUT, "conformance.json"), path(OUT, "conformance.md")]
    every = sorted(os.path.relpath(p) for p in _PKG.glob("**/*.py"))  # tests it all
    return {"targets": report, "file_dep": every, "verbosity": 2,
            "actions": [(run_stage, ["tools.conformance:write_report", OUT])]}


def task_bench(sel: Selection):
    """Time each library against its peers (onnxruntime, and OpenVINO when installed),
    each side in its own fresh process (never part of build; always runs when asked):
    bench.json, then bench:summary, the suite table out/bench-summary.md (.json).
    Options: threads=1,2 rounds=3 runs=10 warmup=10 profile=1 peers=onnxruntime,openvino
    (default: every installed peer)."""
    opts = [get_var(k, d) for k, d in (("threads", "1,2"), ("rounds", "3"), ("runs", "10"),
                                       ("warmup", "10"), ("profile", "0"))]
    peers = get_var("peers", None)
    reports, peak = [], path(OUT, "bench-peak.json")
    # An entry of executor aot has no .so to time (its sizes are the budget task's);
    # a VM entry's .so runs in the VM.
    timed = [(m, t) for m, t in sel.entries if executor_of(m, t) in ("graph", "vm")]
    for m, t in timed:
        a = artifacts(m, t)
        reports.append(path(OUT, m.name, t.name, "bench.json"))
        # A target with a run prefix is timed there, emulated (tools.bench_emulated).
        on_target = _on_target(t) if t.run else None
        yield {"name": f"{m.name}@{t.name}", "verbosity": 2, "uptodate": [False],
               "targets": [reports[-1]],
               "file_dep": [a["so"], onnx_path(m),
                            *([on_target["pipeline_run"]] if on_target else [])],
               "actions": [(run_stage, ["tools.bench:bench_library", a["so"], onnx_path(m),
                                        {k: list(v) for k, v in m.inputs.items()},
                                        m.name, t.name, reports[-1], peak, *opts, on_target,
                                        peers])]}
    # After every entry's bench ("summary" has no "@", so no entry is called so).
    summary = [path(OUT, "bench-summary.md"), path(OUT, "bench-summary.json")]
    yield {"name": "summary", "verbosity": 2, "uptodate": [False],
           "task_dep": [f"bench:{m.name}@{t.name}" for m, t in timed],
           "targets": summary,
           "actions": [(run_stage, ["tools.bench_table:summarize", reports, peak, *summary])]}


def reference_identity() -> dict:
    """What decides a validation besides its files and options: the versions of
    the reference implementations and this machine's architecture (read from the
    installed metadata: nothing is imported)."""
    versions = {}
    for dist in ("onnx", "onnxruntime", "numpy"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"reference": versions, "machine": platform.machine()}


CREATORS = (task_validate, task_conformance, task_bench)
