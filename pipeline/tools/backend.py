"""The ONNX backend (onnx.backend.base): prepare a model with the real compiler, run it.

    rep = pipeline.tools.backend.prepare(model, "CPU", opt_level=3)
    outputs = rep.run([x, ...])          # inputs in graph-input order, or a dict

`prepare` imports the model, optimises it at the chosen opt level, compiles
every kernel with llvmlite, links a shared library with cc, dlopens it and
runs it in the graph executor. The module itself is an onnx backend module
(`prepare`, `run_model`, `run_node`, `supports_device`), so onnx's backend test
runner can drive it (tests/test_onnx_backend.py).

Our compiler is static-shape: an input with a symbolic dimension, or an input
that an operator needs at build time (a Reshape's shape, Slice's starts, Pad's
pads... see BUILD_TIME_INPUTS), is resolved at `run`: the model is compiled
for the concrete shapes and those inputs' values, and the result is cached
per distinct (shapes, values).

What we do not support is declared here, in one place: operators without a
converter in the registry (automatically), dtypes the IR lacks, float64 on
operators outside FLOAT64_OPS, and the operator features listed in LIMITS.
`unsupported(model)` names every reason a model cannot be compiled; the
conformance suite skips exactly those models.
"""

from __future__ import annotations

import atexit
import itertools
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.backend.base import Backend, BackendRep

TARGET = "llvm -mcpu=native"
# ONNX element types the graph IR has (pipeline/ir/graph.py DTYPES).
SUPPORTED_DTYPES = {TensorProto.FLOAT: "float32", TensorProto.DOUBLE: "float64",
                    TensorProto.INT64: "int64", TensorProto.INT32: "int32",
                    TensorProto.BOOL: "bool"}

# ONNX operators whose converters produce only graph ops with float64 lowerings
# (registry `float64=True`); a DOUBLE input or output of any other operator is
# unsupported (convolutions, pools and normalisations are float32 only).
FLOAT64_OPS = frozenset((
    # unary (ops/unary.py)
    "Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Exp",
    "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Erf", "Gelu", "Softplus", "Floor", "Ceil",
    "Round", "Clip", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
    "Acosh", "Atanh", "Sign", "Softsign", "ThresholdedRelu", "Shrink", "Mish", "Celu", "Swish",
    "IsNaN", "IsInf",
    # elementwise (ops/elementwise.py)
    "Identity", "Dropout", "Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "Sum", "Max",
    "Min", "Mean", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Where", "Cast",
    "CastLike",
    # data movement and shapes (ops/shape.py, movement.py, index.py)
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather", "Pad",
    "Expand", "Tile", "Transpose", "DepthToSpace", "SpaceToDepth", "Shape", "Size",
    "ConstantOfShape", "Range",
    # linalg, reductions, softmax
    "MatMul", "Gemm", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
    "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax",
    "ArgMin", "Softmax", "LogSoftmax", "Hardmax",
    # added with float64 support from the start
    "GatherElements", "ScatterElements", "Scatter", "ScatterND", "NegativeLogLikelihoodLoss",
    "SoftmaxCrossEntropyLoss", "CumSum", "CumProd", "TopK", "Trilu",
))

# Operator inputs a static-shape compiler needs as build-time constants: they
# decide output shapes or loop bounds. When a model feeds them as graph
# inputs, the rep compiles on first run with their values frozen.
BUILD_TIME_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3),
    "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "Clip": (1, 2), "TopK": (1,),
    "ConstantOfShape": (0,), "Range": (0, 1, 2), "OneHot": (1,), "CumSum": (1,),
    "CumProd": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "Trilu": (1,), "Dropout": (1, 2),
    **{op: (1,) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                           "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                           "ReduceSumSquare")},
}


@dataclass(frozen=True)
class NodeView:
    """What a LIMITS rule sees of one node: attributes, input and output types."""

    op_type: str
    opset: int
    attrs: dict
    names: tuple[str, ...]                         # input names, "" if absent
    inputs: tuple[tuple[int, tuple] | None, ...]   # (elem_type, dims), None if unknown
    outputs: tuple[tuple[int, tuple] | None, ...]


@dataclass(frozen=True)
class Limit:
    """An operator feature we do not support: `applies(node)` says whether a node uses it."""

    op_type: str
    reason: str
    applies: Callable[[NodeView], bool]


def _rank(t) -> int | None:
    return None if t is None else len(t[1])


def _given(n: NodeView, pos: int) -> bool:
    """Whether optional input `pos` is present."""
    return pos < len(n.names) and bool(n.names[pos])


