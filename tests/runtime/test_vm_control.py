"""Control flow in the VM (docs/vm.md): If, Loop and Scan models built with
pipeline.build(..., executor="vm") against onnxruntime: branches with their own
constants and captured outer tensors, loops with a trip count, a condition,
loop-carried values and scan outputs, a Scan with two states, an If inside a Loop.
A Loop that stops early with scan outputs is one clear run-time error."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper

import pipeline
from pipeline.errors import UnsupportedOperatorError
from pipeline.runtime.vm import VirtualMachine, VMError

TARGET = "llvm -mcpu=native"
t = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, inits=()):
    model = helper.make_model(helper.make_graph(nodes, "cf", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _vm(model, tmp_path) -> VirtualMachine:
    graph, params = pipeline.frontend.from_onnx(model, control_flow=True)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params, executor="vm")
    return VirtualMachine(factory.export_library(tmp_path / "cf.so"))


def _check(model, tmp_path, *feeds: dict) -> None:
    vm = _vm(model, tmp_path)
    for feed in feeds:
        want = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feed)
        got = vm.run(**feed)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _const(name, values, shape):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name + "v", T.FLOAT, shape, values))


def _if_model():
    """y = If c: (x + k) * w else x - k, each branch its own constant k; w outer."""
    then = helper.make_graph([_const("k", [1, 2, 3], [3]),
                              helper.make_node("Add", ["x", "k"], ["s"]),
                              helper.make_node("Mul", ["s", "w"], ["y1"])],
                             "then", [], [t("y1", T.FLOAT, [2, 3])])
    orelse = helper.make_graph([_const("k", [5, 5, 5], [3]),
                                helper.make_node("Sub", ["x", "k"], ["y2"])],
                               "else", [], [t("y2", T.FLOAT, [2, 3])])
    return _model([helper.make_node("Relu", ["x0"], ["x"]),
                   helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=orelse),
                   helper.make_node("Neg", ["y"], ["z"])],
                  [t("c", T.BOOL, []), t("x0", T.FLOAT, [2, 3])], [t("z", T.FLOAT, [2, 3])],
                  [helper.make_tensor("w", T.FLOAT, [3], [0.5, -1, 2])])


def test_if_takes_either_branch(tmp_path):
    x = np.linspace(-2, 3, 6, dtype=np.float32).reshape(2, 3)
    _check(_if_model(), tmp_path, {"c": np.array(True), "x0": x}, {"c": np.array(False), "x0": x})


def _loop_body(cond_out: str = "c_in"):
    """(i, c_in, acc) -> (cond, acc + x * i, scan: acc + x * i); x captured."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             helper.make_node("Add", ["acc", "xi"], ["acc2"]),
             helper.make_node("Identity", ["acc2"], ["row"])]
    if cond_out != "c_in":  # stop once the sum passes 10
        nodes += [helper.make_node("ReduceSum", ["acc2"], ["total"], keepdims=0),
                  helper.make_node("Less", ["total", "ten"], [cond_out])]
    return helper.make_graph(
        nodes, "body", [t("i", T.INT64, []), t("c_in", T.BOOL, []), t("acc", T.FLOAT, [2])],
        [t(cond_out, T.BOOL, []), t("acc2", T.FLOAT, [2]), t("row", T.FLOAT, [2])])


def test_loop_with_trip_count_carried_value_and_scan_output(tmp_path):
    model = _model([helper.make_node("Loop", ["m", "", "a0"], ["a", "rows"],
                                     body=_loop_body())],
                   [t("x", T.FLOAT, [2]), t("a0", T.FLOAT, [2])],
                   [t("a", T.FLOAT, [2]), t("rows", T.FLOAT, [4, 2])],
                   [helper.make_tensor("m", T.INT64, [], [4])])
    _check(model, tmp_path, {"x": np.array([1.0, -0.5], np.float32),
                             "a0": np.array([0.25, 2.0], np.float32)})


