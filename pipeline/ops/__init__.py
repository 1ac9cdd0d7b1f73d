"""Operators, one module per family; importing this package registers them all."""

from pipeline.ops import elementwise, linalg, nn, shape, unary  # noqa: F401  (registration)
from pipeline.ops.registry import ONNX_CONVERTERS, OPS, get, infer_types, onnx_converter

__all__ = ["ONNX_CONVERTERS", "OPS", "get", "infer_types", "onnx_converter"]