# Operator features that have a converter but are not (yet) implemented.
LIMITS: tuple[Limit, ...] = (
    Limit("MaxPool", "the Indices output", lambda n: len(n.outputs) > 1),
    Limit("BatchNormalization", "training mode",
          lambda n: len(n.outputs) > 1 or bool(n.attrs.get("training_mode", 0))),
    Limit("Dropout", "the training_mode input (random masks)", lambda n: _given(n, 2)),
    Limit("Resize", "antialias", lambda n: bool(n.attrs.get("antialias", 0))),
    Limit("Resize", "coordinate_transformation_mode tf_crop_and_resize",
          lambda n: n.attrs.get("coordinate_transformation_mode") == b"tf_crop_and_resize"),
    # The ONNX spec (and reference) divide by in_len * scale - 1, onnxruntime by
    # out_len - 1: they differ when in_len * scale is not an integer; we follow
    # onnxruntime. Scales fed as an input are not known here, so this also skips
    # integer upsampling cases.
    Limit("Resize", "align_corners with scales (ONNX reference and onnxruntime disagree)",
          lambda n: n.attrs.get("coordinate_transformation_mode") == b"align_corners"
          and _given(n, 2) and not _given(n, 3)),
)


def unsupported(model: onnx.ModelProto, limits: bool = True) -> list[str]:
    """Every reason `model` cannot be compiled, from the declarations above and the
    operator registry; [] if it is supported. limits=False leaves out LIMITS (the
    conformance audit runs such models to check that no limit hides a pass)."""
    from pipeline.ops import onnx_converter

    g = model.graph
    opset = _default_opset(model)
    reasons: list[str] = []
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # a model ONNX cannot infer still gets its operators checked
        inferred = g
    types = {vi.name: vi.type for vi in [*inferred.value_info, *inferred.input,
                                         *inferred.output]}
    for init in g.initializer:
        types[init.name] = helper.make_tensor_type_proto(init.data_type, init.dims)
    for tp in types.values():
        kind = tp.WhichOneof("value")
        if kind is None:  # untyped (ONNX could not infer it): the import will tell
            continue
        if kind != "tensor_type":
            reasons.append(f"{kind.removesuffix('_type')} values")
        elif tp.tensor_type.elem_type not in SUPPORTED_DTYPES:
            reasons.append("dtype " + TensorProto.DataType.Name(tp.tensor_type.elem_type))
    for node in g.node:
        if node.domain not in ("", "ai.onnx"):
            reasons.append(f"domain {node.domain} ({node.op_type})")
            continue
        if node.op_type == "Constant":
            continue
        if onnx_converter(node.op_type, opset) is None:
            reasons.append(f"{node.op_type} (opset {opset}): no converter")
            continue
        if node.op_type not in FLOAT64_OPS and any(
                _elem_type(types.get(name)) == TensorProto.DOUBLE
                for name in (*node.input, *node.output) if name):
            reasons.append(f"{node.op_type}: dtype DOUBLE")
        view = NodeView(node.op_type, opset,
                        {a.name: helper.get_attribute_value(a) for a in node.attribute},
                        tuple(node.input),
                        tuple(_tensor(types.get(i)) if i else None for i in node.input),
                        tuple(_tensor(types.get(o)) for o in node.output if o))
        reasons += [f"{lim.op_type}: {lim.reason}" for lim in LIMITS
                    if limits and lim.op_type == node.op_type and lim.applies(view)]
    return sorted(set(reasons))


def _elem_type(tp) -> int | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    return tp.tensor_type.elem_type


def _tensor(tp) -> tuple[int, tuple] | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField(
            "shape"):
        return None
    dims = tuple(d.dim_value if d.HasField("dim_value") else None
                 for d in tp.tensor_type.shape.dim)
    return tp.tensor_type.elem_type, dims


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


# -- compile and run ------------------------------------------------------------

_LIBS: tempfile.TemporaryDirectory | None = None
_COUNTER = itertools.count()
# Kernel objects by kernel hash, shared by every model this process compiles:
# the conformance suites repeat many kernels (about 2,500 kernels, 940 distinct,
# in the node suite), and a hash names everything that decides the machine code.
_KERNELS: dict[str, bytes] = {}


def _lib_path() -> str:
    """A fresh .so path (dlopen caches libraries by path, so never reuse one)."""
    global _LIBS
    if _LIBS is None:
        _LIBS = tempfile.TemporaryDirectory(prefix="pipeline-backend-")
        atexit.register(_LIBS.cleanup)
    return os.path.join(_LIBS.name, f"model{next(_COUNTER)}.so")


