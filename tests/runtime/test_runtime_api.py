"""The runtime API TVM users expect, on the C executor, each checked against what
TVM documents (quoted in the comments; python/tvm/contrib/graph_executor.py,
python/tvm/runtime/module.py, python/tvm/contrib/debugger/debug_executor.py,
src/runtime/graph_executor/graph_executor.cc): get_input_index, get_input_info /
get_output_info, share_params, set_input_zero_copy, benchmark / time_evaluator
(BenchmarkResult) and the debug executor. Numbers are compared with onnx's
reference evaluator.

One small model, built once at opt_level 0 so its nodes keep the ONNX names:
x -> MatMul(W1) -> Add(b1) -> Relu -> Reshape -> MatMul(W2) -> Sigmoid = y, and
Neg(x) = z. The memory plan gives Relu the MatMul's storage (checked below), the
Reshape is an alias that runs nothing (`__nop`).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import tarfile
import threading
import time

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from pipeline.frontend import from_onnx
from pipeline.ir.target import parse_target
from pipeline.link.blob import pack_blob, write_devc
from pipeline.link.export import link_library
from pipeline.runtime import (
    BenchmarkResult,
    GraphModule,
    empty_aligned,
    load_module,
    load_params,
    save_params,
)
from pipeline.runtime.debug_executor import GraphModuleDebug, create
from pipeline.runtime.timing import time_evaluator
from tests.support.onnx_models import make_model, value_info

TARGET = "llvm -mcpu=native"
RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((8, 16)).astype(np.float32)
B1 = RNG.standard_normal(16).astype(np.float32)
W2 = RNG.standard_normal((8, 4)).astype(np.float32)
X = RNG.standard_normal((2, 8)).astype(np.float32)
X2 = RNG.standard_normal((2, 8)).astype(np.float32)
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _model(b1=B1):
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["h2"], name="add1"),
             helper.make_node("Relu", ["h2"], ["r"], name="relu1"),
             helper.make_node("Reshape", ["r", "shape"], ["s"], name="reshape1"),
             helper.make_node("MatMul", ["s", "W2"], ["t"], name="mm2"),
             helper.make_node("Sigmoid", ["t"], ["y"], name="sig"),
             helper.make_node("Neg", ["x"], ["z"], name="neg")]
    inits = [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(b1, "b1"),
             numpy_helper.from_array(W2, "W2"),
             numpy_helper.from_array(np.array([4, 8], np.int64), "shape")]
    return make_model(nodes, [value_info("x", [2, 8])], [value_info("y", None),
                                                          value_info("z", None)], inits)


def _ref(x=X, b1=B1, names=("y", "z")) -> list[np.ndarray]:
    return ReferenceEvaluator(_model(b1)).run(list(names), {"x": x})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The model's library as .so and .tar (for its lib0.o), in a module-wide folder."""
    from pipeline import build
    from pipeline.transform import PassContext

    out = tmp_path_factory.mktemp("rtapi")
    graph, params = from_onnx(_model())
    with PassContext(opt_level=0):
        factory = build(graph, target=TARGET, params=params)
    factory.export_library(str(out / "m.so"))
    factory.export_library(str(out / "m.tar"))
    return out


@pytest.fixture(scope="module")
def lib(built):
    return load_module(built / "m.so")


def _gmod(lib) -> GraphModule:
    return GraphModule(lib["default"]("cpu"))


def _outputs(gmod) -> list[np.ndarray]:
    return [gmod.get_output(k) for k in range(gmod.get_num_outputs())]


# ---------------------------------------------------------------- info


def test_get_input_index(lib):
    # TVM GraphModule.get_input_index: "The input index. -1 will be returned if the given
    # input name is not found." Params are inputs there too (input_nodes_ holds them).
    gmod = _gmod(lib)
    assert gmod.get_input_index("x") == 0
    for name, value in lib.params.items():
        index = gmod.get_input_index(name)
        assert index >= 1
        np.testing.assert_array_equal(gmod.get_input(name), value)
        assert gmod.module.input_data_address(index) == gmod.module.input_data_address(name)
    assert gmod.get_input_index("nope") == -1
    with pytest.raises(TypeError, match="must be a string"):
        gmod.get_input_index(0)


