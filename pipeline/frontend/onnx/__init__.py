"""ONNX -> graph IR (TVM: relay.frontend.from_onnx): the import machinery
(importer.py), the converter registry (registry.py) and one module of converters
per operator family; importing this package registers them all."""

from pipeline.frontend.onnx import (  # noqa: F401  (registration)
    attention,
    attention_ms,
    control,
    conv,
    conv_transpose,
    dynamic,
    elementwise,
    index,
    linalg,
    loss,
    movement,
    nbits,
    norm,
    pool,
    quant,
    quant_conv,
    quant_ms,
    recurrent,
    reduce,
    resize,
    scan,
    scatter,
    sequence,
    sequence_map,
    shape,
    softmax,
    transformer_ms,
    unary,
)
from pipeline.frontend.onnx.importer import (
    CONTROL_FLOW,
    ImportContext,
    OnnxNode,
    default_opset,
    domain_opset,
    from_onnx,
    load_model,
)
from pipeline.frontend.onnx.registry import (
    ONNX_CONVERTERS,
    Converter,
    Limit,
    NodeView,
    onnx_converter,
    onnx_op,
)
from pipeline.frontend.onnx.shapes import with_input_shapes

__all__ = ["CONTROL_FLOW", "ONNX_CONVERTERS", "Converter", "ImportContext", "Limit",
           "NodeView", "OnnxNode", "default_opset", "domain_opset", "from_onnx", "load_model",
           "onnx_converter", "onnx_op", "with_input_shapes"]
