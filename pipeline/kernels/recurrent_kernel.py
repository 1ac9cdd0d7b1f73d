"""The graph op `rnn_sequence` (its converters: pipeline/frontend/onnx/recurrent.py): the whole
time loop of one LSTM, GRU or RNN layer, all directions, in one kernel.

Inputs (in this order, the optional ones as the node's `optional` attribute lists them):
  xw       X·Wᵀ + biases for every time step, computed before by one `dense`:
           [seq, batch, dirs*G*H] (layout 0) or [batch, seq, dirs*G*H] (layout 1)
  r_packed the recurrence weights Rᵀ packed at build time by `pack_recurrence`: per
           direction, per column group (LSTM: the 4H gate columns; GRU: z,r then h; RNN:
           H), blocks of BLOCK columns stored [k][BLOCK] (the panel layout of
           dsl/gemm_tile, so the step's product streams it without packing)
  seq_lens [batch] int32, init_h / init_c like Y_h, peep [dirs, 3H] (i, o, f),
  rbias    [dirs, H]: GRU's Rbh when linear_before_reset (else folded into xw).

Work is split over (direction, tile of up to TILE batch rows), on the library's thread
team: rows of a tile share each weight load of the product, and directions and tiles
are independent. Per time step a tile computes gates = h·Rᵀ in vector registers, then
the cell's elementwise update. Rows past their sequence length keep their state (and
write zeros into Y), as onnxruntime does; the reverse direction starts at each row's
last valid step.
"""

from __future__ import annotations

import llvmlite.ir as ir

from pipeline.dsl.vector import fma, parallel_for, zeros
from pipeline.kernels.registry import lowering
from pipeline.ops.recurrent_layout import BLOCK, LANES, group_widths, padded

TILE = 4           # batch rows per work item


def _sigmoid(kb, x):
    one = kb.fconst(1.0, x)
    return kb.fdiv(one, kb.fadd(one, kb.exp(kb.neg(x))))


def _tanh(kb, x):
    """tanh with kb.exp (vectorisable): sign(x) (1 - e) / (1 + e), e = exp(-2|x|)."""
    e = kb.exp(kb.fmul(kb.fconst(-2.0, x), kb.intrinsic("fabs", x)))
    one = kb.fconst(1.0, x)
    t = kb.fdiv(kb.fsub(one, e), kb.fadd(one, e))
    return kb.select(kb.compare("<", x, kb.fconst(0.0, x)), kb.neg(t), t)


def activation(kb, act: tuple, x):
    """f(x) for act = (name, alpha, beta)."""
    name, alpha, beta = act
    f, zero, one = (lambda v: kb.fconst(v, x)), kb.fconst(0.0, x), kb.fconst(1.0, x)
    negative = kb.compare("<", x, zero)
    if name == "sigmoid":
        return _sigmoid(kb, x)
    if name == "tanh":
        return _tanh(kb, x)
    if name == "relu":
        return kb.select(negative, zero, x)
    if name == "affine":
        return kb.fadd(kb.fmul(f(alpha), x), f(beta))
    if name == "leakyrelu":
        return kb.select(negative, kb.fmul(f(alpha), x), x)
    if name == "thresholdedrelu":
        return kb.select(kb.compare(">", x, f(alpha)), x, zero)
    if name == "scaledtanh":
        return kb.fmul(f(alpha), _tanh(kb, kb.fmul(f(beta), x)))
    if name == "hardsigmoid":
        return kb.fmax(zero, kb.fmin(one, kb.fadd(kb.fmul(f(alpha), x), f(beta))))
    if name == "elu":
        return kb.select(negative, kb.fmul(f(alpha), kb.fsub(kb.exp(x), one)), x)
    if name == "softsign":
        return kb.fdiv(x, kb.fadd(one, kb.intrinsic("fabs", x)))
    if name == "softplus":  # max(x, 0) + log(1 + exp(-|x|)): no overflow
        tail = kb.intrinsic("log", kb.fadd(one, kb.exp(kb.neg(kb.intrinsic("fabs", x)))))
        return kb.fadd(kb.select(negative, zero, x), tail)
    raise AssertionError(name)  # the converter checked the name


