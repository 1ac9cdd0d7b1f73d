"""Operators whose output shape depends on values, in the VM (docs/vm.md): NonZero,
NonMaxSuppression, Unique, TopK with a runtime k, Range / ConstantOfShape / Expand
with runtime shape inputs. Each model is built once with pipeline.build(...,
executor="vm") and run at several value patterns (empty results included) against
onnx.reference; a detection-style graph (NMS -> Gather of the selected boxes) against
onnxruntime, through the Python VM and through pipeline-run."""

from __future__ import annotations

import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import pipeline
from pipeline.errors import UnsupportedOperatorError
from pipeline.link.runtime_c import build_pipeline_run
from pipeline.runtime.vm import VirtualMachine, VMError

TARGET = "llvm -mcpu=native"
t = helper.make_tensor_value_info
RNG = np.random.default_rng(7)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    model = helper.make_model(helper.make_graph(nodes, "dd", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _library(model, tmp_path, name="dd") -> str:
    graph, params = pipeline.frontend.from_onnx(model)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params, executor="vm")
    return str(factory.export_library(tmp_path / f"{name}.so"))


def _check(model, tmp_path, feeds: list[dict], reference=None) -> VirtualMachine:
    """Build once, run every feed; outputs equal the reference's (onnx.reference by
    default), shapes included."""
    vm = VirtualMachine(_library(model, tmp_path))
    reference = reference or ReferenceEvaluator(model).run
    for feed in feeds:
        want = reference(None, feed)
        got = vm.run(**feed)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape, (g.shape, w.shape, feed)
            assert g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    return vm


def test_nonzero_at_several_patterns(tmp_path):
    model = _model([helper.make_node("NonZero", ["x"], ["y"])], [t("x", T.FLOAT, [3, 4, 2])],
                   [t("y", T.INT64, None)])
    x = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    _check(model, tmp_path, [{"x": x * (x > 0.5)}, {"x": np.zeros_like(x)},
                             {"x": np.ones_like(x)}, {"x": x * (x > 1.5)}])


def test_nonzero_of_bool_and_int(tmp_path):
    model = _model([helper.make_node("NonZero", ["b"], ["y"]),
                    helper.make_node("NonZero", ["i"], ["z"])],
                   [t("b", T.BOOL, [5]), t("i", T.INT32, [2, 3])],
                   [t("y", T.INT64, None), t("z", T.INT64, None)])
    _check(model, tmp_path, [{"b": np.array([1, 0, 0, 1, 1], bool),
                              "i": np.array([[0, 3, 0], [-1, 0, 0]], np.int32)},
                             {"b": np.zeros(5, bool), "i": np.zeros((2, 3), np.int32)}])


def _unique_model(sorted_: int, dtype=T.FLOAT, shape=(10,)):
    node = helper.make_node("Unique", ["x"], ["y", "indices", "inverse", "counts"],
                            sorted=sorted_)
    return _model([node], [t("x", dtype, list(shape))],
                  [t(n, T.FLOAT if n == "y" and dtype == T.FLOAT else T.INT64, None)
                   for n in ("y", "indices", "inverse", "counts")])


@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_four_outputs(tmp_path, sorted_):
    model = _unique_model(sorted_)
    feeds = [{"x": RNG.integers(0, 4, 10).astype(np.float32)},
             {"x": np.full(10, 2.5, np.float32)},
             {"x": np.arange(10, 0, -1).astype(np.float32)},
             {"x": RNG.standard_normal(10).astype(np.float32)}]
    _check(model, tmp_path, feeds)


def test_unique_int64_2d(tmp_path):
    model = _unique_model(1, T.INT64, (3, 4))
    _check(model, tmp_path, [{"x": RNG.integers(-3, 3, (3, 4))},
                             {"x": np.zeros((3, 4), np.int64)}])


@pytest.mark.parametrize("axis,largest", [(1, 1), (0, 0), (-1, 0)])
def test_topk_with_a_runtime_k(tmp_path, axis, largest):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    model = _model([node], [t("x", T.FLOAT, [4, 6]), t("k", T.INT64, [1])],
                   [t("v", T.FLOAT, None), t("i", T.INT64, None)])
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    length = x.shape[axis]
    _check(model, tmp_path, [{"x": x, "k": np.array([k], np.int64)}
                             for k in (1, length, 0, 3)])


def test_topk_k_above_the_axis_is_one_error(tmp_path):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    model = _model([node], [t("x", T.FLOAT, [2, 3]), t("k", T.INT64, [1])],
                   [t("v", T.FLOAT, None), t("i", T.INT64, None)])
    vm = VirtualMachine(_library(model, tmp_path))
    with pytest.raises(VMError, match=r"^kernel topk_\w+ returned an error \(1\): an "
                                      r"input value out of its range$"):
        vm.run(x=np.zeros((2, 3), np.float32), k=np.array([4], np.int64))


def _nms_model(center=0, n_boxes=6, classes=2):
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thr"],
                            ["selected"], center_point_box=center)
    return _model([node], [t("boxes", T.FLOAT, [2, n_boxes, 4]),
                           t("scores", T.FLOAT, [2, classes, n_boxes]),
                           t("max_out", T.INT64, [1]), t("iou", T.FLOAT, [1]),
                           t("thr", T.FLOAT, [1])], [t("selected", T.INT64, None)])


