"""One contract per doit internal the build overrides or relies on (doit==0.37.0 is
pinned in pyproject.toml): each asserts the internal is still there, with the
signature and behaviour pipeline/tasks depends on, so a doit upgrade that moves
one fails here, loudly, instead of silently rebuilding everything or nothing.
"""

from __future__ import annotations

import inspect
import io
import json
from pathlib import Path

import doit
import pytest
from doit import create_after, doit_cmd
from doit.cmd_base import DoitCmdBase
from doit.dependency import Dependency, MD5Checker, get_file_md5
from doit.exceptions import TaskFailed
from doit.loader import load_tasks
from doit.reporter import ConsoleReporter
from doit.task import Task, dict_to_task
from doit.tools import config_changed

from pipeline.tasks import make_tasks
from pipeline.tasks.checker import BuildChecker
from pipeline.tasks.config import BuildConfig, ModelEntry, TargetEntry, ValidateOptions
from pipeline.tasks.explain import options_changed, reasons
from pipeline.tasks.paths import BUILD_STAGES
from pipeline.tasks.reporter import BuildReporter
from pipeline.tasks.run import run_stage
from tests.support import REPO


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_doit_is_the_pinned_version():
    pin = [line for line in (REPO / "pyproject.toml").read_text().splitlines()
           if '"doit' in line]
    assert pin and "doit==0.37.0" in pin[0]
    assert doit.__version__ == (0, 37, 0)


# -- explain.options_changed overrides config_changed._calc_digest --------------------

def test_config_changed_calls_the_digest_we_override_and_saves_it():
    assert _params(config_changed.__init__) == ["self", "config", "encoder"]
    assert _params(config_changed._calc_digest) == ["self"]
    check = options_changed({"b": 1, "a": [2]}, "toolchain")
    task = Task("t", None, uptodate=[check])  # doit calls configure_task here
    assert check(task, {}) is False  # no record yet
    # Our digest is the options' JSON (explain shows old -> new), and doit saves it
    # under "_config_changed", which options_changed reads back as `previous`.
    assert check.config_digest == json.dumps({"a": [2], "b": 1}, sort_keys=True)
    assert [saver() for saver in task.value_savers] == [{"_config_changed":
                                                         check.config_digest}]
    assert check(task, {"_config_changed": check.config_digest}) is True
    assert check.previous == check.config_digest


def test_uptodate_items_reach_explain_as_check_args_kwargs():
    check = options_changed({"x": 1})
    task = Task("t", None, uptodate=[check, False])
    assert task.uptodate == [(check, [], {}), (False, None, None)]
    assert reasons(task) == ["runs whenever asked"]


# -- checker.BuildChecker overrides MD5Checker ------------------------------------------

def test_file_checker_methods_we_override():
    assert issubclass(BuildChecker, MD5Checker)
    base = {"exists": ["self", "file_path"], "info": ["self", "file_path"],
            "check_modified": ["self", "file_path", "file_stat", "state"],
            "get_state": ["self", "dep", "current_state"]}
    for name, params in base.items():
        assert _params(getattr(MD5Checker, name)) == params, name
        assert _params(getattr(BuildChecker, name)) == params, name
    assert MD5Checker.CheckerError is OSError
    assert _params(get_file_md5) == ["path"]


def test_dependency_asks_the_checker_and_records_its_class_name():
    # exists() for targets, info() for file_dep (a marked output counts as there);
    # the class name is recorded: renaming BuildChecker would rebuild everything.
    source = inspect.getsource(Dependency)
    for call in ("self.checker.exists(targ)", "self.checker.info(dep)",
                 "self.checker.get_state(dep, ", "self.checker.__class__.__name__"):
        assert call in source, call
    assert BuildChecker.__name__ == "BuildChecker"
    # DOIT_CONFIG's check_file_uptodate may be the class itself.
    assert DoitCmdBase.get_checker_cls(None, BuildChecker) is BuildChecker


# -- reporter.BuildReporter overrides ConsoleReporter ------------------------------------

def test_reporter_methods_we_override():
    ours = {n for n, f in vars(BuildReporter).items()
            if callable(f) and not n.startswith("_")} | {"__init__"}
    for name in sorted(ours):
        base = getattr(ConsoleReporter, name, None)
        assert base is not None, f"ConsoleReporter.{name} is gone"
        assert _params(base) == _params(getattr(BuildReporter, name)), name
    # doit makes the reporter as reporter_cls(outstream, {"failure_verbosity": n}).
    reporter = BuildReporter(io.StringIO(), {"failure_verbosity": 0})
    assert reporter.outstream is not None and reporter.failures == []


