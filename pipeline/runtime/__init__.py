"""Runtime: load exported libraries and run their graphs (no llvmlite needed)."""

from pipeline.runtime.graph_executor import GraphExecutor, GraphModule
from pipeline.runtime.module import Module, load_module
from pipeline.runtime.pack import BlobError
from pipeline.runtime.params import load_params, save_params

__all__ = [
    "BlobError",
    "GraphExecutor",
    "GraphModule",
    "Module",
    "load_module",
    "load_params",
    "save_params",
]
