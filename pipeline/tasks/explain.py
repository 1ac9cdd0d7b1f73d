"""Why a task runs: the reasons behind every rebuild, in the user's words.

doit decides that a task must run from three things, and leaves traces of
each on the task object of the process that checks it:
  - an `uptodate` check returned False: ours is `options_changed`, which,
    unlike doit's config_changed, stores the options themselves, so we can say
    which option changed and from what to what;
  - a target is missing;
  - file dependencies changed (doit sets `task.dep_changed`).
`reasons(task)` turns those traces into short sentences ("pass option
opt_level: 3 -> 2", "weights changed: out/m/m.weights.params", "compiler
source changed: pipeline/codegen/render.py", "missing output ...").
"""

from __future__ import annotations

import json
import os

from doit.tools import config_changed

from pipeline.tasks import lazy
from pipeline.tasks.paths import OUT

# Option keys that describe the machine (and what runs the model) rather than the passes.
TARGET_KEYS = {"target", "resolved", "executor"}


class options_changed(config_changed):  # noqa: N801 (named like doit's own checkers)
    """doit uptodate check: True while `options` (a JSON-able dict) is unchanged.

    `what` names the kind of options in explanations ("inputs", "validate");
    None means a target entry's dict, whose keys are target or pass options.
    """

    def __init__(self, options: dict, what: str | None = None):
        super().__init__(options)
        self.what = what
        self.previous: str | None = None

    def _calc_digest(self) -> str:
        return json.dumps(self.config, sort_keys=True)

    def __call__(self, task, values) -> bool:
        self.previous = values.get("_config_changed")
        return super().__call__(task, values)

    def describe(self) -> list[str]:
        """The changed options as sentences; empty if unchanged or never checked."""
        if self.previous is None:
            return ["first build (no record of a previous one)"]
        try:
            old = json.loads(self.previous)
        except ValueError:  # a record from before options were stored whole
            return ["options record from an older version"]
        new = self.config
        out = []
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                kind = self.what or ("target" if key in TARGET_KEYS else "pass option")
                out.append(f"{kind} {key}: {_short(old.get(key))} -> {_short(new.get(key))}")
        return out


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def classify(path: str) -> str:
    """What a changed input file is, for an explanation."""
    name = os.path.basename(path)
    parts = path.replace(os.sep, "/").split("/")
    if name.endswith(".onnx"):
        return "model file"
    if name.endswith(".weights.params"):
        return "weights"
    if name.endswith(".py"):
        if "pipeline" in parts:
            return "compiler source"
        return "model generator source" if "models" in parts else "source"
    if name.endswith((".c", ".h")) and "pipeline" in parts:
        return "C runtime source"
    if name == "kernels.json":
        return "kernel list"
    if name.endswith(".json") and "kernels" in parts:
        return "kernel spec"
    if parts[0] == OUT:
        return "upstream artifact"
    return "input file"


def reasons(task) -> list[str]:
    """Why doit decided to run `task` (call it when the task starts)."""
    out = []
    for check, _args, _kwargs in task.uptodate:
        if check is False:
            return ["runs whenever asked"]
        if isinstance(check, options_changed) and check.config_digest != check.previous:
            out += check.describe()
        elif hasattr(check, "missing") and check.missing():  # e.g. kernel specs
            out += check.describe()
        elif isinstance(check, lazy.Fetched) and check.left_in_cache(task):
            out.append(f"downloads=all: {check.left_in_cache(task)[0]} is in the cache only")
    missing = [t for t in task.targets if not lazy.exists(t)]
    if out and out[0].startswith("first build"):
        return out[:1]
    if missing:
        more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        out.append(f"missing output {missing[0]}{more}")
    elif task.dep_changed:
        for dep in sorted(task.dep_changed):
            out.append(f"{classify(dep)} changed: {dep}")
    return out or ["first build (no record of a previous one)"]
