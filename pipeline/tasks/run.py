"""run_stage: the python action of every doit task that runs a stage (the work is
in pipeline.tasks.stages and the tools), through the action cache when the task
has a part in it (pipeline.tasks.tiered.CachedRun)."""

from __future__ import annotations

import importlib
import os
import threading
import traceback

from doit.exceptions import TaskFailed

from pipeline.errors import PipelineError
from pipeline.tasks import lazy, tiered
from pipeline.tasks.paths import LOGS, path
from pipeline.tasks.tiered import CachedRun, CacheSettings


def _load_stages_in_background() -> None:
    threading.Thread(target=importlib.import_module, args=("pipeline.tasks.stages",),
                     daemon=True).start()


# `doit -n` forks its workers before any stage has loaded the compiler, so each
# would load it (0.6 s) when its first task starts: the worker that takes
# optimize while another ran import pays it on the build's critical path.
# Loading from fork time on readies a waiting worker while the other works; in
# a daemon thread, so a worker with nothing to do (a no-op build) exits at once.
os.register_at_fork(after_in_child=_load_stages_in_background)


def run_stage(fn: str, *args, task, cached: CachedRun | None = None):
    """Run the stage `fn` ("module:function" in pipeline) for the doit `task` (doit
    passes it by name); returns what doit expects of a python action.

    cached: what decides the outputs and the cache settings: the outputs are looked
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
    key = None
    try:
        if cached is not None and cached.settings.actions:
            key = cached.action.key()
            tier = tiered.lookup(cached.settings, cached.action, key, (fn, list(args)))
            if tier is not None:
                return {"cache": tier, "worker": os.getpid(), **_warnings(cached.settings)}
        # Inputs a cache hit left in the cache come down (or are remade) now.
        for dep in sorted(task.file_dep):
            if not os.path.exists(dep):
                tiered.materialize(dep)
        result = tiered.run_body(fn, args)
        if key is not None:
            tiered.save(cached.settings, key, cached.action.all_outputs())
        if cached is not None:
            lazy.drop(cached.action.all_outputs().values())
    except PipelineError as err:
        return TaskFailed(str(err))
    except Exception as err:  # noqa: BLE001 - a bug: log it, keep the user's line short
        log = _write_traceback(task.name)
        return TaskFailed(f"{task.name}: internal error {type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''} "
                          f"(full traceback in {log})")
    values = result if isinstance(result, dict) else {}
    values["worker"] = os.getpid()  # which process ran it: the report's timeline rows
    if cached is not None:
        values.update(_warnings(cached.settings))
    return values


def _warnings(settings: CacheSettings) -> dict:
    """{"warnings": [...]} from the remote tier since the last call, or {}."""
    found = tiered.take_warnings(settings)
    return {"warnings": found} if found else {}


def _write_traceback(task_name: str) -> str:
    """Write the current exception's traceback to out/logs/<task>.log; returns the path."""
    log = path(LOGS, task_name.replace(":", "_").replace("/", "_") + ".log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as f:
        traceback.print_exc(file=f)
    return log
