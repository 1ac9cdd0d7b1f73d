"""Shape, data-movement and indexing operators compiled end to end and compared
with onnxruntime at pass opt_level 0 and 3: Transpose, Squeeze/Unsqueeze,
Slice, Split, Gather, Pad, Expand, Tile, DepthToSpace, SpaceToDepth, Resize,
Upsample, and Shape chains the frontend evaluates at build time.
The cases: tests/support/op_cases/shape.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import pipeline
from pipeline.errors import ModelError, UnsupportedOperatorError
from pipeline.frontend import from_onnx
from tests.support.compare import run_ours
from tests.support.onnx_models import rand
from tests.support.op_cases.elementwise import check, ints, model_of
from tests.support.op_cases.shape import CASES, NOT_IN_ONNXRUNTIME, gather, i64, resize, shape_chain

pytest.importorskip("onnxruntime")

node = helper.make_node


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime(case, opt_level):
    model, feeds = CASES[case]()
    check(model, feeds, opt_level, reference=case in NOT_IN_ONNXRUNTIME)


def test_shape_chain_leaves_no_nodes():
    """Shape -> Gather -> Unsqueeze -> Concat is evaluated during import and the
    nodes that computed the Reshape target are dropped."""
    graph, _ = from_onnx(shape_chain()[0])
    assert [n.op for n in graph.nodes] == ["reshape", "relu"]


def test_gather_out_of_range_index_is_a_runtime_error():
    model, feeds = gather(i64(0, 5), axis=1)
    with pytest.raises(RuntimeError, match="returned an error"):
        run_ours(model, feeds, opt_level=0)


def test_reshape_shape_from_runtime_input_runs_only_in_the_vm():
    """A shape input given at run time makes a data-dependent Reshape: the graph
    executor refuses it in one line naming the node (the VM runs it:
    tests/runtime/test_vm_dynamic.py)."""
    x = rand(2, 6)
    nodes = [node("Reshape", ["x", "s"], ["y"], name="r")]
    model = model_of(nodes, {"x": x, "s": i64(3, 4)}, out_shape=(3, 4))
    graph, params = from_onnx(model)
    with pytest.raises(UnsupportedOperatorError, match=r"data-dependent output shapes at "
                       r"node\(s\) r \(reshape_to\): only the VM runs them"):
        pipeline.build(graph, target="llvm", params=params)


def test_resize_tf_crop_and_resize_without_roi_is_a_model_error():
    model, _ = resize(rand(1, 1, 3, 3), [1, 1, 2, 2], mode="linear",
                      coordinate_transformation_mode="tf_crop_and_resize")
    with pytest.raises(ModelError, match="tf_crop_and_resize needs a roi of 8 values"):
        from_onnx(model)


def fused_bodies(model):
    from pipeline.transform import PassContext, optimize

    graph, params = from_onnx(model)
    with PassContext(opt_level=3):
        graph, _ = optimize(graph, params)
    return [tuple(b.op for b in n.attr("body")) for n in graph.nodes]


def test_data_movement_takes_epilogues_of_its_dtype_only():
    """Transpose and Gather anchor a kernel and take the elementwise ops after them,
    int64 ones included; a dtype change (Cast) starts a kernel of its own."""
    assert fused_bodies(CASES["transpose_then_add_relu"]()[0]) == [("transpose", "add", "relu")]
    nodes = [node("Gather", ["x", "i"], ["g"], axis=0), node("Mul", ["g", "k"], ["m"]),
             node("Cast", ["m"], ["y"], to=TensorProto.FLOAT)]
    feeds = {"x": ints(4, 3)}
    model = model_of(nodes, feeds, inits={"i": i64(3, 0), "k": i64(2, 3, 4)})
    assert fused_bodies(model) == [("gather", "mul"), ("cast",)]
    check(model, feeds, 3)


def test_reshapes_of_intermediates_are_aliases_not_copies():
    """Flatten / Reshape / Squeeze of an intermediate share its storage and run nothing
    (`__nop`, no kernel), also chained and while the source is still read afterwards;
    a reshape of a graph input or into a graph output stays a copy. Every output
    matches onnxruntime."""
    import json

    from tests.support.compare import build_and_load, run_ort
    from tests.support.onnx_models import make_model

    node = helper.make_node
    nodes = [node("Relu", ["x"], ["a"]),
             node("Flatten", ["a"], ["f"], axis=1),                 # alias of a
             node("Reshape", ["f", "s"], ["r"]),                      # alias of an alias
             node("Neg", ["r"], ["n"]),
             node("Add", ["a", "a"], ["later"]),                      # a read after its alias
             node("Reshape", ["later", "s"], ["out2"]),               # into a graph output
             node("Reshape", ["x", "s"], ["xr"]),                     # of a graph input
             node("Mul", ["n", "xr"], ["m"]),
             node("Squeeze", ["m", "ax"], ["sq"]),                    # alias, then read
             node("Sigmoid", ["sq"], ["out1"])]
    model = make_model(nodes, [("x", (1, 2, 3, 4))], [("out1", None), ("out2", None)],
                       {"s": np.array([1, 24], np.int64), "ax": np.array([0], np.int64)})
    feeds = {"x": rand(1, 2, 3, 4, seed=4, low=-2, high=2)}
    graph, params = from_onnx(model)
    gm, factory = build_and_load(graph, params)
    for got, want in zip([gm.run(**feeds) or gm.get_output(k) for k in range(2)],
                         run_ort(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    doc = json.loads(factory.lowered.graph_json)
    funcs = [n["attrs"]["func_name"] for n in doc["nodes"] if n["op"] == "tvm_op"]
    assert funcs.count("__nop") == 3, funcs
    sids = doc["attrs"]["storage_id"][1]
    for k, n in enumerate(doc["nodes"]):
        if n.get("attrs", {}).get("func_name") == "__nop":
            assert sids[k] == sids[n["inputs"][0][0]]
    assert sum(f.startswith("reshape_") for f in funcs) == 2, funcs  # the copies


def test_concat_of_intermediates_is_written_in_place():
    """A concat whose inputs are contiguous pieces of its output (dims before the axis
    all 1) on 64-byte boundaries runs nothing: each input lives at its offset in the
    output's storage, chained concats nested into the last. Concats that cannot
    (an input twice, a batch before the axis, pieces off the boundary) still copy.
    Every output matches onnxruntime, also read through a slice after the concat."""
    import json

    from tests.support.compare import build_and_load, run_ort
    from tests.support.onnx_models import make_model

    node = helper.make_node
    nodes = [node("Relu", ["x"], ["a"]),                         # [1, 4, 4, 4]: 256 bytes
             node("Sigmoid", ["x"], ["b"]),
             node("Concat", ["a", "b"], ["c"], axis=1),          # in place
             node("Neg", ["x"], ["d"]),
             node("Concat", ["c", "d"], ["e"], axis=1),          # in place, c nested in e
             node("Tanh", ["e"], ["out1"]),
             node("Mul", ["a", "b"], ["ab"]),                     # a read after the concat
             node("Concat", ["ab", "ab"], ["twice"], axis=1),    # an input twice: copies
             node("Exp", ["y"], ["ey"]),                          # [2, 3, 1, 1]
             node("Abs", ["y"], ["ay"]),
             node("Concat", ["ey", "ay"], ["batch"], axis=1),    # a batch of 2: copies
             node("Concat", ["twice", "x"], ["out2"], axis=1),   # a graph input: copies
             node("Relu", ["batch"], ["out3"])]
    model = make_model(nodes, [("x", (1, 4, 4, 4)), ("y", (2, 3, 1, 1))],
                       [("out1", None), ("out2", None), ("out3", None)], {})
    feeds = {"x": rand(1, 4, 4, 4, seed=5, low=-2, high=2),
             "y": rand(2, 3, 1, 1, seed=6, low=-2, high=2)}
    graph, params = from_onnx(model)
    gm, factory = build_and_load(graph, params)
    gm.run(**feeds)
    for k, want in enumerate(run_ort(model, feeds)):
        np.testing.assert_allclose(gm.get_output(k), want, rtol=1e-6, atol=1e-6)
    doc = json.loads(factory.lowered.graph_json)
    attrs = doc["attrs"]
    sids, offsets = attrs["storage_id"][1], attrs["storage_offset"][1]
    shapes = attrs["shape"][1]
    concats = [(k, n) for k, n in enumerate(doc["nodes"]) if n["name"].startswith("fused_concat")]
    in_place = [(k, n) for k, n in concats if n["attrs"]["func_name"] == "__nop"]
    assert len(concats) == 5 and len(in_place) == 2, [n["attrs"]["func_name"] for _, n in concats]
    for k, n in in_place:
        at = offsets[k]
        for i, *_ in n["inputs"]:
            assert (sids[i], offsets[i]) == (sids[k], at)
            at += 4 * int(np.prod(shapes[i]))
        assert at == offsets[k] + 4 * int(np.prod(shapes[k]))
    assert offsets[in_place[0][0]] == 0 and offsets[in_place[0][1]["inputs"][1][0]] == 256
    # The debug executor joins an in-place concat's output from its inputs' recordings.
    from onnx.reference import ReferenceEvaluator

    from pipeline.runtime.debug_executor import GraphModuleDebug

    c, e = ReferenceEvaluator(model).run(["c", "e"], feeds)
    debug = GraphModuleDebug(gm.module, timing_runs=1)
    debug.run(**feeds)
    for (_, n), want in zip(in_place, (c, e), strict=True):
        np.testing.assert_allclose(debug.node_outputs[n["name"]][0], want, rtol=1e-6)
        np.testing.assert_allclose(debug.debug_get_output(n["name"]), want, rtol=1e-6)


def test_merged_axes_read_the_same_offsets():
    """merge_axes (the remap lowering's fewer, longer loops) keeps every output
    element's input offset: transposes and slices of random shapes, compared with
    the unmerged tables, with at least one case really merging."""
    from functools import reduce

    from pipeline.kernels.movement import merge_axes

    def offsets(tables):
        return reduce(np.add, np.ix_(*tables), np.zeros((), np.int64)).reshape(-1)

    rng = np.random.default_rng(0)
    merged = 0
    for _ in range(200):
        shape = tuple(int(d) for d in rng.integers(1, 5, rng.integers(1, 6)))
        perm = rng.permutation(len(shape))
        strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
        starts = [int(rng.integers(0, d)) for d in shape]
        out = tuple(shape[p] - starts[p] for p in perm)  # a slice, then transposed
        tables = [(starts[p] + np.arange(d, dtype=np.int64)) * strides[p]
                  for d, p in zip(out, perm, strict=True)]
        dims, new = merge_axes(out, tables)
        assert [len(t) for t in new] == list(dims)
        np.testing.assert_array_equal(offsets(new), offsets(tables))
        merged += len(dims) < len(out)
    assert merged > 50
