"""pipeline: an incremental ML compiler from ONNX to self-contained CPU libraries.

Stages, in processing order (one package each):
  frontend  -> ONNX to graph IR            transform -> graph passes (PassContext)
  lower     -> fused nodes to KernelSpecs  codegen   -> LLVM IR text, objects
  backend   -> graph JSON + memory plan    contrib   -> linker (lib0.o, .so, .tar)
  runtime   -> blob, load_module, GraphModule
"""

from pipeline import frontend, runtime, transform
from pipeline.build import build

__all__ = ["build", "frontend", "runtime", "transform"]
