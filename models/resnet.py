"""ResNet-18 and ResNet-50 (torchvision layout, batch 1 unless asked, 224x224) as ONNX models.

The graphs follow torchvision's `resnet18` / `resnet50` (v1.5: a bottleneck's stride
sits on its 3x3 conv), written the way the PyTorch exporter writes an eval-mode
model without optimisation: every BatchNormalization is its own node, with its own
scale / bias / running mean / running var initializers, after a bias-free Conv.
Node and initializer names follow the PyTorch module names ("layer1.0.conv1",
"layer1.0.bn1.running_var", "layer2.0.downsample.0.weight").

Weights are random but seeded, and scaled so activations stay O(1) to the output:
He-normal convs, BN with gamma in [0.5, 1) and running var in [0.5, 1.5), and the
last BN of each residual branch has gamma in [0.2, 0.5) so that summing 16 residual
blocks onto the identity path does not blow the activations up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from models._onnx import GraphBuilder, he_normal, small_bias

INPUT_SHAPE = (1, 3, 224, 224)
NUM_CLASSES = 1000
BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9  # what torch.onnx writes for nn.BatchNorm2d's default momentum of 0.1
GAMMA = (0.5, 1.0)
RESIDUAL_GAMMA = (0.2, 0.5)  # last BN of each residual branch: keeps the sums O(1)


@dataclass
class _Layers:
    """Emits conv / bn / relu nodes with seeded parameters into one graph."""

    g: GraphBuilder
    rng: np.random.Generator

    def conv(self, x: str, name: str, c_in: int, c_out: int, k: int, stride: int) -> str:
        """k x k bias-free Conv, 'same'-style padding k // 2, as torchvision uses."""
        w = self.g.initializer(f"{name}.weight", he_normal(self.rng, (c_out, c_in, k, k)))
        pad = k // 2
        return self.g.node(
            "Conv",
            [x, w],
            name,
            dilations=[1, 1],
            group=1,
            kernel_shape=[k, k],
            pads=[pad, pad, pad, pad],
            strides=[stride, stride],
        )

    def bn(self, x: str, name: str, c: int, gamma: tuple[float, float] = GAMMA) -> str:
        """Inference BatchNormalization with gamma ~ U(gamma), small beta and mean.

        onnx.reference (1.23) evaluates opset 9-13 BatchNormalization with batch
        statistics blended in, so its outputs for these models are wrong; compare
        against onnxruntime instead (onnx/onnx PR #8442).
        """
        rng = self.rng
        params = {
            "weight": rng.uniform(*gamma, size=c),
            "bias": rng.uniform(-0.1, 0.1, size=c),
            "running_mean": rng.uniform(-0.1, 0.1, size=c),
            "running_var": rng.uniform(0.5, 1.5, size=c),
        }
        inputs = [x] + [self.g.initializer(f"{name}.{k}", v) for k, v in params.items()]
        return self.g.node(
            "BatchNormalization", inputs, name, epsilon=BN_EPSILON, momentum=BN_MOMENTUM
        )

    def relu(self, x: str, name: str) -> str:
        return self.g.node("Relu", [x], name)

    def conv_bn(
        self,
        x: str,
        prefix: str,
        i: int,
        c_in: int,
        c_out: int,
        k: int,
        stride: int,
        gamma: tuple[float, float] = GAMMA,
    ) -> str:
        """Conv "{prefix}.conv{i}" followed by its own BN "{prefix}.bn{i}"."""
        y = self.conv(x, f"{prefix}.conv{i}", c_in, c_out, k, stride)
        return self.bn(y, f"{prefix}.bn{i}", c_out, gamma)

    def downsample(self, x: str, prefix: str, c_in: int, c_out: int, stride: int) -> str:
        """Shortcut projection: 1x1 Conv with `stride`, then BN (torchvision's downsample)."""
        y = self.conv(x, f"{prefix}.downsample.0", c_in, c_out, 1, stride)
        return self.bn(y, f"{prefix}.downsample.1", c_out)

    def basic_block(self, x: str, prefix: str, c_in: int, planes: int, stride: int) -> str:
        """BasicBlock: 3x3 conv (stride) - bn - relu - 3x3 conv - bn, + shortcut, relu."""
        y = self.relu(self.conv_bn(x, prefix, 1, c_in, planes, 3, stride), f"{prefix}.relu1")
        y = self.conv_bn(y, prefix, 2, planes, planes, 3, 1, RESIDUAL_GAMMA)
        return self._merge(x, y, prefix, c_in, planes, stride, relu_name=f"{prefix}.relu2")

    def bottleneck(self, x: str, prefix: str, c_in: int, planes: int, stride: int) -> str:
        """Bottleneck (v1.5): 1x1 - 3x3 (stride) - 1x1 x4, each conv + bn, + shortcut."""
        c_out = planes * 4
        y = self.relu(self.conv_bn(x, prefix, 1, c_in, planes, 1, 1), f"{prefix}.relu1")
        y = self.relu(self.conv_bn(y, prefix, 2, planes, planes, 3, stride), f"{prefix}.relu2")
        y = self.conv_bn(y, prefix, 3, planes, c_out, 1, 1, RESIDUAL_GAMMA)
        return self._merge(x, y, prefix, c_in, c_out, stride, relu_name=f"{prefix}.relu3")

    def _merge(
        self, x: str, y: str, prefix: str, c_in: int, c_out: int, stride: int, relu_name: str
    ) -> str:
        # The shortcut needs a projection exactly when the branch changes shape.
        shortcut = x
        if stride != 1 or c_in != c_out:
            shortcut = self.downsample(x, prefix, c_in, c_out, stride)
        return self.relu(self.g.node("Add", [y, shortcut], f"{prefix}.add"), relu_name)


