"""Sequence and optional values in the VM (docs/vm.md, "Sequences and optionals"): one
library of a model using SplitToSequence, SequenceInsert/Erase/At/Length/Construct and
an If returning an optional sequence, run through the Python VM and through
pipeline-run (the C VM, sequence outputs as output_<i>_<j>.npy), against
onnxruntime (onnx 1.23's reference wraps an If's optional sequence in one more list)."""

from __future__ import annotations

import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper

import pipeline
from pipeline.link.runtime_c import build_pipeline_run
from pipeline.runtime.vm import VirtualMachine, VMError

TARGET = "llvm -mcpu=native"
SEQ = helper.make_sequence_type_proto(helper.make_tensor_type_proto(T.FLOAT, None))


def _model():
    then = helper.make_graph([helper.make_node("Optional", ["pair"], ["o"])], "then", [],
                             [helper.make_value_info("o", helper.make_optional_type_proto(SEQ))])
    orelse = helper.make_graph([helper.make_node("Optional", [], ["o"], type=SEQ)], "else", [],
                               [helper.make_value_info("o", helper.make_optional_type_proto(SEQ))])
    nodes = [
        helper.make_node("SplitToSequence", ["x", "split"], ["parts"], axis=1),
        helper.make_node("SequenceInsert", ["parts", "y", "zero"], ["s1"]),
        helper.make_node("SequenceErase", ["s1"], ["s2"]),
        helper.make_node("SequenceLength", ["s1"], ["n"]),
        helper.make_node("Relu", ["y"], ["ry"]),
        helper.make_node("SequenceConstruct", ["y", "ry"], ["pair"]),
        helper.make_node("SequenceAt", ["pair", "pos"], ["a"]),
        helper.make_node("Add", ["a", "y"], ["z"]),
        helper.make_node("If", ["cond"], ["opt"], then_branch=then, else_branch=orelse),
        helper.make_node("OptionalHasElement", ["opt"], ["has"]),
    ]
    graph = helper.make_graph(
        nodes, "seq",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 6]),
         helper.make_tensor_value_info("y", T.FLOAT, [2, 3]),
         helper.make_tensor_value_info("pos", T.INT64, []),
         helper.make_tensor_value_info("cond", T.BOOL, [])],
        [helper.make_value_info("s2", SEQ), helper.make_tensor_value_info("n", T.INT64, []),
         helper.make_tensor_value_info("z", T.FLOAT, [2, 3]),
         helper.make_value_info("opt", helper.make_optional_type_proto(SEQ)),
         helper.make_tensor_value_info("has", T.BOOL, [])],
        [helper.make_tensor("split", T.INT64, [3], [1, 3, 2]),
         helper.make_tensor("zero", T.INT64, [], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _feeds(cond: bool, pos: int = -1):
    rng = np.random.default_rng(int(cond))
    return {"x": rng.standard_normal((2, 6)).astype(np.float32),
            "y": rng.standard_normal((2, 3)).astype(np.float32),
            "pos": np.array(pos, np.int64), "cond": np.array(cond)}


def _same(got, want):
    if want is None or isinstance(want, list):
        assert (got is None) == (want is None)
        assert len(got or []) == len(want or [])
        for g, w in zip(got or [], want or [], strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-6)
    else:
        assert got.shape == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _reference():
    return ort.InferenceSession(_model().SerializeToString(),
                                providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seq")
    graph, params = pipeline.frontend.from_onnx(_model(), control_flow=True)
    factory = pipeline.build(graph, target=TARGET, params=params, executor="vm")
    return str(factory.export_library(str(folder / "seq.so")))


@pytest.mark.parametrize("cond", [True, False])
def test_sequences_and_optionals_match_onnxruntime(library, cond):
    reference = _reference()
    vm = VirtualMachine(library)
    feeds = _feeds(cond)
    got = vm.run(**feeds)
    want = reference.run(None, feeds)
    assert isinstance(got[0], list) and [p.shape for p in got[0]] == [(2, 3), (2, 1), (2, 3)]
    assert (got[3] is None) != cond
    for g, w in zip(got, want, strict=True):
        _same(g, w)


def test_a_position_out_of_range_is_one_error(library):
    vm = VirtualMachine(library)
    with pytest.raises(VMError, match="sequence position 2 out of range for length 2"):
        vm.run(**_feeds(True, pos=2))


def test_sequence_outputs_through_pipeline_run(library, tmp_path):
    """pipeline-run writes a sequence output as output_<i>_<j>.npy, one file an element,
    and nothing for an empty optional."""
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run)
    reference = _reference()
    for cond in (True, False):
        feeds, args, out = _feeds(cond, pos=0), [], tmp_path / f"out{int(cond)}"
        for name, value in feeds.items():
            np.save(tmp_path / f"{name}.npy", value)
            args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
        proc = subprocess.run([run, library, *args, "--output-dir", out], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        want = reference.run(None, feeds)
        for i, w in enumerate(want):
            if w is None or isinstance(w, list):
                items = sorted(out.glob(f"output_{i}_*.npy"), key=lambda p: int(p.stem[9:]))
                _same([np.load(p) for p in items] if w is not None else None, w)
                assert w is not None or not list(out.glob(f"output_{i}*"))
            else:
                _same(np.load(out / f"output_{i}.npy"), w)


def test_sequence_outputs_on_arm64_under_qemu(tmp_path):
    """The same model built for arm64, its pipeline-run under qemu: the sequence elements
    and the optional's absence as onnxruntime gives them on the host."""
    import yaml

    from tests.support import REPO
    from tests.support.toolchains import require_tools

    entry = yaml.safe_load((REPO / "configs" / "cross.yaml").read_text())["targets"]["arm64"]
    require_tools(entry["cc"], entry["run"].split()[0])
    graph, params = pipeline.frontend.from_onnx(_model(), control_flow=True)
    factory = pipeline.build(graph, target=entry["target"], params=params, executor="vm")
    lib = factory.export_library(tmp_path / "seq.so", cc=entry["cc"])
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run, cc=entry["cc"])
    feeds, args, out = _feeds(False, pos=1), [], tmp_path / "out"
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    proc = subprocess.run([*entry["run"].split(), run, lib, *args, "--output-dir", out],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    want = _reference().run(None, feeds)
    parts = sorted(out.glob("output_0_*.npy"), key=lambda p: int(p.stem[9:]))
    _same([np.load(p) for p in parts], want[0])
    _same(np.load(out / "output_2.npy"), want[2])
    assert want[3] is None and not list(out.glob("output_3*"))


def test_a_kernel_reading_an_element_of_unknown_shape_is_refused_at_import():
    """SequenceAt at a runtime position of parts of different widths, read by a kernel:
    one error naming the node (its result's shape is known only at run time)."""
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["parts"], axis=1),
             helper.make_node("SequenceAt", ["parts", "pos"], ["p"]),
             helper.make_node("Relu", ["p"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 6]),
                     helper.make_tensor_value_info("pos", T.INT64, [])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
        [helper.make_tensor("split", T.INT64, [2], [2, 4])]),
        opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(pipeline.errors.PipelineError,
                       match=r"node 'SequenceAt_1' \(SequenceAt\): the sequence's elements "
                             "differ in shape"):
        pipeline.frontend.from_onnx(model, control_flow=True)


def _growing_slices(trip: int, cond_input: bool = False):
    """A Loop of constant trip count `trip` appending Relu(x[:, :i + 1]) to a sequence:
    each iteration's element is one column wider (the import unrolls it)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["end", "zero"], ["ends"]),
         helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["cols"]),
         helper.make_node("Relu", ["cols"], ["r"]),
         helper.make_node("SequenceInsert", ["s", "r"], ["s_out"])],
        "body", [helper.make_tensor_value_info("i", T.INT64, []),
                 helper.make_tensor_value_info("c", T.BOOL, []), helper.make_value_info("s", SEQ)],
        [helper.make_tensor_value_info("c_out", T.BOOL, []), helper.make_value_info("s_out", SEQ)],
        [helper.make_tensor("one", T.INT64, [], [1]),
         helper.make_tensor("zero", T.INT64, [1], [0]),
         helper.make_tensor("starts", T.INT64, [1], [0]),
         helper.make_tensor("axes", T.INT64, [1], [1])])
    inits = [helper.make_tensor("trip", T.INT64, [], [trip])]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, [2, 5])]
    if cond_input:
        inputs.append(helper.make_tensor_value_info("cond", T.BOOL, []))
    else:
        inits.append(helper.make_tensor("cond", T.BOOL, [], [True]))
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=T.FLOAT),
             helper.make_node("Loop", ["trip", "cond", "empty"], ["seq"], name="loop",
                              body=body)]
    return helper.make_model(helper.make_graph(nodes, "grow", inputs,
                                               [helper.make_value_info("seq", SEQ)], inits),
                             opset_imports=[helper.make_opsetid("", 18)])


def test_a_loop_of_known_trip_count_with_growing_shapes_unrolls(tmp_path):
    """Slices growing with the iteration number: one copy of the body per iteration
    (docs/vm.md, "Control flow"), matching onnxruntime."""
    model = _growing_slices(3)
    graph, params = pipeline.frontend.from_onnx(model, control_flow=True)
    assert not any(n.op == "loop" for n in graph.nodes)
    factory = pipeline.build(graph, target=TARGET, params=params, executor="vm")
    x = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32)
    (got,) = VirtualMachine(str(factory.export_library(str(tmp_path / "grow.so")))).run(x=x)
    (want,) = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert [g.shape for g in got] == [(2, 1), (2, 2), (2, 3)]
    _same(got, want)


@pytest.mark.parametrize("trip, cond_input", [(65, False), (3, True)])
def test_a_growing_loop_not_unrollable_is_refused(trip, cond_input):
    """Over 64 iterations, or a condition known only at run time: the VM loop's one-line
    refusal naming the node."""
    with pytest.raises(pipeline.errors.PipelineError,
                       match=r"node 'loop' body: .*changes with the Loop's iteration number"):
        pipeline.frontend.from_onnx(_growing_slices(trip, cond_input), control_flow=True)
