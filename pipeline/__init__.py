"""pipeline: an incremental ML compiler from ONNX to self-contained CPU libraries.

Stages, in processing order (one package each):
  frontend  -> ONNX to graph IR            transform -> graph passes (PassContext)
  lower     -> fused nodes to KernelSpecs  codegen   -> LLVM IR text, objects
  plan      -> graph JSON + memory plan    contrib   -> linker (lib0.o, .so, .tar)
  runtime   -> blob, load_module, GraphModule

Submodules load on first use, so `import pipeline.runtime` (all a deployed
library needs) pulls in neither llvmlite nor onnx.
"""

import importlib

__all__ = ["build", "frontend", "runtime", "transform"]


def __getattr__(name: str):
    if name == "build":
        return importlib.import_module("pipeline.build_module").build
    if name in ("frontend", "runtime", "transform"):
        return importlib.import_module(f"pipeline.{name}")
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
