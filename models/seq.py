"""A recurrent sequence tagger, as an ONNX model: no embeddings, per-frame features in.

features [batch (1), 32, 64] (batch, time, features) -> Transpose to time-major ->
bidirectional LSTM (hidden 128) -> its Y [32, 2, 1, 128] as [32, 1, 256] -> GRU
(hidden 128, linear_before_reset as PyTorch exports it) -> Y [32, 1, 128] ->
batch-major again -> MatMul + Add to 20 classes -> output [batch, 32, 20] (logits).
Weights are [directions, gates * hidden, inputs] in ONNX's gate orders (LSTM i, o, f, c;
GRU z, r, h), uniform in +-1/sqrt(hidden) as PyTorch initialises them.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from models._onnx import GraphBuilder, small_bias

SEED = 0
BATCH, SEQ, FEATURES, HIDDEN, CLASSES = 1, 32, 64, 128, 20


def _uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    bound = 1.0 / math.sqrt(HIDDEN)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def lstm_gru_seq(batch: int = BATCH) -> onnx.ModelProto:
    """Build the tagger with seeded random weights for `batch` sequences (the weights do
    not depend on it); returns the ModelProto."""
    rng = np.random.default_rng(SEED)
    g = GraphBuilder("lstm_gru_seq")
    x = g.input("features", (batch, SEQ, FEATURES))
    x = g.node("Transpose", [x], "to_time_major", perm=[1, 0, 2])
    lstm = [g.initializer(f"lstm.{k}", _uniform(rng, shape)) for k, shape in (
        ("input.weight", (2, 4 * HIDDEN, FEATURES)), ("hidden.weight", (2, 4 * HIDDEN, HIDDEN)),
        ("bias", (2, 8 * HIDDEN)))]
    y = g.node("LSTM", [x, *lstm], "lstm", hidden_size=HIDDEN, direction="bidirectional")
    y = g.node("Transpose", [y], "lstm_dirs_last", perm=[0, 2, 1, 3])
    y = g.node("Reshape", [y, g.initializer("lstm_out_shape", np.array(
        [SEQ, batch, 2 * HIDDEN]))], "lstm_concat_dirs")
    gru = [g.initializer(f"gru.{k}", _uniform(rng, shape)) for k, shape in (
        ("input.weight", (1, 3 * HIDDEN, 2 * HIDDEN)), ("hidden.weight", (1, 3 * HIDDEN, HIDDEN)),
        ("bias", (1, 6 * HIDDEN)))]
    y = g.node("GRU", [y, *gru], "gru", hidden_size=HIDDEN, linear_before_reset=1)
    y = g.node("Squeeze", [y, g.initializer("gru_dir_axis", np.array([1]))], "gru_one_dir")
    y = g.node("Transpose", [y], "to_batch_major", perm=[1, 0, 2])
    w = g.initializer("head.weight", _uniform(rng, (HIDDEN, CLASSES)))
    b = g.initializer("head.bias", small_bias(rng, CLASSES, HIDDEN))
    y = g.node("MatMul", [y, w], "head")
    y = g.node("Add", [y, b], "head_bias", output="output")
    g.output(y, (batch, SEQ, CLASSES))
    return g.build()
