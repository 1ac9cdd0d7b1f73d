"""float16, the narrow integers (int8, uint8, int16, uint16, uint32) and uint64 end to end:
ONNX import, params, kernels (narrow storage, wider compute: pipeline/dsl/builder.py),
the C executor; against onnx.reference, exactly (a float16 op computed in float32
and rounded once is the IEEE half result; integers wrap). Then what stays out."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

from pipeline.runtime.params import load_params, save_params
from tests.support import REPO
from tests.support.compare import TARGET, lib_path, run_ours
from tests.support.doit_runner import doit
from tests.support.onnx_models import make_model


def _mixed_dtypes_model() -> onnx.ModelProto:
    """Casts into and out of float16/int8/uint8, arithmetic in each, fusable chains
    (Add -> Mul in float16, Add -> Cast in int8: each step must round or wrap) and
    float16 / uint8 weights."""
    t = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=T.FLOAT16),
        helper.make_node("Add", ["h", "w16"], ["s"]),
        helper.make_node("Mul", ["s", "s"], ["m"]),
        helper.make_node("Cast", ["m"], ["y"], to=T.FLOAT),
        helper.make_node("Cast", ["x"], ["i8"], to=T.INT8),
        helper.make_node("Add", ["i8", "i8"], ["i8s"]),
        helper.make_node("Cast", ["i8s"], ["fi"], to=T.FLOAT),
        helper.make_node("Cast", ["x"], ["u8"], to=T.UINT8),
        helper.make_node("Add", ["u8", "u8"], ["u8s"]),
        helper.make_node("Div", ["u8s", "d8"], ["u8d"]),
        helper.make_node("Max", ["u8d", "u8"], ["u8m"]),
        # int16 / uint16 compute in i32 and uint32 in i64: products wrap, uint16 0 - x
        # wraps to 65536 - x, uint32 products above 2**31 stay positive.
        helper.make_node("Cast", ["x"], ["i16"], to=T.INT16),
        helper.make_node("Mul", ["i16", "i16"], ["i16sq"]),
        helper.make_node("Mul", ["i16sq", "i16"], ["i16cube"]),
        helper.make_node("Cast", ["u8"], ["u16"], to=T.UINT16),
        helper.make_node("Sub", ["zero16", "u16"], ["u16neg"]),
        helper.make_node("Cast", ["u16neg"], ["u32"], to=T.UINT32),
        helper.make_node("Mul", ["u32", "u32"], ["u32sq"]),
        helper.make_node("Less", ["u32sq", "u32"], ["u32lt"]),
    ]
    rng = np.random.default_rng(0)
    inits = {"w16": rng.standard_normal(33).astype(np.float16),
             "d8": np.array([3, 7, 200], np.uint8).repeat(11),
             "zero16": np.zeros(1, np.uint16)}
    outs = [("y", T.FLOAT), ("m", T.FLOAT16), ("i8s", T.INT8), ("fi", T.FLOAT),
            ("u8s", T.UINT8), ("u8m", T.UINT8), ("i16cube", T.INT16),
            ("u32sq", T.UINT32), ("u32lt", T.BOOL)]
    return make_model(nodes, [t("x", T.FLOAT, [4, 33])], [t(n, e, None) for n, e in outs],
                      inits, opset=17)


@pytest.mark.parametrize("opt_level", [0, 3])
def test_narrow_dtypes_match_reference_exactly(opt_level):
    model = _mixed_dtypes_model()
    # Whole numbers in int8 range plus fractions: casts truncate, sums overflow and wrap.
    x = np.random.default_rng(1).uniform(-127, 127, (4, 33)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x}, opt_level=opt_level)
    names = [o.name for o in model.graph.output]
    for name, g, w in zip(names, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_array_equal(g, w, err_msg=name)


def _uint64_model() -> onnx.ModelProto:
    """The ops whose uint64 result differs from int64's (division, compares, max/min,
    TopK, conversions, a right shift), on values above 2**63 where a signed instruction
    would read them as negative."""
    t = helper.make_tensor_value_info
    nodes = [helper.make_node("Div", ["a", "b"], ["div"]),
             helper.make_node("Mod", ["a", "b"], ["mod"]),
             helper.make_node("Less", ["a", "b"], ["less"]),
             helper.make_node("GreaterOrEqual", ["a", "b"], ["ge"]),
             helper.make_node("Max", ["a", "b"], ["max"]),
             helper.make_node("Min", ["a", "b"], ["min"]),
             helper.make_node("TopK", ["a", "k"], ["top", "top_i"]),
             helper.make_node("BitShift", ["a", "s"], ["shr"], direction="RIGHT"),
             helper.make_node("Cast", ["a"], ["a_f32"], to=T.FLOAT),
             helper.make_node("Cast", ["a"], ["a_f64"], to=T.DOUBLE),
             helper.make_node("Cast", ["f"], ["f_u64"], to=T.UINT64),
             helper.make_node("Pow", ["f", "b"], ["pow"])]
    outs = [("div", T.UINT64), ("mod", T.UINT64), ("less", T.BOOL), ("ge", T.BOOL),
            ("max", T.UINT64), ("min", T.UINT64), ("top", T.UINT64), ("top_i", T.INT64),
            ("shr", T.UINT64), ("a_f32", T.FLOAT), ("a_f64", T.DOUBLE),
            ("f_u64", T.UINT64), ("pow", T.FLOAT)]
    inits = {"k": np.array([3], np.int64), "s": np.array([1, 5, 63, 0, 2, 7, 1, 60], np.uint64)}
    return make_model(nodes, [t("a", T.UINT64, [8]), t("b", T.UINT64, [8]),
                              t("f", T.FLOAT, [8])],
                      [t(n, e, None) for n, e in outs], inits, opset=18)


@pytest.mark.parametrize("opt_level,target", [(0, TARGET), (3, TARGET), (3, "c")])
def test_uint64_above_int64_range_matches_reference_exactly(opt_level, target):
    """LLVM and the c target (its C holds integers unsigned: udiv, icmp ult, uitofp...)."""
    model = _uint64_model()
    top = np.uint64(2**64 - 1)
    a = np.array([top, 2**63, 2**63 + 12345, 7, 2**63 - 1, 100, 2**64 - 8, 3], np.uint64)
    b = np.array([3, 2**63 + 1, 10, 2**63, 1, 2**62, 2**64 - 9, 5], np.uint64)
    f = np.array([1.5e19, 9.3e18, 0.5, 1e10, 0.75, 1.0, 1.8e19, 2.0], np.float32)
    feeds = {"a": a, "b": b, "f": f}
    want = ReferenceEvaluator(model).run(None, feeds)
    got = run_ours(model, feeds, opt_level=opt_level, target=target)
    for out, g, w in zip(model.graph.output, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, out.name
        np.testing.assert_array_equal(g, w, err_msg=out.name)


_CAST_TO = [T.FLOAT16, T.DOUBLE, T.INT8, T.UINT8, T.INT16, T.UINT16, T.INT32, T.UINT32,
            T.INT64, T.BOOL]


def test_cast_to_and_from_every_dtype_matches_reference_exactly():
    """float32 values (fractions truncate toward zero, float16 rounds to nearest even,
    integers beyond a narrow type keep their low bits, as numpy's casts through a
    wider integer do) cast to each dtype, and each of those back to float32 and, with
    CastLike, to float16."""
    t = helper.make_tensor_value_info
    nodes, outs = [], []
    for to in _CAST_TO:
        name = T.DataType.Name(to).lower()
        nodes += [helper.make_node("Cast", ["x"], [name], to=to),
                  helper.make_node("Cast", [name], [f"{name}_f32"], to=T.FLOAT),
                  helper.make_node("CastLike", [name, "like16"], [f"{name}_f16"])]
        outs += [t(name, to, None), t(f"{name}_f32", T.FLOAT, None),
                 t(f"{name}_f16", T.FLOAT16, None)]
    model = make_model(nodes, [t("x", T.FLOAT, [3, 24])], outs,
                       {"like16": np.zeros(1, np.float16)}, opset=19)
    x = np.concatenate([np.linspace(0, 127.9, 24), np.linspace(-0.9, -126.5, 24),
                        np.array([0.1, 1 / 3, 2049, 2051, 100.5, 127.99, 0.0, -0.0, 1e-8,
                                  65519, 3e-5, -6e-8] * 2)]).astype(np.float32).reshape(3, 24)
    x[1] = np.where(np.arange(24) % 2, x[1], -x[1])  # sign-alternating row
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for level in (0, 3):
        got = run_ours(model, {"x": x}, opt_level=level)
        for out, g, w in zip(outs, got, want, strict=True):
            assert g.dtype == w.dtype, out.name
            np.testing.assert_array_equal(g, w, err_msg=f"{out.name} at opt_level {level}")


def test_params_keep_narrow_dtypes_with_tvm_type_codes():
    """float16 is DLPack (float=2, 16 bits), int8 (int=0, 8), uint8 (uint=1, 8)."""
    arrays = {"h": np.array([1.5, -65504, np.inf], np.float16),
              "i": np.array([-128, 127], np.int8), "u": np.arange(250, 256, dtype=np.uint8)}
    raw = save_params(arrays)
    back = load_params(raw)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype
        np.testing.assert_array_equal(back[name], a)
    # The (code, bits, lanes) of each array header, in sorted name order.
    headers = [raw[k + 28:k + 32] for k in range(len(raw) - 8)
               if raw[k:k + 8] == (0xDD5E40F096B4A13F).to_bytes(8, "little")]
    assert headers == [bytes([2, 16, 1, 0]), bytes([0, 8, 1, 0]), bytes([1, 8, 1, 0])]


def _float16_ops_model() -> onnx.ModelProto:
    """Operators whose kernels are not plain elementwise loops, on one float16 input:
    softmax across columns, resize, reductions, normalisation, scans, indexing."""
    t = helper.make_tensor_value_info
    rng = np.random.default_rng(2)
    inits = {"g": rng.uniform(0.5, 1.5, 8).astype(np.float16),
             "b": rng.uniform(-0.2, 0.2, 8).astype(np.float16),
             "idx": np.array([2, 0, 5], np.int64), "axis": np.array(1, np.int64),
             "scales": np.array([1, 1, 2, 2], np.float32), "k": np.array([2], np.int64)}
    nodes = [helper.make_node("Softmax", ["x"], ["softmax"], axis=1),
             helper.make_node("Resize", ["x", "", "scales"], ["resize"], mode="linear"),
             helper.make_node("ReduceMean", ["x"], ["mean"], axes=[2, 3]),
             helper.make_node("ReduceMax", ["x"], ["max"], axes=[1]),
             helper.make_node("InstanceNormalization", ["x", "g", "b"], ["norm"]),
             helper.make_node("CumSum", ["x", "axis"], ["cumsum"]),
             helper.make_node("TopK", ["x", "k"], ["topk", "topk_i"]),
             helper.make_node("Gather", ["x", "idx"], ["gather"], axis=3),
             helper.make_node("Transpose", ["x"], ["transpose"], perm=[0, 2, 3, 1]),
             helper.make_node("Erf", ["x"], ["erf"])]
    outs = [o for n in nodes for o in n.output]
    return make_model(nodes, [t("x", T.FLOAT16, [2, 8, 6, 6])],
                      [helper.make_empty_tensor_value_info(o) for o in outs], inits,
                      opset=17)


def test_float16_operators_match_reference_to_half_precision():
    """Kernels compute in float32 and round once where ONNX's float16 reference rounds
    at every step: within 2e-3 relative (two half ulps) plus 1e-3 absolute."""
    model = _float16_ops_model()
    x = np.random.default_rng(3).standard_normal((2, 8, 6, 6)).astype(np.float16)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = run_ours(model, {"x": x}, opt_level=3)
    for out, g, w in zip(model.graph.output, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, out.name
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-3,
                                   atol=1e-3, err_msg=out.name)


@pytest.mark.slow
def test_resnet18_fp16_matches_onnxruntime_within_its_config_tolerance():
    """The deploy config's float16 ResNet-18, built as `doit build` builds it: every
    convolution a float16 kernel (activations, weights), the output within the
    tolerance configs/deploy.yaml states of onnxruntime running the same file."""
    pytest.importorskip("onnxruntime")
    import models
    import pipeline
    from pipeline.runtime import GraphModule, load_module
    from pipeline.tasks.config import load_config
    from pipeline.tools.validate import compare, random_inputs, reference_outputs

    entry = load_config(REPO / "configs" / "deploy.yaml") \
        .models["resnet18_fp16"]
    model = models.build(entry.generator)
    graph, params = pipeline.frontend.from_onnx(model)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params)
    convs = [spec for spec in factory.kernels if spec.ops[0].op.startswith("conv2d")]
    assert len(convs) >= 10
    # float16 activations in and out of every conv; float16 weights, except Winograd's
    # transformed weights, which AlterOpLayout keeps in float32
    assert all(spec.params[0].dtype == spec.params[-1].dtype == "float16" for spec in convs)
    assert all(t.dtype == "float16" for spec in convs if "winograd" not in spec.ops[0].op
               for t in spec.params)
    gmod = GraphModule(load_module(factory.export_library(lib_path()))["default"]())
    feeds = random_inputs(model, {}, entry.validate.seed)
    gmod.run(**feeds)
    ours = [gmod.get_output(0)]
    refs = reference_outputs(model, feeds, entry.validate.reference)
    assert entry.validate.reference == "onnxruntime" and ours[0].dtype == np.float32
    (row,) = compare(["output"], ours, refs, entry.validate.rtol, entry.validate.atol)
    assert row["passed"], row


# -- what stays out: one line naming the tensor or node, a non-zero exit from doit --

def _graph_model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "out_of_scope", inputs, outputs,
                                                list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def _out_of_scope_models() -> dict[str, tuple[onnx.ModelProto, str]]:
    """name -> (model, the error line's distinctive part)."""
    t = helper.make_tensor_value_info
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "body", [],
                             [t("z", T.FLOAT, [2])])
    return {
        "u64in": (_graph_model([helper.make_node("ArgMax", ["x"], ["y"], name="up")],
                               [t("x", T.UINT64, [2])], [t("y", T.INT64, [1])]),
                  "node 'up' (argmax): uint64 input is not supported"),
        "strinit": (_graph_model(
            [helper.make_node("Cast", ["k"], ["k32"], to=T.FLOAT, name="widen"),
             helper.make_node("Add", ["x", "k32"], ["y"], name="add")],
            [t("x", T.FLOAT, [2])], [t("y", T.FLOAT, [2])],
            [helper.make_tensor("k", T.STRING, [2], [b"1", b"2"])]),
            "initializer 'k' (used by node 'widen' (Cast)) has unsupported element type STRING"),
        "strcast": (_graph_model([helper.make_node("Cast", ["x"], ["y"], to=T.STRING,
                                                   name="to_str")],
                                 [t("x", T.FLOAT, [2])], [t("y", T.STRING, [2])]),
                    "node 'to_str' (Cast): cast to STRING is not supported"),
        "cond": (_graph_model([helper.make_node("If", ["c"], ["y"], name="branch",
                                                then_branch=body, else_branch=body)],
                              [t("c", T.BOOL, []), t("x", T.FLOAT, [2])],
                              [t("y", T.FLOAT, [2])]),
                 "If (control flow: subgraphs are not compiled) at node(s) branch"),
    }


