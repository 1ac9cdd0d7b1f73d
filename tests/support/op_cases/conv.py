"""The operator cases of tests/ops/test_ops_conv.py: CASES maps a name to a function
returning (model, feeds). tests/cross/test_cpu_sweep.py compiles them for every CPU."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from tests.support.nn_cases import model, one
from tests.support.onnx_models import rand

node = helper.make_node
# -- Conv / ConvTranspose -----------------------------------------------------------------

def conv(op_type, x_shape, w_shape, bias=True, w_input=False, **attrs):
    oc = w_shape[1] * attrs.get("group", 1) if op_type == "ConvTranspose" else w_shape[0]
    inits = {} if w_input else {"w": rand(*w_shape, seed=1)}
    if bias:
        inits["b"] = rand(oc, seed=2)
    inputs = {"x": rand(*x_shape)} | ({"w": rand(*w_shape, seed=1)} if w_input else {})
    return model([node(op_type, ["x", "w", *(["b"] if bias else [])], ["y"], **attrs)],
                 inputs, inits)


def mobilenet_block():
    """Expand 1x1 -> BN -> Clip(0, 6) -> depthwise 3x3 s1 -> BN -> Clip -> project 1x1
    -> BN -> residual Add, as in MobileNetV2 (Clip with constant min/max inputs)."""
    c, e = 4, 12
    inits = {"w1": rand(e, c, 1, 1, seed=1), "w2": rand(e, 1, 3, 3, seed=2),
             "w3": rand(c, e, 1, 1, seed=3), "lo": np.array(0.0, np.float32),
             "hi": np.array(6.0, np.float32)}
    nodes = []
    for k, ch in ((1, e), (2, e), (3, c)):
        inits |= {f"s{k}": rand(ch, seed=10 + k, low=0.5, high=1.5),
                  f"o{k}": rand(ch, seed=20 + k), f"m{k}": rand(ch, seed=30 + k),
                  f"v{k}": rand(ch, seed=40 + k, low=0.5, high=2.0)}
    nodes += [node("Conv", ["x", "w1"], ["c1"]),
              node("BatchNormalization", ["c1", "s1", "o1", "m1", "v1"], ["b1"]),
              node("Clip", ["b1", "lo", "hi"], ["r1"]),
              node("Conv", ["r1", "w2"], ["c2"], group=e, pads=[1, 1, 1, 1]),
              node("BatchNormalization", ["c2", "s2", "o2", "m2", "v2"], ["b2"]),
              node("Clip", ["b2", "lo", "hi"], ["r2"]),
              node("Conv", ["r2", "w3"], ["c3"]),
              node("BatchNormalization", ["c3", "s3", "o3", "m3", "v3"], ["b3"]),
              node("Add", ["b3", "x"], ["y"])]
    return model(nodes, {"x": rand(1, c, 9, 9, low=-3, high=3)}, inits)


def conv_t_relu():
    m, feeds = conv("ConvTranspose", (1, 4, 5, 5), (4, 3, 2, 2), strides=[2, 2])
    m.graph.node[0].output[0] = "t"
    m.graph.node.append(node("Relu", ["t"], ["y"]))
    return m, feeds


def causal_conv(length=7, k=4):
    """CausalConvWithState (opset 27) with bias, past state and silu: both outputs."""
    inputs = {"x": rand(2, 3, length), "past": rand(2, 3, k - 1, seed=3)}
    return model([node("CausalConvWithState", ["x", "w", "b", "past"], ["y", "s"],
                       activation="silu")], inputs,
                 {"w": rand(3, 1, k, seed=1), "b": rand(3, seed=2)}, opset=27,
                 outputs=(("y", (2, 3, length)), ("s", (2, 3, k - 1))))


def conv_bn(op_type, x_shape, w_shape, **attrs):
    """`op_type` followed by BatchNormalization with constant statistics: after
    FoldBatchNorm (opt_level >= 1) one conv with folded weights and bias."""
    m, feeds = conv(op_type, x_shape, w_shape, **attrs)
    oc = m.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    m.graph.node[0].output[0] = "t"
    for k, name in enumerate(["s", "o", "mu", "v"]):
        m.graph.initializer.append(helper.make_tensor(
            name, TensorProto.FLOAT, (oc,),
            rand(oc, seed=20 + k, low=0.5 if name == "v" else -1.0, high=1.5).tolist()))
    m.graph.node.append(node("BatchNormalization", ["t", "s", "o", "mu", "v"], ["y"]))
    return m, feeds


CONV = {
    "conv1d_pads": lambda: conv("Conv", (2, 3, 10), (4, 3, 3), pads=[1, 2]),
    # a 1-wide input: the implicit GEMM's patch positions fold to Python ints
    "conv1d_size1_pad1": lambda: conv("Conv", (1, 3, 1), (4, 3, 3), pads=[1, 1]),
    "conv1d_s2_d2_groups": lambda: conv("Conv", (1, 4, 13), (6, 2, 3), group=2,
                                        strides=[2], dilations=[2]),
    "conv1d_same_upper": lambda: conv("Conv", (1, 3, 9), (5, 3, 4), auto_pad="SAME_UPPER",
                                      strides=[2]),
    "conv1d_depthwise_nobias": lambda: conv("Conv", (1, 4, 8), (4, 1, 5), bias=False,
                                            group=4, auto_pad="SAME_LOWER"),
    "conv_depthwise_s2_same": lambda: conv("Conv", (1, 6, 9, 9), (6, 1, 3, 3), group=6,
                                           strides=[2, 2], auto_pad="SAME_UPPER"),
    "conv_depthwise_multiplier": lambda: conv("Conv", (1, 3, 7, 7), (6, 1, 3, 3), group=3,
                                              pads=[1, 1, 1, 1]),
    "conv_groups3_dil_s2": lambda: conv("Conv", (1, 6, 11, 10), (9, 2, 3, 2), group=3,
                                        strides=[2, 1], dilations=[2, 3], pads=[2, 1, 0, 3]),
    "conv_same_lower_dil": lambda: conv("Conv", (1, 2, 8, 7), (3, 2, 3, 3),
                                        auto_pad="SAME_LOWER", dilations=[2, 2], strides=[2, 2]),
    "conv_kernel_shape_attr": lambda: conv("Conv", (1, 2, 6, 6), (3, 2, 3, 3),
                                           kernel_shape=[3, 3], auto_pad="VALID"),
    # No output sees every tap inside the input: all border rectangles, no interior.
    "conv_no_interior": lambda: conv("Conv", (1, 2, 3, 4), (3, 2, 5, 5), pads=[2, 2, 2, 2]),
    "conv_wide_pads_s2": lambda: conv("Conv", (1, 2, 9, 8), (2, 2, 3, 3), strides=[2, 2],
                                      pads=[3, 1, 2, 4]),
    # The implicit-GEMM path (>= 4 output channels per group, C/g * kh * kw >= 8):
    # groups, dilation, stride, padding, panel tails, two k chunks, 1x1 forms.
    "conv_gemm_groups2_dil": lambda: conv("Conv", (1, 8, 11, 10), (8, 4, 3, 3), group=2,
                                          dilations=[2, 1], pads=[2, 1, 1, 0], strides=[1, 2]),
    "conv_gemm_1x1_s2_pads": lambda: conv("Conv", (1, 16, 9, 9), (20, 16, 1, 1),
                                          strides=[2, 2], pads=[1, 1, 1, 1]),
    "conv_gemm_1x1_tails": lambda: conv("Conv", (2, 16, 5, 7), (21, 16, 1, 1)),
    "conv_gemm_k_chunks": lambda: conv("Conv", (1, 64, 6, 6), (8, 64, 3, 3), bias=False,
                                       pads=[1, 1, 1, 1]),
    "conv3d_s2_pads": lambda: conv("Conv", (1, 3, 6, 7, 5), (4, 3, 3, 3, 2), strides=[2, 1, 2],
                                   pads=[1, 1, 0, 1, 0, 1]),
    "conv3d_groups_dil_same": lambda: conv("Conv", (2, 4, 5, 6, 6), (6, 2, 2, 3, 3), group=2,
                                           dilations=[1, 2, 1], auto_pad="SAME_UPPER"),
    "conv3d_depthwise_nobias": lambda: conv("Conv", (1, 3, 4, 5, 6), (3, 1, 3, 3, 3),
                                            bias=False, group=3, pads=[1] * 6),
    "conv_runtime_weight": lambda: conv("Conv", (2, 3, 6, 6), (4, 3, 3, 3), w_input=True,
                                        pads=[1, 1, 1, 1]),
    "mobilenetv2_block": mobilenet_block,
    "convt_k3": lambda: conv("ConvTranspose", (1, 3, 5, 5), (3, 2, 3, 3)),
    "convt_unet_k2s2": lambda: conv("ConvTranspose", (2, 4, 4, 5), (4, 3, 2, 2),
                                    strides=[2, 2]),
    "convt_s2_pads_outpad": lambda: conv("ConvTranspose", (1, 2, 4, 4), (2, 3, 3, 3),
                                         strides=[2, 2], pads=[1, 1, 1, 1],
                                         output_padding=[1, 1]),
    "convt_asym_s3_dil": lambda: conv("ConvTranspose", (1, 2, 3, 4), (2, 2, 3, 2),
                                      bias=False, strides=[3, 2], dilations=[2, 1],
                                      pads=[1, 2, 0, 1]),
    "convt_groups2": lambda: conv("ConvTranspose", (1, 4, 4, 4), (4, 3, 3, 3), group=2,
                                  strides=[2, 2], pads=[1, 1, 1, 1]),
    "convt_depthwise": lambda: conv("ConvTranspose", (1, 3, 4, 4), (3, 1, 4, 4), group=3,
                                    strides=[2, 2], pads=[1, 1, 1, 1]),
    "convt_output_shape": lambda: conv("ConvTranspose", (1, 2, 3, 3), (2, 2, 3, 3),
                                       strides=[2, 2], output_shape=[8, 7]),
    "convt_output_shape_same_upper": lambda: conv("ConvTranspose", (1, 2, 3, 3),
                                                  (2, 2, 3, 3), strides=[2, 2],
                                                  output_shape=[6, 5], auto_pad="SAME_UPPER"),
    "convt_same_upper": lambda: conv("ConvTranspose", (1, 2, 3, 4), (2, 2, 3, 3),
                                     strides=[2, 2], auto_pad="SAME_UPPER"),
    "convt_same_lower": lambda: conv("ConvTranspose", (1, 2, 3, 4), (2, 2, 4, 3),
                                     strides=[2, 2], auto_pad="SAME_LOWER"),
    "convt_valid": lambda: conv("ConvTranspose", (1, 2, 3, 3), (2, 2, 3, 3), strides=[2, 2],
                                auto_pad="VALID"),
    "convt_1d": lambda: conv("ConvTranspose", (2, 3, 6), (3, 2, 4), strides=[2],
                             pads=[1, 1]),
    "convt_1d_output_shape": lambda: conv("ConvTranspose", (1, 2, 5), (2, 3, 3),
                                          strides=[3], output_shape=[16]),
    # Several row chunks, two groups, 9 taps (three tap groups) and a scalar tail.
    "convt_chunks_groups_tail": lambda: conv("ConvTranspose", (1, 128, 20, 21), (128, 3, 3, 3),
                                             group=2, strides=[2, 2], pads=[1, 0, 1, 1]),
    "convt3d_s2_pads_outpad": lambda: conv("ConvTranspose", (1, 3, 3, 4, 3), (3, 2, 3, 2, 3),
                                           strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1],
                                           output_padding=[1, 0, 1]),
    "convt3d_groups_dil": lambda: conv("ConvTranspose", (2, 4, 3, 3, 3), (4, 1, 2, 2, 2),
                                       group=2, dilations=[2, 1, 1], bias=False),
    "convt_runtime_weight": lambda: conv("ConvTranspose", (1, 2, 3, 3), (2, 2, 2, 2),
                                         w_input=True, strides=[2, 2]),
    "convt_relu_fused": conv_t_relu,
    "conv1d_bn_folded": lambda: conv_bn("Conv", (2, 3, 9), (4, 3, 3), pads=[1, 1]),
    "convt_groups_bn_folded": lambda: conv_bn("ConvTranspose", (1, 4, 3, 3), (4, 3, 2, 2),
                                              group=2, strides=[2, 2]),
    "convt1d_bn_folded": lambda: conv_bn("ConvTranspose", (1, 3, 5), (3, 2, 3), bias=False,
                                         strides=[2]),
    "conv3d_bn_folded": lambda: conv_bn("Conv", (1, 2, 4, 4, 4), (3, 2, 2, 2, 2)),
    "convt3d_bn_folded": lambda: conv_bn("ConvTranspose", (1, 4, 2, 3, 2), (4, 1, 2, 2, 2),
                                         group=2, strides=[2, 2, 2]),
}


# -- pooling ---------------------------------------------------------------------------------

POOL = {
    "maxpool1d_s2_p1": lambda: one("MaxPool", (2, 3, 9), kernel_shape=[3], strides=[2],
                                   pads=[1, 1]),
    "maxpool1d_dil_ceil": lambda: one("MaxPool", (1, 2, 10), kernel_shape=[2], strides=[3],
                                      dilations=[2], ceil_mode=1),
    "avgpool1d_incl": lambda: one("AveragePool", (1, 2, 8), kernel_shape=[3], pads=[1, 2],
                                  count_include_pad=1),
    "maxpool_same_lower": lambda: one("MaxPool", (1, 2, 7, 6), kernel_shape=[3, 2],
                                      strides=[2, 2], auto_pad="SAME_LOWER"),
    "maxpool_dil_pads_ceil": lambda: one("MaxPool", (1, 2, 9, 9), kernel_shape=[3, 3],
                                         strides=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1],
                                         ceil_mode=1),
    "avgpool_valid": lambda: one("AveragePool", (1, 2, 7, 6), kernel_shape=[2, 3],
                                 strides=[2, 2], auto_pad="VALID"),
    "avgpool_same_upper_excl": lambda: one("AveragePool", (1, 2, 7, 7), kernel_shape=[3, 3],
                                           strides=[2, 2], auto_pad="SAME_UPPER"),
    "avgpool_dilations_v19": lambda: one("AveragePool", (1, 2, 8, 8), opset=19,
                                         kernel_shape=[2, 2], dilations=[2, 2],
                                         pads=[1, 1, 1, 1]),
    "lppool_p2_pads_s2": lambda: one("LpPool", (1, 3, 7, 6), opset=11, kernel_shape=[3, 2],
                                     strides=[2, 2], pads=[1, 0, 1, 1]),
    "lppool1d_p3": lambda: one("LpPool", (2, 2, 9), opset=11, kernel_shape=[3], p=3),
    "lppool_p1_ceil_v18": lambda: one("LpPool", (1, 2, 7, 7), opset=18, kernel_shape=[2, 2],
                                      strides=[2, 2], p=1, ceil_mode=1),
    "global_lppool_p2": lambda: one("GlobalLpPool", (2, 3, 4, 5)),
    "global_lppool_p3_1d": lambda: one("GlobalLpPool", (2, 3, 6), p=3),
    # (No window may start in the end padding: onnx 1.23's shape inference counts
    # such windows, onnxruntime and onnx.reference drop them, as we do.)
    "maxpool3d_s2_pads_ceil": lambda: one("MaxPool", (1, 2, 5, 6, 7), kernel_shape=[3, 2, 3],
                                          strides=[2, 2, 2], pads=[1, 1, 1, 0, 0, 1],
                                          ceil_mode=1),
    "avgpool3d_incl_same_upper": lambda: one("AveragePool", (2, 2, 4, 5, 6),
                                             kernel_shape=[2, 3, 3], strides=[2, 2, 2],
                                             auto_pad="SAME_UPPER", count_include_pad=1),
    "avgpool3d_excl_dil_v19": lambda: one("AveragePool", (1, 1, 6, 6, 6), opset=19,
                                          kernel_shape=[2, 2, 2], dilations=[2, 1, 2],
                                          pads=[1, 1, 1, 1, 1, 1]),
    "lppool3d_p2": lambda: one("LpPool", (1, 2, 4, 4, 4), opset=18, kernel_shape=[2, 2, 2]),
    "global_maxpool": lambda: one("GlobalMaxPool", (2, 3, 5, 4)),
    "global_maxpool_1d": lambda: one("GlobalMaxPool", (2, 3, 7)),
    "global_avgpool_1d": lambda: one("GlobalAveragePool", (2, 3, 7)),
}


CAUSAL = {"causal_conv_past_bias_silu": causal_conv,
          "causal_conv_short_input": lambda: causal_conv(length=2, k=5)}

CASES = CONV | POOL | CAUSAL
# Valid ONNX that onnxruntime refuses (dilation with SAME padding; opset 27's
# CausalConvWithState): compared with onnx.reference instead.
REFERENCE_ONLY = {"conv_same_lower_dil", "conv3d_groups_dil_same", *CAUSAL}