def compile_model(model: onnx.ModelProto, opt_level: int = 3, target: str = TARGET,
                  shape: dict[str, tuple[int, ...]] | None = None,
                  freeze: dict[str, np.ndarray] | None = None):
    """Import, optimise, compile, link and load `model`; returns its GraphModule."""
    from pipeline.driver.build import build
    from pipeline.frontend import from_onnx
    from pipeline.runtime import GraphModule, load_module
    from pipeline.transform import PassContext

    graph, params = from_onnx(model, shape=shape, freeze=freeze)
    with PassContext(opt_level=opt_level):
        factory = build(graph, target=target, params=params, kernel_cache=_KERNELS)
    path = factory.export_library(_lib_path())
    module = load_module(path)
    os.unlink(path)  # the mapping stays valid; nothing else reads the file
    return GraphModule(module["default"]())


class PipelineRep(BackendRep):
    """A prepared model: compiled once if its inputs are static, else per distinct
    (input shapes, build-time input values) seen by `run`."""

    def __init__(self, model: onnx.ModelProto, opt_level: int = 3, target: str = TARGET):
        self.model = model
        self.opt_level = opt_level
        self.target = target
        inits = {i.name for i in model.graph.initializer}
        self.inputs = [vi for vi in model.graph.input if vi.name not in inits]
        self.input_names = [vi.name for vi in self.inputs]
        self.frozen = _build_time_inputs(model.graph, set(self.input_names))
        self.static = not self.frozen and all(
            d.HasField("dim_value") for vi in self.inputs
            for d in vi.type.tensor_type.shape.dim)
        self._cache: dict[tuple, Any] = {}
        if self.static:
            self._cache[()] = compile_model(model, opt_level, target)

    def _module(self, feeds: dict[str, np.ndarray]):
        if self.static:
            return self._cache[()]
        shapes = tuple((n, feeds[n].shape) for n in self.input_names if n not in self.frozen)
        values = tuple((n, feeds[n].dtype.str, feeds[n].shape, feeds[n].tobytes())
                       for n in self.input_names if n in self.frozen)
        key = (shapes, values)
        if key not in self._cache:
            self._cache[key] = compile_model(
                self.model, self.opt_level, self.target, shape=dict(shapes),
                freeze={n: feeds[n] for n in self.frozen})
        return self._cache[key]

    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        """Outputs in graph-output order; `inputs` is a list in graph-input order,
        a dict by name, or a single array."""
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) > len(self.input_names):
                raise ValueError(f"{len(inputs)} inputs given; the model's inputs are "
                                 f"{self.input_names}")
            feeds = {n: np.asarray(v) for n, v in zip(self.input_names, inputs, strict=False)}
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ValueError(f"missing inputs {missing}; the model's inputs are "
                             f"{self.input_names}")
        gmod = self._module(feeds)
        gmod.run(**{n: feeds[n] for n in self.input_names if n not in self.frozen})
        return [gmod.get_output(k) for k in range(gmod.get_num_outputs())]


def _build_time_inputs(graph: onnx.GraphProto, input_names: set[str]) -> set[str]:
    """Graph inputs whose values a BUILD_TIME_INPUTS position depends on (directly, or
    through the nodes computing it; Shape and Size read only their input's shape)."""
    needed = {node.input[pos] for node in graph.node
              for pos in BUILD_TIME_INPUTS.get(node.op_type, ())
              if pos < len(node.input) and node.input[pos]}
    producer = {out: node for node in graph.node for out in node.output}
    todo = list(needed)
    while todo:
        node = producer.get(todo.pop())
        if node is None or node.op_type in ("Shape", "Size"):
            continue
        for name in node.input:
            if name and name not in needed:
                needed.add(name)
                todo.append(name)
    return needed & input_names


class PipelineBackend(Backend):
    """onnx.backend.base.Backend over the compiler; device "CPU" only.

    Keyword options of prepare/run_model/run_node: opt_level (0..3, default 3)
    and target (default "llvm -mcpu=native").
    """

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device) and not unsupported(model)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PipelineRep:
        if not cls.supports_device(device):
            raise ValueError(f"unsupported device {device!r}: only CPU is")
        return PipelineRep(model, int(kwargs.get("opt_level", 3)), kwargs.get("target", TARGET))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> list[np.ndarray]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> list[np.ndarray]:
        """Run one node on `inputs` (a list matching node.input, or a dict)."""
        if isinstance(inputs, dict):
            arrays = [np.asarray(inputs[n]) for n in node.input if n]
        else:
            arrays = [np.asarray(v) for v in inputs]
        names = [n for n in node.input if n]
        graph_inputs = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, arrays, strict=True)]
        graph_outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(
            helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs),
            opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, dict(zip(names, arrays, strict=True)), device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().split(":")[0] == "CPU"


prepare = PipelineBackend.prepare
run_model = PipelineBackend.run_model
run_node = PipelineBackend.run_node
supports_device = PipelineBackend.supports_device
is_compatible = PipelineBackend.is_compatible