def rnn_sequence_lower(kb, node, ins, out, epilogue):
    a = node.attr
    cell, hidden, dirs, layout = a("cell"), a("hidden"), len(a("directions")), a("layout")
    xw, packed = ins[0], ins[1]
    opt = dict(zip(a("optional"), ins[2:], strict=True))
    seq, batch = xw.type.shape[:2] if layout == 0 else xw.type.shape[1::-1]
    widths = group_widths(cell, hidden)
    gate_cols = sum(widths)
    per_dir = sum(padded(w) for w in widths) * hidden
    tile = min(TILE, batch)
    tiles = -(-batch // tile)
    last_rows = batch - (tiles - 1) * tile
    work = seq * batch * dirs * hidden * gate_cols
    with parallel_for(kb, dirs * tiles, "rnn", work=work) as item:
        d, t_index = item // tiles, item % tiles
        if last_rows == tile:
            _tile(kb, node, xw, packed, opt, out, d, t_index * tile, tile, seq, batch, per_dir)
        else:
            with kb.b.if_else(t_index < tiles - 1) as (full, rest):
                with full:
                    _tile(kb, node, xw, packed, opt, out, d, t_index * tile, tile, seq,
                          batch, per_dir)
                with rest:
                    _tile(kb, node, xw, packed, opt, out, d, t_index * tile, last_rows, seq,
                          batch, per_dir)


def _tile(kb, node, xw, packed, opt, out, d, b0, rows, seq, batch, per_dir):
    """All time steps of direction `d` (an Index) for batch rows b0 .. b0 + rows."""
    a = node.attr
    cell, hidden, layout = a("cell"), a("hidden"), a("layout")
    directions, result = a("directions"), a("result")
    dirs = len(directions)
    hdim = hidden
    widths = group_widths(cell, hidden)
    stride = sum(padded(w) for w in widths)  # a row of the gates scratch
    n_cols = dirs * sum(widths)
    h = kb.scratch(rows * hdim)
    c = kb.scratch(rows * hdim) if cell == "lstm" else None
    gates = kb.scratch(rows * stride)
    rh = kb.scratch(rows * hdim) if cell == "gru" and not a("linear_before_reset") else None
    reverse = _reverse_flag(directions, d)

    def state_offset(b):  # [dirs, batch, H] or [batch, dirs, H]
        return ((d * batch + b) if layout == 0 else (b * dirs + d)) * hdim

    lens = []
    for r in range(rows):
        if "seq_lens" in opt:
            n = kb.index(kb.load(opt["seq_lens"], b0 + r))
            lens.append(kb.smin(kb.smax(n, 0), seq))
        else:
            lens.append(seq)
    with kb.loop(0, hdim, "init") as j:
        for r in range(rows):
            for state, name in ((h, "init_h"), (c, "init_c")):
                if state is None:
                    continue
                value = kb.load(opt[name], state_offset(b0 + r) + j) if name in opt else \
                    kb.f32(0.0)
                kb.store(state, r * hdim + j, value)

    with kb.loop(0, seq, "step") as s:
        active, times, xw_at = [], [], []
        for r in range(rows):
            on = s < lens[r]
            t = kb.select(reverse, kb.smax(lens[r] - 1 - s, 0), s)
            active.append(on)
            times.append(t)
            b = b0 + r
            row = (t * batch + b) if layout == 0 else (b * seq + t)
            xw_at.append(row * n_cols + d * sum(widths))
        base = d * per_dir
        _product(kb, packed, base, h, rows, hdim, padded(widths[0]), gates, 0, stride)
        if cell == "gru" and not a("linear_before_reset"):
            _gru_reset_stage(kb, node, xw, gates, stride, h, rh, xw_at, d, rows)
            _product(kb, packed, base + padded(widths[0]) * hidden, rh, rows, hdim,
                     padded(widths[1]), gates, padded(widths[0]), stride)
        elif cell == "gru":
            _product(kb, packed, base + padded(widths[0]) * hidden, h, rows, hdim,
                     padded(widths[1]), gates, padded(widths[0]), stride)
        with kb.loop(0, hdim, "j") as j:
            for r in range(rows):
                def g(k, r=r):
                    return kb.load(gates, r * stride + k)

                def x(k, r=r):
                    return kb.load(xw, xw_at[r] + k)

                new_h = _cell_update(kb, node, opt, d, x, g, h, c, r * hdim + j, j)
                if result == "y":
                    b = b0 + r
                    t = kb.select(active[r], times[r], s)
                    at = (((t * dirs + d) * batch + b) if layout == 0 else
                          ((b * seq + t) * dirs + d)) * hdim + j
                    kb.store(out, at, kb.select(active[r], new_h[0], kb.f32(0.0)))
                for state, value in zip((h, c), new_h, strict=False):
                    old = kb.load(state, r * hdim + j)
                    kb.store(state, r * hdim + j, kb.select(active[r], value, old))
    if result in ("y_h", "y_c"):  # zeros for an empty sequence, as onnxruntime
        state = h if result == "y_h" else c
        with kb.loop(0, hdim, "fin") as j:
            for r in range(rows):
                value = kb.load(state, r * hdim + j)
                if "seq_lens" in opt:
                    value = kb.select(kb.index(lens[r]) > 0, value, kb.f32(0.0))
                kb.store(out, state_offset(b0 + r) + j, value)


def _reverse_flag(directions, d):
    """i1: direction `d` (an Index) runs backwards in time."""
    if len(directions) == 1:
        return ir.Constant(ir.IntType(1), int(directions[0] == "reverse"))
    return d > 0  # bidirectional: forward, then reverse


def _product(kb, packed, base, src, rows, hdim, width, gates, col0, stride):
    """gates[r, col0 + n] = sum_k src[r, k] * Rᵀ[k, n] for n < width (a multiple of
    BLOCK), Rᵀ's blocks read from packed[base + (blk * hdim + k) * BLOCK + ...].
    Fewer rows take more blocks at once: eight accumulators hide the FMA latency
    (one row, one block would wait on two dependent chains)."""
    blocks = width // BLOCK
    span = max(1, min(4 // rows, blocks))
    with kb.loop(0, blocks // span, "blk") as blk:
        _product_blocks(kb, packed, base, src, rows, hdim, blk * span, span, gates, col0,
                        stride)
    for first in range(blocks - blocks % span, blocks):
        _product_blocks(kb, packed, base, src, rows, hdim, first, 1, gates, col0, stride)


def _product_blocks(kb, packed, base, src, rows, hdim, first, span, gates, col0, stride):
    """_product's blocks first .. first + span, in registers over the whole k."""
    units = 2 * span
    accs = [[kb.local(zeros(LANES)) for _ in range(units)] for _ in range(rows)]
    with kb.loop(0, hdim, "k") as k:
        ws = [kb.vload(packed, base + (first + u // 2) * (hdim * BLOCK) + k * BLOCK
                       + (u % 2) * LANES, LANES) for u in range(units)]
        for r in range(rows):
            x = kb.splat(kb.load(src, r * hdim + k), LANES)
            for u in range(units):
                kb.set(accs[r][u], fma(kb, x, ws[u], kb.get(accs[r][u])))
    for r in range(rows):
        for u in range(units):
            kb.vstore(gates, r * stride + col0 + first * BLOCK + u * LANES,
                      kb.get(accs[r][u]))


def _pick(kb, d, per_dir, fn):
    """fn(activations of the direction) for the run-time direction `d` (an Index):
    computed once if both directions use the same ones, else both and selected."""
    if len(per_dir) == 1 or per_dir[0] == per_dir[1]:
        return fn(per_dir[0])
    first, second = fn(per_dir[0]), fn(per_dir[1])
    return [kb.select(d > 0, y, x) for x, y in zip(first, second, strict=True)]


def _clip(kb, node, x):
    limit = node.attr("clip")
    if not limit:
        return x
    return kb.fmax(kb.fconst(-limit, x), kb.fmin(kb.fconst(limit, x), x))


def _gru_reset_stage(kb, node, xw, gates, stride, h, rh, xw_at, d, rows):
    """GRU without linear_before_reset: z and r from the first product; z kept in the
    gates scratch for the update, r·h into `rh` for the second product."""
    hidden = node.attr("hidden")
    per_dir = node.attr("activations")
    with kb.loop(0, hidden, "zr") as j:
        for r in range(rows):
            pre = [_clip(kb, node, kb.fadd(kb.load(xw, xw_at[r] + g * hidden + j),
                                           kb.load(gates, r * stride + g * hidden + j)))
                   for g in (0, 1)]
            z, reset = _pick(kb, d, per_dir, lambda acts, pre=pre: [
                activation(kb, acts[0], p) for p in pre])
            kb.store(gates, r * stride + j, z)
            kb.store(rh, r * hidden + j, kb.fmul(reset, kb.load(h, r * hidden + j)))


def _cell_update(kb, node, opt, d, x, g, h, c, at, j):
    """The new (h,) or (h, c) of element `at` of the state; x(k) / g(k) read the input
    projection and the recurrent product at column k."""
    cell, hidden = node.attr("cell"), node.attr("hidden")
    per_dir = node.attr("activations")
    h_old = kb.load(h, at)

    def pre(k):
        return kb.fadd(x(k * hidden + j), g(k * hidden + j))

    if cell == "rnn":
        v = _clip(kb, node, pre(0))
        return _pick(kb, d, per_dir, lambda acts: [activation(kb, acts[0], v)])
    if cell == "gru":
        h_col = padded(2 * hidden)  # the h gate's product: the second column group
        if node.attr("linear_before_reset"):
            pz, pr = _clip(kb, node, pre(0)), _clip(kb, node, pre(1))
            z, reset = _pick(kb, d, per_dir, lambda acts: [activation(kb, acts[0], pz),
                                                            activation(kb, acts[0], pr)])
            rec = kb.fadd(g(h_col + j), kb.load(opt["rbias"], d * hidden + j))
            ph = _clip(kb, node, kb.fadd(x(2 * hidden + j), kb.fmul(reset, rec)))
        else:
            z = g(j)  # _gru_reset_stage stored the update gate there
            ph = _clip(kb, node, kb.fadd(x(2 * hidden + j), g(h_col + j)))
        (cand,) = _pick(kb, d, per_dir, lambda acts: [activation(kb, acts[1], ph)])
        one = kb.fconst(1.0, z)
        return [kb.fadd(kb.fmul(kb.fsub(one, z), cand), kb.fmul(z, h_old))]
    # LSTM: gate columns i, o, f, c; peepholes i, o, f
    c_old = kb.load(c, at)
    peep = opt.get("peep")

    def with_peep(v, k, state):
        if peep is None:
            return v
        return kb.fadd(v, kb.fmul(kb.load(peep, d * (3 * hidden) + k * hidden + j), state))

    pi = _clip(kb, node, with_peep(pre(0), 0, c_old))
    pf = _clip(kb, node, with_peep(pre(2), 2, c_old))
    pc = _clip(kb, node, pre(3))
    i, f, cand = _pick(kb, d, per_dir, lambda acts: [
        activation(kb, acts[0], pi), activation(kb, acts[0], pf), activation(kb, acts[1], pc)])
    if node.attr("input_forget"):
        f = kb.fsub(kb.fconst(1.0, i), i)
    c_new = kb.fadd(kb.fmul(f, c_old), kb.fmul(i, cand))
    po = _clip(kb, node, with_peep(pre(1), 1, c_new))
    o, hc = _pick(kb, d, per_dir, lambda acts: [activation(kb, acts[0], po),
                                                activation(kb, acts[2], c_new)])
    return [kb.fmul(o, hc), c_new]


lowering("rnn_sequence", lower=rnn_sequence_lower)
