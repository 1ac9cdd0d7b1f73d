"""A three-layer MLP over a 224x224 RGB image, as an ONNX model.

data [1, 3, 224, 224] -> Flatten -> Gemm 150528->64 -> Relu -> Gemm 64->64 -> Relu
-> Gemm 64->10 -> output [1, 10]. Gemm weights are stored [out, in] with transB=1, as
PyTorch's Linear exports them. The first weight alone is 150528 x 64 floats (~38 MB).
"""

from __future__ import annotations

import numpy as np
import onnx

from models._onnx import GraphBuilder, he_normal, small_bias

SEED = 0
INPUT_SHAPE = (1, 3, 224, 224)
# (in_features, out_features) of each Linear layer.
LAYERS = ((3 * 224 * 224, 64), (64, 64), (64, 10))


def mlp(batch: int = 1, size: int = 224) -> onnx.ModelProto:
    """Build the MLP with seeded random weights for `batch` images of size x size
    pixels (the weights do not depend on the batch; a small size makes a model for a
    microcontroller: at 16, the first layer holds 192 KiB of weights); returns the
    ModelProto."""
    rng = np.random.default_rng(SEED)
    g = GraphBuilder("mlp")
    x = g.node("Flatten", [g.input("data", (batch, 3, size, size))], "flatten", axis=1)
    layers = ((3 * size * size, LAYERS[0][1]), *LAYERS[1:])
    for i, (fan_in, fan_out) in enumerate(layers):
        name = f"fc{i + 1}"
        w = g.initializer(f"{name}.weight", he_normal(rng, (fan_out, fan_in)))
        b = g.initializer(f"{name}.bias", small_bias(rng, fan_out, fan_in))
        last = i == len(layers) - 1
        x = g.node(
            "Gemm",
            [x, w, b],
            name,
            output="output" if last else None,
            alpha=1.0,
            beta=1.0,
            transB=1,
        )
        if not last:
            x = g.node("Relu", [x], f"relu{i + 1}")
    g.output(x, (batch, LAYERS[-1][1]))
    return g.build()
