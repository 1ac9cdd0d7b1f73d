"""Layer 4, frontends: model formats (ONNX) into the graph IR. Imports ops, ir, errors
(never kernels)."""

from pipeline.frontend.onnx import from_onnx, load_model

__all__ = ["from_onnx", "load_model"]
