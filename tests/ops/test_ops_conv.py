"""Convolution and pooling operators (Conv/ConvTranspose 1-D and 2-D with groups,
dilation, strides, pads and auto_pad; MaxPool/AveragePool/global pools) compiled
end to end and compared with onnxruntime at pass opt_level 0 and 3; BatchNorm
folding into every convolution; one-line errors for what we do not support.
CausalConvWithState (opset 27) against onnx.reference.
The cases: tests/support/op_cases/conv.py."""

from __future__ import annotations

import pytest
from onnx import helper

from pipeline.frontend import from_onnx
from pipeline.transform import PassContext, optimize
from tests.support.nn_cases import check, check_error, unchecked, with_epilogue
from tests.support.onnx_models import rand
from tests.support.op_cases.conv import CASES, REFERENCE_ONLY

pytest.importorskip("onnxruntime")

node = helper.make_node


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_conv_pool_op_matches_onnxruntime(case, opt_level):
    m, feeds = CASES[case]()
    check(m, feeds, opt_level, reference=case in REFERENCE_ONLY)


FUSED = ["conv1d_pads", "conv1d_s2_d2_groups", "conv_depthwise_s2_same", "conv_no_interior",
         "conv_gemm_groups2_dil", "conv_gemm_1x1_tails", "convt_1d", "convt_asym_s3_dil",
         "convt_chunks_groups_tail", "maxpool1d_s2_p1", "avgpool1d_incl", "lppool_p2_pads_s2",
         "global_maxpool", "global_lppool_p3_1d", "global_avgpool_1d",
         "maxpool3d_s2_pads_ceil", "conv3d_s2_pads", "convt3d_s2_pads_outpad",
         "causal_conv_past_bias_silu", "causal_conv_short_input"]


@pytest.mark.parametrize("case", FUSED)
def test_fused_epilogue_sees_the_right_index(case):
    m, feeds = with_epilogue(*CASES[case]())
    check(m, feeds, 3, reference=case in REFERENCE_ONLY)


@pytest.mark.parametrize(("case", "op"), [("conv1d_bn_folded", "conv1d"),
                                          ("convt_groups_bn_folded", "conv_transpose2d"),
                                          ("convt1d_bn_folded", "conv_transpose1d"),
                                          ("conv3d_bn_folded", "conv3d"),
                                          ("convt3d_bn_folded", "conv_transpose3d")])
def test_batch_norm_folds_into_any_conv(case, op):
    m, _ = CASES[case]()
    graph, params = from_onnx(m)
    with PassContext(opt_level=1, disabled_pass=["FuseOps"]):
        graph, _ = optimize(graph, params)
    assert [n.op for n in graph.nodes] == [op]


# -- errors: one line naming the node ---------------------------------------------------------

ERRORS = {
    "conv_bad_auto_pad": (lambda: unchecked(
        [node("Conv", ["x", "w"], ["y"], name="c0", auto_pad="SAME")], (1, 2, 5, 5),
        {"w": rand(3, 2, 3, 3)}), "auto_pad"),
    "conv4d": (lambda: unchecked([node("Conv", ["x", "w"], ["y"], name="c0")],
                                 (1, 2, 3, 3, 3, 3), {"w": rand(3, 2, 2, 2, 2, 2)}), "3-D"),
    "maxpool_indices": (lambda: unchecked(
        [node("MaxPool", ["x"], ["y", "indices"], name="c0", kernel_shape=[2, 2])],
        (1, 2, 4, 4), outputs=("y", "indices")), "Indices"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_unsupported_is_one_clear_line(case):
    check_error(*ERRORS[case])
