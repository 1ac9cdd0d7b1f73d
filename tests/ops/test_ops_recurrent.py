"""LSTM, GRU and RNN (pipeline/ops/recurrent.py) compiled end to end and compared with
onnxruntime: directions, layouts, sequence_lens, initial states, peepholes,
linear_before_reset, clip, input_forget and the parameterised activations, every
optional output. onnx.reference is not the reference here: its LSTM/GRU/RNN ignore
sequence_lens, clip, input_forget and most activations."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.support.compare import run_ort, run_ours
from tests.support.nn_cases import check, check_error, unchecked
from tests.support.onnx_models import make_model, rand

pytest.importorskip("onnxruntime")

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ("y", "y_h", "y_c"), "GRU": ("y", "y_h"), "RNN": ("y", "y_h")}


def recurrent(op: str, seq=5, batch=3, size=6, hidden=5, direction="forward", layout=0,
              outputs=None, seq_lens=None, initial=False, peepholes=False, opset=14,
              **attrs):
    """One `op` node: X, and the optional sequence_lens / initial_h / initial_c as graph
    inputs; W, R, B (and P) as initializers."""
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inits = {"w": rand(dirs, g * hidden, size, seed=1), "r": rand(dirs, g * hidden, hidden,
                                                                  seed=2),
             "b": rand(dirs, 2 * g * hidden, seed=3)}
    x_shape = (seq, batch, size) if layout == 0 else (batch, seq, size)
    feeds = {"x": rand(*x_shape, seed=4, low=-2, high=2)}
    names = ["x", "w", "r", "b", "", "", "", ""]
    if seq_lens is not None:
        feeds["lens"] = np.array(seq_lens, np.int32)
        names[4] = "lens"
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    if initial:
        feeds["h0"] = rand(*state, seed=5)
        names[5] = "h0"
        if op == "LSTM":
            feeds["c0"] = rand(*state, seed=6)
            names[6] = "c0"
    if peepholes:
        inits["p"] = rand(dirs, 3 * hidden, seed=7)
        names[7] = "p"
    while not names[-1]:
        names.pop()
    outputs = outputs or OUTPUTS[op]
    node = helper.make_node(op, names, list(outputs), hidden_size=hidden,
                            direction=direction, **({"layout": layout} if opset >= 14 else {}),
                            **attrs)
    vis = [helper.make_tensor_value_info(k, TensorProto.INT32 if v.dtype == np.int32 else
                                         TensorProto.FLOAT, v.shape) for k, v in feeds.items()]
    m = make_model([node], vis, [(o, None) for o in outputs if o], inits, opset)
    return m, feeds


ACTS = {"activations": ["HardSigmoid", "ScaledTanh", "LeakyRelu", "Affine", "Elu",
                        "Softsign"],
        "activation_alpha": [0.3, 0.8, 0.2, 1.1, 0.7], "activation_beta": [0.4, 1.3, 0.1]}
CASES = {
    "lstm_reverse_initial_peep": lambda: recurrent("LSTM", direction="reverse", initial=True,
                                                   peepholes=True),
    "lstm_bidirectional_lens": lambda: recurrent("LSTM", direction="bidirectional",
                                                 seq_lens=[5, 2, 4], initial=True),
    "lstm_input_forget_acts": lambda: recurrent("LSTM", input_forget=1, peepholes=True,
                                                activations=["Sigmoid", "Relu", "Softplus"]),
    "lstm_bidirectional_acts": lambda: recurrent("LSTM", direction="bidirectional", **ACTS),
    "lstm_only_y_c_opset7": lambda: recurrent("LSTM", outputs=("", "", "y_c"), opset=7,
                                              hidden=18),
    "gru_linear_before_reset": lambda: recurrent("GRU", linear_before_reset=1, initial=True,
                                                 direction="bidirectional",
                                                 seq_lens=[1, 5, 3]),
    "gru_acts": lambda: recurrent("GRU", activations=["ThresholdedRelu", "Tanh"],
                                  activation_alpha=[0.1], outputs=("", "y_h"), opset=22),
    "rnn_bidirectional_lens_relu": lambda: recurrent(
        "RNN", direction="bidirectional", seq_lens=[3, 0, 5], initial=True,
        activations=["Relu", "Sigmoid"]),
}


BATCH_MAJOR = {
    "lstm_batch_major_clip": dict(op="LSTM", clip=0.5, direction="bidirectional", batch=6,
                                  initial=True),
    "gru_batch_major_reverse": dict(op="GRU", direction="reverse", batch=5, hidden=17,
                                    clip=1.0),
    "rnn_batch_major": dict(op="RNN", outputs=("", "y_h"), batch=9),
}


# At opt_level 3 only: the layer is one opaque kernel at every level, and the node suite
# (test_onnx_backend.py) runs the defaults of each operator at 0 and 3.
@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrent_matches_onnxruntime(case):
    check(*CASES[case](), 3)


@pytest.mark.parametrize("case", sorted(BATCH_MAJOR))
def test_batch_major_layout_matches_onnxruntime(case, opt_level=3):
    """layout 1 (onnxruntime refuses it): onnxruntime runs the same layer at layout 0
    on the transposed inputs, its results transposed back."""
    m, feeds = recurrent(layout=1, **BATCH_MAJOR[case])
    m0, _ = recurrent(layout=0, **BATCH_MAJOR[case])
    seq_major = {k: v.transpose(1, 0, 2) for k, v in feeds.items()}  # x, h0, c0
    want = run_ort(m0, seq_major)
    got = run_ours(m, feeds, opt_level=opt_level)
    for g, w in zip(got, want, strict=True):
        w = w.transpose(2, 0, 1, 3) if w.ndim == 4 else w.transpose(1, 0, 2)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_weights_known_only_at_run_time_are_one_clear_line():
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=2, name="l0")
    graph = helper.make_graph([node], "bad", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 1, 4)),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, (1, 8, 4)),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, (1, 8, 2))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    check_error(lambda: helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]),
                "build time")


def test_unknown_activation_is_one_clear_line():
    inits = {"w": rand(1, 2, 4), "r": rand(1, 2, 2)}
    check_error(lambda: unchecked([helper.make_node("RNN", ["x", "w", "r"], ["y"], name="r0",
                                                    hidden_size=2, activations=["Swish"])],
                                  (3, 1, 4), inits), "activation 'Swish'")
