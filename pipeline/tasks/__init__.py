"""Layer 8, the build system on doit: these task creators, `stages` (the work),
`checker`, `reporter`, `explain`, `cache` (kernel cache), `config` and `deps`
(the sources each task runs). Imports every package below; tools'
validate/bench/conformance run only by name (run_stage).

The task creators only describe tasks; the work is in pipeline.tasks.stages.

Task names (model m, target entry t):
  model:m        generate an ONNX file with models/ (generated models only)
  import:m       ONNX -> graph IR + weights          (out/m/m.ir.json, m.weights.params)
  optimize:m@t   passes + lowering -> graph JSON, params, kernels.json, kernel specs
  kernel:<hash>  one kernel spec -> <cache>/<hash>.ll, .o, .sha256 (created after optimize;
                 the cache is shared by all entries, see pipeline/tasks/cache.py)
  lib0:m@t       the entry's kernel objects -> lib0.o (the target's cc -r)
  devc:m@t       graph JSON + params -> devc.o (the packed blob)
  runtime:t      the C executor and pipeline-run for target t, by its cc ->
                 out/runtime/t/executor.o, pipeline-run (sources pipeline/runtime/c/)
  export:m@t     lib0.o + devc.o + executor.o -> m.so (linked by the target's cc)
  validate:m@t   run m.so against the reference -> validation.json
  explain        print why each task of the last build ran (out/build-report.json)
  gc             remove cache entries no entry of the matrix uses
Every task declares its inputs, including the compiler sources it runs (doit
does not see code edits otherwise; derived from the stage's code by `code_of`);
option dicts go into one options_changed (a config_changed that keeps the
options, so pipeline.tasks.explain can say which one changed). A task that runs
the target's compiler also hashes its identity (path and --version;
TargetEntry.toolchain), so changing a target's cc rebuilds that target's lib0.o
and .so, and no other target's.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import threading
import traceback
from pathlib import Path

from doit import create_after
from doit.exceptions import TaskFailed

from pipeline.errors import PipelineError
from pipeline.link.runtime_c import C_SOURCES
from pipeline.lower.sources import CODEGEN_ROOTS
from pipeline.tasks import cache
from pipeline.tasks.config import BuildConfig, ModelEntry, TargetEntry
from pipeline.tasks.deps import sources
from pipeline.tasks.explain import options_changed

OUT = "out"
_PKG = Path(__file__).resolve().parent.parent  # pipeline/


def _load_stages_in_background() -> None:
    threading.Thread(target=importlib.import_module, args=("pipeline.tasks.stages",),
                     daemon=True).start()


# `doit -n` forks its workers before any stage has loaded the compiler, so each
# would load it (0.6 s) when its first task starts: the worker that takes
# optimize while another ran import pays it on the build's critical path.
# Loading from fork time on readies a waiting worker while the other works; in
# a daemon thread, so a worker with nothing to do (a no-op build) exits at once.
os.register_at_fork(after_in_child=_load_stages_in_background)


def path(*parts: str) -> str:
    """Every path doit sees goes through here: doit compares paths as strings."""
    return os.path.normpath(os.path.join(*parts))


def code_of(*roots: str, stop: tuple[str, ...] = ()) -> list[str]:
    """The source files the code of `roots` runs ("module:function" in pipeline, as
    run_stage takes them, or a module), derived from the code: pipeline.tasks.deps."""
    found = sources(*(f"pipeline.{r}" for r in roots), stop=tuple(f"pipeline.{s}" for s in stop))
    return [os.path.relpath(p) for p in found]


def run_stage(fn: str, *args, task):
    """Run the stage `fn` ("module:function" in pipeline) for the doit `task` (doit
    passes it by name); returns what doit expects of a python action.

    A user-caused error (PipelineError) becomes one TaskFailed line. Any other
    exception is a compiler bug, but the user still gets one line: the task, the
    exception, and the log under out/logs/ holding the full traceback. Stages are
    imported only when a task runs, so a no-op build never loads the compiler.

    A dict the stage returns becomes the task's doit values (the reporter reads
    a kernel task's {"compiled": bool} to count cache hits).
    """
    module, _, name = fn.partition(":")
    _test_kill(task.name, "before")
    try:
        result = getattr(importlib.import_module(f"pipeline.{module}"), name)(*args)
    except PipelineError as err:
        return TaskFailed(str(err))
    except Exception as err:  # noqa: BLE001 - a bug: log it, keep the user's line short
        log = _write_traceback(task.name)
        return TaskFailed(f"{task.name}: internal error {type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''} "
                          f"(full traceback in {log})")
    _test_kill(task.name, "after")
    return result if isinstance(result, dict) else None


def _write_traceback(task_name: str) -> str:
    """Write the current exception's traceback to out/logs/<task>.log; returns the path."""
    log = path(OUT, "logs", task_name.replace(":", "_").replace("/", "_") + ".log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as f:
        traceback.print_exc(file=f)
    return log


# Fault injection for tests/test_reliability.py: PIPELINE_TEST_KILL_AT=<task-name
# prefix>[:before] makes the process running that task SIGKILL itself after the
# stage wrote its outputs (or before it starts), the way a power cut or the OOM
# killer would end a build: no cleanup, no doit database written.
KILL_ENV = "PIPELINE_TEST_KILL_AT"


def _test_kill(task_name: str, when: str) -> None:
    prefix, _, at = os.environ.get(KILL_ENV, "").rpartition(":")
    if at not in ("before", "after"):
        prefix, at = os.environ.get(KILL_ENV, ""), "after"
    if prefix and at == when and task_name.startswith(prefix):
        os.kill(os.getpid(), signal.SIGKILL)


def onnx_path(entry: ModelEntry) -> str:
    if entry.path is not None:
        return os.path.relpath(entry.path)
    return path(OUT, "models", f"{entry.name}.onnx")


def imported(m: ModelEntry) -> tuple[str, str]:
    """The import stage's outputs: graph IR JSON and weights."""
    return (path(OUT, m.name, f"{m.name}.ir.json"),
            path(OUT, m.name, f"{m.name}.weights.params"))


def runtime_artifacts(t: TargetEntry) -> dict[str, str]:
    """The runtime task's outputs for target t."""
    d = path(OUT, "runtime", t.name)
    return {"executor": path(d, "executor.o"), "run": path(d, "pipeline-run")}


def artifacts(m: ModelEntry, t: TargetEntry) -> dict[str, str]:
    d = path(OUT, m.name, t.name)
    return {"graph_json": path(d, f"{m.name}.json"), "params": path(d, f"{m.name}.params"),
            "kernels": path(d, "kernels.json"), "lib0": path(d, "lib0.o"),
            "devc": path(d, "devc.o"), "so": path(d, f"{m.name}.so"),
            "validation": path(d, "validation.json")}


def make_tasks(config: BuildConfig, models: list[ModelEntry], targets: list[TargetEntry],
               kernel_cache: str | None = None):
    """The task-creator functions for a selection of the matrix (dodo.py exposes them).

    kernel_cache: the kernel cache folder (None: $PIPELINE_KERNEL_CACHE or out/kernels).
    """
    cache_root = cache.cache_dir(kernel_cache)
    entries = [(m, t) for m in models for t in targets]
    # Asked once per target (ConfigError, caught by dodo.py, if a cc is missing).
    toolchain = {t.name: t.toolchain() for t in targets} if models else {}
    packing = {t.name: t.packing() for t in targets} if models else {}
    # Each task's file_dep lists the code its stage runs (code_of). The kernel
    # versions optimize writes into the specs hash the code generator's files
    # without importing them: listed as roots of their own.
    front_src = code_of("tasks.stages:import_model")
    opt_src = code_of("tasks.stages:optimize_model",
                      *(r.removeprefix("pipeline.") for r in CODEGEN_ROOTS))

    def task_model():
        """Generate the ONNX files of models built by models/ generators."""
        from models import source_files

        for m in models:
            if m.generator:
                yield {"name": m.name, "targets": [onnx_path(m)], "clean": True,
                       "actions": [(run_stage, ["tasks.stages:generate_model", m.generator,
                                                onnx_path(m)])],
                       "file_dep": [os.path.relpath(p) for p in source_files(m.generator)]}

    def task_import():
        """Import each ONNX model into the graph IR."""
        for m in models:
            ir, weights = imported(m)
            yield {"name": m.name, "targets": [ir, weights], "clean": True,
                   "actions": [(run_stage, ["tasks.stages:import_model", onnx_path(m),
                                            {k: list(v) for k, v in m.inputs.items()},
                                            ir, weights])],
                   "file_dep": [onnx_path(m), *front_src],
                   "uptodate": [options_changed({"inputs": {k: list(v) for k, v in
                                                             m.inputs.items()}}, "input")]}

    def task_optimize():
        """Run the passes for each model x target and list the kernels it needs."""
        for m, t in entries:
            a = artifacts(m, t)
            opts = t.to_dict()
            yield {"name": f"{m.name}@{t.name}", "clean": True,
                   "targets": [a["graph_json"], a["params"], a["kernels"]],
                   "actions": [(run_stage, ["tasks.stages:optimize_model", *imported(m), opts,
                                            cache_root, a["graph_json"], a["params"],
                                            a["kernels"]])],
                   "file_dep": [*imported(m), *opt_src],
                   "uptodate": [options_changed(opts)]}

    @create_after(executed="optimize", target_regex=r".*\.o$")
    def task_kernel():
        """Compile each distinct kernel once, shared by every model and target."""
        seen = set()
        for m, t in entries:
            manifest = Path(artifacts(m, t)["kernels"])
            if not manifest.exists():
                continue
            for k in json.loads(manifest.read_text())["kernels"]:
                if k["hash"] in seen:
                    continue
                seen.add(k["hash"])
                base = path(cache_root, k["hash"])
                yield {"name": k["hash"], "doc": k["symbol"],
                       "targets": [f"{base}.o", f"{base}.ll", f"{base}.sha256"],
                       "file_dep": [f"{base}.json"],
                       "actions": [(run_stage, ["tasks.cache:compile_entry", cache_root,
                                                k["hash"]])]}

    # A corrupted cache entry is recompiled while linking (cache.compile_entry),
    # but what that compiles is named by the kernel's hash in kernels.json.
    lib0_src = code_of("tasks.stages:link_lib0", stop=("tasks.cache:compile_entry",))

    def task_lib0():
        """Combine an entry's kernel objects into lib0.o."""
        for m, t in entries:
            a = artifacts(m, t)
            # Objects are content-addressed by the hashes kernels.json lists, so
            # the manifest decides lib0.o; "kernel" orders us after compilation.
            yield {"name": f"{m.name}@{t.name}", "targets": [a["lib0"]], "clean": True,
                   "task_dep": ["kernel"],
                   "file_dep": [a["kernels"], *lib0_src],
                   "uptodate": [options_changed(toolchain[t.name], "toolchain")],
                   "actions": [(run_stage, ["tasks.stages:link_lib0", a["kernels"], cache_root,
                                            a["lib0"], t.cc])]}

    def task_devc():
        """Pack graph JSON, params and the kernel list into devc.o."""
        for m, t in entries:
            a = artifacts(m, t)
            yield {"name": f"{m.name}@{t.name}", "targets": [a["devc"]], "clean": True,
                   "file_dep": [a["graph_json"], a["params"], a["kernels"],
                                *code_of("tasks.stages:pack_devc")],
                   "uptodate": [options_changed(packing[t.name], "packing")],
                   "actions": [(run_stage, ["tasks.stages:pack_devc", a["graph_json"],
                                            a["params"], a["kernels"], a["devc"],
                                            packing[t.name]["pack"], t.cc])]}

    # The C sources are no Python for code_of to follow: listed by hand.
    runtime_src = [*(os.path.relpath(p) for p in C_SOURCES),
                   *code_of("tasks.stages:build_runtime")]

    def task_runtime():
        """Compile the C executor (linked into every library) and pipeline-run, per
        target, with the target's cc."""
        for t in targets:
            if t.name not in toolchain:  # no model selected: nothing links an executor
                continue
            r = runtime_artifacts(t)
            yield {"name": t.name, "targets": [r["executor"], r["run"]], "clean": True,
                   "file_dep": runtime_src,
                   "uptodate": [options_changed(toolchain[t.name], "toolchain")],
                   "actions": [(run_stage, ["tasks.stages:build_runtime", r["executor"],
                                            r["run"], t.cc])]}

    def task_export():
        """Link lib0.o, devc.o and the target's executor.o into the model's shared library."""
        for m, t in entries:
            a, r = artifacts(m, t), runtime_artifacts(t)
            yield {"name": f"{m.name}@{t.name}", "targets": [a["so"]], "clean": True,
                   "file_dep": [a["lib0"], a["devc"], r["executor"],
                                *code_of("tasks.stages:export_library")],
                   "uptodate": [options_changed(toolchain[t.name], "toolchain")],
                   "actions": [(run_stage, ["tasks.stages:export_library", a["lib0"],
                                            a["devc"], r["executor"], a["so"], t.cc])]}

    def task_build():
        """Build every selected model x target (model=, target=, config= narrow it)."""
        return {"actions": None,
                "task_dep": [f"export:{m.name}@{t.name}" for m, t in entries]}

    def task_validate():
        """Run each built library and compare its outputs with the reference."""
        for m, t in entries:
            a = artifacts(m, t)
            opts = m.validate.to_dict()
            shapes = {k: list(v) for k, v in m.inputs.items()}
            yield {"name": f"{m.name}@{t.name}", "targets": [a["validation"]],
                   "file_dep": [a["so"], onnx_path(m),
                                *code_of("tools.validate:validate_library")],
                   "uptodate": [options_changed({"validate": opts, "inputs": shapes},
                                                "validation")],
                   "actions": [(run_stage, ["tools.validate:validate_library", a["so"],
                                            onnx_path(m), shapes, opts, m.name, t.name,
                                            a["validation"]])]}

    def task_conformance():
        """Run ONNX's backend test suites (not part of build): out/conformance.json, .md."""
        report = [path(OUT, "conformance.json"), path(OUT, "conformance.md")]
        every = sorted(os.path.relpath(p) for p in _PKG.glob("**/*.py"))  # tests it all
        return {"targets": report, "file_dep": every, "verbosity": 2,
                "actions": [(run_stage, ["tools.conformance:write_report", OUT])]}

    def task_bench():
        """Time each library against onnxruntime (never part of build; always runs when
        asked): bench.json. Options: threads=1,2 runs=20 warmup=3 profile=1."""
        from doit import get_var

        opts = [get_var(k, d) for k, d in (("threads", "1,2"), ("runs", "20"),
                                           ("warmup", "3"), ("profile", "0"))]
        for m, t in entries:
            a = artifacts(m, t)
            yield {"name": f"{m.name}@{t.name}", "verbosity": 2, "uptodate": [False],
                   "targets": [path(OUT, m.name, t.name, "bench.json")],
                   "file_dep": [a["so"], onnx_path(m)],
                   "actions": [(run_stage, ["tools.bench:bench_library", a["so"], onnx_path(m),
                                            {k: list(v) for k, v in m.inputs.items()},
                                            m.name, t.name,
                                            path(OUT, m.name, t.name, "bench.json"), *opts])]}

    def task_explain():
        """Print why each task of the last build ran, and what it compiled or reused."""
        from pipeline.tasks.reporter import print_report

        return {"actions": [print_report], "uptodate": [False], "verbosity": 2}

    def task_gc():
        """Remove kernel-cache entries that no model x target of this config uses."""
        return {"actions": [(collect_unused, [config, cache_root])], "uptodate": [False],
                "params": [{"name": "max_age_days", "long": "max-age-days", "type": float,
                            "default": 0.0, "help": "keep entries used this recently "
                            "(for a cache shared with other checkouts)"}],
                "verbosity": 2}

    return {name: fn for name, fn in locals().items() if name.startswith("task_")}


def collect_unused(config: BuildConfig, cache_root: str, max_age_days: float) -> None:
    """`doit gc`: drop cache entries absent from every kernels.json of the whole matrix."""
    keep = set()
    for m in config.models.values():
        for t in config.targets.values():
            manifest = Path(artifacts(m, t)["kernels"])
            if manifest.exists():
                keep |= {k["hash"] for k in json.loads(manifest.read_text())["kernels"]}
    removed = cache.collect_garbage(cache_root, keep, max_age_days)
    print(f"{cache_root}: removed {len(removed)} unused kernels, {len(keep)} in use")
