"""`doit gc`: drop what no entry of the whole matrix uses any more from the
kernel cache (<hash>.*), the kernel specs and their IR (out/specs), and the action cache
(ac/, cas/: pipeline.tasks.action_cache), and the markers' records of how to
remake outputs (out/.remote/producers: pipeline.tasks.lazy).

An action-cache entry is kept if its key is what a task of the matrix would
look up now (its inputs as they are on disk, or as markers say) or if it was
used within --max-age-days (for a cache other checkouts share); a blob is kept
if a kept entry or one of this checkout's markers names it.

Hard links: a restored output, a kernel object and its blob may be one file
under several names. gc only ever unlinks names, so the bytes stay as long as
another name holds them: an artifact in out/ never loses its contents because
its blob went, and a kept entry's blob is never removed.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from pipeline.tasks import action_cache as ac
from pipeline.tasks import cache, lazy
from pipeline.tasks.config import BuildConfig
from pipeline.tasks.tiered import CacheSettings


def current_keys(config: BuildConfig, settings: CacheSettings) -> set[str]:
    """The action keys the cached tasks of the whole matrix would look up now;
    a task whose inputs are missing (never built) has none."""
    from pipeline.tasks import make_tasks

    creators = make_tasks(config, list(config.models.values()), list(config.targets.values()),
                          dataclasses.replace(settings, dask=None))
    keys = set()
    for stage in ("model", "import", "optimize", "kernel", "lib0", "devc", "runtime", "export",
                  "validate"):
        made = creators[f"task_{stage}"]()
        for task in [made] if isinstance(made, dict) else made:
            for action in task.get("actions") or ():
                cached = action[2].get("cached") if isinstance(action, tuple) and \
                    len(action) > 2 else None
                if cached and all(lazy.exists(p) for p in cached[0].inputs):
                    keys.add(cached[0].key())
    return keys


def collect_unused(config: BuildConfig, settings: CacheSettings, specs_dir: str,
                   manifests: list[str], max_age_days: float) -> None:
    """Remove unused kernels, specs, action-cache entries and blobs; print counts.
    manifests: every kernels.json path of the whole matrix."""
    keep = set()
    for manifest in manifests:
        if os.path.exists(manifest):
            keep |= {k["hash"] for k in cache.listed_kernels(manifest)}
    removed = cache.collect_garbage(settings.root, keep, max_age_days)
    print(f"{settings.root}: removed {len(removed)} unused kernels, {len(keep)} in use")
    specs = [p for p in (Path(specs_dir).iterdir() if os.path.isdir(specs_dir) else ())
             if p.suffix in (".json", ".ll") and p.stem not in keep]
    lazy.clean([str(p) for p in specs])
    keys = current_keys(config, settings)
    marked = lazy.markers()
    entries, blobs = ac.prune(settings.root, keys, {m["sha256"] for m in marked},
                              max_age_days)
    lazy.prune_producers({m["producer"] for m in marked})
    print(f"{settings.root}: removed {len({p.stem for p in specs})} unused kernel specs, "
          f"{entries} action cache entries and {blobs} blobs; {len(keys)} entries in use")
