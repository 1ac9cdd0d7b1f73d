"""One kernel compile as a pure function: what the kernel task runs locally and a
cluster worker runs remotely (pipeline.tasks.cluster).

A leaf of the cache stack: the kernel cache (pipeline.tasks.cache) and the
cluster client both call it, and it calls neither.
"""

from __future__ import annotations

import warnings


def compile_spec(spec_json: str, ir: str | None = None) -> tuple[str, bytes, list[str]]:
    """A pure function: a kernel spec (JSON text) and its IR if rendered already
    (None: render it) -> (LLVM IR text, object bytes, the compiler's fallback
    notes). What a cluster worker runs (pipeline.tasks.cluster)."""
    # Imported here: the compiler loads only when a kernel is compiled.
    from pipeline.codegen.compile import CompileWarning
    from pipeline.driver.build import compile_kernel
    from pipeline.lower.kernel import KernelSpec

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CompileWarning)
        text, obj = compile_kernel(KernelSpec.from_json(spec_json), ir)
    return text, obj, [str(w.message) for w in caught if issubclass(w.category, CompileWarning)]