def test_while_loop_stops_on_its_condition(tmp_path):
    body = _loop_body("go")
    body.node.insert(0, _const("ten", [10.0], []))
    body.output.pop()  # no scan output: the iteration count may vary
    model = _model([helper.make_node("Loop", ["", "c", "a0"], ["a"], body=body)],
                   [t("c", T.BOOL, []), t("x", T.FLOAT, [2]), t("a0", T.FLOAT, [2])],
                   [t("a", T.FLOAT, [2])])
    one = np.array([1.0, 0.5], np.float32)
    _check(model, tmp_path, {"c": np.array(True), "x": one, "a0": np.zeros(2, np.float32)},
           {"c": np.array(False), "x": one, "a0": np.ones(2, np.float32)})


def test_loop_stopping_early_with_scan_outputs_is_one_error(tmp_path):
    body = _loop_body("go")
    body.node.insert(0, _const("ten", [10.0], []))
    model = _model([helper.make_node("Loop", ["m", "c", "a0"], ["a", "rows"], body=body)],
                   [t("c", T.BOOL, []), t("x", T.FLOAT, [2]), t("a0", T.FLOAT, [2])],
                   [t("a", T.FLOAT, [2]), t("rows", T.FLOAT, [8, 2])],
                   [helper.make_tensor("m", T.INT64, [], [8])])
    vm = _vm(model, tmp_path)
    x = np.array([1.0, 1.0], np.float32)
    feed = {"c": np.array(True), "x": x * 0.01, "a0": np.zeros(2, np.float32)}
    _check(model, tmp_path, feed)  # all 8 turns: fine
    with pytest.raises(VMError, match="a Loop ended before its trip count") as err:
        vm.run(c=np.array(True), x=x, a0=np.zeros(2, np.float32))
    assert "\n" not in str(err.value)


def test_scan_with_two_states_and_an_if_inside_a_loop(tmp_path):
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "e"], ["s2"]), helper.make_node("Mul", ["p", "e"], ["p2"]),
         helper.make_node("Max", ["s2", "p2"], ["o"])], "scan",
        [t("s", T.FLOAT, [2]), t("p", T.FLOAT, [2]), t("e", T.FLOAT, [2])],
        [t("s2", T.FLOAT, [2]), t("p2", T.FLOAT, [2]), t("o", T.FLOAT, [2])])
    inner_if = helper.make_node("If", ["odd"], ["v"], then_branch=helper.make_graph(
        [helper.make_node("Neg", ["acc"], ["n"])], "t", [], [t("n", T.FLOAT, [2])]),
        else_branch=helper.make_graph([helper.make_node("Identity", ["acc"], ["n2"])], "e", [],
                                      [t("n2", T.FLOAT, [2])]))
    loop_body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"]), helper.make_node("Cast", ["r"], ["odd"],
                                                                          to=T.BOOL),
         inner_if, helper.make_node("Add", ["v", "x"], ["acc2"])], "lb",
        [t("i", T.INT64, []), t("c", T.BOOL, []), t("acc", T.FLOAT, [2])],
        [t("c", T.BOOL, []), t("acc2", T.FLOAT, [2])])
    model = _model([helper.make_node("Scan", ["s0", "p0", "xs"], ["s", "p", "os"], body=body,
                                     num_scan_inputs=1),
                    helper.make_node("Loop", ["m", "", "s"], ["acc"], body=loop_body)],
                   [t("s0", T.FLOAT, [2]), t("p0", T.FLOAT, [2]), t("xs", T.FLOAT, [3, 2]),
                    t("x", T.FLOAT, [2])],
                   [t("s", T.FLOAT, [2]), t("p", T.FLOAT, [2]), t("os", T.FLOAT, [3, 2]),
                    t("acc", T.FLOAT, [2])],
                   [helper.make_tensor("m", T.INT64, [], [5]),
                    helper.make_tensor("two", T.INT64, [], [2])])
    rng = np.random.default_rng(0)
    _check(model, tmp_path, {"s0": rng.standard_normal(2).astype(np.float32),
                             "p0": np.ones(2, np.float32),
                             "xs": rng.standard_normal((3, 2)).astype(np.float32),
                             "x": np.array([0.5, -1.5], np.float32)})


