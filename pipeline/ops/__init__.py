"""Layer 2, operator definitions, one module per family (shape rule, kind, numpy
reference, sample inputs); importing this package registers them all. Imports only
ir and errors (pipeline/kernels/ lowers them, pipeline/frontend/onnx/ converts to them)."""

from pipeline.ops import (  # noqa: F401  (registration)
    attention,
    conv,
    conv_blocked,
    conv_pointwise,
    conv_transpose,
    conv_winograd,
    dense_packed,
    depthwise_blocked,
    dynamic,
    dynamic_movement,
    elementwise,
    index,
    layout,
    linalg,
    loss,
    movement,
    nbits,
    norm,
    pool,
    pool_blocked,
    qconv_blocked,
    qdense_packed,
    quant,
    quant_conv,
    recurrent,
    recurrent_kernel,
    reduce,
    resize,
    scan,
    scatter,
    shape,
    softmax,
    unary,
)
from pipeline.ops.registry import OPS, OpKind, get, infer_types

__all__ = ["OPS", "OpKind", "get", "infer_types"]
