"""Layer 2, operators, one module per family (shape rule, lowering, converters);
importing this package registers them all. Imports only dsl, ir and errors."""

from pipeline.ops import (  # noqa: F401  (registration)
    attention,
    conv,
    conv_blocked,
    conv_pointwise,
    conv_transpose,
    conv_winograd,
    dense_packed,
    depthwise_blocked,
    elementwise,
    index,
    layout,
    linalg,
    loss,
    movement,
    norm,
    pool,
    pool_blocked,
    qconv_blocked,
    qdense_packed,
    quant,
    quant_conv,
    quant_ms,
    recurrent,
    reduce,
    resize,
    scan,
    scatter,
    shape,
    softmax,
    unary,
)
from pipeline.ops.registry import ONNX_CONVERTERS, OPS, get, infer_types, onnx_converter

__all__ = ["ONNX_CONVERTERS", "OPS", "get", "infer_types", "onnx_converter"]