def _boxes(n, batch=2):
    corner = RNG.uniform(0, 4, (batch, n, 2)).astype(np.float32)
    size = RNG.uniform(0.5, 2, (batch, n, 2)).astype(np.float32)
    return np.concatenate([corner, corner + size], axis=2)


@pytest.mark.parametrize("center", [0, 1])
def test_nms_at_several_thresholds(tmp_path, center):
    model = _nms_model(center)
    boxes = _boxes(6)
    scores = RNG.uniform(0, 1, (2, 2, 6)).astype(np.float32)

    def feed(max_out, iou, thr):
        return {"boxes": boxes, "scores": scores, "max_out": np.array([max_out], np.int64),
                "iou": np.array([iou], np.float32), "thr": np.array([thr], np.float32)}

    _check(model, tmp_path, [feed(3, 0.3, 0.2), feed(6, 0.0, 0.0), feed(6, 1.0, -1.0),
                             feed(2, 0.5, 0.99), feed(0, 0.5, 0.0), feed(6, 0.5, 2.0)])


def test_range_constant_of_shape_expand_with_runtime_shapes(tmp_path):
    nodes = [helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
             helper.make_node("ConstantOfShape", ["shape"], ["c"],
                              value=helper.make_tensor("v", T.INT32, [1], [7])),
             helper.make_node("Expand", ["x", "shape"], ["e"])]
    model = _model(nodes, [t("start", T.FLOAT, []), t("limit", T.FLOAT, []),
                           t("delta", T.FLOAT, []), t("shape", T.INT64, [2]),
                           t("x", T.FLOAT, [3, 1])],
                   [t("r", T.FLOAT, None), t("c", T.INT32, None), t("e", T.FLOAT, None)])
    x = RNG.standard_normal((3, 1)).astype(np.float32)

    def feed(start, limit, delta, shape):
        return {"start": np.array(start, np.float32), "limit": np.array(limit, np.float32),
                "delta": np.array(delta, np.float32), "shape": np.array(shape, np.int64),
                "x": x}

    _check(model, tmp_path, [feed(1, 7, 1.5, [3, 4]), feed(5, 1, -0.5, [1, 5]),
                             feed(3, 3, 1, [3, 1]), feed(0, 1, 2, [3, 0])])


def test_integer_range(tmp_path):
    model = _model([helper.make_node("Range", ["a", "b", "d"], ["r"])],
                   [t("a", T.INT32, []), t("b", T.INT32, []), t("d", T.INT32, [])],
                   [t("r", T.INT32, None)])

    def feed(a, b, d):
        return {k: np.array(v, np.int32) for k, v in zip("abd", (a, b, d), strict=True)}

    _check(model, tmp_path, [feed(0, 10, 3), feed(10, -2, -4), feed(5, 5, 1), feed(5, 1, 1)])


