"""The sources whose edits change generated code (a light module: doit's task
loading reads it without importing the code generator).

Validation and runtime code are deliberately absent: editing them must not
rebuild any kernel. Add a folder here when new code starts deciding kernels.
"""

from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent

CODEGEN_SOURCES = tuple(sorted(
    [*(_PKG / "dsl").glob("*.py"), *(_PKG / "ops").glob("*.py"),
     *(_PKG / "codegen").glob("*.py"), _PKG / "lower" / "kernel.py",
     _PKG / "lower" / "sources.py", _PKG / "ir" / "graph.py", _PKG / "ir" / "target.py"]))
