"""Recurrent layers: ONNX LSTM, GRU and RNN (opsets 7 .. 22).

Each ONNX node becomes
  dense(X, W', b')            the input projection of every time step in one GEMM:
                              W' = W of all directions stacked [dirs*G*H, I], b' = Wb + Rb
                              (GRU with linear_before_reset keeps Rbh apart)
  rnn_sequence(xw, R', ...)   per requested output (Y, Y_h, Y_c), the time loop of all
                              directions in one kernel (pipeline/kernels/recurrent_kernel.py)
W, R and B are build-time constants (packed here: R' is Rᵀ in the kernel's panel layout);
sequence_lens, initial_h, initial_c and P are read at run time. The executor's kernels
write one output each: Y_h next to Y is read off Y (rnn_last), but Y_c runs the
recurrence again.

Graph op
  rnn_sequence(xw, r_packed, [seq_lens], [init_h], [init_c], [peep], [rbias];
               cell, hidden, directions, layout, result, activations, clip,
               input_forget, linear_before_reset, optional)
    result "y": [seq, dirs, batch, H] (layout 0) / [batch, seq, dirs, H] (layout 1);
    "y_h", "y_c": [dirs, batch, H] / [batch, dirs, H]. float32.
  rnn_last(y, [seq_lens]; layout, directions)  Y_h from Y: each row's last valid step
"""

from __future__ import annotations

from pipeline.kernels.registry import lowering


def _last_lower(kb, node, ins, out, epilogue):
    """Y_h[d, b] = Y[last step of row b in direction d]: t = len - 1 forward, 0 in
    reverse; zeros for an empty row. Y is [seq, dirs, batch, H] or [batch, seq, dirs, H]."""
    y, layout = ins[0], node.attr("layout")
    seq = y.type.shape[0 if layout == 0 else 1]
    reverse = [name == "reverse" for name in node.attr("directions")]
    with kb.nest(out.type.shape, "o") as index:
        d, b = (index[0], index[1]) if layout == 0 else (index[1], index[0])
        n = seq if len(ins) == 1 else kb.smin(kb.smax(kb.index(kb.load(ins[1], b)), 0), seq)
        last = n - 1
        if any(reverse):
            last = 0 if all(reverse) else kb.select(d > 0, 0, last)
        t = max(last, 0) if isinstance(last, int) else kb.smax(last, 0)
        at = [t, d, b, index[2]] if layout == 0 else [b, t, d, index[2]]
        value = kb.load(y, kb.dot(at, y.strides))
        if len(ins) > 1:
            value = kb.select(kb.index(n) > 0, value, kb.f32(0.0))
        kb.store(out, kb.dot(index, out.strides), value)


lowering("rnn_last", lower=_last_lower)
