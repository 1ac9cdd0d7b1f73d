"""MobileNetV2 (torchvision layout, width 1.0, batch 1 unless asked, 224x224) as an ONNX model.

The graph follows torchvision's `mobilenet_v2` written the way the PyTorch exporter
writes an eval-mode model without optimisation: bias-free Conv, then its own
BatchNormalization, then ReLU6 as Clip (opset 11+ form, min 0 and max 6 as scalar
initializer inputs). Each inverted residual block is an optional 1x1 expansion
(x6), a depthwise 3x3 Conv (group = channels) carrying the stride, and a linear
1x1 projection; blocks that keep shape add their input back. The head is a 1x1 Conv
to 1280 channels, GlobalAveragePool, Flatten and a Gemm to 1000 classes (the
classifier's Dropout disappears in eval mode). Names follow the PyTorch modules
("features.2.conv.1.0" is block 2's depthwise conv).

Weights are random but seeded, scaled as in models/resnet.py so activations stay
O(1): He-normal convs, BN gamma in [0.5, 1), and the projection BN of residual
blocks gamma in [0.2, 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from models._onnx import GraphBuilder, he_normal, small_bias

SEED = 2
INPUT_SHAPE = (1, 3, 224, 224)
NUM_CLASSES = 1000
BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9
GAMMA = (0.5, 1.0)
RESIDUAL_GAMMA = (0.2, 0.5)
# torchvision's inverted_residual_setting: expansion t, channels c, repeats n, stride s.
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
            (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
STEM_CHANNELS = 32
LAST_CHANNELS = 1280


@dataclass
class _Layers:
    """Emits conv / bn / relu6 nodes with seeded parameters into one graph."""

    g: GraphBuilder
    rng: np.random.Generator
    clip_min: str
    clip_max: str

    def conv_bn(
        self,
        x: str,
        prefix: str,
        c_in: int,
        c_out: int,
        k: int,
        stride: int = 1,
        groups: int = 1,
        gamma: tuple[float, float] = GAMMA,
        bn_name: str | None = None,
    ) -> str:
        """Conv "{prefix}" (bias-free, padding k // 2) then BN "{bn_name}".

        Without `bn_name` the pair is torchvision's Conv2dNormActivation: the conv is
        "{prefix}.0" and the BN "{prefix}.1". Grouped convs store weights
        [c_out, c_in / groups, k, k], so a depthwise conv's fan-in is k * k.
        """
        conv_name = prefix if bn_name else f"{prefix}.0"
        bn_name = bn_name or f"{prefix}.1"
        shape = (c_out, c_in // groups, k, k)
        w = self.g.initializer(f"{conv_name}.weight", he_normal(self.rng, shape))
        pad = k // 2
        y = self.g.node(
            "Conv",
            [x, w],
            conv_name,
            dilations=[1, 1],
            group=groups,
            kernel_shape=[k, k],
            pads=[pad, pad, pad, pad],
            strides=[stride, stride],
        )
        rng = self.rng
        params = {
            "weight": rng.uniform(*gamma, size=c_out),
            "bias": rng.uniform(-0.1, 0.1, size=c_out),
            "running_mean": rng.uniform(-0.1, 0.1, size=c_out),
            "running_var": rng.uniform(0.5, 1.5, size=c_out),
        }
        inputs = [y] + [self.g.initializer(f"{bn_name}.{k}", v) for k, v in params.items()]
        return self.g.node(
            "BatchNormalization", inputs, bn_name, epsilon=BN_EPSILON, momentum=BN_MOMENTUM
        )

    def relu6(self, x: str, name: str) -> str:
        return self.g.node("Clip", [x, self.clip_min, self.clip_max], name)

    def conv_bn_relu6(self, x: str, prefix: str, c_in: int, c_out: int, k: int,
                      stride: int = 1, groups: int = 1) -> str:
        """Conv2dNormActivation: "{prefix}.0" conv, ".1" BN, ".2" ReLU6."""
        y = self.conv_bn(x, prefix, c_in, c_out, k, stride, groups)
        return self.relu6(y, f"{prefix}.2")

    def inverted_residual(self, x: str, prefix: str, c_in: int, c_out: int, stride: int,
                          expand: int) -> str:
        """[1x1 expand -] depthwise 3x3 (stride) - linear 1x1 project [+ input]."""
        hidden = c_in * expand
        residual = stride == 1 and c_in == c_out
        y, i = x, 0
        if expand != 1:
            y = self.conv_bn_relu6(y, f"{prefix}.conv.0", c_in, hidden, 1)
            i = 1
        y = self.conv_bn_relu6(y, f"{prefix}.conv.{i}", hidden, hidden, 3, stride, hidden)
        y = self.conv_bn(y, f"{prefix}.conv.{i + 1}", hidden, c_out, 1,
                         gamma=RESIDUAL_GAMMA if residual else GAMMA,
                         bn_name=f"{prefix}.conv.{i + 2}")
        return self.g.node("Add", [x, y], f"{prefix}.add") if residual else y


def mobilenet_v2(batch: int = 1) -> onnx.ModelProto:
    """MobileNetV2; data [batch,3,224,224] -> output [batch,1000]."""
    g = GraphBuilder("mobilenet_v2")
    # One shared pair of bounds, as the exporter's constant folding leaves them.
    nn = _Layers(g, np.random.default_rng(SEED), g.initializer("relu6.min", np.float32(0.0)),
                 g.initializer("relu6.max", np.float32(6.0)))

    data = g.input("data", (batch, *INPUT_SHAPE[1:]))
    x = nn.conv_bn_relu6(data, "features.0", 3, STEM_CHANNELS, 3, 2)
    c_in, index = STEM_CHANNELS, 1
    for expand, c_out, repeats, stride in SETTINGS:
        for i in range(repeats):
            # Only a stage's first block changes resolution or width.
            x = nn.inverted_residual(x, f"features.{index}", c_in, c_out,
                                     stride if i == 0 else 1, expand)
            c_in, index = c_out, index + 1
    x = nn.conv_bn_relu6(x, f"features.{index}", c_in, LAST_CHANNELS, 1)

    x = g.node("GlobalAveragePool", [x], "avgpool")
    x = g.node("Flatten", [x], "flatten", axis=1)
    w = g.initializer("classifier.1.weight", he_normal(nn.rng, (NUM_CLASSES, LAST_CHANNELS)))
    b = g.initializer("classifier.1.bias", small_bias(nn.rng, NUM_CLASSES, LAST_CHANNELS))
    x = g.node("Gemm", [x, w, b], "classifier.1", output="output", alpha=1.0, beta=1.0,
               transB=1)
    g.output(x, (batch, NUM_CLASSES))
    return g.build()
