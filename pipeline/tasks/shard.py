"""Sharding: `doit build shard=I/N` builds the I-th of N deterministic slices of the
matrix, so N CI jobs split one matrix and meet in the (remote) action cache.

Entries (model@target) are sorted by name and dealt round-robin: every entry is
in exactly one shard, the slices differ in size by at most one, and the
assignment depends only on the selected entry names, never on the machine.
"""

from __future__ import annotations

import re

from pipeline.errors import ConfigError


def parse_shard(spec: str) -> tuple[int, int]:
    """"I/N" (1 <= I <= N) -> (I, N); ConfigError naming the variable otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ConfigError(f"shard={spec}: expected I/N with 1 <= I <= N, e.g. shard=1/4")
    return int(m[1]), int(m[2])


def shard_entries(entries: list[tuple], spec: str | None) -> list[tuple]:
    """The (model, target) entries of shard `spec` ("I/N"; None: all of them)."""
    if not spec:
        return entries
    i, n = parse_shard(spec)
    ordered = sorted(entries, key=lambda e: f"{e[0].name}@{e[1].name}")
    return ordered[i - 1::n]
