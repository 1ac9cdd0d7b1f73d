"""Outputs left in the cache: a build "without the bytes" (Bazel's
--remote_download_minimal).

On an action-cache hit whose blob is only on the remote tier, an output the
build does not need on disk (an intermediate: weights, params, devc.o, lib0.o,
kernel objects, specs) is not downloaded. A marker records what the file would
hold, and where its bytes are:

    out/.remote/<sha256 of the absolute path>.json
        {"path", "sha256", "size", "executable", "producer": <key>}
    out/.remote/producers/<key>.json
        {"fn", "args", "action", "settings"}: the stage that made it, to
        fetch its bytes again (settings) or recompute them (fn, args, action)

To doit's file checker (pipeline.tasks.checker) a marked path exists, with the
marker's mtime and the recorded size, and to the action keys of the stages
downstream (pipeline.tasks.action_cache.file_digest) it hashes to the recorded
digest: so a stage whose inputs are all marked can still hit the cache, and its
inputs never come down. A stage that must run fetches its marked inputs first
(pipeline.tasks.tiered.materialize), or recomputes them when no tier has the
bytes any more. A real file always wins over a marker, and every writer of an
output drops its marker, so a marker never contradicts the file it stands for.

Markers are per checkout (under out/, like doit's database): a shared cache
folder never holds them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.files import atomic_write
from pipeline.tasks.paths import MARKERS

PRODUCERS = os.path.join(MARKERS, "producers")


def marker_path(path: str) -> str:
    return os.path.join(MARKERS, hashlib.sha256(os.path.abspath(path).encode()).hexdigest()
                        + ".json")


def write(path: str, sha256: str, size: int, executable: bool, producer: str) -> None:
    """Mark `path` as holding the blob `sha256` (made by the action `producer`) and
    remove any file there (it holds other bytes: the caller checked)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    atomic_write(marker_path(path), json.dumps(
        {"path": path, "sha256": sha256, "size": size, "executable": executable,
         "producer": producer}, sort_keys=True).encode())


def write_producer(key: str, doc: dict) -> None:
    """Record how to fetch or remake the outputs of action `key` (written once)."""
    target = os.path.join(PRODUCERS, key + ".json")
    if not os.path.exists(target):
        atomic_write(target, json.dumps(doc, sort_keys=True, default=str).encode())


def producer(key: str) -> dict | None:
    try:
        return json.loads(Path(PRODUCERS, key + ".json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def read(path: str) -> dict | None:
    """The marker of `path`, or None: no marker, or a real file there (then a
    leftover marker is removed)."""
    marker = marker_path(path)
    if os.path.exists(path):
        if os.path.exists(marker):
            drop([path])
        return None
    try:
        return json.loads(Path(marker).read_text())
    except (FileNotFoundError, ValueError):
        return None


def markers() -> list[dict]:
    """Every marker of this checkout."""
    found = []
    for p in Path(MARKERS).glob("*.json") if os.path.isdir(MARKERS) else ():
        with contextlib.suppress(FileNotFoundError, ValueError):
            found.append(json.loads(p.read_text()))
    return found


def prune_producers(used: set[str]) -> None:
    """Remove the producer records no marker names (doit gc)."""
    for p in Path(PRODUCERS).glob("*.json") if os.path.isdir(PRODUCERS) else ():
        if p.stem not in used:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def drop(paths) -> None:
    """Forget the markers of `paths` (their files were written, or removed)."""
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker_path(p))


def exists(path: str) -> bool:
    """A real file or a marked one (with a readable marker)."""
    return os.path.exists(path) or read(path) is not None


@dataclass(frozen=True)
class MarkedStat:
    """What doit's checker reads of a stat: the marker's mtime, the output's size."""
    st_mtime: float
    st_size: int


def stat(path: str):
    """os.stat(path), or a MarkedStat for a marked path; OSError if neither."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        marker = marker_path(path)
        st = os.stat(marker)  # FileNotFoundError: neither
        doc = read(path)
        if doc is None:
            raise
        return MarkedStat(st.st_mtime, doc["size"])


def digest(path: str) -> str | None:
    """The sha256 a marked path stands for (None: not marked)."""
    doc = read(path)
    return doc["sha256"] if doc else None


def clean(targets) -> None:
    """A doit clean action: remove the task's `targets` (doit passes them by name)
    and their markers."""
    for p in targets:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    drop(targets)


class Fetched:
    """doit uptodate check: with downloads=all, a task whose outputs a cache hit
    left in the cache is not up to date, so it runs, hits again and brings them
    down; with downloads=minimal it has no say (None)."""

    def __init__(self, downloads: str):
        self.downloads = downloads

    def left_in_cache(self, task) -> list[str]:
        if self.downloads != "all":
            return []
        return [t for t in task.targets if not os.path.exists(t) and exists(t)]

    def __call__(self, task, values) -> bool | None:
        return None if self.downloads != "all" else not self.left_in_cache(task)