def test_zero_copy_input_is_read_in_place(tmp_path):
    """set_input_zero_copy: runs read the caller's array as it is at each run (a Scan
    takes its rows, a Reshape of it is an output), until set_input copies again."""
    from pipeline.runtime import empty_aligned

    body = helper.make_graph(
        [helper.make_node("Add", ["s", "e"], ["s2"]), helper.make_node("Mul", ["e", "e"], ["o"])],
        "scan", [t("s", T.FLOAT, [2]), t("e", T.FLOAT, [2])],
        [t("s2", T.FLOAT, [2]), t("o", T.FLOAT, [2])])
    model = _model([helper.make_node("Scan", ["s0", "xs"], ["s", "os"], body=body,
                                     num_scan_inputs=1),
                    helper.make_node("Reshape", ["xs", "six"], ["flat"])],
                   [t("s0", T.FLOAT, [2]), t("xs", T.FLOAT, [3, 2])],
                   [t("s", T.FLOAT, [2]), t("os", T.FLOAT, [3, 2]), t("flat", T.FLOAT, [6])],
                   [helper.make_tensor("six", T.INT64, [1], [6])])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    vm = _vm(model, tmp_path)
    rng = np.random.default_rng(3)
    s0 = rng.standard_normal(2).astype(np.float32)
    xs = empty_aligned((3, 2), np.float32)
    xs[:] = rng.standard_normal((3, 2))
    vm.set_input("main", s0=s0)
    vm.set_input_zero_copy("xs", xs)

    def agrees(feed_xs):
        want = session.run(None, {"s0": s0, "xs": feed_xs})
        for got, ref in zip(vm.invoke("main"), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)

    agrees(xs.copy())
    xs[:] = rng.standard_normal((3, 2))  # written in place: the next run reads it
    agrees(xs.copy())
    before = xs.copy()
    vm.set_input("main", xs=before)  # a copy again: the array no longer matters
    xs[:] = 0
    agrees(before)
    with pytest.raises(VMError, match="64-byte aligned"):
        vm.set_input_zero_copy("xs", empty_aligned((7,), np.float32)[1:].reshape(3, 2))
    with pytest.raises(VMError, match=r"expected float32 \[3, 2\], given float32 \[2, 3\]"):
        vm.set_input_zero_copy("xs", empty_aligned((2, 3), np.float32))
    with pytest.raises(VMError, match="no input 'ys'"):
        vm.set_input_zero_copy("ys", xs)


def test_graph_executor_still_refuses_control_flow():
    with pytest.raises(UnsupportedOperatorError,
                       match=r"If \(control flow: subgraphs are not compiled\)"):
        pipeline.frontend.from_onnx(_if_model())
    graph, params = pipeline.frontend.from_onnx(_if_model(), control_flow=True)
    with pytest.raises(UnsupportedOperatorError, match=r"control flow at node\(s\) If_1 \(if\): "
                                                       r"only the VM runs them"):
        pipeline.build(graph, target=TARGET, params=params)


