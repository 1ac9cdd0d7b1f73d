"""Runtime: load exported libraries and run their graphs. Imports only `errors`, `ir`
(dtype sizes, int4 packing), `link` (the blob format, the linker for a .tar) and
`vm.format` (the .ro reader of runtime/vm.py): no llvmlite, onnx or compiler."""

from pipeline.runtime.blob import BlobError
from pipeline.runtime.graph_executor import GraphExecutor, GraphModule, empty_aligned
from pipeline.runtime.module import Module, load_module
from pipeline.runtime.params import load_params, save_params
from pipeline.runtime.timing import BenchmarkResult

__all__ = [
    "BenchmarkResult",
    "BlobError",
    "GraphExecutor",
    "GraphModule",
    "Module",
    "empty_aligned",
    "load_module",
    "load_params",
    "save_params",
]
