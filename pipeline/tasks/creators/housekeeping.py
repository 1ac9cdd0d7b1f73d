"""The housekeeping family: the HTML report (report), why the last build's tasks
ran (explain), and removing what no entry uses from the caches (gc)."""

from __future__ import annotations

import dataclasses

from pipeline.tasks import gc, lazy
from pipeline.tasks.config import BuildConfig
from pipeline.tasks.creators import check, link, model, optimize
from pipeline.tasks.paths import CACHED_STAGES, OUT, SPECS, artifacts, path
from pipeline.tasks.reporter import print_report
from pipeline.tasks.run import run_stage
from pipeline.tasks.selection import Selection, select
from pipeline.tasks.tiered import CacheSettings


def task_report(sel: Selection):
    """Write out/report.html: the matrix, the last build's timeline, the slowest
    nodes (from doit bench profile=1) and the memory plans (needs .[report])."""
    return {"actions": [(run_stage, ["tools.report:write_report", OUT,
                                     [(m.name, t.name) for m, t in sel.entries],
                                     path(OUT, "report.html")])],
            "targets": [path(OUT, "report.html")], "uptodate": [False], "verbosity": 2}


def task_explain(sel: Selection):
    """Print why each task of the last build ran, and what it compiled or reused."""
    return {"actions": [print_report], "uptodate": [False], "verbosity": 2}


def task_gc(sel: Selection):
    """Remove kernels, specs and action-cache entries no model x target of this
    config uses (pipeline.tasks.gc)."""
    manifests = [artifacts(m, t)["kernels"] for m in sel.config.models.values()
                 for t in sel.config.targets.values()]
    return {"actions": [(collect_unused, [sel.config, sel.settings, SPECS, manifests])],
            "uptodate": [False],
            "params": [{"name": "max_age_days", "long": "max-age-days", "type": float,
                        "default": 0.0, "help": "keep entries used this recently "
                        "(for a cache shared with other checkouts)"}],
            "verbosity": 2}


def collect_unused(config: BuildConfig, settings: CacheSettings, specs_dir: str,
                   manifests: list[str], max_age_days: float) -> None:
    """The gc action: remove unused kernels and specs, then the action-cache
    entries and blobs no cached task of the whole matrix would look up now;
    print counts. manifests: every kernels.json path of the whole matrix."""
    specs = gc.collect_kernels(settings, specs_dir, manifests, max_age_days)
    gc.collect_actions(settings, current_keys(config, settings), specs, max_age_days)


def current_keys(config: BuildConfig, settings: CacheSettings) -> set[str]:
    """The action keys the cached tasks of the whole matrix would look up now;
    a task whose inputs are missing (never built) has none."""
    sel = select(config, list(config.models.values()), list(config.targets.values()),
                 dataclasses.replace(settings, dask=None))
    creators = {fn.__name__: fn for family in (model, optimize, link, check)
                for fn in family.CREATORS}
    keys = set()
    for stage in CACHED_STAGES:
        made = creators[f"task_{stage}"](sel)
        for task in [made] if isinstance(made, dict) else made:
            run = (task.get("meta") or {}).get("cached")
            if run and all(lazy.exists(p) for p in run.action.inputs):
                keys.add(run.action.key())
    return keys


CREATORS = (task_report, task_explain, task_gc)
