"""Operators, one module per family; importing this package registers them all."""

from pipeline.ops import (  # noqa: F401  (registration)
    conv,
    elementwise,
    index,
    linalg,
    norm,
    pool,
    reduce,
    resize,
    shape,
    unary,
)
from pipeline.ops.registry import ONNX_CONVERTERS, OPS, get, infer_types, onnx_converter

__all__ = ["ONNX_CONVERTERS", "OPS", "get", "infer_types", "onnx_converter"]
