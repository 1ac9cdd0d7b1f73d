"""The cache location never changes what a build needs (issue 15, point 0).

For every (previous run's cache, this run's cache) in {default, DIR1, DIR2,
emptied}, a build followed by `doit build` or `doit validate` succeeds with the
bytes of a clean build: what a task reads from the cache is an input it
declares (kernel specs live in out/specs) or is recreated (objects). "emptied"
is a cache folder deleted between the two runs. The first build of each
previous-cache choice is made once and copied (paths are relative to the
folder, mtimes kept), so each case costs one doit run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.build_outputs import artifact_bytes
from tests.support.checkouts import tiny_checkout
from tests.support.doit_runner import doit

CACHES = {"default": None, "DIR1": "c1", "DIR2": "c2", "emptied": "ce"}


def cache_args(which: str) -> list[str]:
    return [] if CACHES[which] is None else [f"cache={CACHES[which]}"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """One folder per previous-cache choice, built with it; plus "clean" (reference)."""
    root = tmp_path_factory.mktemp("prev")
    folders = {}
    for which in [*CACHES, "clean"]:
        d = tiny_checkout(root / which)
        args = cache_args(which) if which != "clean" else []
        code, _, out = doit(d, "build", "config=matrix.yaml", *args)
        assert code == 0, out[-3000:]
        folders[which] = d
    return folders


@pytest.mark.parametrize("command", ["build", "validate"])
@pytest.mark.parametrize("this", list(CACHES))
@pytest.mark.parametrize("previous", list(CACHES))
def test_switching_cache_location(built, tmp_path: Path, previous: str, this: str,
                                  command: str):
    d = tmp_path / "w"
    shutil.copytree(built[previous], d, symlinks=True)
    if previous == "emptied" or this == "emptied":
        shutil.rmtree(d / "ce", ignore_errors=True)
    code, executed, out = doit(d, command, "config=matrix.yaml", *cache_args(this))
    assert code == 0 and "Traceback" not in out, out[-3000:]
    assert artifact_bytes(d) == artifact_bytes(built["clean"])
    if command == "validate":
        assert json.loads((d / "out/tiny/llvm/validation.json").read_text())["passed"]
    cache = d / (CACHES[this] or "out/kernels")
    if previous != this or this == "emptied":  # the objects are in this run's cache now
        kernels = json.loads((d / "out/tiny/llvm/kernels.json").read_text())["kernels"]
        assert all((cache / f"{k['hash']}.o").exists() for k in kernels)
    else:
        assert executed <= {"validate:tiny@llvm"}  # nothing moved: nothing to redo