def test_a_runtime_shape_over_the_element_limit_is_one_error(tmp_path, monkeypatch):
    model = _model([helper.make_node("ConstantOfShape", ["s"], ["c"])],
                   [t("s", T.INT64, [2])], [t("c", T.FLOAT, None)])
    vm = VirtualMachine(_library(model, tmp_path))
    monkeypatch.setenv("PIPELINE_MAX_TENSOR_ELEMENTS", "1000")
    assert vm.run(s=np.array([10, 100], np.int64))[0].shape == (10, 100)
    with pytest.raises(VMError, match=r"1001 elements is more than the limit of 1000 "
                                      r"\(\$PIPELINE_MAX_TENSOR_ELEMENTS\)"):
        vm.run(s=np.array([7, 143], np.int64))


def _detection_model(n_boxes=8, classes=3):
    """boxes [1, N, 4], scores [1, C, N] -> NMS -> the selected boxes [n, 4] (Gather
    of column 2 of the selection, then of the boxes) and their scores * 2."""
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou",
                                                    "thr"], ["selected"]),
             helper.make_node("Gather", ["selected", "two"], ["box_index"], axis=1),
             helper.make_node("Squeeze", ["boxes", "zero"], ["boxes2"]),
             helper.make_node("Gather", ["boxes2", "box_index"], ["picked"], axis=0),
             helper.make_node("Mul", ["picked", "scale"], ["out_boxes"])]
    inits = [helper.make_tensor("max_out", T.INT64, [1], [3]),
             helper.make_tensor("iou", T.FLOAT, [1], [0.4]),
             helper.make_tensor("two", T.INT64, [], [2]),
             helper.make_tensor("zero", T.INT64, [1], [0]),
             helper.make_tensor("scale", T.FLOAT, [4], [2, 2, 2, 2])]
    return _model(nodes, [t("boxes", T.FLOAT, [1, n_boxes, 4]),
                          t("scores", T.FLOAT, [1, classes, n_boxes]),
                          t("thr", T.FLOAT, [1])],
                  [t("selected", T.INT64, None), t("out_boxes", T.FLOAT, None)], inits)


def _detection_feeds(n_boxes=8, classes=3):
    feeds = []
    for thr in (0.1, 0.5, 0.9, 1.5):
        feeds.append({"boxes": _boxes(n_boxes, 1),
                      "scores": RNG.uniform(0, 1, (1, classes, n_boxes)).astype(np.float32),
                      "thr": np.array([thr], np.float32)})
    return feeds


def test_detection_graph_matches_onnxruntime(tmp_path):
    model = _detection_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _check(model, tmp_path, _detection_feeds(), reference=session.run)


def test_detection_graph_through_pipeline_run(tmp_path):
    """One VM library, several inputs, through the C runtime: each output .npy has the
    runtime shape onnxruntime gives."""
    model = _detection_model()
    lib = _library(model, tmp_path, "det")
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for k, feed in enumerate(_detection_feeds()):
        args = []
        for name, value in feed.items():
            np.save(tmp_path / f"{name}{k}.npy", value)
            args += ["--input", f"{name}={tmp_path / f'{name}{k}.npy'}"]
        out = tmp_path / f"out{k}"
        proc = subprocess.run([run, lib, *args, "--output-dir", out], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        want = session.run(None, feed)
        for j, w in enumerate(want):
            got = np.load(out / f"output_{j}.npy")
            assert got.shape == w.shape
            np.testing.assert_allclose(got, w, rtol=1e-6)


def test_a_static_kernel_reading_a_data_dependent_tensor_is_refused():
    model = _model([helper.make_node("NonZero", ["x"], ["y"]),
                    helper.make_node("Transpose", ["y"], ["z"])],
                   [t("x", T.FLOAT, [3, 4])], [t("z", T.INT64, None)])
    graph, params = pipeline.frontend.from_onnx(model)
    with pytest.raises(UnsupportedOperatorError, match=r"node '.*' \(transpose\) reads 'y', "
                                                       r"whose shape depends on values"):
        pipeline.build(graph, target=TARGET, params=params, executor="vm")
    with pytest.raises(UnsupportedOperatorError, match=r"data-dependent output shapes at "
                                                       r"node\(s\) .*: only the VM runs them"):
        pipeline.build(graph, target=TARGET, params=params)


def test_reshape_slice_tile_with_runtime_shape_inputs(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"]),
             helper.make_node("Tile", ["x", "repeats"], ["t"])]
    model = _model(nodes, [t("x", T.FLOAT, [2, 3, 4]), t("shape", T.INT64, [2]),
                           t("starts", T.INT64, [2]), t("ends", T.INT64, [2]),
                           t("axes", T.INT64, [2]), t("steps", T.INT64, [2]),
                           t("repeats", T.INT64, [3])],
                   [t("r", T.FLOAT, None), t("s", T.FLOAT, None), t("t", T.FLOAT, None)])
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)

    def feed(shape, starts, ends, axes, steps, repeats):
        values = {"shape": shape, "starts": starts, "ends": ends, "axes": axes,
                  "steps": steps, "repeats": repeats}
        return {"x": x, **{k: np.array(v, np.int64) for k, v in values.items()}}

    _check(model, tmp_path, [
        feed([4, -1], [0, 1], [2, 3], [0, 2], [1, 1], [1, 2, 1]),
        feed([0, 12], [-1, 3], [-100, 0], [2, 1], [-1, -2], [2, 1, 3]),
        feed([24, 1], [1, 0], [1, 9], [0, -1], [1, 3], [0, 1, 1]),
        feed([-1, 8], [2 ** 62, 0], [-(2 ** 62), 2], [-1, 1], [-3, 1], [1, 1, 1])])


