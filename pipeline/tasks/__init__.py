"""Layer 8, the build system on doit: these task creators, `stages` (the work),
`checker`, `reporter`, `explain`, `cache` (kernel cache), `config` and `deps`
(the sources each task runs). Imports every package below; tools'
validate/bench/conformance run only by name (run_stage).

The task creators only describe tasks; the work is in pipeline.tasks.stages.

Task names (model m, target entry t):
  model:m        generate an ONNX file with models/ (generated models only)
  import:m       ONNX -> graph IR + weights          (out/m/m.ir.json, m.weights.params)
  optimize:m@t   passes + lowering -> graph JSON, params, kernels.json, kernel specs
                 and their LLVM IR (out/specs/<hash>.json, .ll)
  kernel:<hash>  one kernel's IR -> <cache>/<hash>.ll, .o, .sha256 (created after optimize;
                 the cache is shared by all entries, see pipeline/tasks/cache.py)
  lib0:m@t       the entry's kernel objects -> lib0.o (the target's cc -r)
  devc:m@t       graph JSON + params -> devc.o (the packed blob)
  runtime:t      the C executor and pipeline-run for target t, by its cc ->
                 out/runtime/t/executor.o, pipeline-run (sources pipeline/runtime/c/)
  export:m@t     lib0.o + devc.o + executor.o -> m.so (linked by the target's cc)
  validate:m@t   run m.so against the reference -> validation.json
  explain        print why each task of the last build ran (out/build-report.json)
  report         out/report.html from what the other tasks left (pipeline.tools.report)
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
import importlib.metadata
import os
import platform
import signal
import threading
import traceback
from pathlib import Path

from doit import create_after
from doit.exceptions import TaskFailed

from pipeline.errors import PipelineError
from pipeline.ir.target import parse_target
from pipeline.link.runtime_c import C_SOURCES
from pipeline.lower.sources import CODEGEN_ROOTS
from pipeline.tasks import cache, lazy, tiered
from pipeline.tasks.config import BuildConfig, ModelEntry, TargetEntry
from pipeline.tasks.deps import sources
from pipeline.tasks.explain import options_changed
from pipeline.tasks.shard import shard_entries
from pipeline.tasks.tiered import Action, CacheSettings

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


def run_stage(fn: str, *args, task, cached: tuple[Action, CacheSettings] | None = None):
    """Run the stage `fn` ("module:function" in pipeline) for the doit `task` (doit
    passes it by name); returns what doit expects of a python action.

    cached: (what decides the outputs, the cache settings): the outputs are looked
    up in the action cache's tiers first and restored on a hit (values
    {"cache": "local" | "remote"}; intermediates may stay in the cache:
    pipeline.tasks.lazy), else computed and stored (pipeline.tasks.tiered).
    Inputs a hit left in the cache are fetched, or remade, before the stage runs.

    A user-caused error (PipelineError) becomes one TaskFailed line. Any other
    exception is a compiler bug, but the user still gets one line: the task, the
    exception, and the log under out/logs/ holding the full traceback. Stages are
    imported only when a task runs, so a no-op build never loads the compiler.

    A dict the stage returns becomes the task's doit values (the reporter reads
    a kernel task's {"compiled": bool} to count cache hits), with "worker": the
    pid that ran it.
    """
    _test_kill(task.name, "before")
    key = None
    try:
        if cached is not None and cached[1].actions:
            action, settings = cached
            key = action.key()
            tier = tiered.lookup(settings, action, key, (fn, list(args)))
            if tier is not None:
                return {"cache": tier, "worker": os.getpid(), **_warnings(settings)}
        # Inputs a cache hit left in the cache come down (or are remade) now.
        for dep in sorted(task.file_dep):
            if not os.path.exists(dep):
                tiered.materialize(dep)
        result = tiered.run_body(fn, args)
        if key is not None:
            tiered.save(settings, key, action.all_outputs())
        if cached is not None:
            lazy.drop(cached[0].all_outputs().values())
    except PipelineError as err:
        return TaskFailed(str(err))
    except Exception as err:  # noqa: BLE001 - a bug: log it, keep the user's line short
        log = _write_traceback(task.name)
        return TaskFailed(f"{task.name}: internal error {type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''} "
                          f"(full traceback in {log})")
    _test_kill(task.name, "after")
    values = result if isinstance(result, dict) else {}
    values["worker"] = os.getpid()  # which process ran it: the report's timeline rows
    if cached is not None:
        values.update(_warnings(cached[1]))
    return values


def _warnings(settings: CacheSettings) -> dict:
    """{"warnings": [...]} from the remote tier since the last call, or {}."""
    found = tiered.take_warnings(settings)
    return {"warnings": found} if found else {}


def _write_traceback(task_name: str) -> str:
    """Write the current exception's traceback to out/logs/<task>.log; returns the path."""
    log = path(OUT, "logs", task_name.replace(":", "_").replace("/", "_") + ".log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as f:
        traceback.print_exc(file=f)
    return log


# Fault injection for tests/build_system/test_reliability.py: PIPELINE_TEST_KILL_AT=<task-name
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
    """The ONNX file the entry builds from: the user's, or one the model task writes
    (a generator's, or the user's with random weights)."""
    if not entry.written:
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


SPECS = path(OUT, "specs")  # kernel specs (and IR) optimize writes: the kernel tasks' inputs


def make_tasks(config: BuildConfig, models: list[ModelEntry], targets: list[TargetEntry],
               settings: CacheSettings | None = None, shard: str | None = None):
    """The task-creator functions for a selection of the matrix (dodo.py exposes them).

    settings: the cache tiers (None: the kernel cache $PIPELINE_KERNEL_CACHE or
    out/kernels, action cache on, no remote tier); shard: "I/N", this run's slice
    of the model x target entries (pipeline.tasks.shard).
    """
    settings = settings or CacheSettings(cache.cache_dir(None))
    cache_root = settings.root

    def cached(fn: str, args: list, inputs: list[str], outputs: list[str] | dict,
               extra: dict | None = None, specs_of: str | None = None,
               fetch: tuple = ()) -> tuple:
        """The doit action running stage `fn` through the action cache; `fetch`: the
        outputs a hit always brings to disk (pipeline.tasks.lazy)."""
        named = outputs if isinstance(outputs, dict) else {p: p for p in outputs}
        # Where the work happens (the cache folder, the Dask scheduler) decides no output.
        key_args = ["<cache>" if a == cache_root else
                    None if settings.dask and a == settings.dask else a for a in args]
        action = Action(fn, key_args, list(inputs), named, extra or {}, specs_of, SPECS,
                        tuple(fetch))
        return (run_stage, [fn, *args], {"cached": (action, settings)})
    fetched = lazy.Fetched(settings.downloads)
    entries = shard_entries([(m, t) for m in models for t in targets], shard)
    models = [m for m in models if any(e[0] is m for e in entries)]
    targets = [t for t in targets if any(e[1] is t for e in entries)]
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
        """Generate the ONNX files of models built by models/ generators, and of path
        models with random weights."""
        from models import reweight_sources, source_files

        for m in models:
            if m.random_weights is not None:
                src = os.path.relpath(m.path)
                deps = [src, *(os.path.relpath(p) for p in reweight_sources())]
                yield {"name": m.name, "targets": [onnx_path(m)], "clean": [lazy.clean],
                       "actions": [cached("tasks.stages:reweight_model",
                                          [src, onnx_path(m), m.random_weights], deps,
                                          [onnx_path(m)])],
                       "file_dep": deps,
                       "uptodate": [options_changed({"random_weights": m.random_weights},
                                                    "random_weights"), fetched]}
            elif m.generator:
                deps = [os.path.relpath(p) for p in source_files(m.generator)]
                yield {"name": m.name, "targets": [onnx_path(m)], "clean": [lazy.clean],
                       "actions": [cached("tasks.stages:generate_model",
                                          [m.generator, onnx_path(m), dict(m.args)], deps,
                                          [onnx_path(m)])],
                       "file_dep": deps,
                       "uptodate": [options_changed({"args": dict(m.args)}, "generator"),
                                    fetched]}

    def task_import():
        """Import each ONNX model into the graph IR."""
        for m in models:
            ir, weights = imported(m)
            deps = [onnx_path(m), *front_src]
            shapes = {k: list(v) for k, v in m.inputs.items()}
            yield {"name": m.name, "targets": [ir, weights], "clean": [lazy.clean],
                   "actions": [cached("tasks.stages:import_model",
                                      [onnx_path(m), shapes, ir, weights], deps, [ir, weights])],
                   "file_dep": deps,
                   "uptodate": [options_changed({"inputs": {k: list(v) for k, v in
                                                             m.inputs.items()}}, "input"),
                                fetched]}

    def task_optimize():
        """Run the passes for each model x target and list the kernels it needs."""
        for m, t in entries:
            a = artifacts(m, t)
            opts = t.to_dict()
            deps = [*imported(m), *opt_src]
            outs = [a["graph_json"], a["params"], a["kernels"]]
            yield {"name": f"{m.name}@{t.name}", "clean": [lazy.clean],
                   "targets": outs,
                   "actions": [cached("tasks.stages:optimize_model",
                                      [*imported(m), opts, SPECS, *outs, cache_root],
                                      deps, outs,
                                      specs_of=a["kernels"],
                                      # read to create the kernel tasks; graph JSON
                                      # is a deliverable
                                      fetch=(a["kernels"], a["graph_json"]))],
                   "file_dep": deps,
                   # The specs and IR it wrote are outputs too (shared by entries,
                   # so not doit targets): a missing one reruns it.
                   "uptodate": [options_changed(opts), SpecsPresent(a["kernels"]), fetched]}

    @create_after(executed="optimize", target_regex=r".*\.o$")
    def task_kernel():
        """Compile each distinct kernel once, shared by every model and target."""
        seen, tasks = set(), []
        for m, t in entries:
            manifest = artifacts(m, t)["kernels"]
            if not os.path.exists(manifest):
                continue
            for k in cache.listed_kernels(manifest):
                if k["hash"] in seen:
                    continue
                seen.add(k["hash"])
                entry = {s[1:]: path(cache_root, k["hash"] + s) for s in cache.SUFFIXES}
                spec = cache.spec_path(SPECS, k["hash"])
                # The spec is read from out/specs (declared), never from the cache
                # folder, which may have moved or been emptied since optimize ran;
                # so is the IR optimize rendered from it (the spec decides it: not
                # an input of its own; rendered again if gone).
                tasks.append({"name": k["hash"], "doc": k["symbol"],
                       "targets": sorted(entry.values()),
                       "file_dep": [spec], "uptodate": [fetched],
                       "actions": [cached("tasks.cache:compile_entry",
                                          [cache_root, k["hash"], spec, settings.dask],
                                          [spec], entry)]})
        if settings.dask:  # the cluster starts on every kernel not cached yet
            from pipeline.tasks.cluster import prefetch

            prefetch(settings.dask, [_read_spec(t["file_dep"][0]) for t in tasks
                                     if not cache.is_valid(cache_root, t["name"])
                                     and not _in_action_cache(t["actions"][0])])
        yield from tasks

    # A corrupted cache entry is recompiled while linking (cache.compile_entry),
    # but what that compiles is named by the kernel's hash in kernels.json; an
    # object a cache hit left in the cache comes down verified by its digest.
    lib0_src = code_of("tasks.stages:link_lib0", stop=("tasks.cache:compile_entry",
                                                       "tasks.tiered:materialize"))

    def task_lib0():
        """Combine an entry's kernel objects into lib0.o."""
        for m, t in entries:
            a = artifacts(m, t)
            deps = [a["kernels"], *lib0_src]
            # Objects are content-addressed by the hashes kernels.json lists, so
            # the manifest decides lib0.o; "kernel" orders us after compilation.
            yield {"name": f"{m.name}@{t.name}", "targets": [a["lib0"]], "clean": [lazy.clean],
                   "task_dep": ["kernel"],
                   "file_dep": deps,
                   "uptodate": [options_changed(toolchain[t.name], "toolchain"), fetched],
                   "actions": [cached("tasks.stages:link_lib0",
                                      [a["kernels"], cache_root, a["lib0"], t.cc, SPECS],
                                      deps, [a["lib0"]], toolchain[t.name])]}

    def task_devc():
        """Pack graph JSON, params and the kernel list into devc.o."""
        for m, t in entries:
            a = artifacts(m, t)
            deps = [a["graph_json"], a["params"], a["kernels"],
                    *code_of("tasks.stages:pack_devc")]
            yield {"name": f"{m.name}@{t.name}", "targets": [a["devc"]], "clean": [lazy.clean],
                   "file_dep": deps,
                   "uptodate": [options_changed(packing[t.name], "packing"), fetched],
                   "actions": [cached("tasks.stages:pack_devc",
                                      [a["graph_json"], a["params"], a["kernels"], a["devc"],
                                       packing[t.name]["pack"], t.cc],
                                      deps, [a["devc"]], packing[t.name])]}

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
            yield {"name": t.name, "targets": [r["executor"], r["run"]], "clean": [lazy.clean],
                   "file_dep": runtime_src,
                   "uptodate": [options_changed(toolchain[t.name], "toolchain"), fetched],
                   "actions": [cached("tasks.stages:build_runtime",
                                      [r["executor"], r["run"], t.cc], runtime_src,
                                      [r["executor"], r["run"]], toolchain[t.name])]}

    def task_export():
        """Link lib0.o, devc.o and the target's executor.o into the model's shared library."""
        for m, t in entries:
            a, r = artifacts(m, t), runtime_artifacts(t)
            deps = [a["lib0"], a["devc"], r["executor"],
                    *code_of("tasks.stages:export_library")]
            yield {"name": f"{m.name}@{t.name}", "targets": [a["so"]], "clean": [lazy.clean],
                   "file_dep": deps,
                   "uptodate": [options_changed(toolchain[t.name], "toolchain"), fetched],
                   "actions": [cached("tasks.stages:export_library",
                                      [a["lib0"], a["devc"], r["executor"], a["so"], t.cc],
                                      deps, [a["so"]], toolchain[t.name],
                                      fetch=(a["so"],))]}

    def task_build():
        """Build every selected model x target (model=, target=, config= narrow it)."""
        # The generated models first: doit -n starts tasks in the order it reaches
        # them, so a big model's generation would otherwise wait behind the runtime
        # compile, its import behind other models' optimize, and the kernels (created
        # after the last optimize) for it, one worker idle meanwhile.
        return {"actions": None,
                "task_dep": [*(f"model:{m.name}" for m in models if m.written),
                             *(f"export:{m.name}@{t.name}" for m, t in entries)]}

    def task_validate():
        """Run each built library and compare its outputs with the reference."""
        reference = reference_identity()
        for m, t in entries:
            a = artifacts(m, t)
            opts = m.validate.to_dict()
            shapes = {k: list(v) for k, v in m.inputs.items()}
            deps = [a["so"], onnx_path(m), *code_of("tools.validate:validate_library")]
            # A library for another machine runs there, in the target's pipeline-run
            # through its run prefix (tools.on_target); the host's loads in process.
            target = parse_target(t.target)
            on_target = None if target.is_host else {
                "run": t.run, "pipeline_run": runtime_artifacts(t)["run"],
                "config": str(t.path), "arch": target.arch}
            if on_target and t.run:
                deps.append(on_target["pipeline_run"])
            yield {"name": f"{m.name}@{t.name}", "targets": [a["validation"]],
                   "file_dep": deps,
                   "uptodate": [options_changed({"validate": opts, "inputs": shapes,
                                                 "run": t.run}, "validation")],
                   # Cached like a stage (as Bazel caches a passed test): a failed
                   # validation is never stored, so it reruns until it passes.
                   "actions": [cached("tools.validate:validate_library",
                                      [a["so"], onnx_path(m), shapes, opts, m.name, t.name,
                                       a["validation"], on_target], deps, [a["validation"]],
                                      reference, fetch=(a["validation"],))]}

    def task_conformance():
        """Run ONNX's backend test suites (not part of build): out/conformance.json, .md."""
        report = [path(OUT, "conformance.json"), path(OUT, "conformance.md")]
        every = sorted(os.path.relpath(p) for p in _PKG.glob("**/*.py"))  # tests it all
        return {"targets": report, "file_dep": every, "verbosity": 2,
                "actions": [(run_stage, ["tools.conformance:write_report", OUT])]}

    def task_bench():
        """Time each library against onnxruntime, each side in its own fresh process (never
        part of build; always runs when asked): bench.json, then bench:summary, the suite
        table out/bench-summary.md (.json). Options: threads=1,2 rounds=3 runs=10
        warmup=10 profile=1."""
        from doit import get_var

        opts = [get_var(k, d) for k, d in (("threads", "1,2"), ("rounds", "3"), ("runs", "10"),
                                           ("warmup", "10"), ("profile", "0"))]
        reports, peak = [], path(OUT, "bench-peak.json")
        for m, t in entries:
            a = artifacts(m, t)
            reports.append(path(OUT, m.name, t.name, "bench.json"))
            # A target with a run prefix is timed there, emulated (tools.bench_emulated).
            on_target = t.run and {"run": t.run, "pipeline_run": runtime_artifacts(t)["run"],
                                   "config": str(t.path), "arch": parse_target(t.target).arch}
            yield {"name": f"{m.name}@{t.name}", "verbosity": 2, "uptodate": [False],
                   "targets": [reports[-1]],
                   "file_dep": [a["so"], onnx_path(m),
                                *([on_target["pipeline_run"]] if on_target else [])],
                   "actions": [(run_stage, ["tools.bench:bench_library", a["so"], onnx_path(m),
                                            {k: list(v) for k, v in m.inputs.items()},
                                            m.name, t.name, reports[-1], peak, *opts,
                                            on_target or None])]}
        # After every entry's bench ("summary" has no "@", so no entry is called so).
        yield {"name": "summary", "verbosity": 2, "uptodate": [False],
               "task_dep": [f"bench:{m.name}@{t.name}" for m, t in entries],
               "targets": [path(OUT, "bench-summary.md"), path(OUT, "bench-summary.json")],
               "actions": [(run_stage, ["tools.bench:summarize", reports,
                                        peak, path(OUT, "bench-summary.md"),
                                        path(OUT, "bench-summary.json")])]}

    def task_report():
        """Write out/report.html: the matrix, the last build's timeline, the slowest
        nodes (from doit bench profile=1) and the memory plans (needs .[report])."""
        return {"actions": [(run_stage, ["tools.report:write_report", OUT,
                                         [(m.name, t.name) for m, t in entries],
                                         path(OUT, "report.html")])],
                "targets": [path(OUT, "report.html")], "uptodate": [False], "verbosity": 2}

    def task_explain():
        """Print why each task of the last build ran, and what it compiled or reused."""
        from pipeline.tasks.reporter import print_report

        return {"actions": [print_report], "uptodate": [False], "verbosity": 2}

    def task_gc():
        """Remove kernels, specs and action-cache entries no model x target of this
        config uses (pipeline.tasks.gc)."""
        from pipeline.tasks.gc import collect_unused

        manifests = [artifacts(m, t)["kernels"] for m in config.models.values()
                     for t in config.targets.values()]
        return {"actions": [(collect_unused, [config, settings, SPECS, manifests])],
                "uptodate": [False],
                "params": [{"name": "max_age_days", "long": "max-age-days", "type": float,
                            "default": 0.0, "help": "keep entries used this recently "
                            "(for a cache shared with other checkouts)"}],
                "verbosity": 2}

    return {name: fn for name, fn in locals().items() if name.startswith("task_")}


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


def _read_spec(spec: str) -> str:
    tiered.materialize(spec)  # a cache hit may have left it in the cache
    return Path(spec).read_text()


def _in_action_cache(action: tuple) -> bool:
    """Whether the local tier holds the outputs of a cached() action."""
    what, settings = action[2]["cached"]
    return settings.actions and os.path.exists(path(settings.root, "ac", what.key()))


class SpecsPresent:
    """doit uptodate check: True while every spec kernels_json lists, and its IR, is
    in out/specs."""

    def __init__(self, kernels_json: str):
        self.kernels_json = kernels_json

    def missing(self) -> list[str]:
        try:
            listed = cache.listed_kernels(self.kernels_json)
        except (FileNotFoundError, ValueError, KeyError):
            return []  # no manifest: the missing target reruns the task anyway
        return [p for k in listed for spec in [cache.spec_path(SPECS, k["hash"])]
                for p in (spec, cache.ir_path(spec)) if not lazy.exists(p)]

    def __call__(self, task, values) -> bool:
        return not self.missing()

    def describe(self) -> list[str]:
        gone = self.missing()
        return [f"missing output {gone[0]}" + (f" (+{len(gone) - 1} more)" if gone[1:] else "")]
