"""Element-indexed and positional operators, and the losses built on them, compiled end
to end and compared with onnxruntime at pass opt_level 0 and 3: GatherElements,
ScatterElements (and the old Scatter), ScatterND, TopK, CumSum, CumProd, Trilu, OneHot,
CenterCropPad, Compress, ReverseSequence,
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, on float32 and float64.
The cases: tests/support/op_cases/index.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import pipeline
from pipeline.errors import ModelError, UnsupportedOperatorError
from pipeline.frontend import from_onnx
from tests.support.compare import run_ours
from tests.support.onnx_models import rand
from tests.support.op_cases.elementwise import check, doubles, ints, model_of
from tests.support.op_cases.index import CASES, LABELS, NOT_IN_ONNXRUNTIME, X, graph, nll
from tests.support.op_cases.shape import i64

pytest.importorskip("onnxruntime")

node = helper.make_node


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime(case, opt_level):
    model, feeds = CASES[case]()
    check(model, feeds, opt_level, reference=case in NOT_IN_ONNXRUNTIME)


def test_tensor_scatter_past_the_cache_end_is_a_runtime_error():
    """Linear mode: write index 5 + 2 rows > 6 (circular mode would wrap)."""
    model, feeds = graph("TensorScatter", {"c": rand(2, 6, 4), "u": rand(2, 2, 4, seed=1)},
                         {"w": np.array([0, 5], np.int64)}, opset=24)
    with pytest.raises(RuntimeError, match="returned an error"):
        run_ours(model, feeds)


def test_index_out_of_range_is_a_runtime_error():
    model, feeds = graph("GatherElements", {"x": X}, {"i": np.full((1, 4, 5), 3, np.int64)},
                         axis=0)
    with pytest.raises(RuntimeError, match="returned an error"):
        run_ours(model, feeds)


def test_nll_target_outside_classes_is_a_runtime_error():
    model, feeds = nll(rand(3, 4), np.array([1, 4, 0]))
    with pytest.raises(RuntimeError, match="returned an error"):
        run_ours(model, feeds)


def test_topk_k_from_runtime_input_runs_only_in_the_vm():
    """A k given at run time makes a data-dependent TopK: the graph executor refuses it
    in one line naming it (the VM runs it: tests/runtime/test_vm_dynamic.py)."""
    model, feeds = graph("TopK", {"x": X, "k": i64(2)}, outputs=("v", "i"))
    graph_ir, params = from_onnx(model)
    with pytest.raises(UnsupportedOperatorError, match=r"data-dependent output shapes at "
                       r"node\(s\) .*\(topk\w*\).*only the VM runs them"):
        pipeline.build(graph_ir, target="llvm", params=params)


def test_loss_on_int_input_names_the_node():
    model = model_of([node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], name="loss")],
                     {"x": ints(3, 4), "t": LABELS[:, 0]}, np.int64, 13)
    with pytest.raises(ModelError, match=r"node 'loss' \(nll_loss\): input int64"):
        from_onnx(model)


def test_cast_with_float64_tensor_proto_constant():
    """A DOUBLE Constant feeds a float64 chain (the frontend's dtype map)."""
    value = helper.make_tensor("c", TensorProto.DOUBLE, [3], [0.1, 0.2, 0.3])
    model = model_of([node("Constant", [], ["c"], value=value), node("Add", ["x", "c"], ["y"])],
                     {"x": doubles(2, 3)}, np.float64, 13)
    check(model, {"x": doubles(2, 3)}, 3)
