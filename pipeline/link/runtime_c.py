"""Compile the C runtime: the executor object linked into every library, and the
`pipeline-run` program (sources: pipeline/runtime/c/).

Both are compiled once per target with that target's C compiler (`cc`; None: the
host's, $CC else "cc", as pipeline/link/cc.py picks it), so a foreign target's
library links a foreign executor. The API caches executor.o under a key of the
sources' hash and the compiler's identity (cc.toolchain_identity); the doit task
`runtime:<target>` writes out/runtime/<target>/ instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pipeline.files import temp_output
from pipeline.link.cc import _run, _tool, toolchain_identity

__all__ = ["C_DIR", "C_SOURCES", "EXECUTOR_C", "VM_SOURCES", "build_pipeline_run",
           "compile_executor", "compile_vm", "executor_object", "vm_object"]

C_DIR = Path(__file__).resolve().parent.parent / "runtime" / "c"
# The .c files compiled into executor.o (one relocatable object, cc -r).
EXECUTOR_C = (C_DIR / "executor.c", C_DIR / "binding.c", C_DIR / "debug.c")
# All but pipeline_run.c make up executor.o (the .c files include the headers).
C_SOURCES = (C_DIR / "pipeline_runtime.h", C_DIR / "executor_internal.h", C_DIR / "sha256.h",
             C_DIR / "parallel.h", C_DIR / "dtypes.h", C_DIR / "pages.h", C_DIR / "reader.h",
             *EXECUTOR_C, C_DIR / "pipeline_run.c")
# vm.o, the VM interpreter linked into `executor: vm` libraries instead of executor.o
# (it includes parallel.h and the API header).
VM_SOURCES = (C_DIR / "pipeline_runtime.h", C_DIR / "parallel.h", C_DIR / "dtypes.h",
              C_DIR / "pages.h", C_DIR / "reader.h", C_DIR / "vm_sequence.h", C_DIR / "vm.c")
# -fvisibility=hidden: only the pl_* API (marked default) is exported from the
# library; the executor's helpers stay out of its dynamic symbol table.
_CFLAGS = ("-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra")
# The kernel cache's variable (pipeline/tasks/cache.py): when set, the API keeps
# executor.o there; else in the user's cache folder (never in the working directory).
_CACHE_ENV = "PIPELINE_KERNEL_CACHE"


def compile_executor(output: str | os.PathLike, cc: str | None = None) -> None:
    """Compile the executor's .c files (EXECUTOR_C) into the relocatable object
    `output` (written atomically; `cc -r -nostdlib` compiles them and links them
    with the target's `ld -r`); LinkError with the command and stderr if the
    compiler fails."""
    with temp_output(output) as tmp:
        _run("compile executor", [*_tool(cc), *_CFLAGS, "-r", "-nostdlib",
                                  *map(str, EXECUTOR_C), "-o", tmp])


def compile_vm(output: str | os.PathLike, cc: str | None = None) -> None:
    """Compile the VM interpreter (vm.c) into the object `output` (atomically), as
    compile_executor does the graph executor; LinkError if the compiler fails."""
    with temp_output(output) as tmp:
        _run("compile VM", [*_tool(cc), *_CFLAGS, "-c", str(C_DIR / "vm.c"), "-o", tmp])


def build_pipeline_run(output: str | os.PathLike, cc: str | None = None) -> None:
    """Compile and link the `pipeline-run` program to `output` (executable)."""
    with temp_output(output) as tmp:
        _run("build pipeline-run", [*_tool(cc), *_CFLAGS, "-o", tmp,
                                    str(C_DIR / "pipeline_run.c"), "-ldl"])
        os.chmod(tmp, 0o755)


def _cached(name: str, sources, compile_fn, cc: str | None, cache) -> Path:
    """`<cache>/runtime/<key>/<name>`, compiled once by compile_fn(path, cc); the key a
    hash of the sources and toolchain_identity(cc)."""
    key = hashlib.sha256(json.dumps(toolchain_identity(cc), sort_keys=True).encode())
    for src in sources:
        key.update(src.read_bytes())
    root = Path(cache or os.environ.get(_CACHE_ENV) or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "pipeline"))
    obj = root / "runtime" / key.hexdigest()[:20] / name
    if not obj.exists():
        compile_fn(obj, cc)
    return obj


def executor_object(cc: str | None = None, cache: str | os.PathLike | None = None) -> Path:
    """executor.o for `cc`, compiled once: `<cache>/runtime/<key>/executor.o`, the key
    a hash of the C sources and toolchain_identity(cc) (ToolchainError if cc cannot
    run). cache: default $PIPELINE_KERNEL_CACHE, else $XDG_CACHE_HOME/pipeline
    (~/.cache/pipeline)."""
    # pipeline_run.c is not part of executor.o
    return _cached("executor.o", [s for s in C_SOURCES if s.name != "pipeline_run.c"],
                   compile_executor, cc, cache)


def vm_object(cc: str | None = None, cache: str | os.PathLike | None = None) -> Path:
    """vm.o for `cc`, compiled once and cached as executor_object's executor.o."""
    return _cached("vm.o", VM_SOURCES, compile_vm, cc, cache)
