"""`doit build shard=I/N`: deterministic slices of the matrix (issue 15, point 5)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.errors import ConfigError
from pipeline.tasks.shard import shard_entries
from tests.support.checkouts import TARGET, tiny_checkout
from tests.support.doit_runner import doit


def test_shards_partition_the_entries_evenly_and_deterministically():
    entries = [(SimpleNamespace(name=m), SimpleNamespace(name=t))
               for m in ("c", "a", "b") for t in ("x", "y")]
    names = [{f"{m.name}@{t.name}" for m, t in shard_entries(entries, f"{i}/4")}
             for i in range(1, 5)]
    assert set().union(*names) == {f"{m}@{t}" for m in "abc" for t in "xy"}
    assert sum(map(len, names)) == 6 and {len(n) for n in names} == {1, 2}
    shuffled = list(reversed(entries))
    assert [{f"{m.name}@{t.name}" for m, t in shard_entries(shuffled, f"{i}/4")}
            for i in range(1, 5)] == names
    for bad in ("0/2", "3/2", "1", "a/b"):
        with pytest.raises(ConfigError, match=f"shard={bad}: expected I/N"):
            shard_entries(entries, bad)


def test_two_shards_build_disjoint_halves(tmp_path: Path):
    tiny_checkout(tmp_path, f"a: {TARGET}\nb: {TARGET}\n")
    built = []
    for i in (1, 2):
        code, executed, out = doit(tmp_path, "build", "config=matrix.yaml", f"shard={i}/2")
        assert code == 0, out[-3000:]
        built.append({n for n in executed if n.startswith("export:")})
    assert built == [{"export:tiny@a"}, {"export:tiny@b"}]
    code, _, out = doit(tmp_path, "build", "config=matrix.yaml", "shard=3/2")
    assert code != 0 and "shard=3/2: expected I/N" in out and "Traceback" not in out
