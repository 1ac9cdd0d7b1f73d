"""Frontends: model formats into the graph IR."""

from pipeline.frontend.onnx import from_onnx, load_model

__all__ = ["from_onnx", "load_model"]
