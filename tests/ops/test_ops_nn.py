"""Normalisation, linear algebra, softmax and reduction operators
(Batch/Instance/LayerNormalization, LRN, Gemm/MatMul, Softmax/LogSoftmax,
Reduce*, ArgMax/ArgMin) compiled end to end and compared with onnxruntime at
pass opt_level 0 and 3, plus one-line errors for what we do not support.
The cases: tests/support/op_cases/nn.py."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from tests.support.nn_cases import check, check_error, unchecked, with_epilogue
from tests.support.onnx_models import rand
from tests.support.op_cases.nn import CASES, REFERENCE_ONLY

pytest.importorskip("onnxruntime")

node = helper.make_node


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_nn_op_matches_onnxruntime(case, opt_level):
    m, feeds = CASES[case]()
    check(m, feeds, opt_level, reference=case in REFERENCE_ONLY)


FUSED = ["layernorm_axis1", "layernorm_axis0", "rmsnorm_axis1", "instancenorm_3d",
         "groupnorm21_per_channel", "lrn_size5", "matmul_1d_2d",
         "matmul_2d_1d", "matmul_1d_3d", "matmul_4d_broadcast", "matmul_tile_edges",
         "gemm_transa", "matmul_tile_edges_const_b", "ReduceMean_middle_input",
         "reducemean_spatial_keep", "ReduceLogSumExp_last_attr", "ReduceL2_all"]


@pytest.mark.parametrize("case", FUSED)
def test_fused_epilogue_sees_the_right_index(case):
    m, feeds = with_epilogue(*CASES[case]())
    check(m, feeds, 3, reference=case in REFERENCE_ONLY)


# -- errors: one line naming the node ---------------------------------------------------------

ERRORS = {
    "batchnorm_training": (lambda: unchecked(
        [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="c0",
              training_mode=1)], (2, 3), {k: rand(3) for k in "sbmv"}, opset=15,
        outputs=("y", "rm", "rv")), "training mode"),
    "reduce_runtime_axes": (lambda: helper.make_model(helper.make_graph(
        [node("ReduceSum", ["x", "axes"], ["y"], name="c0")], "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3)),
         helper.make_tensor_value_info("axes", TensorProto.INT64, (1,))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 13)]), "build time"),
    "reduce_axis_out_of_range": (lambda: unchecked(
        [node("ReduceMean", ["x"], ["y"], name="c0", axes=[3])], (2, 3)), "axis"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_unsupported_is_one_clear_line(case):
    check_error(*ERRORS[case])
