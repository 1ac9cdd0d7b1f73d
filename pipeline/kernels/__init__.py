"""Layer 3, kernels: each operator family's lowerings and schedule variants (and the
weight packing their layouts need); importing this package registers them all.
Imports dsl, ops' registry and shared helpers, ir and errors: never an operator
family's definitions (a numpy reference edit must recompile no kernel)."""

from pipeline.kernels import (  # noqa: F401  (registration)
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
    nbits_gather,
    nbits_int8,
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
from pipeline.kernels.registry import LOWERINGS, Lowering, lowering_of

__all__ = ["LOWERINGS", "Lowering", "lowering_of"]