def test_get_input_and_output_info(lib):
    # TVM GetInputInfo: shape and dtype dicts of the inputs that are not params;
    # GetOutputInfo: the same for the outputs, keyed by the name of each output's node.
    gmod = _gmod(lib)
    y, z = _ref()
    assert gmod.get_input_info() == ({"x": (2, 8)}, {"x": "float32"})
    shapes, dtypes = gmod.get_output_info()
    assert shapes == {"sig": y.shape, "neg": z.shape}
    assert dtypes == {"sig": str(y.dtype), "neg": str(z.dtype)}
    assert gmod.get_num_outputs() == 2 and gmod.get_num_inputs() == 1


# ---------------------------------------------------------------- share_params


def test_share_params_shares_storage_without_copy(lib):
    # TVM share_params: "Share parameters from pre-existing GraphExecutor instance";
    # params_bytes "used only for the parameter names"; ShareParams skips names the graph
    # lacks (GetInputIndex < 0) and afterwards both executors hold the same NDArray.
    first, second = _gmod(lib), _gmod(lib)
    params = dict(lib.params, not_in_graph=np.zeros(3, np.float32))
    second.share_params(first, save_params(params))
    for name in lib.params:
        assert second.module.input_data_address(name) == first.module.input_data_address(name)
    assert second.module.input_data_address("x") != first.module.input_data_address("x")
    # A param set through one executor is what the other runs with.
    new_b1 = RNG.standard_normal(16).astype(np.float32)
    first.set_input("b1", new_b1)
    second.run(x=X)
    for got, want in zip(_outputs(second), _ref(b1=new_b1), strict=True):
        np.testing.assert_allclose(got, want, **TOL)
    # The shared storage outlives the executor that made it.
    del first
    second.run(x=X2)
    for got, want in zip(_outputs(second), _ref(x=X2, b1=new_b1), strict=True):
        np.testing.assert_allclose(got, want, **TOL)


