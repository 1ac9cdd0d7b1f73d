"""Where the build puts things, and what its stages are called: the one place for
the output folder's name, every artifact's path and the list of build stages.

A leaf of pipeline.tasks (it imports nothing of the package), so every module of
the build, the cache stack included, can name a path without importing another.
Every path doit sees goes through `path`: doit compares paths as strings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the annotations: config imports the compiler
    from pipeline.tasks.config import ModelEntry, TargetEntry

OUT = "out"  # the output folder, relative to the folder doit runs in

# The stages a build runs, in pipeline order (the doit task names before ":"):
# the reporter's timeline and `doit gc`'s action keys are read from these.
BUILD_STAGES = ("model", "import", "optimize", "kernel", "lib0", "devc", "runtime", "export",
                "aot", "budget")
# The stages whose outputs the action cache keeps: the build's, and validate.
CACHED_STAGES = (*BUILD_STAGES, "validate")

CACHE_ENV = "PIPELINE_KERNEL_CACHE"  # the kernel cache folder unless cache= says


def path(*parts: str) -> str:
    """The parts joined and normalised: every path doit sees is made here."""
    return os.path.normpath(os.path.join(*parts))


SPECS = path(OUT, "specs")  # kernel specs (and IR) optimize writes: the kernel tasks' inputs
LOGS = path(OUT, "logs")    # a stage's traceback after an internal error
REPORT = path(OUT, "build-report.json")  # what the last run executed (reporter)
# The same record, of the last run that ran a build stage: `doit report` draws its
# timeline after validate and bench have replaced build-report.json.
LAST_BUILD = path(OUT, "last-build.json")
MARKERS = path(OUT, ".remote")  # outputs left in the cache (pipeline.tasks.lazy)
DEFAULT_CACHE = path(OUT, "kernels")


def cache_dir(override: str | None = None) -> str:
    """The kernel cache folder: the command-line override, $PIPELINE_KERNEL_CACHE,
    or out/kernels."""
    return os.path.normpath(override or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def onnx_path(entry: ModelEntry) -> str:
    """The ONNX file the entry builds from: the user's, or one the model task writes
    (a generator's, or the user's with random weights)."""
    if not entry.written:
        return os.path.relpath(entry.path)
    return path(OUT, "models", f"{entry.name}.onnx")


def imported(m: ModelEntry) -> tuple[str, str]:
    """The import stage's outputs: graph IR JSON and weights."""
    return (path(OUT, m.name, f"{m.name}.ir.json"),
            path(OUT, m.name, f"{m.name}.weights.params"))


def runtime_artifacts(t: TargetEntry) -> dict[str, str]:
    """The runtime task's outputs for target t: {"executor", "run"} -> path, and
    "vm", the VM interpreter it compiles too when an entry of t uses the VM."""
    d = path(OUT, "runtime", t.name)
    return {"executor": path(d, "executor.o"), "run": path(d, "pipeline-run"),
            "vm": path(d, "vm.o")}


def artifacts(m: ModelEntry, t: TargetEntry) -> dict[str, str]:
    """The artifacts of one model x target entry, by name -> path."""
    d = path(OUT, m.name, t.name)
    return {"graph_json": path(d, f"{m.name}.json"), "params": path(d, f"{m.name}.params"),
            "kernels": path(d, "kernels.json"), "lib0": path(d, "lib0.o"),
            "devc": path(d, "devc.o"), "so": path(d, f"{m.name}.so"),
            "ro": path(d, f"{m.name}.ro"),
            "validation": path(d, "validation.json"),
            # the library's flash and RAM measured from the built files (export, aot)
            "sizes": path(d, "sizes.json"),
            # executor aot (docs/microcontrollers.md): the static library, its header,
            # the Model Library Format tar, its metadata.json, and the program that
            # runs the model on files (the test firmware on a bare-metal target)
            "archive": path(d, f"lib{m.name}.a"), "header": path(d, f"{m.name}.h"),
            "mlf": path(d, f"{m.name}.tar"), "metadata": path(d, "metadata.json"),
            "program": path(d, f"{m.name}.elf")}


def spec_path(specs_dir: str, kernel_hash: str) -> str:
    """Where optimize writes a kernel's spec (out/specs): the kernel task's input."""
    return os.path.normpath(os.path.join(specs_dir, kernel_hash + ".json"))


def ir_path(spec: str) -> str:
    """The LLVM IR beside a spec file (<hash>.ll next to <hash>.json): optimize
    renders each kernel once and writes it to out/specs, the kernel task compiles it."""
    return os.path.splitext(spec)[0] + ".ll"


def listed_kernels(kernels_json: str) -> list[dict]:
    """The kernels an entry's kernels.json lists: [{"hash", "symbol"}, ...] in link order."""
    return json.loads(Path(kernels_json).read_text())["kernels"]