@pytest.mark.parametrize("op", ["Loop", "Scan"])
def test_loop_and_scan_are_named_as_control_flow(op):
    import pipeline
    from pipeline.errors import UnsupportedOperatorError

    t = helper.make_tensor_value_info
    body = helper.make_graph([helper.make_node("Identity", ["s"], ["s2"])], "body",
                             [t("s", T.FLOAT, [2])], [t("s2", T.FLOAT, [2])])
    inputs = ["", "", "x"] if op == "Loop" else ["x"]
    attrs = {"num_scan_inputs": 0} if op == "Scan" else {}
    model = _graph_model([helper.make_node(op, inputs, ["y"], name="again", body=body,
                                           **attrs)],
                         [t("x", T.FLOAT, [2])], [t("y", T.FLOAT, [2])])
    with pytest.raises(UnsupportedOperatorError,
                       match=rf"{op} \(control flow: subgraphs are not compiled\) at node\(s\) "
                             r"again\."):
        pipeline.frontend.from_onnx(model)


def test_out_of_scope_types_and_control_flow_fail_doit_with_one_line_each(tmp_path):
    """uint64 on an op that would compare it signed, a string initializer, a Cast to
    string and If, each its own model of one
    config: `doit -c build`
    exits non-zero, with one error line per model naming the tensor or node."""
    cases = _out_of_scope_models()
    lines = ["models:"]
    for name, (model, _) in cases.items():
        onnx.save(model, str(tmp_path / f"{name}.onnx"))
        lines.append(f"  {name}: {{path: {name}.onnx}}")
    lines.append('targets:\n  llvm: {target: "llvm -mcpu=native", opt_level: 0}')
    (tmp_path / "matrix.yaml").write_text("\n".join(lines) + "\n")
    code, _, out = doit(tmp_path, "-c", "build", "config=matrix.yaml", timeout=600)
    assert code != 0 and "Traceback" not in out, out
    for name, (_, message) in cases.items():
        hits = [line for line in out.splitlines() if message in line]
        assert len(hits) == 1 and f"{name}.onnx" in hits[0], (name, out)
