"""A small BERT-style encoder (2 layers, hidden 128, 4 heads, 32 tokens) as ONNX.

input_ids int64 [1, 32] -> output float32 [1, 32, 128] (the last hidden state).
The graph is written the way torch.onnx (opset 17) exports a Hugging Face BertModel
without attention mask or token types: Gather word and position embeddings (the
position ids are an int64 initializer), Add, LayerNormalization; per layer, Linear
layers as MatMul with a [in, out] weight then Add of the bias, Reshape / Transpose
into heads (K transposed straight to [b, h, d, s]), MatMul QK^T, Div by sqrt(d),
Softmax(axis=-1), MatMul V, Transpose / Reshape back, output projection, residual
Add and LayerNormalization; the feed-forward GELU is the exact Erf form
x * 0.5 * (1 + Erf(x / sqrt(2))) in the node order the exporter writes (Div, Erf,
Add, Mul, Mul). Names follow the PyTorch modules ("encoder.layer.0.attention.self.query").

Weights are random but seeded: Linear weights N(0, 1/fan_in) so attention scores
spread and GELU sees both signs, embeddings N(0, 1), LayerNorm gamma in [0.5, 1.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from models._onnx import GraphBuilder, small_bias

SEED = 3
OPSET = 17  # LayerNormalization is an ONNX operator from opset 17
VOCAB = 1000
MAX_POSITIONS = 64
SEQ = 32
HIDDEN = 128
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 4 * HIDDEN
LAYERS = 2
LN_EPSILON = 1e-12  # BertConfig.layer_norm_eps


@dataclass
class _Layers:
    """Emits linear / layer-norm / attention nodes with seeded parameters."""

    g: GraphBuilder
    rng: np.random.Generator
    batch: int = 1

    def const(self, name: str, value: object) -> str:
        """A constant initializer (a scalar or a shape), as constant folding leaves them."""
        return self.g.initializer(name, np.asarray(value))

    def linear(self, x: str, name: str, fan_in: int, fan_out: int) -> str:
        """MatMul by a [fan_in, fan_out] weight, then Add the bias (torch's 3-D Linear)."""
        w = self.rng.normal(0.0, 1.0 / math.sqrt(fan_in), size=(fan_in, fan_out))
        w = self.g.initializer(f"{name}.weight", w)
        b = self.g.initializer(f"{name}.bias", small_bias(self.rng, fan_out, fan_in))
        y = self.g.node("MatMul", [x, w], f"{name}.MatMul")
        return self.g.node("Add", [y, b], f"{name}.Add")

    def layer_norm(self, x: str, name: str, output: str | None = None) -> str:
        gamma = self.g.initializer(f"{name}.weight", self.rng.uniform(0.5, 1.5, size=HIDDEN))
        beta = self.g.initializer(f"{name}.bias", self.rng.uniform(-0.1, 0.1, size=HIDDEN))
        return self.g.node("LayerNormalization", [x, gamma, beta], name, output, axis=-1,
                           epsilon=LN_EPSILON)

    def heads(self, x: str, name: str, perm: list[int]) -> str:
        """[b, S, H] -> [b, S, heads, d] -> Transpose(perm)."""
        shape = self.const(f"{name}.shape", [self.batch, SEQ, HEADS, HEAD_DIM])
        y = self.g.node("Reshape", [x, shape], f"{name}.Reshape")
        return self.g.node("Transpose", [y], f"{name}.Transpose", perm=perm)

    def attention(self, x: str, prefix: str) -> str:
        """Self-attention plus output projection, residual Add and LayerNorm."""
        sp = f"{prefix}.attention.self"
        q = self.heads(self.linear(x, f"{sp}.query", HIDDEN, HIDDEN), f"{sp}.q", [0, 2, 1, 3])
        k = self.heads(self.linear(x, f"{sp}.key", HIDDEN, HIDDEN), f"{sp}.k", [0, 2, 3, 1])
        v = self.heads(self.linear(x, f"{sp}.value", HIDDEN, HIDDEN), f"{sp}.v", [0, 2, 1, 3])
        scores = self.g.node("MatMul", [q, k], f"{sp}.scores")  # [1, heads, S, S]
        scores = self.g.node("Div", [scores, self.const(f"{sp}.scale",
                                                        np.float32(math.sqrt(HEAD_DIM)))],
                             f"{sp}.Div")
        probs = self.g.node("Softmax", [scores], f"{sp}.Softmax", axis=-1)
        ctx = self.g.node("MatMul", [probs, v], f"{sp}.context")  # [1, heads, S, d]
        ctx = self.g.node("Transpose", [ctx], f"{sp}.context.Transpose", perm=[0, 2, 1, 3])
        shape = self.const(f"{sp}.context.shape", [self.batch, SEQ, HIDDEN])
        ctx = self.g.node("Reshape", [ctx, shape], f"{sp}.context.Reshape")
        op = f"{prefix}.attention.output"
        y = self.linear(ctx, f"{op}.dense", HIDDEN, HIDDEN)
        y = self.g.node("Add", [y, x], f"{op}.residual")
        return self.layer_norm(y, f"{op}.LayerNorm")

    def gelu(self, x: str, name: str) -> str:
        """Exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))), as torch exports nn.GELU()."""
        y = self.g.node("Div", [x, self.const(f"{name}.sqrt2", np.float32(math.sqrt(2.0)))],
                        f"{name}.Div")
        y = self.g.node("Erf", [y], f"{name}.Erf")
        y = self.g.node("Add", [y, self.const(f"{name}.one", np.float32(1.0))], f"{name}.Add")
        y = self.g.node("Mul", [x, y], f"{name}.Mul")
        return self.g.node("Mul", [y, self.const(f"{name}.half", np.float32(0.5))],
                           f"{name}.Mul_1")

    def feed_forward(self, x: str, prefix: str, output: str | None = None) -> str:
        y = self.linear(x, f"{prefix}.intermediate.dense", HIDDEN, INTERMEDIATE)
        y = self.gelu(y, f"{prefix}.intermediate.gelu")
        y = self.linear(y, f"{prefix}.output.dense", INTERMEDIATE, HIDDEN)
        y = self.g.node("Add", [y, x], f"{prefix}.output.residual")
        return self.layer_norm(y, f"{prefix}.output.LayerNorm", output)


def bert_encoder(batch: int = 1) -> onnx.ModelProto:
    """The encoder; input_ids int64 [batch,32] -> output [batch,32,128]."""
    g = GraphBuilder("bert_encoder", opset=OPSET)
    nn = _Layers(g, np.random.default_rng(SEED), batch)
    ids = g.input("input_ids", (batch, SEQ), TensorProto.INT64)

    words = g.initializer("embeddings.word_embeddings.weight",
                          nn.rng.standard_normal((VOCAB, HIDDEN)))
    positions = g.initializer("embeddings.position_embeddings.weight",
                              nn.rng.standard_normal((MAX_POSITIONS, HIDDEN)))
    position_ids = nn.const("embeddings.position_ids", np.arange(SEQ)[None, :])
    x = g.node("Gather", [words, ids], "embeddings.word_embeddings", axis=0)
    p = g.node("Gather", [positions, position_ids], "embeddings.position_embeddings", axis=0)
    x = g.node("Add", [x, p], "embeddings.Add")
    x = nn.layer_norm(x, "embeddings.LayerNorm")

    for i in range(LAYERS):
        prefix = f"encoder.layer.{i}"
        last = i == LAYERS - 1
        x = nn.feed_forward(nn.attention(x, prefix), prefix, "output" if last else None)
    g.output(x, (batch, SEQ, HIDDEN))
    return g.build()