def _resnet(name: str, block: str, depths: Sequence[int], seed: int,
            batch: int) -> onnx.ModelProto:
    """Build a ResNet whose stages have `depths` blocks of kind "basic" or "bottleneck",
    for `batch` images (the weights do not depend on it)."""
    g = GraphBuilder(name)
    nn = _Layers(g, np.random.default_rng(seed))
    make_block = nn.basic_block if block == "basic" else nn.bottleneck
    expansion = 1 if block == "basic" else 4

    x = nn.conv(g.input("data", (batch, *INPUT_SHAPE[1:])), "conv1", 3, 64, 7, 2)
    x = nn.relu(nn.bn(x, "bn1", 64), "relu")
    x = g.node(
        "MaxPool",
        [x],
        "maxpool",
        ceil_mode=0,
        kernel_shape=[3, 3],
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )

    c_in = 64
    for stage, (planes, depth) in enumerate(zip((64, 128, 256, 512), depths, strict=True), start=1):
        for i in range(depth):
            # Only a stage's first block changes resolution; layer1 keeps the pooled 56x56.
            stride = 2 if i == 0 and stage > 1 else 1
            x = make_block(x, f"layer{stage}.{i}", c_in, planes, stride)
            c_in = planes * expansion

    x = g.node("GlobalAveragePool", [x], "avgpool")
    x = g.node("Flatten", [x], "flatten", axis=1)
    w = g.initializer("fc.weight", he_normal(nn.rng, (NUM_CLASSES, c_in)))
    b = g.initializer("fc.bias", small_bias(nn.rng, NUM_CLASSES, c_in))
    x = g.node("Gemm", [x, w, b], "fc", output="output", alpha=1.0, beta=1.0, transB=1)
    g.output(x, (batch, NUM_CLASSES))
    return g.build()


def resnet18(batch: int = 1) -> onnx.ModelProto:
    """ResNet-18 (BasicBlock, [2, 2, 2, 2]); data [batch,3,224,224] -> output [batch,1000]."""
    return _resnet("resnet18", "basic", (2, 2, 2, 2), seed=18, batch=batch)


def resnet50(batch: int = 1) -> onnx.ModelProto:
    """ResNet-50 (Bottleneck x4, [3, 4, 6, 3]); data [batch,3,224,224] -> output
    [batch,1000]."""
    return _resnet("resnet50", "bottleneck", (3, 4, 6, 3), seed=50, batch=batch)
