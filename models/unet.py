"""A small U-Net (3 levels, 16-32-64 channels, 64x64 input) as an ONNX model.

data [1, 3, 64, 64] -> output [1, 2, 64, 64] (per-pixel logits of 2 classes).

    inc    DoubleConv 3->16            64x64  --------------------------+ skip
    down1  MaxPool 2, DoubleConv 16->32  32x32  ------------+ skip      |
    down2  MaxPool 2, DoubleConv 32->64  16x16              |           |
    up1    ConvTranspose 64->32 (k2 s2) -> 32x32, Concat ---+, DoubleConv 64->32
    up2    Resize x2 (bilinear) -> 64x64, Concat -----------------------+, DoubleConv 48->16
    outc   1x1 Conv 16->2 (with bias)

DoubleConv is (3x3 Conv bias-free, BatchNormalization, Relu) twice, as the common
PyTorch U-Net writes it; the two up steps use the two usual upsamplers (a learned
ConvTranspose, and nn.Upsample(scale_factor=2, mode="bilinear") exported at opset 13
as Resize with an omitted roi, constant scales and pytorch_half_pixel coordinates).

Weights are random but seeded: He-normal convs, BN gamma in [0.5, 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from models._onnx import GraphBuilder, he_normal, small_bias

SEED = 4
INPUT_SHAPE = (1, 3, 64, 64)
CLASSES = 2
BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9


@dataclass
class _Layers:
    """Emits conv / bn / relu / up-sampling nodes with seeded parameters."""

    g: GraphBuilder
    rng: np.random.Generator

    def double_conv(self, x: str, prefix: str, c_in: int, c_out: int) -> str:
        """(3x3 Conv "{prefix}.{0,3}", BN ".{1,4}", Relu ".{2,5}") twice."""
        for i, c in enumerate((c_in, c_out)):
            name = f"{prefix}.double_conv.{3 * i}"
            w = self.g.initializer(f"{name}.weight", he_normal(self.rng, (c_out, c, 3, 3)))
            x = self.g.node("Conv", [x, w], name, dilations=[1, 1], group=1,
                            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
            bn = f"{prefix}.double_conv.{3 * i + 1}"
            params = {
                "weight": self.rng.uniform(0.5, 1.0, size=c_out),
                "bias": self.rng.uniform(-0.1, 0.1, size=c_out),
                "running_mean": self.rng.uniform(-0.1, 0.1, size=c_out),
                "running_var": self.rng.uniform(0.5, 1.5, size=c_out),
            }
            inputs = [x] + [self.g.initializer(f"{bn}.{k}", v) for k, v in params.items()]
            x = self.g.node("BatchNormalization", inputs, bn, epsilon=BN_EPSILON,
                            momentum=BN_MOMENTUM)
            x = self.g.node("Relu", [x], f"{prefix}.double_conv.{3 * i + 2}")
        return x

    def down(self, x: str, prefix: str, c_in: int, c_out: int) -> str:
        x = self.g.node("MaxPool", [x], f"{prefix}.maxpool", ceil_mode=0,
                        kernel_shape=[2, 2], pads=[0, 0, 0, 0], strides=[2, 2])
        return self.double_conv(x, f"{prefix}.conv", c_in, c_out)

    def up_transposed(self, x: str, prefix: str, c_in: int, c_out: int) -> str:
        """ConvTranspose k2 s2 with bias; its weight is [c_in, c_out, 2, 2]."""
        w = self.rng.normal(0.0, np.sqrt(2.0 / c_in), size=(c_in, c_out, 2, 2))
        w = self.g.initializer(f"{prefix}.up.weight", w)
        b = self.g.initializer(f"{prefix}.up.bias", small_bias(self.rng, c_out, c_in * 4))
        return self.g.node("ConvTranspose", [x, w, b], f"{prefix}.up", dilations=[1, 1],
                           group=1, kernel_shape=[2, 2], pads=[0, 0, 0, 0], strides=[2, 2])

    def up_resize(self, x: str, prefix: str) -> str:
        """x2 bilinear up-sampling (align_corners=False), roi omitted."""
        scales = self.g.initializer(f"{prefix}.up.scales",
                                    np.array([1.0, 1.0, 2.0, 2.0], np.float32))
        return self.g.node("Resize", [x, "", scales], f"{prefix}.up",
                           coordinate_transformation_mode="pytorch_half_pixel",
                           cubic_coeff_a=-0.75, mode="linear", nearest_mode="floor")

    def merge(self, up: str, skip: str, prefix: str, c_in: int, c_out: int) -> str:
        """Concat [skip, up] on channels (skip first, as U-Net code does), DoubleConv."""
        x = self.g.node("Concat", [skip, up], f"{prefix}.concat", axis=1)
        return self.double_conv(x, f"{prefix}.conv", c_in, c_out)


def unet(batch: int = 1) -> onnx.ModelProto:
    """The U-Net; data [batch,3,64,64] -> output [batch,2,64,64]."""
    g = GraphBuilder("unet")
    nn = _Layers(g, np.random.default_rng(SEED))

    x1 = nn.double_conv(g.input("data", (batch, *INPUT_SHAPE[1:])), "inc", 3, 16)  # 16 @ 64x64
    x2 = nn.down(x1, "down1", 16, 32)  # 32 @ 32x32
    x3 = nn.down(x2, "down2", 32, 64)  # 64 @ 16x16
    y = nn.merge(nn.up_transposed(x3, "up1", 64, 32), x2, "up1", 64, 32)  # 32 @ 32x32
    y = nn.merge(nn.up_resize(y, "up2"), x1, "up2", 32 + 16, 16)  # 16 @ 64x64

    w = g.initializer("outc.conv.weight", he_normal(nn.rng, (CLASSES, 16, 1, 1)))
    b = g.initializer("outc.conv.bias", small_bias(nn.rng, CLASSES, 16))
    y = g.node("Conv", [y, w, b], "outc.conv", output="output", dilations=[1, 1], group=1,
               kernel_shape=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1])
    g.output(y, (batch, CLASSES, 64, 64))
    return g.build()