@pytest.mark.slow  # 10,000 runs in a process of its own
def test_ten_thousand_runs_keep_rss_flat(tmp_path):
    """The pooled allocator: a Loop/If model run 10,000 times in one process, inputs
    taking either branch in turn, gives the same outputs every time and its RSS does
    not grow after warm-up (each run allocates the storages of main, the loop body
    three times and a branch: without reuse, kilobytes a run)."""
    import json
    import os
    import subprocess
    import sys

    from tests.support import REPO
    from tests.support.onnx_models import tiny_loop_if

    tiny_loop_if(tmp_path / "loop.onnx")
    graph, params = pipeline.frontend.from_onnx(tmp_path / "loop.onnx", control_flow=True)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params, executor="vm")
    lib = factory.export_library(tmp_path / "loop.so")
    session = ort.InferenceSession(str(tmp_path / "loop.onnx"))
    vm = VirtualMachine(lib)
    inputs = [np.full((1, 4), v, np.float32) for v in (3, -3)]
    inputs += [np.random.default_rng(s).standard_normal((1, 4), dtype=np.float32)
               for s in range(4)]
    expected, branches = {}, set()
    for k, x in enumerate(inputs):
        want = session.run(None, {"x": x})
        branches.add(bool(want[1][-1].sum() > 0))
        for j, (got, ref) in enumerate(zip(vm.run(x), want, strict=True)):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
            expected[f"y{k}_{j}"] = got
    assert branches == {True, False}
    np.savez(tmp_path / "inputs.npz", **{f"x{k}": x for k, x in enumerate(inputs)})
    np.savez(tmp_path / "expected.npz", **expected)
    proc = subprocess.run([sys.executable, "-m", "tests.support.vm_soak", str(lib),
                           str(tmp_path / "inputs.npz"), str(tmp_path / "expected.npz"),
                           "10000", "1000"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert not result["errors"] and result["runs"] == 10000, result
    growth = result["rss_end"] - result["rss_warm"]
    print(f"\n10000 VM runs; RSS {result['rss_warm'] / 2**20:.2f} -> "
          f"{result['rss_end'] / 2**20:.2f} MiB after 1000 runs of warm-up")
    assert growth < 2**20, f"RSS grew by {growth / 2**10:.0f} KiB after warm-up"


def _window_loop_model():
    """A Loop (trip count m, a graph input) whose body slices rows i .. i + 2 of the
    captured x: Unsqueeze(i) and Unsqueeze(i + 2) are the Slice's starts and ends,
    computed at run time; and adds Range(i, i + 3) as floats, so
    acc = sum_i x[i:i+2] + sum(i .. i+2) and cnt counts the turns."""
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["two"], value=helper.make_tensor("2", T.INT64, [], [2])),
         helper.make_node("Constant", [], ["three"],
                          value=helper.make_tensor("3", T.INT64, [], [3])),
         helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("a", T.INT64, [1], [0])),
         helper.make_node("Constant", [], ["one"], value=helper.make_tensor("1", T.INT64, [], [1])),
         helper.make_node("Add", ["i", "two"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "ax"], ["starts"]),
         helper.make_node("Unsqueeze", ["end", "ax"], ["ends"]),
         helper.make_node("Slice", ["x", "starts", "ends"], ["window"]),
         helper.make_node("Add", ["i", "three"], ["limit"]),
         helper.make_node("Range", ["i", "limit", "one"], ["steps"]),
         helper.make_node("Cast", ["steps"], ["fsteps"], to=T.FLOAT),
         helper.make_node("Add", ["acc", "window"], ["acc1"]),
         helper.make_node("Add", ["acc1", "fsteps"], ["acc2"]),
         helper.make_node("Add", ["cnt", "one"], ["cnt2"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "window",
        [t("i", T.INT64, []), t("c_in", T.BOOL, []), t("acc", T.FLOAT, [2, 3]),
         t("cnt", T.INT64, [])],
        [t("c_out", T.BOOL, []), t("acc2", T.FLOAT, [2, 3]), t("cnt2", T.INT64, [])])
    return _model([helper.make_node("Loop", ["m", "", "a0", "n0"], ["a", "n"], body=body)],
                  [t("m", T.INT64, []), t("x", T.FLOAT, [6, 3]), t("a0", T.FLOAT, [2, 3])],
                  [t("a", T.FLOAT, [2, 3]), t("n", T.INT64, [])],
                  [helper.make_tensor("n0", T.INT64, [], [0])])


def test_loop_body_slicing_by_the_iteration_number_through_pipeline_run(tmp_path):
    """One VM library for every trip count: the body's Slice and Range start at the
    iteration number (a static length, so static kernels), through pipeline-run (the
    C runtime) against onnxruntime; a trip count taking the window past x's rows (ONNX
    would clamp it to one row) fails the run in one line, writing nothing."""
    import subprocess

    from pipeline.link.runtime_c import build_pipeline_run

    model = _window_loop_model()
    graph, params = pipeline.frontend.from_onnx(model, control_flow=True)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params, executor="vm")
    lib = factory.export_library(tmp_path / "window.so")
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 3), dtype=np.float32)
    a0 = rng.standard_normal((2, 3), dtype=np.float32)

    def pipeline_run(m: int, out):
        feed = {"m": np.array(m, np.int64), "x": x, "a0": a0}
        args = []
        for name, value in feed.items():
            np.save(tmp_path / f"{name}{m}.npy", value)
            args += ["--input", f"{name}={tmp_path / f'{name}{m}.npy'}"]
        return feed, subprocess.run([run, lib, *args, "--output-dir", out],
                                    capture_output=True, text=True, timeout=120)

    for m in (0, 1, 3, 5):
        feed, proc = pipeline_run(m, tmp_path / f"out{m}")
        assert proc.returncode == 0, proc.stderr
        for j, want in enumerate(session.run(None, feed)):
            got = np.load(tmp_path / f"out{m}" / f"output_{j}.npy")
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    _check(model, tmp_path, {"m": np.array(4, np.int64), "x": x, "a0": a0})
    _feed, proc = pipeline_run(6, tmp_path / "out6")
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "an input value out of its range" in proc.stderr, proc.stderr
    assert not (tmp_path / "out6" / "output_0.npy").exists()


