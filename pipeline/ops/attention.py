"""The attention operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/attention.py; their ONNX converters:
pipeline/frontend/onnx/attention.py (Attention, RotaryEmbedding) and
pipeline/frontend/onnx/transformer_ms.py (the com.microsoft ones).
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.dims import dim_sum
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import logical_shapes, split_appended
from pipeline.ops.registry import OpKind, broadcast_shape, register

# What an attention node writes (attribute `output`): the context Y, or one of the
# intermediate score matrices [B, Hq, Sq, Sk] ONNX Attention's qk_matmul_output
# exposes: Q Kᵀ * scale after softcap, that plus the mask, or the softmax of it.
OUTPUTS = ("y", "scores", "biased", "probs")


def _infer(types, node):
    if any(t.dtype != "float32" for t in types):
        raise ModelError(f"node {node.name!r} (attention): float32 operands only")
    types, appended = split_appended(types, node)
    q, kt, v = logical_shapes([t.shape for t in types], node)
    if appended:
        _, kt_new, v_new = logical_shapes([q, *(t.shape for t in appended)], node)
        if kt_new[:3] != kt[:3] or (*v_new[:2], v_new[3]) != (*v[:2], v[3]):
            raise ModelError(f"node {node.name!r} (attention): appended Kᵀ {list(kt_new)} "
                             f"and V {list(v_new)} do not extend Kᵀ {list(kt)}, V {list(v)}")
        kt = (*kt[:3], dim_sum((kt[3], kt_new[3])))
        v = (*v[:2], dim_sum((v[2], v_new[2])), v[3])
    group = node.attr("group", 1)
    if not (q[0] == kt[0] == v[0] and kt[1] == v[1] and q[1] == kt[1] * group
            and q[3] == kt[2] and kt[3] == v[2]):
        raise ModelError(f"node {node.name!r} (attention): Q {list(q)}, Kᵀ {list(kt)}, "
                         f"V {list(v)} do not multiply (query heads per key head: {group})")
    scores = (*q[:3], kt[3])
    last = node.attr("mask_keys", "all") == "last"
    if node.attr("mask_keys", "all") not in ("all", "last"):
        raise ModelError(f"node {node.name!r} (attention): mask_keys "
                         f"{node.attr('mask_keys')!r} is not 'all' or 'last'")
    # mask_keys="last": the mask's columns are the last keys (checked against them)
    masked = (*scores[:3], types[3].shape[-1]) if last and len(types) > 3 else scores
    if len(types) > 3 and broadcast_shape(masked, types[3].shape,
                                          where=f"node {node.name!r}") != masked:
        raise ModelError(f"node {node.name!r} (attention): mask {list(types[3].shape)} "
                         f"does not broadcast to the scores {list(scores)}")
    output = node.attr("output", "y")
    if output not in OUTPUTS:
        raise ModelError(f"node {node.name!r} (attention): output {output!r} is not one of "
                         f"{list(OUTPUTS)}")
    logical = (*q[:3], v[3]) if output == "y" else scores
    return [TensorType(tuple(logical[p] for p in node.attr("out_perm")), "float32")]


def _numpy(xs, node):
    xs, appended = split_appended(xs, node)
    if appended:  # K and V whole: the appended ones after them along the key axis
        xs = [xs[0], np.concatenate([xs[1], appended[0]], node.attr("k_perm")[3]),
              np.concatenate([xs[2], appended[1]], node.attr("v_perm")[2]), *xs[3:]]
    q, k, v = (np.transpose(x, node.attr(f"{n}_perm")).astype(np.float64)
               for x, n in zip(xs, "qkv", strict=False))
    group = node.attr("group", 1)
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.matmul(q, k) * node.attr("scale")
    cap = node.attr("softcap", 0.0)
    if cap > 0:
        s = cap * np.tanh(s / cap)
    output = node.attr("output", "y")
    if len(xs) > 3 and output != "scores":
        mask = xs[3]
        if node.attr("mask_keys", "all") == "last":  # no mask on the keys before its own
            before = s.shape[-1] - mask.shape[-1]
            mask = np.concatenate([np.zeros((*mask.shape[:-1], before), mask.dtype), mask], -1)
        s = s + mask
    if output in ("y", "probs"):
        top = s.max(axis=-1, keepdims=True)
        empty = np.isneginf(top)
        e = np.exp(s - np.where(empty, 0.0, top))
        total = e.sum(axis=-1, keepdims=True)
        s = e / np.where(total == 0, 1.0, total)
        if node.attr("masked_rows", "nan") != "zero":
            s = np.where(empty, np.nan, s)
    if output == "y":
        s = np.matmul(s, v)
    inverse = np.argsort(node.attr("out_perm"))  # logical dim u sits at position inverse[u]
    return [np.transpose(s, np.argsort(inverse)).astype(np.float32)]


def _sample(rng, dtype):
    """Q from [B, Sq, Hq, D], Kᵀ from [B, Sk, Hkv, D], V plain with two query heads per
    key head, a softcap, a mask over k with one row masked whole, the output merged
    back as [B, Sq, Hq, Dv]; Sk = 19 (a partial vector)."""
    b, hkv, sq, sk, d, dv = 2, 3, 6, 19, 5, 7
    xs = [rng.uniform(-1, 1, s).astype(dtype)
          for s in ((b, sq, 2 * hkv, d), (b, sk, hkv, d), (b, hkv, sk, dv), (b, 1, sq, sk))]
    xs[3][1, 0, 2] = -np.inf
    return xs, {"q_perm": (0, 2, 1, 3), "k_perm": (0, 2, 3, 1), "v_perm": (0, 1, 2, 3),
                "out_perm": (0, 2, 1, 3), "scale": 0.4, "group": 2, "softcap": 1.5,
                "masked_rows": "zero"}


register("attention", OpKind.OPAQUE, _infer, numpy=_numpy, sample=_sample)
"""attention: softmax(Q Kᵀ * scale [+ mask]) V in one kernel (made by FuseAttention,
pipeline/transform/attention.py, from the MatMul, Div/Mul, Add, Softmax, MatMul
chain exporters write, and by the Attention converters).

