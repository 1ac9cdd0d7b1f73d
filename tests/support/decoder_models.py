"""A small GPT-style decoder with a KV cache, written with onnx.helper, float32 or with
its MatMuls quantized to 4 bits (MatMulNBits, block 32, zero points) by onnxruntime's
own blockwise quantizer (tests/support/nbits_models.py), and optionally its token
embedding table too (GatherBlockQuantized, uint8 two values a byte, the same quantizer).

Two layers, hidden 128, 4 heads of 32, learned positions, LayerNorm, a GELU MLP (x4), a
tied-free lm_head. Inputs: input_ids and position_ids [batch, seq] (int64),
past_key_<i> / past_value_<i> [batch, heads, past, 32]; outputs: logits [batch, seq,
vocab] and present_key_<i> / present_value_<i> [batch, heads, past+seq, 32] (the cache
and the step's keys concatenated along the symbolic axis), so one model serves the
prefill (seq tokens) and every decode step (seq 1, past growing).

The causal mask needs no Range over a symbolic length: every query sees every past key,
so the scores are computed in two parts, q @ past_k^T [.., seq, past] unmasked and
q @ k^T [.., seq, seq] with the mask position_k > position_q (from position_ids, a
broadcast comparison) added, then concatenated along the key axis before the Softmax.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.support.nbits_models import nbits_node, quantize_weight
from tests.support.onnx_models import GraphParts

VOCAB, HIDDEN, HEADS, LAYERS, POSITIONS = 512, 128, 4, 2, 256
HEAD_DIM = HIDDEN // HEADS
BLOCK = 32


class _Decoder(GraphParts):
    """Nodes and initializers being collected; `bits` 4 writes MatMulNBits in place of
    every MatMul by a weight, 0 keeps float32 MatMuls."""

    def __init__(self, seed: int, bits: int, accuracy_level: int = 0):
        super().__init__(seed)
        self.bits, self.accuracy_level = bits, accuracy_level

    def weight(self, *shape, scale=0.1) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        self.k += 1
        out = out or f"t{self.k}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], f"n{self.k}", **attrs))
        return out

    def linear(self, x: str, n_in: int, n_out: int, bias: bool = True) -> str:
        w = self.weight(n_in, n_out, scale=1 / np.sqrt(n_in))
        if self.bits:
            self.k += 1
            y = f"t{self.k}"
            node, inits = nbits_node(f"q{self.k}", x, y, w, self.bits, BLOCK,
                                     accuracy_level=self.accuracy_level)
            self.nodes.append(node)
            self.inits += inits
        else:
            y = self.op("MatMul", x, self.const(w))
        return self.op("Add", y, self.const(self.weight(n_out, scale=0.02))) if bias else y

    def layer_norm(self, x: str) -> str:
        return self.op("LayerNormalization", x,
                       self.const(1 + self.weight(HIDDEN)), self.const(self.weight(HIDDEN)),
                       axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        erf = self.op("Erf", self.op("Div", x, self.const(np.float32(np.sqrt(2.0)))))
        half = self.op("Mul", x, self.const(np.float32(0.5)))
        return self.op("Mul", half, self.op("Add", erf, self.const(np.float32(1.0))))

    def heads(self, x: str) -> str:
        """[batch, seq, hidden] -> [batch, heads, seq, head_dim]."""
        split = self.const(np.array([0, 0, HEADS, HEAD_DIM], np.int64))
        return self.op("Transpose", self.op("Reshape", x, split), perm=[0, 2, 1, 3])

    def attention(self, x: str, layer: int, causal: str) -> str:
        q, k, v = (self.heads(self.linear(x, HIDDEN, HIDDEN)) for _ in range(3))
        self.op("Concat", f"past_key_{layer}", k, axis=2, out=f"present_key_{layer}")
        v_all = self.op("Concat", f"past_value_{layer}", v, axis=2,
                        out=f"present_value_{layer}")
        scale = self.const(np.float32(1 / np.sqrt(HEAD_DIM)))
        q = self.op("Mul", q, scale)
        old = self.op("MatMul", q, self.op("Transpose", f"past_key_{layer}", perm=[0, 1, 3, 2]))
        new = self.op("Add", self.op("MatMul", q, self.op("Transpose", k, perm=[0, 1, 3, 2])),
                      causal)
        probs = self.op("Softmax", self.op("Concat", old, new, axis=-1), axis=-1)
        merged = self.op("Transpose", self.op("MatMul", probs, v_all), perm=[0, 2, 1, 3])
        merged = self.op("Reshape", merged, self.const(np.array([0, 0, HIDDEN], np.int64)))
        return self.linear(merged, HIDDEN, HIDDEN)

    def causal_bias(self) -> str:
        """[batch, 1, seq, seq]: -1e9 where a key's position is after the query's."""
        rows = self.op("Unsqueeze", "position_ids", self.const(np.array([1, 3], np.int64)))
        cols = self.op("Unsqueeze", "position_ids", self.const(np.array([1, 2], np.int64)))
        later = self.op("Cast", self.op("Greater", cols, rows), to=TensorProto.FLOAT)
        return self.op("Mul", later, self.const(np.float32(-1e9)))


    def embeddings(self, table: np.ndarray, ids: str) -> str:
        """The rows `ids` of `table` [V, H] by a GatherBlockQuantized of the table
        quantized along H to `bits` (block 32, zero points: its MatMulNBits quantization
        as the transposed weight, row v's blocks)."""
        packed, scales, zp = quantize_weight(table.T.copy(), self.bits, BLOCK, False)
        names = [self.const(packed.reshape(table.shape[0], -1)), ids, self.const(scales),
                 self.const(zp)]
        self.k += 1
        out = f"t{self.k}"
        self.nodes.append(helper.make_node("GatherBlockQuantized", names, [out], f"n{self.k}",
                                           domain="com.microsoft", block_size=BLOCK,
                                           bits=self.bits))
        return out


def decoder(bits: int = 0, seed: int = 0, quantized_embeddings: bool = False,
            accuracy_level: int = 0) -> onnx.ModelProto:
    """The decoder, float32 (bits 0) or with its MatMuls as 4-bit MatMulNBits (bits 4),
    the same float weights before quantization for the same seed; with bits 4 and
    `quantized_embeddings` its token embeddings (wte) as a 4-bit GatherBlockQuantized;
    `accuracy_level` the MatMulNBits nodes' (4: int8 activations)."""
    net = _Decoder(seed, bits, accuracy_level)
    table = net.weight(VOCAB, HIDDEN, scale=0.5)
    wte = None if bits and quantized_embeddings else net.const(table)
    wpe = net.const(net.weight(POSITIONS, HIDDEN, scale=0.5))
    tokens = (net.embeddings(table, "input_ids") if wte is None
              else net.op("Gather", wte, "input_ids", axis=0))
    x = net.op("Add", tokens, net.op("Gather", wpe, "position_ids", axis=0))
    causal = net.causal_bias()
    for layer in range(LAYERS):
        x = net.op("Add", x, net.attention(net.layer_norm(x), layer, causal))
        mlp = net.linear(net.gelu(net.linear(net.layer_norm(x), HIDDEN, 4 * HIDDEN)),
                         4 * HIDDEN, HIDDEN)
        x = net.op("Add", x, mlp)
    net.linear(net.layer_norm(x), HIDDEN, VOCAB, bias=False)
    net.nodes[-1].output[0] = "logits"
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    cache = ["batch", HEADS, "past", HEAD_DIM]
    grown = ["batch", HEADS, "past+seq", HEAD_DIM]
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
              helper.make_tensor_value_info("position_ids", i64, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("logits", f, ["batch", "seq", VOCAB])]
    for layer in range(LAYERS):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{layer}", f, cache))
            outputs.append(helper.make_tensor_value_info(f"present_{kind}_{layer}", f, grown))
    graph = helper.make_graph(net.nodes, "gpt_decoder", inputs, outputs, net.inits)
    opsets = [helper.make_opsetid("", 17)]
    if bits:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def initial_cache(batch: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    """past_key_<i> / past_value_<i> of `past` random entries (position 0..past-1)."""
    rng = np.random.default_rng(seed)
    return {f"past_{kind}_{layer}": rng.standard_normal((batch, HEADS, past, HEAD_DIM))
            .astype(np.float32) for layer in range(LAYERS) for kind in ("key", "value")}


def step_feeds(ids: np.ndarray, past: int, cache: dict[str, np.ndarray]) -> dict:
    """The inputs of one call: tokens ids [batch, seq] at positions past..past+seq-1."""
    batch, seq = ids.shape
    pos = np.broadcast_to(np.arange(past, past + seq, dtype=np.int64), (batch, seq)).copy()
    return {"input_ids": ids, "position_ids": pos, **cache}
