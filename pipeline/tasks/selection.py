"""What every task creator works from: the slice of the build matrix this doit run
builds (`Selection`), and the one way a cached stage becomes a doit task
(`Selection.cached_stage`: its inputs and outputs given once)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipeline.tasks import lazy
from pipeline.tasks.config import BuildConfig, ModelEntry, TargetEntry
from pipeline.tasks.deps import sources
from pipeline.tasks.paths import SPECS, cache_dir
from pipeline.tasks.run import run_stage
from pipeline.tasks.shard import shard_entries
from pipeline.tasks.tiered import Action, CachedRun, CacheSettings


def code_of(*roots: str, stop: tuple[str, ...] = ()) -> list[str]:
    """The source files the code of `roots` runs ("module:function" in pipeline, as
    run_stage takes them, or a module), derived from the code: pipeline.tasks.deps."""
    found = sources(*(f"pipeline.{r}" for r in roots), stop=tuple(f"pipeline.{s}" for s in stop))
    return [os.path.relpath(p) for p in found]


@dataclass(frozen=True)
class Selection:
    """The models, targets and model x target entries one doit run builds, with
    what its tasks share: the cache settings, each target's compiler identity
    (`toolchain`) and devc.o packing, keyed by target name."""
    config: BuildConfig | None
    models: list[ModelEntry]
    targets: list[TargetEntry]
    entries: list[tuple[ModelEntry, TargetEntry]]
    settings: CacheSettings
    toolchain: dict[str, dict]
    packing: dict[str, dict]

    @property
    def fetched(self) -> lazy.Fetched:
        """The uptodate check that brings outputs left in the cache down (downloads=all)."""
        return lazy.Fetched(self.settings.downloads)

    def cached_stage(self, name: str, fn: str, args: list, inputs: list[str],
                     outputs: list[str] | dict[str, str], uptodate: list, *,
                     extra: dict | None = None, specs_of: str | None = None,
                     fetch: tuple = (), clean: bool = True, **fields) -> dict:
        """The doit task `name` that runs stage `fn` on `args` through the action cache.

        inputs: its input files (file_dep and the action key's inputs); outputs: its
        files (targets), a list or name -> path; extra: what decides the outputs
        besides files (the toolchain identity); specs_of, fetch: see tiered.Action;
        clean: remove the targets and their markers on `doit clean`; fields: more
        of the task dict (doc, task_dep). Returns the task dict; its "meta"
        {"cached": CachedRun} is what gc and the kernel tasks read.
        """
        named = outputs if isinstance(outputs, dict) else {p: p for p in outputs}
        # Where the work happens (the cache folder, the Dask scheduler) decides no output.
        key_args = ["<cache>" if a == self.settings.root else
                    None if self.settings.dask and a == self.settings.dask else a for a in args]
        run = CachedRun(Action(fn, key_args, list(inputs), named, extra or {}, specs_of, SPECS,
                               tuple(fetch)), self.settings)
        task = {"name": name, "file_dep": inputs, "uptodate": uptodate,
                "targets": sorted(named.values()) if isinstance(outputs, dict) else outputs,
                "actions": [(run_stage, [fn, *args], {"cached": run})],
                "meta": {"cached": run}, **fields}
        if clean:
            task["clean"] = [lazy.clean]
        return task


def select(config: BuildConfig | None, models: list[ModelEntry], targets: list[TargetEntry],
           settings: CacheSettings | None = None, shard: str | None = None) -> Selection:
    """The Selection of `models` x `targets` (shard "I/N": this run's slice of the
    entries, pipeline.tasks.shard). settings None: the kernel cache
    $PIPELINE_KERNEL_CACHE or out/kernels, action cache on, no remote tier.
    ConfigError (dodo.py reports it) if a selected target's compiler is missing."""
    settings = settings or CacheSettings(cache_dir(None))
    entries = shard_entries([(m, t) for m in models for t in targets], shard)
    models = [m for m in models if any(e[0] is m for e in entries)]
    targets = [t for t in targets if any(e[1] is t for e in entries)]
    # Asked once per target, and only when some model is selected.
    toolchain = {t.name: t.toolchain() for t in targets} if models else {}
    packing = {t.name: t.packing() for t in targets} if models else {}
    return Selection(config, models, targets, entries, settings, toolchain, packing)
