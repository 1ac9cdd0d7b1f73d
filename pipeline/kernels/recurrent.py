"""rnn_last: Y_h read off Y, each row's last valid step (how LSTM, GRU and RNN become
graph ops: pipeline/frontend/onnx/recurrent.py; their time loop:
pipeline/kernels/recurrent_kernel.py)."""

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
