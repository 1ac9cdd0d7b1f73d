"""pipeline: an incremental ML compiler from ONNX to self-contained CPU libraries.

Packages, bottom layer first; each imports only from those above it in this list
(tests/unit/test_layers.py checks):
  errors, ir  -> user errors; graph IR (Graph, Node, TensorType) and Target
  dsl         -> kernel DSL: KernelBuilder, vectors, parallel_for, shared GEMM tile
  ops         -> operators per family: shape rule, lowering, ONNX converters
  frontend    -> ONNX to graph IR          transform -> graph passes (PassContext)
  lower       -> fused nodes to KernelSpecs plan      -> graph JSON + memory plan
  codegen     -> KernelSpec to LLVM IR text, objects
  link        -> cc/ld/tar, devc.o ELF and blob writers, atomic file writes
  runtime     -> blob reader, load_module, GraphModule (nothing from the compiler)
  driver      -> `build` and GraphExecutorFactory.export_library
  tasks       -> the doit build: task creators, stages, checker, reporter, caches, config
  tools       -> ONNX backend, conformance, validate, bench, rebuild_bench

Submodules load on first use, so `import pipeline.runtime` (all a deployed
library needs) pulls in neither llvmlite nor onnx.
"""

import importlib

# Registers the names of bfloat16 and the float8 dtypes (the IR's, pipeline/ir/graph.py)
# with numpy, so np.dtype("bfloat16") works wherever a dtype name becomes an array type.
import ml_dtypes  # noqa: F401

__all__ = ["build", "frontend", "runtime", "transform"]


def __getattr__(name: str):
    if name == "build":
        return importlib.import_module("pipeline.driver.build").build
    if name in ("frontend", "runtime", "transform"):
        return importlib.import_module(f"pipeline.{name}")
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
