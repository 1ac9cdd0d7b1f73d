"""Every registered operator, driven by the registry (pipeline.ops.OPS, ONNX_CONVERTERS).

- Each graph op with a numpy version is compiled on its own `sample` (declared
  with the op: small valid inputs and attributes) through the real pipeline
  (build at opt_level 0, so the op is its own kernel; export_library, dlopen,
  graph executor) and compared with that numpy version, in float32 and, where
  the op declares it, float64. Adding an operator with `numpy` and `sample`
  adds it here.
- Each ONNX converter's declarations (emits, build_time_inputs) are checked
  against the registry and the ONNX schemas, and the backend's "no converter"
  verdict against the registry for every ONNX operator.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.frontend.onnx import ONNX_CONVERTERS, onnx_converter
from pipeline.ir.graph import Graph, Node, TensorType
from pipeline.ops import OPS, infer_types
from tests.support.compare import TARGET, lib_path

# Graph ops without a numpy version, and why: their kernels are checked against
# onnxruntime / onnx.reference through their ONNX operators (test_ops_*.py, the
# conformance suites), or, for the blocked and packed variants AlterOpLayout
# makes, through the plain op they replace (test_layout.py).
NO_NUMPY = {
    **dict.fromkeys(("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                     "conv_transpose3d"), "convolution: not cheap in numpy"),
    **dict.fromkeys(("conv2d_nchwc", "conv2d_pointwise", "conv2d_winograd_nchwc",
                     "depthwise_conv2d_nchwc", "dense_packed", "max_pool2d_nchwc",
                     "avg_pool2d_nchwc", "global_avg_pool_nchwc", "global_max_pool_nchwc"),
                    "blocked/packed layout variant"),
    **dict.fromkeys(("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d",
                     "avg_pool3d", "lp_pool1d", "lp_pool2d", "lp_pool3d"),
                    "windowed pooling with pads, ceil_mode, count_include_pad: not cheap"),
    **dict.fromkeys(("batch_norm", "layer_norm", "rms_norm", "instance_norm", "group_norm",
                     "lrn"), "normalisation: float32 only, checked against onnxruntime"),
    **dict.fromkeys(("nll_loss", "scatter_elements", "scatter_nd"),
                    "reductions over duplicate indices: not cheap"),
    **dict.fromkeys(("conv2d_integer", "matmul_integer"),
                    "int8 products: checked through ConvInteger, MatMulInteger, QLinearConv, "
                    "QLinearMatMul and QGemm (node suite, test_quant.py)"),
    **dict.fromkeys(("qconv2d_nchwc", "qdepthwise_conv2d_nchwc", "qpad_nchwc",
                     "qdense_packed"),
                    "blocked int8 layout variant"),
    "rnn_sequence": "a whole recurrent layer: checked against onnxruntime (test_ops_recurrent.py)",
    "grid_sample": "per-point taps under three padding rules: checked against onnx.reference "
                   "(node suite, test_ops_grid_sample.py)",
}
TOLERANCE = {"float32": (2e-5, 2e-6), "float64": (1e-12, 1e-13)}


def test_every_op_has_numpy_and_sample_or_a_reason():
    with_numpy = {name for name, op in OPS.items() if op.numpy is not None}
    assert set(NO_NUMPY) == set(OPS) - with_numpy, "update NO_NUMPY or add numpy versions"
    assert not [name for name in with_numpy if OPS[name].sample is None], \
        "ops with a numpy version need a sample (register(..., sample=...))"


@pytest.fixture(scope="session")
def kernel_cache() -> dict[str, bytes]:
    return {}


def _run(graph: Graph, inputs: dict[str, np.ndarray], cache: dict) -> list[np.ndarray]:
    from pipeline import build
    from pipeline.runtime import GraphModule, load_module
    from pipeline.runtime.vm import VirtualMachine
    from pipeline.transform import PassContext
    from pipeline.vm.program import has_control_flow

    vm = has_control_flow(graph)  # an output shape that depends on values (ops/dynamic.py)
    with PassContext(opt_level=0):  # no fusion or layout change: the op's own kernel
        factory = build(graph, target=TARGET, params={}, kernel_cache=cache,
                        executor="vm" if vm else "graph")
    if vm:
        return VirtualMachine(factory.export_library(lib_path())).run(**inputs)
    gmod = GraphModule(load_module(factory.export_library(lib_path()))["default"]())
    gmod.run(**inputs)
    return [gmod.get_output(k) for k in range(gmod.get_num_outputs())]


CASES = [pytest.param(name, dtype, id=f"{name}-{dtype}")
         for name, op in OPS.items() if op.numpy is not None
         for dtype in (("float32", "float64") if op.float64 else ("float32",))]


@pytest.mark.parametrize("name,dtype", CASES)
def test_kernel_matches_numpy(name: str, dtype: str, kernel_cache):
    op = OPS[name]
    arrays, attrs = op.sample(np.random.default_rng(0), dtype)
    names = [f"x{k}" for k in range(len(arrays))]
    types = {n: TensorType(a.shape, str(a.dtype)) for n, a in zip(names, arrays, strict=True)}
    want = op.numpy(arrays, Node.make(name, name, names, ("y",), **attrs))
    outputs = [f"y{k}" for k in range(len(want))]
    node = Node.make(name, name, names, outputs, **attrs)
    types.update(zip(outputs, infer_types(node, [types[n] for n in names]), strict=True))
    graph = Graph(inputs=tuple(names), params=(), outputs=tuple(outputs), nodes=(node,),
                  types=types)
    graph.verify(infer_types)
    got = _run(graph, dict(zip(names, arrays, strict=True)), kernel_cache)
    rtol, atol = TOLERANCE[dtype]
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{name} ({dtype})")


# -- ONNX converter declarations ------------------------------------------------------

def _schemas(op_type: str) -> list:
    """The ONNX schema versions of `op_type` ("Name" in the default domain or
    "domain.Name", ai.onnx.preview.FlexAttention), oldest first."""
    domain, _, name = op_type.rpartition(".")
    return sorted((s for s in onnx.defs.get_all_schemas_with_history()
                   if s.name == name and s.domain == domain), key=lambda s: s.since_version)


def test_converter_declarations_match_registry_and_onnx_schemas():
    """Every converter names an ONNX operator, emits only registered graph ops, its
    build-time input positions exist in every schema version it converts and the
    subgraphs it inlines are graph attributes of them."""
    for op_type, converters in ONNX_CONVERTERS.items():
        if op_type.startswith("com.microsoft."):
            # onnxruntime's contrib operators (ops/quant_ms.py): onnx has no schema of
            # them; their inputs are checked against onnxruntime in test_quant.py.
            assert all(set(c.emits) <= set(OPS) for c in converters), op_type
            continue
        schemas = _schemas(op_type)
        assert schemas, f"{op_type}: not an ONNX operator"
        for k, conv in enumerate(converters):
            where = f"{op_type} converter (opset {conv.since})"
            assert set(conv.emits) <= set(OPS), f"{where}: emits unknown {conv.emits}"
            upto = converters[k + 1].since if k + 1 < len(converters) else 10 ** 6
            covered = [s for s in schemas if s.since_version < upto]
            # The schema in force at `since`, and every later one this converter handles.
            covered = [s for s in covered if s.since_version >= conv.since] or covered[-1:]
            assert covered, f"{where}: before the operator's first ONNX version"
            if conv.build_time_inputs:
                widest = max(len(s.inputs) for s in covered)
                variadic = any(s.inputs and s.inputs[-1].option ==
                               onnx.defs.OpSchema.FormalParameterOption.Variadic
                               for s in covered)
                assert variadic or max(conv.build_time_inputs) < widest, \
                    f"{where}: build_time_inputs {conv.build_time_inputs}, {widest} inputs"
            for lim in conv.limits:
                assert lim.reason and callable(lim.applies), where
            assert all(s.attributes[a].type == onnx.defs.OpSchema.AttrType.GRAPH
                       for s in covered for a in conv.subgraphs), f"{where}: {conv.subgraphs}"


def test_backend_reports_no_converter_exactly_for_ops_the_registry_lacks():
    """backend.unsupported() on a one-node model of each ONNX operator (latest opset):
    'no converter' iff the registry has none at that opset (control flow and the
    sequence/optional ops have their own converters, for the VM: CONTROL_CONVERTERS)."""
    from pipeline.frontend.onnx.registry import CONTROL_CONVERTERS
    from pipeline.tools import backend

    opset = onnx.defs.onnx_opset_version()
    for op_type in sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""}):
        node = helper.make_node(op_type, ["x"], ["y"])
        model = helper.make_model(helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_empty_tensor_value_info("y")]),
            opset_imports=[helper.make_opsetid("", opset)])
        reported = f"{op_type} (opset {opset}): no converter" in backend.unsupported(model)
        missing = (op_type != "Constant" and op_type not in CONTROL_CONVERTERS
                   and onnx_converter(op_type, opset) is None)
        assert reported == missing, op_type


def test_float64_support_follows_the_emitted_ops():
    """A converter takes float64 iff every graph op it emits lowers float64: the backend
    skips MaxPool on DOUBLE, runs LpNormalization and MeanVarianceNormalization (their
    decompositions are float64-capable) and matches numpy's formulas of the ONNX spec."""
    from pipeline.tools import backend

    def model(op_type, **attrs):
        return helper.make_model(helper.make_graph(
            [helper.make_node(op_type, ["x"], ["y"], **attrs)], "g",
            [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3, 4, 5])],
            [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)]),
            opset_imports=[helper.make_opsetid("", 18)])

    assert not onnx_converter("MaxPool", 18).float64
    assert backend.unsupported(model("MaxPool", kernel_shape=[2, 2])) == [
        "MaxPool: dtype DOUBLE"]
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5))
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True))
    cases = [(model("MeanVarianceNormalization"), (x - mean) / (std + 1e-9)),
             (model("LpNormalization", axis=1, p=2),
              x / np.sqrt((x * x).sum(axis=1, keepdims=True))),
             (model("LpNormalization", axis=-1, p=1), x / np.abs(x).sum(axis=-1, keepdims=True))]
    for m, want in cases:
        assert backend.unsupported(m) == []
        (got,) = backend.run_model(m, [x], opt_level=0)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_every_op_has_one_lowering_of_its_kind():
    """Each registered op is lowered (pipeline/kernels): elementwise ops by a scalar
    function, the others by a lower function; no lowering lacks a definition."""
    from pipeline.kernels import LOWERINGS
    from pipeline.ops import OpKind

    assert set(LOWERINGS) == set(OPS)
    wrong = [name for name, op in OPS.items()
             if (LOWERINGS[name].scalar is not None) != (op.kind == OpKind.ELEMENTWISE)]
    assert not wrong, wrong
    assert all(lw.module.startswith("pipeline.kernels.") for lw in LOWERINGS.values())