def test_a_shape_changing_with_the_iteration_number_is_one_import_error():
    """Range(0, i) in a Loop body has the iteration number as its length: refused at
    import in one line naming the node (its output could not be loop-carried)."""
    from pipeline.errors import ModelError

    model = _window_loop_model()
    body = model.graph.node[0].attribute[0].g
    body.node[9].input[0] = "n_zero"  # Range(0, i + 3): a length of i + 3
    body.node.insert(0, helper.make_node("Constant", [], ["n_zero"],
                                         value=helper.make_tensor("z", T.INT64, [], [0])))
    with pytest.raises(ModelError, match=r"node 'Range_\d+' \(iota\): a shape that changes "
                                         "with the Loop's iteration number") as err:
        pipeline.frontend.from_onnx(model, control_flow=True)
    assert "\n" not in str(err.value)


def test_an_if_on_a_known_condition_is_the_branch_it_takes():
    """An If whose condition is known at import (a Size compared with a constant, as
    onnx's expanded AffineGrid does) is replaced by its branch; the other branch, which
    could not import for this input (a Split into 3 of 4 elements), is never converted."""
    then = helper.make_graph([helper.make_node("Split", ["v"], ["p", "q"], axis=0,
                                               num_outputs=2)], "then", [],
                             [t("p", T.FLOAT, [2]), t("q", T.FLOAT, [2])])
    orelse = helper.make_graph([helper.make_node("Split", ["v"], ["r", "s", "u"], axis=0,
                                                 num_outputs=3)], "else", [],
                               [t("r", T.FLOAT, [2]), t("s", T.FLOAT, [2])])
    model = _model([helper.make_node("Size", ["v"], ["n"]),
                    helper.make_node("Constant", [], ["four"],
                                     value=helper.make_tensor("4", T.INT64, [], [4])),
                    helper.make_node("Equal", ["n", "four"], ["c"]),
                    helper.make_node("If", ["c"], ["y", "z"], then_branch=then,
                                     else_branch=orelse)],
                   [t("v", T.FLOAT, [4])], [t("y", T.FLOAT, [2]), t("z", T.FLOAT, [2])])
    model.opset_import[0].version = 18
    graph, _params = pipeline.frontend.from_onnx(model, control_flow=True)
    assert "if" not in {n.op for n in graph.nodes}
    assert [graph.types[o].shape for o in graph.outputs] == [(2,), (2,)]


def test_a_body_shape_computed_at_run_time_is_one_import_error():
    """A Reshape to a loop-carried shape: its result would have a bound, not a shape,
    so the body's next shape rule fails; the error names the Reshape."""
    from pipeline.errors import ModelError

    body = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s_in"], ["r"]),
         helper.make_node("Add", ["acc", "r"], ["acc2"]),
         helper.make_node("Identity", ["s_in"], ["s_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [t("i", T.INT64, []), t("c_in", T.BOOL, []), t("acc", T.FLOAT, [2, 3]),
         t("s_in", T.INT64, [2])],
        [t("c_out", T.BOOL, []), t("acc2", T.FLOAT, [2, 3]), t("s_out", T.INT64, [2])])
    model = _model([helper.make_node("Loop", ["m", "", "a0", "s"], ["a", "s2"], body=body)],
                   [t("m", T.INT64, []), t("x", T.FLOAT, [6]), t("a0", T.FLOAT, [2, 3]),
                    t("s", T.INT64, [2])], [t("a", T.FLOAT, [2, 3])])
    with pytest.raises(ModelError, match=r"body: node 'Reshape_0' \(reshape_to\) has a shape "
                                         "computed at run time") as err:
        pipeline.frontend.from_onnx(model, control_flow=True)
    assert "\n" not in str(err.value)
