"""ONNX converters to the attention operators (defined in pipeline/ops/attention.py):
Attention (opsets 23-25), RotaryEmbedding (23), LinearAttention (27) and
ai.onnx.preview's FlexAttention (1; its score_mod / prob_mod subgraphs inlined).

Attention becomes one `attention` kernel reading Q, K, V in their own layouts (3-D
inputs [B, S, H * D] are reshaped, never transposed), with the query heads per key
head as its `group`. Everything the spec adds to the scores is one additive bias
input: the attention mask (bool as 0 / -inf, padded with -inf to the key length),
the causal and sliding-window masks (a constant table, aligned bottom-right to the
past length), and with nonpad_kv_seqlen (opset 24) the per-batch padding and
causal masks, computed at run time by comparisons. past_key/past_value are
concatenated in front of K and V (the present outputs); qk_matmul_output is a
second attention node writing the scores the mode names. float16 runs in float32
(casts around the kernel); the softmax is float32 whatever softmax_precision says.
Keys beyond the kernel's stack panels take matmul + softmax instead (`attend`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.control import inline_subgraph
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.geometry import MAX_PANEL_FLOATS, panel_floats

# Logical [B, H, S, D] (Q, V) and Kᵀ [B, H, D, S] from each operand layout.
BHSD = {"q": (0, 1, 2, 3), "k": (0, 1, 3, 2), "v": (0, 1, 2, 3)}
BSHD = {"q": (0, 2, 1, 3), "k": (0, 2, 3, 1), "v": (0, 2, 1, 3)}
_QK_OUTPUT = {0: "scores", 1: "scores", 2: "biased", 3: "probs"}


class Emitter:
    """The graph nodes one ONNX node becomes, with fresh tensor names after it."""

    def __init__(self, ctx, n):
        self.ctx, self.n, self.nodes = ctx, n, []
        self.dtype = ctx.type(n.inputs[0]).dtype  # of the operands made from the inputs
        self.batch = ctx.type(n.inputs[0]).shape[0]

    def op(self, op: str, inputs, out: str | None = None, **attrs) -> str:
        """Append a node; returns its output (a name made from `op` unless given)."""
        out = out or f"{self.n.outputs[0]}__{op}{len(self.nodes)}"
        self.nodes.append(Node.make(op, f"{self.n.name}__{op}{len(self.nodes)}", inputs,
                                    (out,), **attrs))
        return out

    def const(self, tag: str, value: np.ndarray) -> str:
        return self.ctx.add_param(f"{self.n.name}_{tag}", value)

    def f32(self, name: str) -> str:
        """`name` as float32 (a cast from a narrower float); other dtypes are an error."""
        dtype = self.ctx.type(name).dtype if name in self.ctx.types else self.dtype
        if dtype == "float32":
            return name
        if dtype not in ("float16", "bfloat16"):
            raise ModelError(f"node {self.n.name!r} ({self.n.op_type}): {name!r} is {dtype}, "
                             "not a float type")
        return self.op("cast", (name,), to="float32")

    def result(self, value: str, out: str, like: str) -> None:
        """Make float32 `value` ONNX output `out`, in the dtype of input `like`: a cast,
        or the node that made it renamed."""
        dtype = self.ctx.type(like).dtype
        if dtype != "float32":
            self.op("cast", (value,), out, to=dtype)
            return
        k = next(k for k, node in enumerate(self.nodes) if node.outputs == (value,))
        self.nodes[k] = dataclasses.replace(self.nodes[k], outputs=(out,))


def static_lengths(ctx, n) -> None:
    """ModelError naming ONNX node n when an input has a symbolic dimension past its
    first (the batch, which may be symbolic): the attention converters build masks
    and panels for static lengths (the VM's decoders compile from the unfused form,
    docs/vm.md)."""
    symbols = sorted({d for i in n.inputs if i for d in ctx.type(i).shape[1:]
                      if isinstance(d, str)})
    if symbols:
        raise ModelError(f"node {n.name!r} ({n.op_type}): symbolic lengths "
                         f"{', '.join(map(repr, symbols))} are not supported yet (a "
                         "symbolic batch is): fix them with shape overrides")


def given(n, pos: int) -> str:
    """Input `pos` of ONNX node n, "" if absent."""
    return n.inputs[pos] if pos < len(n.inputs) else ""


def bhsd(em: Emitter, x: str, heads: int) -> str:
    """A 3-D [B, S, H * D] operand as [B, H, S, D] (for the present outputs)."""
    b, s, hidden = em.ctx.type(x).shape
    split = em.op("reshape", (x,), shape=(b, s, heads, hidden // heads))
    return em.op("transpose", (split,), perm=(0, 2, 1, 3))


def mask_bias(em: Emitter, mask: str, total: int) -> str:
    """The attention mask as an additive float32 bias, padded with -inf to `total` keys."""
    if em.ctx.type(mask).dtype == "bool":
        bias = em.op("where", (mask, em.const("zero", np.zeros((), np.float32)),
                               em.const("neg_inf", np.array(-np.inf, np.float32))))
    else:
        bias = em.f32(mask)
    shape = em.ctx.type(mask).shape
    if shape[-1] < total:
        pads = [0] * (2 * len(shape))
        pads[-1] = total - shape[-1]
        bias = em.op("pad", (bias,), pads=pads, mode="constant", value=-math.inf)
    return bias


def structure_bias(em: Emitter, sq: int, sk: int, past: int, lens: str, causal: bool,
                   left: int = -1, right: int = -1) -> str | None:
    """The causal and sliding-window masks (window sizes -1: unbounded) and, given the
    int64 valid key counts `lens` [B], the padding mask, as one additive bias: a
    constant [Sq, Sk] when the keys before the queries are the `past` ones, else
    [B, 1, Sq, Sk] computed from lens at run time (query i then sits at lens[b] - Sq
    + i); None when there is none."""
    i, j = np.arange(sq).reshape(sq, 1), np.arange(sk).reshape(1, sk)
    if not lens:
        if not (causal or left >= 0 or right >= 0):
            return None
        diff = i + past - j  # how far key j lies behind query i
        allowed = np.ones((sq, sk), bool)
        if causal:
            allowed &= diff >= 0
        if left >= 0:
            allowed &= diff <= left
        if right >= 0:
            allowed &= -diff <= right
        return em.const("bias", np.where(allowed, 0.0, -np.inf).astype(np.float32))
    # offset[b] = lens[b] - Sq: each condition compares lens with a table over (i, j).
    bn = em.ctx.type(lens).shape[0] if lens in em.ctx.types else em.batch
    lens = em.op("reshape", (lens,), shape=(bn, 1, 1, 1))
    base = (j - i + sq).astype(np.int64)
    tests = [("greater", np.broadcast_to(j, (sq, sk)).astype(np.int64))]  # j < nonpad
    if causal:
        tests.append(("greater_equal", base))
    if left >= 0:
        tests.append(("less_equal", base + left))
    if right >= 0:
        tests.append(("greater_equal", base - right))
    allowed = None
    for k, (op, table) in enumerate(tests):
        ok = em.op(op, (lens, em.const(f"table{k}", np.ascontiguousarray(table))))
        allowed = ok if allowed is None else em.op("and", (allowed, ok))
    return em.op("where", (allowed, em.const("zero", np.zeros((), np.float32)),
                           em.const("neg_inf", np.array(-np.inf, np.float32))))


def _kv(em: Emitter, x: str, past: str, present: str, heads: int, three_d: bool):
    """(tensor, perm table) the kernel reads K or V from: the present cache [B, H, S, D]
    when there is a past or the present is asked for, else x in its own layout."""
    if not past and not present:
        if not three_d:
            return em.f32(x), BHSD
        bn, s, hidden = em.ctx.type(x).shape
        return em.op("reshape", (em.f32(x),), shape=(bn, s, heads, hidden // heads)), BSHD
    cur = bhsd(em, x, heads) if three_d else x
    if past:
        cur = em.op("concat", (past, cur), present or None, axis=2)
    elif present:
        cur = em.op("identity", (cur,), present)
    return em.f32(cur), BHSD


def _attention_inputs(em: Emitter):
    """(q, k, v, attrs, (B, Hq, Sq, D, Dv), three_d) of an ONNX Attention node."""
    n, types = em.n, em.ctx.types
    q, k, v = n.inputs[:3]
    three_d = len(types[q].shape) == 3
    if three_d:
        if "q_num_heads" not in n.attrs or "kv_num_heads" not in n.attrs:
            raise ModelError(f"node {n.name!r} (Attention): 3-D inputs need q_num_heads and "
                             "kv_num_heads")
        hq, hkv = int(n.attrs["q_num_heads"]), int(n.attrs["kv_num_heads"])
        bn, sq, hidden = types[q].shape
        d, dv = hidden // hq, types[v].shape[2] // hkv
        q_in = em.op("reshape", (em.f32(q),), shape=(bn, sq, hq, d))
    else:
        (bn, hq, sq, d), hkv, dv = types[q].shape, types[k].shape[1], types[v].shape[3]
        q_in = em.f32(q)
    if hq % hkv:
        raise ModelError(f"node {n.name!r} (Attention): {hq} query heads do not group over "
                         f"{hkv} key heads")
    outs = (*n.outputs, "", "", "")
    k_in, k_perms = _kv(em, k, given(n, 4), outs[1], hkv, three_d)
    v_in, v_perms = _kv(em, v, given(n, 5), outs[2], hkv, three_d)
    attrs = {"q_perm": (BSHD if three_d else BHSD)["q"], "k_perm": k_perms["k"],
             "v_perm": v_perms["v"], "group": hq // hkv, "masked_rows": "zero",
             "scale": float(n.attrs.get("scale", 1.0 / math.sqrt(d))),
             "softcap": float(n.attrs.get("softcap", 0.0))}
    return q_in, k_in, v_in, attrs, (bn, hq, sq, d, dv), three_d


def attend(em: Emitter, inputs: tuple, sizes: tuple, **attrs) -> str:
    """One attention node over inputs (q, k, v[, bias]) with `attrs`; returns its
    output. sizes = (B, Hq, Sq, D, Sk, Dv). When the kernel's stack panels cannot hold
    Sk keys, the same computation from transposes, matmuls, elementwise ops and a
    softmax instead (only output "y"; a row masked whole gives NaN there, as Softmax)."""
    bn, hq, sq, d, sk, dv = sizes
    if panel_floats(sq, d, sk, dv) <= MAX_PANEL_FLOATS:
        return em.op("attention", inputs, **attrs)
    if attrs.get("output", "y") != "y":
        raise ModelError(f"node {em.n.name!r} ({em.n.op_type}): the scores output of {sk} "
                         f"keys of head size {d} exceeds the attention kernel's stack panels")
    q, k, v = (x if perm == (0, 1, 2, 3) else em.op("transpose", (x,), perm=perm)
               for x, perm in zip(inputs, (attrs["q_perm"], attrs["k_perm"], attrs["v_perm"]),
                                  strict=False))
    group = attrs.get("group", 1)
    if group > 1:  # each key head repeated for its group of query heads
        k, v = (em.op("reshape", (em.op("expand", (em.op(
            "reshape", (x,), shape=(bn, hq // group, 1, *tail)),),
            shape=(bn, hq // group, group, *tail)),), shape=(bn, hq, *tail))
            for x, tail in ((k, (d, sk)), (v, (sk, dv))))
    s = em.op("matmul", (q, k), trans_a=0, trans_b=0)
    s = em.op("mul", (s, em.const("scale", np.array(attrs["scale"], np.float32))))
    cap = attrs.get("softcap", 0.0)
    if cap > 0:
        s = em.op("mul", (em.op("tanh", (em.op("mul", (s, em.const(
            "inverse_cap", np.array(1.0 / cap, np.float32)))),)),
            em.const("cap", np.array(cap, np.float32))))
    if len(inputs) > 3:
        s = em.op("add", (s, inputs[3]))
    p = em.op("softmax", (s,), axis=3, flatten=0)
    y = em.op("matmul", (p, v), trans_a=0, trans_b=0)
    out_perm = attrs["out_perm"]
    return y if out_perm == (0, 1, 2, 3) else em.op("transpose", (y,), perm=out_perm)


def _attention(ctx, n):
    static_lengths(ctx, n)
    em = Emitter(ctx, n)
    q, k, v, attrs, (bn, hq, sq, d, dv), three_d = _attention_inputs(em)
    past = ctx.type(n.inputs[4]).shape[2] if given(n, 4) else 0
    sk = ctx.type(n.inputs[1]).shape[1 if three_d else 2] + past
    biases = [b for b in (mask_bias(em, given(n, 3), sk) if given(n, 3) else None,
                          structure_bias(em, sq, sk, past, given(n, 6),
                                         bool(n.attrs.get("is_causal", 0)),
                                         int(n.attrs.get("left_window_size", -1)),
                                         int(n.attrs.get("right_window_size", -1)))) if b]
    bias = biases[0] if len(biases) == 1 else em.op("add", biases) if biases else None
    inputs = (q, k, v, *([bias] if bias else []))
    outs = (*n.outputs, "", "", "")
    out_perm = (0, 2, 1, 3) if three_d else (0, 1, 2, 3)
    sizes = (bn, hq, sq, d, sk, dv)
    y = attend(em, inputs, sizes, out_perm=out_perm, **attrs)
    if three_d:
        y = em.op("reshape", (y,), shape=(bn, sq, hq * dv))
    em.result(y, n.outputs[0], n.inputs[0])
    if outs[3]:
        mode = int(n.attrs.get("qk_matmul_output_mode", 0))
        scores = attend(em, inputs, sizes, out_perm=(0, 1, 2, 3), output=_QK_OUTPUT[mode],
                        **attrs)
        em.result(scores, outs[3], n.inputs[0])
    return em.nodes


# what attend() may emit, and the masks around it
ATTEND_OPS = ("attention", "reshape", "transpose", "expand", "matmul", "mul", "tanh", "add",
              "softmax")
_ATTENTION_OPS = (*ATTEND_OPS, "concat", "identity", "cast", "where", "pad", "greater",
                  "greater_equal", "less_equal", "and")

onnx_op("Attention", 23, emits=_ATTENTION_OPS)(_attention)


@onnx_op("RotaryEmbedding", 23, emits=("rotary_embedding", "reshape", "gather", "cast",
                                        "identity"))
def _rotary(ctx, n):
    """x [B, H, S, D] or [B, S, H * D] (num_heads); cos/sin [max_pos, R/2] read at
    position_ids [B, S], or [B, S, R/2] already."""
    em = Emitter(ctx, n)
    shape = ctx.type(n.inputs[0]).shape
    half = ctx.type(n.inputs[1]).shape[-1]
    x = em.f32(n.inputs[0])
    tables = [em.f32(t) for t in n.inputs[1:3]]
    if given(n, 3):
        tables = [em.op("gather", (t, n.inputs[3]), axis=0) for t in tables]
    if len(shape) == 3:
        heads = int(n.attrs.get("num_heads", 0))
        if heads <= 0:
            raise ModelError(f"node {n.name!r} (RotaryEmbedding): a 3-D input needs num_heads")
        bn, s, head = shape[0], shape[1], shape[2] // heads
        x = em.op("reshape", (x,), shape=(bn, s, heads, head))
        tables = [em.op("reshape", (t,), shape=(bn, s, 1, half)) for t in tables]
    else:
        bn, _, s, head = shape
        tables = [em.op("reshape", (t,), shape=(bn, 1, s, half)) for t in tables]
    dim = int(n.attrs.get("rotary_embedding_dim", 0)) or head
    if 2 * half != dim:
        raise ModelError(f"node {n.name!r} (RotaryEmbedding): cos/sin have {half} columns, "
                         f"not rotary_embedding_dim / 2 = {dim / 2:g}")
    y = em.op("rotary_embedding", (x, *tables), interleaved=int(n.attrs.get("interleaved", 0)))
    if len(shape) == 3:
        y = em.op("reshape", (y,), shape=shape)
    em.result(y, n.outputs[0], n.inputs[0])
    return em.nodes


@onnx_op("LinearAttention", 27, emits=("linear_attention", "cast", "identity"))
def _linear_attention(ctx, n):
    """Two linear_attention nodes (kernels write one output each): the output and the
    present state; the past state is zeros when absent."""
    em = Emitter(ctx, n)
    rule = n.attrs.get("update_rule", b"gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else rule
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ModelError(f"node {n.name!r} (LinearAttention): update_rule {rule!r} is not "
                         "one of linear, gated, delta, gated_delta")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    hq, hkv = int(n.attrs["q_num_heads"]), int(n.attrs["kv_num_heads"])
    (bn, _, qw), vw = ctx.type(n.inputs[0]).shape, ctx.type(n.inputs[2]).shape[2]
    dk, dv = qw // hq, vw // hkv
    for pos, flag, what in ((4, gated, "decay"), (5, delta, "beta")):
        if bool(given(n, pos)) != flag:
            raise ModelError(f"node {n.name!r} (LinearAttention): update_rule {rule!r} "
                             f"{'needs' if flag else 'takes no'} {what}")
    state = em.f32(given(n, 3)) if given(n, 3) else \
        em.const("state", np.zeros((bn, hkv, dk, dv), np.float32))
    inputs = [em.f32(x) for x in n.inputs[:3]] + [state] + \
        [em.f32(n.inputs[pos]) for pos, flag in ((4, gated), (5, delta)) if flag]
    scale = float(n.attrs.get("scale", 0.0)) or 1.0 / math.sqrt(dk)
    attrs = {"q_heads": hq, "kv_heads": hkv, "scale": scale, "gated": int(gated),
             "delta": int(delta)}
    outs = (*n.outputs, "")
    for k, (out, what) in enumerate(zip(outs[:2], ("y", "state"), strict=True)):
        if out:
            value = em.op("linear_attention", inputs, output=what, **attrs)
            em.result(value, out, n.inputs[0] if k == 0 or not given(n, 3) else n.inputs[3])
    return em.nodes


def _flex_shapes(ctx, n) -> tuple[int, ...]:
    """(B, Hq, L, E, Hkv, S, Ev) of a FlexAttention node; ModelError unless they fit."""
    shapes = [ctx.type(x).shape for x in n.inputs[:3]]
    if len(n.inputs) < 3 or any(len(s) != 4 for s in shapes):
        raise ModelError(f"node {n.name!r} (FlexAttention): Q, K, V must be rank 4")
    (bn, hq, sq, d), (bk, hkv, sk, dk), (bv, hv, sv, dv) = shapes
    if not (bn == bk == bv and hkv == hv and sk == sv and d == dk and hq % hkv == 0):
        raise ModelError(f"node {n.name!r} (FlexAttention): Q {list(shapes[0])}, K "
                         f"{list(shapes[1])}, V {list(shapes[2])} do not fit")
    return bn, hq, sq, d, hkv, sk, dv


def _flex_attention(ctx, n):
    """Without modifiers one attention kernel; with score_mod / prob_mod, the scores
    Q·Kᵀ (query heads grouped per key head by a reshape) as matmuls, the modifiers'
    nodes inlined around the softmax, and probs·V. Q and K are pre-scaled by
    sqrt(scale) in their own dtype, as ONNX's reference; float16 computes in float32."""
    bn, hq, sq, d, hkv, sk, dv = _flex_shapes(ctx, n)
    precision = int(n.attrs.get("softmax_precision", 1))
    if precision != 1:  # TensorProto.FLOAT
        raise ModelError(f"node {n.name!r} (FlexAttention): softmax_precision {precision} "
                         "is not supported (1, float32, is)")
    em, group = Emitter(ctx, n), hq // hkv
    root = np.sqrt(np.float32(n.attrs.get("scale", 1.0 / math.sqrt(d))))
    root = em.const("sqrt_scale", np.array(root, em.dtype))
    q, k = (em.f32(em.op("mul", (x, root))) for x in n.inputs[:2])
    v = em.f32(n.inputs[2])
    mods = {a: n.attrs[a] for a in ("score_mod", "prob_mod") if a in n.attrs}
    if not mods:
        y = attend(em, (q, k, v), (bn, hq, sq, d, sk, dv), q_perm=BHSD["q"], k_perm=BHSD["k"],
                   v_perm=BHSD["v"], group=group, scale=1.0, softcap=0.0,
                   masked_rows="nan", out_perm=(0, 1, 2, 3))
        em.result(y, n.outputs[0], n.inputs[0])
        return em.nodes

    def grouped(x, rows, cols):  # [B, Hq, rows, cols] <-> [B, Hkv, group * rows, cols]
        return x if group == 1 else em.op("reshape", (x,), shape=(bn, hq // group, group * rows,
                                                                   cols))

    def ungrouped(x, cols):
        return x if group == 1 else em.op("reshape", (x,), shape=(bn, hq, sq, cols))

    s = ungrouped(em.op("matmul", (grouped(q, sq, d), k), trans_a=0, trans_b=1), sk)
    for attr, after in (("score_mod", "softmax"), ("prob_mod", None)):
        if attr in mods:
            nodes, outs = inline_subgraph(ctx, mods[attr], [s],
                                          [TensorType((bn, hq, sq, sk), "float32")],
                                          f"node {n.name!r} {attr}", f"{n.outputs[0]}__{attr}__")
            em.nodes += nodes
            s = outs[0]
        if after:
            s = em.op("softmax", (s,), axis=3, flatten=0)
    y = ungrouped(em.op("matmul", (grouped(s, sq, sk), v), trans_a=0, trans_b=0), dv)
    em.result(y, n.outputs[0], n.inputs[0])
    return em.nodes


onnx_op("ai.onnx.preview.FlexAttention", 1, emits=(*ATTEND_OPS, "cast"),
        subgraphs=("score_mod", "prob_mod"))(_flex_attention)