# -- get_var, create_after, the loader ------------------------------------------------

def test_get_var_reads_the_command_line_variables():
    assert doit.get_var is doit_cmd.get_var
    assert _params(doit.get_var) == ["name", "default"]
    saved = doit_cmd._CMDLINE_VARS
    try:
        doit_cmd.reset_vars()
        assert doit.get_var("cache", "dflt") == "dflt"
        doit_cmd.set_var("cache", "/c")
        assert doit.get_var("cache", "dflt") == "/c"
    finally:
        doit_cmd._CMDLINE_VARS = saved


@pytest.fixture(scope="module")
def creators() -> dict:
    model, target = ModelEntry("m", Path("m.onnx"), None), TargetEntry("t", "llvm -mcpu=native")
    config = BuildConfig(Path("m.yaml"), {"m": model}, {"t": target}, ValidateOptions())
    return make_tasks(config, [model], [target])


def test_create_after_marks_the_creator_and_the_loader_keeps_our_order(creators):
    @create_after(executed="optimize", target_regex=r".*\.o$")
    def task_x():
        """doc"""

    loader = task_x.doit_create_after
    assert (loader.creator, loader.task_dep, loader.target_regex) == (task_x, "optimize",
                                                                      r".*\.o$")
    tasks = load_tasks(creators, allow_delayed=True)
    # doit sorts the creators by the source line they are defined on; make_tasks'
    # bound creators share one, so the (stable) sort keeps the pipeline order.
    assert [t.name for t in tasks if t.subtask_of is None] == [
        *BUILD_STAGES, "build", "validate", "conformance", "bench", "report", "explain", "gc"]
    kernel = next(t for t in tasks if t.name == "kernel")
    assert kernel.loader.creator is creators["task_kernel"]
    assert kernel.loader.task_dep == "optimize"


# -- python actions: run_stage, the clean and gc actions, task meta ------------------------

def test_python_actions_get_task_targets_and_options_by_name():
    seen = {}

    def stage(fn, *args, task, cached=None):
        seen.update(fn=fn, args=args, task=task.name, cached=cached)
        return {"compiled": True}

    def clean(targets):
        seen["targets"] = targets

    def gc(max_age_days):
        seen["max_age_days"] = max_age_days

    task = Task("t", [(stage, ["a:b", 1], {"cached": "run"}), (gc, [])], targets=["o"],
                clean=[clean], params=[{"name": "max_age_days", "default": 0.0}])
    task.init_options()
    task.options["max_age_days"] = 2.0
    for action in task.actions:
        assert action.execute(io.StringIO(), io.StringIO()) is None
    assert task.actions[0].values == {"compiled": True}  # becomes task.values
    task.clean_actions[0].execute(io.StringIO(), io.StringIO())
    assert seen == {"fn": "a:b", "args": (1,), "task": "t", "cached": "run",
                    "max_age_days": 2.0, "targets": ["o"]}
    # run_stage's `task` may have no default: doit refuses one.
    assert inspect.signature(run_stage).parameters["task"].default is inspect.Parameter.empty
    failing = Task("f", [(lambda: TaskFailed("no"), [])])
    failing.init_options()
    assert isinstance(failing.actions[0].execute(io.StringIO(), io.StringIO()), TaskFailed)


def test_task_meta_carries_the_cached_run(creators):
    task = dict_to_task({"name": "x", "actions": None, "meta": {"cached": 1}})
    assert task.meta == {"cached": 1}
    (imp,) = creators["task_import"]()
    run = imp["meta"]["cached"]
    assert imp["actions"][0][2] == {"cached": run}
    assert run.action.inputs == imp["file_dep"] and imp["targets"] == list(run.action.outputs)


def test_task_attributes_the_reporter_and_explain_read():
    task = Task("kernel:h", [(lambda: None, [])], file_dep=["a"], targets=["b"], task_dep=["c"],
                doc="sym")
    for attr in ("name", "doc", "actions", "file_dep", "targets", "task_dep",
                 "setup_tasks", "values", "uptodate", "dep_changed", "subtask_of"):
        assert hasattr(task, attr), attr
    assert task.file_dep == {"a"}  # a set: the reporter and run_stage sort it