def test_executors_sharing_params_run_in_threads_at_once(lib):
    # The use TVM's share_params serves: one copy of the weights, an executor per thread.
    first = _gmod(lib)
    others = [_gmod(lib) for _ in range(2)]
    for other in others:
        other.share_params(first, save_params(lib.params))
    inputs = [RNG.standard_normal((2, 8)).astype(np.float32) for _ in others]
    results: dict[int, list] = {}

    def work(k):
        for _ in range(30):
            others[k].run(x=inputs[k])
        results[k] = _outputs(others[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(others))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, x in enumerate(inputs):
        for got, want in zip(results[k], _ref(x=x), strict=True):
            np.testing.assert_allclose(got, want, **TOL)


def _resident_pages(address: int, nbytes: int) -> int:
    """How many of the whole pages in [address, address + nbytes) are in RAM (mincore)."""
    page = os.sysconf("SC_PAGE_SIZE")
    lo, hi = -(-address // page) * page, (address + nbytes) // page * page
    vec = (ctypes.c_ubyte * max(1, (hi - lo) // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(lo, hi - lo, vec) == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec[:(hi - lo) // page])


def test_share_params_gives_the_copys_pages_back(tmp_path):
    """Every executor starts with its own copy of the params; sharing them returns
    that copy's pages to the OS (TVM's second executor never fills its own)."""
    from pipeline import build
    from pipeline.transform import PassContext

    w = RNG.standard_normal((1024, 1024)).astype(np.float32)  # a 4 MiB param
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["y"])],
                       [value_info("x", [1, 1024])], [value_info("y", None)],
                       [numpy_helper.from_array(w, "W")])
    graph, params = from_onnx(model)
    with PassContext(opt_level=0):
        build(graph, target=TARGET, params=params).export_library(str(tmp_path / "w.so"))
    big = load_module(tmp_path / "w.so")
    (name,) = big.params
    first, second = _gmod(big), _gmod(big)
    own = second.module.input_data_address(name)
    assert _resident_pages(own, w.nbytes) >= w.nbytes // os.sysconf("SC_PAGE_SIZE") - 1
    second.share_params(first, save_params(big.params))
    assert _resident_pages(own, w.nbytes) == 0
    x = RNG.standard_normal((1, 1024)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    second.run(x=x)
    np.testing.assert_allclose(second.get_output(0), want, rtol=1e-4, atol=1e-3)
    # An executor another one reads from keeps its copy, even once it shares itself.
    source, reader = _gmod(big), _gmod(big)
    reader.share_params(source, save_params(big.params))
    source.share_params(first, save_params(big.params))
    reader.run(x=x)
    np.testing.assert_allclose(reader.get_output(0), want, rtol=1e-4, atol=1e-3)


def test_share_params_needs_the_same_library(lib, built, tmp_path):
    copy = tmp_path / "copy.so"  # the same bytes, loaded as a second library
    shutil.copy(built / "m.so", copy)
    other = _gmod(load_module(copy))
    with pytest.raises(ValueError, match="another library's graph"):
        _gmod(lib).share_params(other, save_params(lib.params))
    with pytest.raises(TypeError, match="expected a GraphExecutor"):
        _gmod(lib).share_params("x", save_params(lib.params))


# ---------------------------------------------------------------- zero copy


def test_set_input_zero_copy_reads_the_callers_buffer(lib):
    # TVM SetInputZeroCopy: "set index-th input to the graph without copying the data";
    # the ops' arguments point at the caller's data from then on.
    gmod = _gmod(lib)
    buffer = empty_aligned((2, 8), np.float32)
    buffer[...] = X
    gmod.set_input_zero_copy("x", buffer)
    assert gmod.module.input_data_address("x") == buffer.ctypes.data
    gmod.run()
    for got, want in zip(_outputs(gmod), _ref(), strict=True):
        np.testing.assert_allclose(got, want, **TOL)
    buffer[...] = X2  # no set_input: the next run reads the buffer as it is now
    gmod.run()
    for got, want in zip(_outputs(gmod), _ref(x=X2), strict=True):
        np.testing.assert_allclose(got, want, **TOL)
    other = empty_aligned((2, 8), np.float32)  # by keyword, as set_input takes them
    other[...] = X
    gmod.set_input_zero_copy(x=other)
    assert gmod.module.input_data_address(0) == other.ctypes.data
    other[...] = X2
    gmod.run()
    for got, want in zip(_outputs(gmod), _ref(x=X2), strict=True):
        np.testing.assert_allclose(got, want, **TOL)
    # set_input copies into the executor's own storage again: the buffer is let go.
    gmod.set_input("x", X)
    buffer[...] = 0
    gmod.run()
    assert gmod.module.input_data_address("x") != buffer.ctypes.data
    for got, want in zip(_outputs(gmod), _ref(), strict=True):
        np.testing.assert_allclose(got, want, **TOL)


def test_set_input_zero_copy_checks_the_array(lib):
    # TVM CheckExternalDLTensor: alignment (data % kAllocAlignment == 0, 64), ndim, shape.
    gmod = _gmod(lib)
    raw = empty_aligned((40,), np.float32)
    with pytest.raises(ValueError, match=r"input 'x': a zero-copy array must be 64-byte "
                                         r"aligned \(its data is at 0x"):
        gmod.set_input_zero_copy("x", raw[1:17].reshape(2, 8))
    with pytest.raises(ValueError, match=r"input 'x': expected shape \[2, 8\] float32, given "
                                         r"shape \[2, 8\] float64"):
        gmod.set_input_zero_copy("x", empty_aligned((2, 8), np.float64))
    with pytest.raises(ValueError, match=r"given shape \[16\] float32"):
        gmod.set_input_zero_copy("x", raw[:16])
    with pytest.raises(ValueError, match="must be C-contiguous"):
        gmod.set_input_zero_copy("x", empty_aligned((2, 16), np.float32)[:, ::2])
    with pytest.raises(TypeError, match="needs a numpy array, got list"):
        gmod.set_input_zero_copy("x", X.tolist())
    with pytest.raises(KeyError, match="no input named 'y'"):
        gmod.set_input_zero_copy("y", empty_aligned((2, 8), np.float32))


def test_zero_copy_input_is_followed_by_its_aliases(lib, built, tmp_path):
    """A graph whose input is read through a reshape the plan aliases to it (`__nop`,
    same storage id): the alias must read the caller's buffer too. pipeline's planner
    never makes one, TVM-format graph JSON may; the executor handles it."""
    graph = json.loads(lib.graph_json)
    neg = next(n for n in graph["nodes"] if n["name"] == "neg")
    nodes = [{"op": "null", "name": "x", "inputs": []},
             {"op": "tvm_op", "name": "alias", "inputs": [[0, 0, 0]],
              "attrs": {"func_name": "__nop", "num_inputs": "1", "num_outputs": "1"}},
             {"op": "tvm_op", "name": "neg", "inputs": [[1, 0, 0]], "attrs": neg["attrs"]}]
    aliased = json.dumps({
        "nodes": nodes, "arg_nodes": [0], "heads": [[2, 0, 0]], "node_row_ptr": [0, 1, 2, 3],
        "attrs": {"shape": ["list_shape", [[2, 8], [16], [2, 8]]],
                  "dltype": ["list_str", ["float32"] * 3],
                  "storage_id": ["list_int", [0, 0, 1]]}})
    with tarfile.open(built / "m.tar") as tar:
        tar.extract("lib0.o", tmp_path, filter="data")
    write_devc(pack_blob(aliased, b"", [neg["attrs"]["func_name"]], TARGET),
               parse_target(TARGET).triple, tmp_path / "devc.o")
    link_library(tmp_path / "lib0.o", tmp_path / "devc.o", tmp_path / "alias.so")
    gmod = _gmod(load_module(tmp_path / "alias.so"))
    buffer = empty_aligned((2, 8), np.float32)
    buffer[...] = X
    gmod.set_input_zero_copy("x", buffer)
    gmod.run()
    np.testing.assert_array_equal(gmod.get_output(0), _ref(names=["z"])[0])
    buffer[...] = X2
    gmod.run()
    np.testing.assert_array_equal(gmod.get_output(0), _ref(x=X2, names=["z"])[0])


# ---------------------------------------------------------------- timing


def test_benchmark_result_statistics_and_table():
    # TVM BenchmarkResult: results in seconds; mean, median, max, min and std (numpy's
    # std: the population standard deviation); str() is a table in milliseconds.
    results = [0.004, 0.001, 0.002, 0.010]
    r = BenchmarkResult(results)
    assert r.results == results
    assert r.mean == pytest.approx(statistics.fmean(results))
    assert r.median == pytest.approx(statistics.median(results))
    assert r.std == pytest.approx(statistics.pstdev(results))
    assert (r.min, r.max) == (0.001, 0.010)
    lines = str(r).splitlines()
    assert lines[0] == "Execution time summary:"
    assert lines[1].split() == ["mean", "(ms)", "median", "(ms)", "max", "(ms)", "min", "(ms)",
                                "std", "(ms)"]
    assert [float(v) for v in lines[2].split()] == pytest.approx(
        [r.mean * 1e3, r.median * 1e3, 10.0, 1.0, r.std * 1e3], abs=1e-4)
    with pytest.raises(ValueError, match="at least one result"):
        BenchmarkResult([])


def test_time_evaluator_calls_and_min_repeat_ms():
    # TVM time_evaluator: "the function will be invoked (1 + number x repeat) times, with
    # the first call discarded"; with min_repeat_ms, "the parameters `number` will be
    # dynamically adjusted to meet the minimum duration requirement of one `repeat`".
    calls = []
    result = time_evaluator(lambda v: calls.append(v), number=3, repeat=4)(7)
    assert len(calls) == 1 + 3 * 4 and set(calls) == {7}
    assert len(result.results) == 4

    def sleepy():
        calls.append(None)
        time.sleep(0.001)

    calls.clear()
    start = time.perf_counter()
    result = time_evaluator(sleepy, number=1, repeat=2, min_repeat_ms=15)()
    assert time.perf_counter() - start >= 2 * 0.015  # each repeat lasted min_repeat_ms
    assert len(calls) > 1 + 2 and len(result.results) == 2
    assert all(r >= 0.001 for r in result.results)  # per call, not per repeat
    for bad in ({"number": 0}, {"repeat": 0}, {"min_repeat_ms": -1}, {"number": 1.5}):
        with pytest.raises(ValueError, match="time_evaluator: "):
            time_evaluator(sleepy, **bad)


def test_graph_module_benchmark_and_time_evaluator(lib):
    # TVM GraphModule.benchmark(device, func_name="run", repeat=5, number=5,
    # min_repeat_ms=None, end_to_end=False, **kwargs): kwargs are inputs; end_to_end
    # times setting them and copying the outputs out ("run_from_inputs").
    gmod = _gmod(lib)
    result = gmod.benchmark("cpu", repeat=3, number=2, x=X)
    assert len(result.results) == 3 and all(r > 0 for r in result.results)
    for got, want in zip(_outputs(gmod), _ref(), strict=True):  # x was set, then run
        np.testing.assert_allclose(got, want, **TOL)
    start = time.perf_counter()
    result = gmod.benchmark(repeat=2, number=1, min_repeat_ms=20)
    assert time.perf_counter() - start >= 2 * 0.020 and len(result.results) == 2
    result = gmod.benchmark("cpu", repeat=2, number=2, end_to_end=True, x=X2)
    assert len(result.results) == 2
    for got, want in zip(_outputs(gmod), _ref(x=X2), strict=True):
        np.testing.assert_allclose(got, want, **TOL)
    ftimer = gmod.module.time_evaluator("run", "cpu", number=2, repeat=3)
    assert len(ftimer().results) == 3
    with pytest.raises(ValueError, match=r"no function 'walk'; available: \['run', "
                                         r"'run_from_inputs'\]"):
        gmod.module.time_evaluator("walk", "cpu")
    with pytest.raises(ValueError, match="only the CPU is supported"):
        gmod.benchmark("cuda")


# ---------------------------------------------------------------- debug executor


def _entry_sid(graph: dict, name: str) -> int:
    nid = next(k for k, n in enumerate(graph["nodes"]) if n["name"] == name)
    return graph["attrs"]["storage_id"][1][graph["node_row_ptr"][nid]]


def test_debug_executor_records_every_node(lib, tmp_path):
    # TVM debug executor: run() executes node by node, keeping every node's output and
    # time (dumped under dump_root); debug_get_output(node) takes "The node index or name".
    graph = json.loads(lib.graph_json)
    # The plan reuses storage (Relu writes MatMul's): a recording taken at the end of
    # the run would be wrong, one taken right after each node is right.
    assert _entry_sid(graph, "mm1") == _entry_sid(graph, "relu1")
    gmod = create(lib.graph_json, lib, "cpu", tmp_path / "dump", timing_runs=2)
    gmod.run(x=X)
    h, h2, r, s, t, y, z = _ref(names=["h", "h2", "r", "s", "t", "y", "z"])
    for node, want in {"mm1": h, "add1": h2, "relu1": r, "reshape1": s, "mm2": t, "sig": y,
                       "neg": z}.items():
        (got,) = gmod.node_outputs[node]
        assert got.shape == want.shape, node
        np.testing.assert_allclose(got, want, **TOL, err_msg=node)
    executed = {"mm1", "add1", "relu1", "mm2", "sig", "neg"}  # reshape1 runs nothing
    assert set(gmod.node_times) == executed
    assert all(row.ms >= 0 for row in gmod.node_times.values())
    table = gmod.format_node_times()
    assert "total of 6 nodes" in table and all(name.split("_")[0] in table
                                               for name in ("dense", "relu", "sigmoid"))
    dumped = load_params((tmp_path / "dump" / "output_tensors.params").read_bytes())
    assert set(dumped) == {f"{name}:0" for name in gmod.node_outputs}
    np.testing.assert_array_equal(dumped["relu1:0"], gmod.node_outputs["relu1"][0])
    trace = json.loads((tmp_path / "dump" / "execution_trace.json").read_text())["traceEvents"]
    assert [e["name"] for e in trace] == ["mm1", "add1", "relu1", "mm2", "sig", "neg"]
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(trace, trace[1:], strict=False))


def test_debug_get_output_runs_up_to_the_node(lib):
    # TVM debug_get_output: "Run graph up to node and get the output to out".
    gmod = GraphModuleDebug(lib["default"](), timing_runs=1)
    gmod.set_input("x", X2)  # no run(): debug_get_output runs what it needs
    h, s = _ref(x=X2, names=["h", "s"])
    np.testing.assert_allclose(gmod.debug_get_output("mm1"), h, **TOL)
    graph = json.loads(lib.graph_json)
    mm1 = next(k for k, n in enumerate(graph["nodes"]) if n["name"] == "mm1")
    out = np.empty_like(h)
    assert gmod.debug_get_output(mm1, out) is out
    np.testing.assert_allclose(out, h, **TOL)
    np.testing.assert_allclose(gmod.debug_get_output("reshape1"), s, **TOL)
    np.testing.assert_array_equal(gmod.debug_get_output("b1"), B1)  # a param node
    with pytest.raises(KeyError, match="no node named 'nope'"):
        gmod.debug_get_output("nope")
    with pytest.raises(IndexError, match="out of range"):
        gmod.debug_get_output(len(graph["nodes"]))
    with pytest.raises(RuntimeError, match="call run"):
        gmod.format_node_times()
    with pytest.raises(ValueError, match="is not the graph of"):
        create(json.dumps({**graph, "heads": graph["heads"][:1]}), lib)
    with pytest.raises(NotImplementedError, match="debug executor"):
        _gmod(lib).debug_get_output("mm1")


# ---------------------------------------------------------------- threads


def test_runs_measure_one_thread_against_the_team(lib):
    """With more than one thread, run() times itself both ways and runs the faster
    (runtime/c/executor.c, run_alone): the first run starts the workers, then three
    runs with the team and three alone, so runs 5 to 7 are alone whatever the
    machine; set_num_threads starts the count again, and one thread is never "alone".
    Every run gives onnx.reference's outputs."""
    gmod = _gmod(lib)
    gmod.set_num_threads(2)
    gmod.set_input(x=X)
    for k in range(7):
        gmod.run()
        for got, want in zip(_outputs(gmod), _ref(), strict=True):
            np.testing.assert_allclose(got, want, **TOL)
        assert gmod.module.runs_alone == max(0, k - 3), k
    for _ in range(60):  # then the faster way, and now and then the other
        gmod.run()
    assert 3 <= gmod.module.runs_alone <= 63
    gmod.set_num_threads(1)
    for _ in range(10):
        gmod.run()
    assert gmod.module.runs_alone == 0
    for got, want in zip(_outputs(gmod), _ref(), strict=True):
        np.testing.assert_allclose(got, want, **TOL)