def test_a_reshape_to_a_wrong_size_is_one_error(tmp_path):
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["r"])],
                   [t("x", T.FLOAT, [2, 3]), t("shape", T.INT64, [2])],
                   [t("r", T.FLOAT, None)])
    vm = VirtualMachine(_library(model, tmp_path))
    assert vm.run(x=np.ones((2, 3), np.float32), shape=np.array([3, 2]))[0].shape == (3, 2)
    with pytest.raises(VMError, match=r"^kernel reshape_to_shape_\w+ returned an error"):
        vm.run(x=np.ones((2, 3), np.float32), shape=np.array([4, 2]))


@pytest.mark.parametrize("axis,sorted_", [(0, 1), (1, 0), (-1, 1), (2, 0)])
def test_unique_along_an_axis(tmp_path, axis, sorted_):
    node = helper.make_node("Unique", ["x"], ["y", "indices", "inverse", "counts"],
                            sorted=sorted_, axis=axis)
    model = _model([node], [t("x", T.INT64, [3, 4, 2])],
                   [t(n, T.INT64, None) for n in ("y", "indices", "inverse", "counts")])
    x = RNG.integers(0, 2, (3, 4, 2))
    x[2] = x[0]
    x[:, 3] = x[:, 1]
    # onnxruntime: onnx.reference takes unsorted slices along axis 0 whatever the axis
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _check(model, tmp_path, [{"x": x}, {"x": np.zeros((3, 4, 2), np.int64)},
                             {"x": RNG.integers(0, 9, (3, 4, 2))}], reference=session.run)


