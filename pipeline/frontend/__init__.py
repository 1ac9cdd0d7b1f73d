"""Layer 3, frontends: model formats (ONNX) into the graph IR. Imports ops, ir, errors."""

from pipeline.frontend.onnx import from_onnx, load_model

__all__ = ["from_onnx", "load_model"]
