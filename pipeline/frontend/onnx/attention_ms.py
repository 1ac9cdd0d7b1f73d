"""com.microsoft MultiHeadAttention and GroupQueryAttention (onnxruntime's contrib
operators, its semantics) onto the `attention` kernel, as ONNX Attention is
(pipeline/frontend/onnx/attention.py): Q, K, V [B, S, N * H] are read in place through
the kernel's perms, a KV cache [B, N, P, H] is concatenated in front of the new keys
(the present outputs), every mask becomes one additive bias.

MultiHeadAttention: separate Q, K, V with the optional packed input bias, or K and V
given as [B, N, L, H] (cross attention over a cache); key_padding_mask [B, T] or
[B, S, T] (0: masked, by mask_filter_value as onnxruntime does), attention_bias,
unidirectional (causal after the past), scale. Packed QKV / KV, the 1-D and 3B + 2
masks, buffer sharing (past_sequence_length) and beams (cache_indirection) are not
implemented.

GroupQueryAttention: packed or separate Q, K, V, past/present KV, seqlens_k (keys
beyond a row's length are masked; with a past the queries are the row's last ones),
causal, local_window_size, softcap, scale, attention_bias, and do_rotary with
cos/sin caches at position_ids or after the past. Static shapes: past and present are
separate buffers (present = past + new), every row's past is the whole past buffer;
quantized caches, head_sink / smooth_softmax, q/k norms, query_seqlens and the qk
output are not implemented.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.attention import (
    ATTEND_OPS,
    BHSD,
    BSHD,
    Emitter,
    attend,
    given,
    static_lengths,
    structure_bias,
)
from pipeline.frontend.onnx.registry import Limit, NodeView, onnx_op
from pipeline.frontend.onnx.transformer_ms import MS, positions_table, rotate
from pipeline.ops.index import slice_node


def _float32_only(n, ctx) -> None:
    dtype = ctx.type(n.inputs[0]).dtype
    if dtype != "float32":
        raise ModelError(f"node {n.name!r} ({n.op_type}): {dtype} is not supported "
                         "(float32 is)")


def _attend(em: Emitter, q: str, kv: tuple, biases: list, attrs: dict, shape: tuple) -> None:
    """Attention over q [B, S, Hq, D] (BSHD layout) and kv = ((k, perms), (v, perms)),
    biases summed, writing output 0 as [B, S, Hq * Dv]; shape (B, S, Hq, D, Sk, Dv)."""
    n = em.n
    bn, sq, hq, d, sk, dv = shape
    biases = [b for b in biases if b]
    bias = biases[0] if biases else None
    for other in biases[1:]:
        bias = em.op("add", (bias, other))
    (k, k_perms), (v, v_perms) = kv
    y = attend(em, (q, k, v, *([bias] if bias else [])), (bn, hq, sq, d, sk, dv),
               q_perm=BSHD["q"], k_perm=k_perms["k"], v_perm=v_perms["v"],
               out_perm=(0, 2, 1, 3), **attrs)
    y = em.op("reshape", (y,), shape=(bn, sq, hq * dv))
    em.result(y, n.outputs[0], n.inputs[0])


# -- MultiHeadAttention ------------------------------------------------------------


def _mha_mask(em: Emitter, mask: str, sq: int) -> str:
    """key_padding_mask [B, T] or [B, S, T] (1 keep, 0 mask) as a bias of
    mask_filter_value where it is 0."""
    shape = em.ctx.type(mask).shape
    if len(shape) not in (2, 3):
        raise ModelError(f"node {em.n.name!r} (MultiHeadAttention): key_padding_mask of shape "
                         f"{list(shape)} is not supported ([B, T] or [B, S, T])")
    keep = em.op("cast", (mask,), to="float32")
    fill = float(em.n.attrs.get("mask_filter_value", -10000.0))
    bias = em.op("mul", (em.op("sub", (em.const("one", np.ones((), np.float32)), keep)),
                         em.const("fill", np.array(fill, np.float32))))
    return em.op("reshape", (bias,), shape=(shape[0], 1, sq if len(shape) == 3 else 1,
                                            shape[-1]))


@onnx_op(MS + "MultiHeadAttention", 1,
         emits=(*ATTEND_OPS, "concat", "identity", "cast", "sub", "slice"),
         limits=(Limit("packed QKV or KV", lambda v: any(
             t is not None and len(t[1]) == 5 for t in v.inputs[:2])),
                 Limit("buffer sharing or beams", lambda v: v.given(8) or v.given(9))))
def _multi_head_attention(ctx, n):
    _float32_only(n, ctx)
    static_lengths(ctx, n)
    em = Emitter(ctx, n)
    heads = int(n.attrs["num_heads"])
    bn, sq, hidden = ctx.type(n.inputs[0]).shape
    k_shape, v_shape = (ctx.type(n.inputs[i]).shape if given(n, i) else None for i in (1, 2))
    if k_shape is None or v_shape is None or len(k_shape) not in (3, 4):
        raise ModelError(f"node {n.name!r} (MultiHeadAttention): packed QKV or KV inputs are "
                         "not supported")
    if given(n, 8) or given(n, 9) or (*n.outputs, "", "", "")[3]:
        raise ModelError(f"node {n.name!r} (MultiHeadAttention): past_sequence_length, "
                         "cache_indirection and the qk output are not supported")
    d = hidden // heads
    q = n.inputs[0]
    q_bias = k_bias = v_bias = ""
    if given(n, 3):
        b_full, widths = n.inputs[3], (hidden, hidden, ctx.type(n.inputs[3]).shape[0]
                                                - 2 * hidden)
        parts, start = [], 0
        for k, w in enumerate(widths):
            part = f"{n.outputs[0]}__bias{k}"
            em.nodes.append(slice_node(f"{n.name}__bias{k}", b_full, part,
                                       ctx.type(n.inputs[3]).shape, [start], [start + w], [0],
                                       [1]))
            parts.append(part)
            start += w
        q_bias, k_bias, v_bias = parts
        q = em.op("add", (q, q_bias))
    q = em.op("reshape", (q,), shape=(bn, sq, heads, d))
    outs = (*n.outputs, "", "", "")
    if len(k_shape) == 4:  # K, V already [B, N, L, H]
        kv = ((n.inputs[1], BHSD), (n.inputs[2], BHSD))
        sk, dv = k_shape[2], v_shape[3]
    else:
        past = ctx.type(n.inputs[6]).shape[2] if given(n, 6) else 0
        kv = tuple(_mha_kv(em, pos, bias, given(n, pos + 5), outs[pos], heads)
                   for pos, bias in ((1, k_bias), (2, v_bias)))
        sk, dv = k_shape[1] + past, v_shape[2] // heads
    causal = structure_bias(em, sq, sk, sk - sq, "", bool(n.attrs.get("unidirectional", 0)))
    if causal:  # onnxruntime masks by mask_filter_value, not -inf
        fill = float(n.attrs.get("mask_filter_value", -10000.0))
        causal = em.const("causal", np.where(np.isinf(ctx.params[causal]), fill, 0.0)
                          .astype(np.float32))
    biases = [_mha_mask(em, n.inputs[4], sq) if given(n, 4) else "",
              (n.inputs[5]) if given(n, 5) else "", causal]
    attrs = {"group": 1, "scale": float(n.attrs.get("scale", 1.0 / np.sqrt(d))),
             "softcap": 0.0}
    _attend(em, q, kv, biases, attrs, (bn, sq, heads, d, sk, dv))
    return em.nodes


def _mha_kv(em: Emitter, pos: int, bias: str, past: str, present: str, heads: int):
    """(tensor, perms) for MultiHeadAttention's K (pos 1) or V (pos 2)."""
    n = em.n
    x = n.inputs[pos]
    if bias:
        x = em.op("add", (x, bias))
    bn, length, width = em.ctx.type(n.inputs[pos]).shape
    if not past and not present:
        return em.op("reshape", (x,), shape=(bn, length, heads, width // heads)), BSHD
    split = em.op("reshape", (x,), shape=(bn, length, heads, width // heads))
    cur = em.op("transpose", (split,), perm=(0, 2, 1, 3))
    if past:
        cur = em.op("concat", (past, cur), present or None, axis=2)
    elif present:
        cur = em.op("identity", (cur,), present)
    return cur, BHSD


# -- GroupQueryAttention -----------------------------------------------------------

_GQA_UNSUPPORTED = {11: "head_sink", 12: "k_scale", 13: "v_scale", 14: "q_norm_weight",
                    15: "k_norm_weight", 16: "query_seqlens"}


def _gqa_limit(v) -> bool:
    return any(v.given(pos) for pos in _GQA_UNSUPPORTED) or any(
        int(v.attrs.get(key, default)) != default for key, default in (
            ("smooth_softmax", -1), ("qk_output", 0), ("kv_cache_bit_width", 0),
            ("sliding_window_cache", 0)))


def _gqa_qkv(em: Emitter, hq: int, hkv: int) -> tuple[str, str, str, int]:
    """(Q, K, V, head size): separate inputs, or slices of the packed query."""
    n, ctx = em.n, em.ctx
    shape = ctx.type(n.inputs[0]).shape
    if given(n, 1):
        return n.inputs[0], n.inputs[1], n.inputs[2], shape[2] // hq
    d = shape[2] // (hq + 2 * hkv)
    parts, start = [], 0
    for k, width in enumerate((hq * d, hkv * d, hkv * d)):
        part = f"{n.outputs[0]}__packed{k}"
        em.nodes.append(slice_node(f"{n.name}__packed{k}", n.inputs[0], part, shape, [start],
                                   [start + width], [2], [1]))
        parts.append(part)
        start += width
    return (*parts, d)


def _gqa_bias(em: Emitter, sq: int, sk: int, past: int) -> list[str]:
    """seqlens_k's padding mask, causal and local-window masks: a prompt (no past) is
    aligned top-left, a step after a past bottom-right at each row's length."""
    n = em.n
    lens = em.op("add", (em.op("cast", (n.inputs[5],), to="int64"),
                         em.const("one", np.ones(1, np.int64))))
    causal = bool(n.attrs.get("causal", 1))
    # local_window_size W counts the query's own key: W - 1 keys before it
    size = int(n.attrs.get("local_window_size", -1))
    window = size - 1 if size > 0 else -1
    if past:
        return [structure_bias(em, sq, sk, past, lens, causal, window)]
    return [structure_bias(em, sq, sk, 0, "", causal, window),
            structure_bias(em, sq, sk, 0, lens, False)]


@onnx_op(MS + "GroupQueryAttention", 1,
         emits=(*ATTEND_OPS, "concat", "identity", "cast", "slice", "where", "greater",
                "greater_equal", "less_equal", "and", "gather", "rotary_embedding"),
         limits=(Limit("quantized caches, head_sink, smooth_softmax, q/k norms, query_seqlens "
                       "or the qk output", _gqa_limit),))
def _group_query_attention(ctx, n):
    _float32_only(n, ctx)
    static_lengths(ctx, n)
    em = Emitter(ctx, n)
    hq, hkv = int(n.attrs["num_heads"]), int(n.attrs["kv_num_heads"])
    if _gqa_limit(NodeView(n.op_type, 1, n.attrs, tuple(n.inputs), (), ())):
        raise ModelError(f"node {n.name!r} (GroupQueryAttention): quantized caches, head_sink, "
                         "smooth_softmax, q/k norms, query_seqlens and the qk output are not "
                         "supported")
    q, k, v, d = _gqa_qkv(em, hq, hkv)
    bn, sq = ctx.type(n.inputs[0]).shape[:2]
    past = ctx.type(n.inputs[3]).shape[2] if given(n, 3) else 0
    sk = past + sq
    q, k, v = (em.op("reshape", (x,), shape=(bn, sq, heads, d))
               for x, heads in ((q, hq), (k, hkv), (v, hkv)))
    if int(n.attrs.get("do_rotary", 0)):
        q, k = _gqa_rotary(em, (q, k), bn, sq, past, d)
    outs = (*n.outputs, "", "", "")
    kv = []
    for x, past_in, present in ((k, given(n, 3), outs[1]), (v, given(n, 4), outs[2])):
        if not past_in and not present:
            kv.append((x, BSHD))
            continue
        cur = em.op("transpose", (x,), perm=(0, 2, 1, 3))
        cur = em.op("concat", (past_in, cur), present or None, axis=2) if past_in else \
            em.op("identity", (cur,), present)
        kv.append((cur, BHSD))
    biases = [*_gqa_bias(em, sq, sk, past), given(n, 10)]
    attrs = {"group": hq // hkv, "scale": float(n.attrs.get("scale", 1.0 / np.sqrt(d))),
             "softcap": float(n.attrs.get("softcap", 0.0)), "masked_rows": "zero"}
    _attend(em, q, tuple(kv), biases, attrs, (bn, sq, hq, d, sk, d))
    return em.nodes


def _gqa_rotary(em: Emitter, qk: tuple, bn: int, sq: int, past: int, d: int):
    """Q and K [B, S, N, H] rotated by the cos/sin caches at position_ids, else at the
    positions after the past."""
    n = em.n
    half = em.ctx.type(n.inputs[7]).shape[-1]
    positions = given(n, 9) or em.const("start", np.array([past], np.int64))
    cos, lead = positions_table(em, n.inputs[7], positions, sq, bn)
    sin, _ = positions_table(em, n.inputs[8], positions, sq, bn)
    if 2 * half > d:
        raise ModelError(f"node {n.name!r} (GroupQueryAttention): cos_cache has {half} "
                         f"columns, more than head size {d} / 2")
    return tuple(rotate(em, x, (cos, sin, lead, sq, half), False,
                        int(n.attrs.get("rotary_interleaved", 0))) for x in qk)
