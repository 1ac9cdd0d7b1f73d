"""The project's dodo.py with fault injection, for tests/test_reliability.py:
`doit -f tests/kill_dodo.py ...` builds as dodo.py does, and with
PIPELINE_TEST_KILL_AT=<task-name prefix>[:before] the process running a task of
that prefix SIGKILLs itself after the stage wrote its outputs (or before it
starts), the way a power cut or the OOM killer would end a build: no cleanup,
no doit database written.

The hook wraps run_stage (pipeline.tasks.run) where the task creators bind it,
before dodo.py creates the tasks, so it runs in the process doit runs the task in.
"""

import os
import runpy
import signal
import sys
from pathlib import Path

import pipeline
from pipeline.tasks import run  # the package loads every creator module

REPO = Path(pipeline.__file__).resolve().parents[1]  # the checkout on PYTHONPATH
_run_stage = run.run_stage
KILL_ENV = "PIPELINE_TEST_KILL_AT"


def _kill_if(task_name: str, when: str) -> None:
    prefix, _, at = os.environ.get(KILL_ENV, "").rpartition(":")
    if at not in ("before", "after"):
        prefix, at = os.environ.get(KILL_ENV, ""), "after"
    if prefix and at == when and task_name.startswith(prefix):
        os.kill(os.getpid(), signal.SIGKILL)


def killing_run_stage(fn: str, *args, task, cached=None):
    """run_stage, killed before the stage or after it computed and stored its
    outputs (not after a failure or a cache hit, which compute nothing)."""
    _kill_if(task.name, "before")
    result = _run_stage(fn, *args, task=task, cached=cached)
    if isinstance(result, dict) and "cache" not in result:
        _kill_if(task.name, "after")
    return result


for module in list(sys.modules.values()):
    if (module is not run and getattr(module, "__name__", "").startswith("pipeline.tasks.")
            and getattr(module, "run_stage", None) is _run_stage):
        module.run_stage = killing_run_stage
globals().update({k: v for k, v in runpy.run_path(str(REPO / "dodo.py")).items()
                  if not k.startswith("__")})
