"""Recurrent layers: ONNX LSTM, GRU and RNN (opsets 7 .. 22).

Each ONNX node becomes
  dense(X, W', b')            the input projection of every time step in one GEMM:
                              W' = W of all directions stacked [dirs*G*H, I], b' = Wb + Rb
                              (GRU with linear_before_reset keeps Rbh apart)
  rnn_sequence(xw, R', ...)   per requested output (Y, Y_h, Y_c), the time loop of all
                              directions in one kernel (pipeline/ops/recurrent_kernel.py)
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

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.shape import need_const
from pipeline.ir.graph import Node
from pipeline.ops.recurrent_layout import BLOCK, group_widths, padded

GATES = {"lstm": 4, "gru": 3, "rnn": 1}


DEFAULT_ACTIVATIONS = {"lstm": ("sigmoid", "tanh", "tanh"), "gru": ("sigmoid", "tanh"),
                       "rnn": ("tanh",)}


# activation -> (default alpha, default beta), None where it takes none
ACTIVATION_PARAMS = {
    "sigmoid": (None, None), "tanh": (None, None), "relu": (None, None),
    "softsign": (None, None), "softplus": (None, None),
    "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}


def pack_recurrence(r: np.ndarray, cell: str, hidden: int) -> np.ndarray:
    """R [dirs, G*H, H] as the kernel reads it: per direction, per column group,
    blocks of BLOCK gate columns stored [k][BLOCK] (Rᵀ), zero-padded to whole blocks."""
    parts = []
    for d in range(r.shape[0]):
        c0 = 0
        for width in group_widths(cell, hidden):
            cols = np.zeros((padded(width), hidden), np.float32)
            cols[:width] = r[d, c0:c0 + width]
            parts.append(cols.reshape(-1, BLOCK, hidden).transpose(0, 2, 1).reshape(-1))
            c0 += width
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def _activations(n, cell: str, dirs: int) -> tuple:
    """Per direction, the cell's activations as (name, alpha, beta); alphas and betas
    are taken in order by the activations that use them (onnxruntime's reading)."""
    names = [v.decode() if isinstance(v, bytes) else v
             for v in n.attrs.get("activations", ())]
    per_cell = len(DEFAULT_ACTIVATIONS[cell])
    if not names:
        names = list(DEFAULT_ACTIVATIONS[cell]) * dirs
    elif len(names) == per_cell and dirs == 2:
        names = names * 2
    if len(names) != per_cell * dirs:
        raise ModelError(f"node {n.name!r} ({n.op_type}): {len(names)} activations given, "
                         f"{per_cell * dirs} expected ({per_cell} per direction)")
    alphas = list(n.attrs.get("activation_alpha", ()))
    betas = list(n.attrs.get("activation_beta", ()))
    resolved = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATION_PARAMS:
            raise ModelError(f"node {n.name!r} ({n.op_type}): activation {name!r} is not "
                             f"supported ({', '.join(ACTIVATION_PARAMS)} are)")
        alpha, beta = ACTIVATION_PARAMS[key]
        if alpha is not None and alphas:
            alpha = float(alphas.pop(0))
        if beta is not None and betas:
            beta = float(betas.pop(0))
        resolved.append((key, alpha or 0.0, beta or 0.0))
    return tuple(tuple(resolved[d * per_cell:(d + 1) * per_cell]) for d in range(dirs))


def _convert(cell: str, ctx, n) -> list[Node]:
    x = n.inputs[0]
    xt = ctx.type(x)
    if xt.dtype != "float32" or len(xt.shape) != 3:
        raise ModelError(f"node {n.name!r} ({n.op_type}): X must be 3-D float32, got "
                         f"{xt.dtype} {list(xt.shape)}")
    direction = n.text("direction", "forward", ("forward", "reverse", "bidirectional"))
    directions = ("forward", "reverse") if direction == "bidirectional" else (direction,)
    dirs, gates = len(directions), GATES[cell]
    w = need_const(ctx, n, 1, "the weight W")
    r = need_const(ctx, n, 2, "the recurrence weight R")
    b = need_const(ctx, n, 3, "the bias B")
    hidden = r.shape[-1]
    size = xt.shape[-1]
    if (w.shape != (dirs, gates * hidden, size) or r.shape != (dirs, gates * hidden, hidden)
            or int(n.attrs.get("hidden_size", hidden)) != hidden):
        raise ModelError(f"node {n.name!r} ({n.op_type}): W {list(w.shape)} / R "
                         f"{list(r.shape)} do not match {dirs} direction(s), hidden_size "
                         f"{n.attrs.get('hidden_size', hidden)}, input size {size}")
    gh = gates * hidden
    if b is not None and b.shape != (dirs, 2 * gh):
        raise ModelError(f"node {n.name!r} ({n.op_type}): B {list(b.shape)} is not "
                         f"[{dirs}, {2 * gh}]")
    b = np.zeros((dirs, 2 * gh), np.float32) if b is None else b
    bias = b[:, :gh] + b[:, gh:]
    lbr = int(n.attrs.get("linear_before_reset", 0)) if cell == "gru" else 0
    optional, extra = [], []
    if lbr:  # Rbh sits inside r * (h Rhᵀ + Rbh): not part of the input projection
        bias[:, 2 * hidden:] = b[:, 2 * hidden:gh]
        optional.append("rbias")
        extra.append(ctx.add_param(f"{n.name}_rbh",
                                   np.ascontiguousarray(b[:, gh + 2 * hidden:], np.float32)))
    for pos, key, cells in ((4, "seq_lens", "lstm gru rnn"), (5, "init_h", "lstm gru rnn"),
                            (6, "init_c", "lstm"), (7, "peep", "lstm")):
        if cell in cells and len(n.inputs) > pos and n.inputs[pos]:
            optional.append(key)
            extra.append(n.inputs[pos])
    if "seq_lens" in optional and ctx.type(extra[optional.index("seq_lens")]).dtype != "int32":
        raise ModelError(f"node {n.name!r} ({n.op_type}): sequence_lens must be int32")
    tag = next(o for o in n.outputs if o)
    weight = ctx.add_param(f"{n.name}_w", np.ascontiguousarray(
        w.reshape(dirs * gh, size), np.float32))
    bias_name = ctx.add_param(f"{n.name}_b", np.ascontiguousarray(bias.reshape(-1),
                                                                  np.float32))
    packed = ctx.add_param(f"{n.name}_r", pack_recurrence(r, cell, hidden))
    xw = f"{tag}__xw"
    nodes = [Node.make("dense", f"{n.name}__xw", (x, weight, bias_name), (xw,))]
    attrs = {"cell": cell, "hidden": hidden, "directions": directions,
             "layout": int(n.attrs.get("layout", 0)),
             "activations": _activations(n, cell, dirs),
             "clip": float(n.attrs.get("clip", 0.0)),
             "input_forget": int(n.attrs.get("input_forget", 0)) if cell == "lstm" else 0,
             "linear_before_reset": lbr, "optional": tuple(optional)}
    outs = dict(zip(("y", "y_h", "y_c"), n.outputs, strict=False))
    for result, out in outs.items():
        if not out:
            continue
        name = n.name if result == "y" else f"{n.name}__{result}"
        if result == "y_h" and outs["y"]:  # read off Y: no second recurrence
            lens = extra[optional.index("seq_lens")] if "seq_lens" in optional else None
            nodes.append(Node.make("rnn_last", name, (outs["y"], *([lens] if lens else [])),
                                   (out,), layout=attrs["layout"], directions=directions))
            continue
        nodes.append(Node.make("rnn_sequence", name, (xw, packed, *extra), (out,),
                               result=result, **attrs))
    return nodes


@onnx_op("LSTM", 7, emits=("dense", "rnn_sequence", "rnn_last"), build_time_inputs=(1, 2, 3))
def _lstm(ctx, n):
    return _convert("lstm", ctx, n)


@onnx_op("GRU", 7, emits=("dense", "rnn_sequence", "rnn_last"), build_time_inputs=(1, 2, 3))
def _gru(ctx, n):
    return _convert("gru", ctx, n)


@onnx_op("RNN", 7, emits=("dense", "rnn_sequence", "rnn_last"), build_time_inputs=(1, 2, 3))
def _rnn(ctx, n):
    return _convert("rnn", ctx, n)
