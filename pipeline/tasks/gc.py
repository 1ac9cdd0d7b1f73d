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

The gc task's action (pipeline.tasks.creators.housekeeping.collect_unused)
runs collect_kernels, then collect_actions with the keys its task creators give.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.tasks import action_cache as ac
from pipeline.tasks import cache, lazy
from pipeline.tasks.paths import listed_kernels
from pipeline.tasks.tiered import CacheSettings


def collect_kernels(settings: CacheSettings, specs_dir: str, manifests: list[str],
                    max_age_days: float) -> list[Path]:
    """Remove the kernel cache entries and the specs (and their IR) in specs_dir
    that no manifest lists; print the count of kernels. manifests: every
    kernels.json path of the whole matrix. Returns the spec files removed."""
    keep = set()
    for manifest in manifests:
        if os.path.exists(manifest):
            keep |= {k["hash"] for k in listed_kernels(manifest)}
    removed = cache.collect_garbage(settings.root, keep, max_age_days)
    print(f"{settings.root}: removed {len(removed)} unused kernels, {len(keep)} in use")
    specs = [p for p in (Path(specs_dir).iterdir() if os.path.isdir(specs_dir) else ())
             if p.suffix in (".json", ".ll") and p.stem not in keep]
    lazy.clean([str(p) for p in specs])
    return specs


def collect_actions(settings: CacheSettings, keys: set[str], specs: list[Path],
                    max_age_days: float) -> None:
    """Remove the action-cache entries not in `keys` (what the matrix would look
    up now) and the blobs nothing keeps, and the producer records no marker
    names; print the counts (with that of the removed `specs`)."""
    marked = lazy.markers()
    entries, blobs = ac.prune(settings.root, keys, {m["sha256"] for m in marked},
                              max_age_days)
    lazy.prune_producers({m["producer"] for m in marked})
    print(f"{settings.root}: removed {len({p.stem for p in specs})} unused kernel specs, "
          f"{entries} action cache entries and {blobs} blobs; {len(keys)} entries in use")