def test_cli_builds_the_vm_and_refuses_the_graph_executor(tmp_path, capsys):
    """`pipeline compile` builds a NonZero model with --executor vm and refuses it in one
    line without."""
    import onnx

    from pipeline.tools import cli

    model = _model([helper.make_node("NonZero", ["x"], ["y"])], [t("x", T.FLOAT, [4])],
                   [t("y", T.INT64, None)])
    onnx.save(model, tmp_path / "nz.onnx")
    assert cli.main(["compile", str(tmp_path / "nz.onnx"), "-o", str(tmp_path / "g.so")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run only in the VM: compile with --executor vm" in err
    assert cli.main(["compile", str(tmp_path / "nz.onnx"), "-o", str(tmp_path / "nz.so"),
                     "--executor", "vm"]) == 0
    np.save(tmp_path / "x.npy", np.array([0, 2, 0, 1], np.float32))
    assert cli.main(["run", str(tmp_path / "nz.so"), "--input", f"x={tmp_path / 'x.npy'}",
                     "--output-dir", str(tmp_path / "o")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "output_0.npy"), [[1, 3]])


def test_doit_builds_the_detection_graph_as_a_vm_entry(tmp_path):
    """The detection graph in a doit matrix: the VM entry builds and matches onnxruntime
    at several inputs; the graph entry fails with one line naming the NMS node."""
    import onnx

    from tests.support.checkouts import matrix
    from tests.support.doit_runner import doit

    model = _detection_model()
    (tmp_path / "nets").mkdir()
    onnx.save(model, tmp_path / "nets" / "det.onnx")
    matrix(tmp_path, "det: {path: nets/det.onnx}\n",
           'vmt: {target: "llvm -mcpu=native", executor: vm}\n'
           'graph: {target: "llvm -mcpu=native"}\n')
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml", "target=vmt")
    assert code == 0 and "Traceback" not in out, out[-3000:]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    vm = VirtualMachine(tmp_path / "out" / "det" / "vmt" / "det.so")
    for feed in _detection_feeds():
        for got, want in zip(vm.run(**feed), session.run(None, feed), strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6)
    code, _, out = doit(tmp_path, "build", "config=matrix.yaml", "target=graph")
    assert code != 0 and "data-dependent output shapes at node(s) NonMaxSuppression_0 (nms): " \
        "only the VM runs them (executor='vm')" in out, out[-3000:]


@pytest.mark.parametrize("arch", ["arm64", "rv64"])
def test_detection_graph_on_a_cross_target_under_qemu(tmp_path, arch):
    """The same VM library built for arm64 / rv64 and its pipeline-run, under qemu: the
    runtime shapes and values onnxruntime gives on the host."""
    import yaml

    from tests.support import REPO
    from tests.support.toolchains import require_tools

    entry = yaml.safe_load((REPO / "configs" / "cross.yaml").read_text())["targets"][arch]
    require_tools(entry["cc"], entry["run"].split()[0])
    model = _detection_model()
    graph, params = pipeline.frontend.from_onnx(model)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target=entry["target"], params=params, executor="vm")
    lib = factory.export_library(tmp_path / "det.so", cc=entry["cc"])
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run, cc=entry["cc"])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for k, feed in enumerate(_detection_feeds()[:2]):
        args = []
        for name, value in feed.items():
            np.save(tmp_path / f"{name}{k}.npy", value)
            args += ["--input", f"{name}={tmp_path / f'{name}{k}.npy'}"]
        proc = subprocess.run([*entry["run"].split(), run, lib, *args, "--output-dir",
                               tmp_path / f"o{k}"], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        for j, want in enumerate(session.run(None, feed)):
            got = np.load(tmp_path / f"o{k}" / f"output_{j}.npy")
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_row_wise_readers_of_topk_and_unique(tmp_path):
    """TopK along axis 0 with a runtime k and Unique's first indices feed Gather and
    elementwise ops that run over the bound; the results keep the runtime rows."""
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=0),
             helper.make_node("Gather", ["table", "i"], ["rows"], axis=0),
             helper.make_node("Add", ["rows", "bias"], ["y"]),
             helper.make_node("Neg", ["v"], ["w"]),
             helper.make_node("Unique", ["labels"], ["u", "first"], sorted=0),
             helper.make_node("Gather", ["table", "first"], ["picked"], axis=0),
             helper.make_node("Relu", ["picked"], ["z"])]
    model = _model(nodes, [t("x", T.FLOAT, [6]), t("k", T.INT64, [1]),
                           t("labels", T.INT64, [6]), t("table", T.FLOAT, [6, 3])],
                   [t("y", T.FLOAT, None), t("w", T.FLOAT, None), t("z", T.FLOAT, None)],
                   [helper.make_tensor("bias", T.FLOAT, [3], [1, 2, 3])])
    table = RNG.standard_normal((6, 3)).astype(np.float32)
    feeds = [{"x": RNG.standard_normal(6).astype(np.float32), "k": np.array([k]),
              "labels": RNG.integers(0, n, 6), "table": table}
             for k, n in ((2, 3), (6, 1), (0, 6))]
    _check(model, tmp_path, feeds)


def test_a_runtime_sized_result_cannot_feed_a_static_kernel():
    model = _model([helper.make_node("Range", ["a", "b", "d"], ["r"]),
                    helper.make_node("Neg", ["r"], ["y"])],
                   [t(n, T.FLOAT, []) for n in "abd"], [t("y", T.FLOAT, None)])
    graph, params = pipeline.frontend.from_onnx(model)
    with pytest.raises(UnsupportedOperatorError, match=r"\(neg\) reads 'r', whose shape depends "
                                                       "on values: its runtime dimensions"):
        pipeline.build(graph, target=TARGET, params=params, executor="vm")
