"""What a doit build left in a folder's out/: the build report (which tasks
executed, and how each got its outputs: computed, restored from cache, on the
cluster), the kernel hashes of a manifest and the tiny model's artifact bytes."""

from __future__ import annotations

import json
from pathlib import Path


def build_report(folder: Path) -> dict:
    return json.loads((folder / "out" / "build-report.json").read_text())


def how(report: dict) -> dict[str, str]:
    """task -> how the last build got its outputs."""
    return {i["task"]: i["how"] for i in report["executed"]}


def hashes(tmp: Path, model: str, target: str) -> set[str]:
    """The kernel hashes of out/<model>/<target>/kernels.json."""
    manifest = tmp / "out" / model / target / "kernels.json"
    return {k["hash"] for k in json.loads(manifest.read_text())["kernels"]}


def kernel_tasks(executed: set[str]) -> set[str]:
    """The kernel hashes of the kernel:<hash> tasks among `executed`."""
    return {name.partition(":")[2] for name in executed if name.startswith("kernel:")}


ARTIFACTS = ("tiny.so", "lib0.o", "devc.o", "tiny.params")


def artifact_bytes(tmp: Path, target: str = "llvm") -> dict[str, bytes]:
    """name -> bytes of the tiny model's deliverables for `target`."""
    d = tmp / "out" / "tiny" / target
    return {name: (d / name).read_bytes() for name in ARTIFACTS}