Inputs q, k, v [, mask]; each of q, k, v is read in its own memory layout
through a permutation (`q_perm`, `k_perm`, `v_perm`: logical dim t is the
operand's dim perm[t]), so the head-splitting Transposes before the products
are never materialised; the logical operands are Q [B, Hq, Sq, D],
Kᵀ [B, Hkv, D, Sk] and V [B, Hkv, Sk, Dv], Hq = Hkv * `group` (grouped-query
attention: query head h reads key head h // group). The result [B, Hq, Sq, Dv]
is written through `out_perm` (the output's dim t is logical dim out_perm[t]),
so the Transpose that merges the heads again is not materialised either. mask
broadcasts to [B, Hq, Sq, Sk] (numpy rules) and is added after the scale and the
`softcap` (if > 0: s = softcap * tanh(s / softcap)). A row whose scores are all
-inf gives NaN as Softmax does, or 0 with masked_rows="zero" (ONNX Attention).
With mask_keys="last" (FuseAttention's split KV-cache form,
pipeline/transform/attention_split.py; the runtime-length kernel only) the mask's
last axis covers only the last keys (the new ones after a cache) and the keys
before them take no mask; the other axes broadcast as before.
With appended=True (read_cache_parts in transform/attention_split.py; the runtime-length
kernel only) two more inputs k_new, v_new follow: keys and values in K's and V's
layouts (same perms) appended after K's and V's along the key axis, so a KV cache is
attended as the past and the new step's keys without the Concat that makes the
present cache (which then only the model's outputs read).
`output` other than "y" writes the scores instead (OUTPUTS above).
"""


def _rotary_infer(types, node):
    x, cos, sin = types
    if any(t.dtype != "float32" for t in types):
        raise ModelError(f"node {node.name!r} (rotary_embedding): float32 operands only")
    half = cos.shape[-1]
    want = (*x.shape[:-1], half)
    if sin.shape[-1] != half or 2 * half > x.shape[-1] or any(
            broadcast_shape(want, t.shape, where=f"node {node.name!r}") != want
            for t in (cos, sin)):
        raise ModelError(f"node {node.name!r} (rotary_embedding): cos {list(cos.shape)} and "
                         f"sin {list(sin.shape)} do not broadcast to {list(want)}")
    return [x]


def _rotary_numpy(xs, node):
    x, cos, sin = (a.astype(np.float64) for a in xs)
    half = cos.shape[-1]
    rot, rest = x[..., :2 * half], x[..., 2 * half:]
    if node.attr("interleaved"):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if node.attr("interleaved"):
        rot = np.stack([real, imag], axis=-1).reshape(rot.shape)
    else:
        rot = np.concatenate([real, imag], axis=-1)
    return [np.concatenate([rot, rest], axis=-1).astype(np.float32)]


def _rotary_sample(rng, dtype):
    """x [B, H, S, D] rotated over its first 6 of 10 features, cos and sin per (b, s)."""
    x = rng.uniform(-1, 1, (2, 3, 4, 10)).astype(dtype)
    angles = rng.uniform(0, 6, (2, 1, 4, 3))
    return [x, np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)], \
        {"interleaved": 1}


register("rotary_embedding", OpKind.OPAQUE, _rotary_infer, numpy=_rotary_numpy,
         sample=_rotary_sample)
"""rotary_embedding: x [..., D] with its first R = 2 * cos.shape[-1] features rotated
in pairs (x1, x2) -> (cos x1 - sin x2, sin x1 + cos x2), the rest copied; pairs are
(i, i + R/2), or (2i, 2i + 1) when `interleaved`. cos and sin broadcast to
x.shape[:-1] + (R/2,) (numpy rules), so one table row serves every head."""


def _linear_dims(types, node):
    """(B, T, Hq, Hkv, dk, dv) of a linear_attention node's operands."""
    (bn, t, qw), vw = types[0].shape, types[2].shape[2]
    hq, hkv = node.attr("q_heads"), node.attr("kv_heads")
    return bn, t, hq, hkv, qw // hq, vw // hkv


def _linear_infer(types, node):
    if any(t.dtype != "float32" for t in types):
        raise ModelError(f"node {node.name!r} (linear_attention): float32 operands only")
    bn, t, hq, hkv, dk, dv = _linear_dims(types, node)
    if hq % hkv or types[1].shape != (bn, t, hkv * dk) or \
            types[3].shape != (bn, hkv, dk, dv):
        raise ModelError(f"node {node.name!r} (linear_attention): query, key, value and state "
                         f"{[list(x.shape) for x in types[:4]]} do not match {hq} query and "
                         f"{hkv} key heads")
    if node.attr("output") == "state":
        return [types[3]]
    return [TensorType((bn, t, hq * dv), "float32")]


def _linear_numpy(xs, node):
    q, k, v, state = (x.astype(np.float64) for x in xs[:4])
    rest = list(xs[4:])
    decay = rest.pop(0).astype(np.float64) if node.attr("gated") else None
    beta = rest.pop(0).astype(np.float64) if node.attr("delta") else None
    bn, t, hq, hkv, dk, dv = _linear_dims([TensorType(x.shape, "float32") for x in xs[:4]],
                                          node)
    group = hq // hkv
    q4, k4, v4 = (x.reshape(bn, t, h, -1) for x, h in ((q, hq), (k, hkv), (v, hkv)))
    out = np.zeros((bn, t, hq, dv))
    state = state.copy()
    for i in range(t):
        if decay is not None:  # [B, T, Hkv] per head or [B, T, Hkv * dk] per key feature
            g = np.exp(decay[:, i].reshape(bn, hkv, -1))
            state = state * g[..., None]
        u = v4[:, i]
        if beta is not None:
            retrieved = np.einsum("bhcm,bhc->bhm", state, k4[:, i])
            u = beta[:, i].reshape(bn, -1, 1) * (u - retrieved)
        state = state + k4[:, i][..., None] * u[..., None, :]
        out[:, i] = node.attr("scale") * np.einsum(
            "bhc,bhcm->bhm", q4[:, i], np.repeat(state, group, axis=1))
    if node.attr("output") == "state":
        return [state.astype(np.float32)]
    return [out.reshape(bn, t, hq * dv).astype(np.float32)]


def _linear_sample(rng, dtype):
    """Gated delta rule, two query heads per key head, decay per key feature."""
    bn, t, hkv, dk, dv = 2, 3, 2, 4, 5
    xs = [rng.uniform(-1, 1, s).astype(dtype) for s in (
        (bn, t, 2 * hkv * dk), (bn, t, hkv * dk), (bn, t, hkv * dv), (bn, hkv, dk, dv))]
    xs += [rng.uniform(-0.5, 0, (bn, t, hkv * dk)).astype(dtype),
           rng.uniform(0, 1, (bn, t, hkv)).astype(dtype)]
    return xs, {"q_heads": 2 * hkv, "kv_heads": hkv, "scale": 0.5, "gated": 1, "delta": 1,
                "output": "y"}


register("linear_attention", OpKind.OPAQUE, _linear_infer, numpy=_linear_numpy,
         sample=_linear_sample)
"""linear_attention: ONNX LinearAttention's recurrence over time, per key head: the
state S [dk, dv] (from input `state`) decays by exp(decay) (`gated`: per head or per
key feature), takes the delta-rule correction u = beta (v - Sᵀ k) (`delta`; else
u = v), grows by k uᵀ, and each of the head's query heads reads scale * Sᵀ q.
Inputs q [B, T, Hq * dk], k [B, T, Hkv * dk], v [B, T, Hkv * dv], state
[B, Hkv, dk, dv], then decay and beta as the flags say. `output` "y" writes
[B, T, Hq * dv], "state" the final state."""
