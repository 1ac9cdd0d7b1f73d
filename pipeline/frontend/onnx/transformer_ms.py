"""The com.microsoft operators onnxruntime's transformer optimizer writes: Gelu,
BiasGelu, FastGelu, QuickGelu, SkipLayerNormalization, SkipSimplifiedLayerNormalization,
EmbedLayerNormalization, RotaryEmbedding, MultiHeadAttention and GroupQueryAttention.

Semantics are onnxruntime's (ContribOperators, the reference for the domain); each
converts to graph ops we have: the activations to gelu / swish (+ a bias add), the
normalisations to adds and layer_norm / rms_norm, RotaryEmbedding to rotary_embedding,
the two attentions to the `attention` kernel as ONNX Attention does
(pipeline/frontend/onnx/attention.py). The frontend looks these converters up as
"com.microsoft.<op>".

Static shapes set two limits on GroupQueryAttention: past and present are separate
buffers (present = past + the new keys, total_sequence_length = their length), and
every batch row has the same past length (seqlens_k masks keys beyond a row's length,
but the new keys sit after the whole past buffer).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.attention import Emitter, given
from pipeline.frontend.onnx.norm import _layer_norm
from pipeline.frontend.onnx.registry import Limit, onnx_op

MS = "com.microsoft."
_BSHD = {"q": (0, 2, 1, 3), "k": (0, 2, 3, 1), "v": (0, 2, 1, 3)}
_BHSD = {"q": (0, 1, 2, 3), "k": (0, 1, 3, 2), "v": (0, 1, 2, 3)}


# -- activations -------------------------------------------------------------------


def _biased(em: Emitter, x: str, bias: str) -> str:
    return em.op("add", (x, bias)) if bias else x


@onnx_op(MS + "Gelu", 1, emits=("gelu",))
def _gelu(ctx, n):
    em = Emitter(ctx, n)
    em.op("gelu", n.inputs[:1], n.outputs[0], approximate="none")
    return em.nodes


@onnx_op(MS + "BiasGelu", 1, emits=("add", "gelu"))
def _bias_gelu(ctx, n):
    em = Emitter(ctx, n)
    em.op("gelu", (_biased(em, n.inputs[0], n.inputs[1]),), n.outputs[0], approximate="none")
    return em.nodes


@onnx_op(MS + "FastGelu", 1, emits=("add", "gelu"))
def _fast_gelu(ctx, n):
    """0.5 x (1 + tanh(0.797885 x + 0.035677 x^3)): Gelu's tanh form."""
    em = Emitter(ctx, n)
    em.op("gelu", (_biased(em, n.inputs[0], given(n, 1)),), n.outputs[0], approximate="tanh")
    return em.nodes


@onnx_op(MS + "QuickGelu", 1, emits=("swish",))
def _quick_gelu(ctx, n):
    """x * sigmoid(alpha x) is Swish."""
    em = Emitter(ctx, n)
    em.op("swish", n.inputs[:1], n.outputs[0], alpha=float(n.attrs.get("alpha", 1.702)))
    return em.nodes


# -- normalisations ----------------------------------------------------------------


def _skip_sum(em: Emitter, n, bias_pos: int) -> str:
    """input + skip (+ bias), into the input_skip_bias_sum output if it is asked for."""
    want = (*n.outputs, "", "", "")[3] or None
    bias = given(n, bias_pos)
    total = em.op("add", n.inputs[:2], None if bias else want)
    return em.op("add", (total, bias), want) if bias else total


@onnx_op(MS + "SkipLayerNormalization", 1,
         emits=("add", "layer_norm", "reduce_mean", "sub", "mul", "sqrt", "reciprocal"))
def _skip_layer_norm(ctx, n):
    """LayerNormalization (last axis, with its mean and inv_std_var outputs) of
    input + skip + bias."""
    em = Emitter(ctx, n)
    total = _skip_sum(em, n, 4)
    inner = dataclasses.replace(n, op_type="LayerNormalization", opset=17,
                                inputs=(total, n.inputs[2], given(n, 3)),
                                outputs=tuple(n.outputs[:3]),
                                attrs={"axis": -1, "epsilon": n.attrs.get("epsilon", 1e-12)})
    ctx.types.setdefault(total, ctx.type(n.inputs[0]))  # the converter reads its rank
    return em.nodes + _layer_norm(ctx, inner)


@onnx_op(MS + "SkipSimplifiedLayerNormalization", 1, emits=("add", "rms_norm"))
def _skip_rms_norm(ctx, n):
    em = Emitter(ctx, n)
    if any((*n.outputs, "", "")[1:3]):
        raise ModelError(f"node {n.name!r} (SkipSimplifiedLayerNormalization): the mean and "
                         "inv_std_var outputs are not supported")
    total = _skip_sum(em, n, 3)
    em.op("rms_norm", (total, n.inputs[2]), n.outputs[0], axis=len(ctx.type(
        n.inputs[0]).shape) - 1, epsilon=float(n.attrs.get("epsilon", 1e-12)))
    return em.nodes


@onnx_op(MS + "EmbedLayerNormalization", 1,
         emits=("gather", "add", "layer_norm", "cast", "reduce_sum", "reshape",
                "identity"))
def _embed_layer_norm(ctx, n):
    """word[input_ids] + position[position_ids or 0..S-1] (+ segment[segment_ids]), layer
    normalised; mask_index is the number of 1s per mask row."""
    em = Emitter(ctx, n)
    ids = n.inputs[0]
    bn, s = ctx.type(ids).shape
    total = em.op("gather", (n.inputs[2], ids), axis=0)
    positions = given(n, 8) or em.const("positions", np.arange(s, dtype=np.int64))
    total = em.op("add", (total, em.op("gather", (n.inputs[3], positions), axis=0)))
    if given(n, 1) and given(n, 4):
        total = em.op("add", (total, em.op("gather", (n.inputs[4], n.inputs[1]), axis=0)))
    outs = (*n.outputs, "", "")
    if outs[2]:
        total = em.op("identity", (total,), outs[2])
    em.op("layer_norm", (total, n.inputs[5], n.inputs[6]), outs[0], axis=2,
          epsilon=float(n.attrs.get("epsilon", 1e-12)))
    if outs[1]:
        if not given(n, 7):
            em.op("reshape", (em.const("no_mask", np.zeros(bn, np.int32)),), outs[1],
                  shape=(bn,))
        else:
            count = em.op("cast", (n.inputs[7],), to="int32")
            em.op("reduce_sum", (count,), outs[1], axes=(1,), keepdims=0)
    return em.nodes


# -- rotary embedding and attention ------------------------------------------------


def positions_table(em: Emitter, table: str, positions: str, s: int, batch: int):
    """(rows, lead): the cos or sin rows [lead, S, R/2] for position_ids [B, S] (lead B)
    or for p0 + 0..S-1 given one start p0 (lead 1)."""
    if math.prod(em.ctx.type(positions).shape) == 1:
        start = em.op("reshape", (em.op("cast", (positions,), to="int64"),), shape=(1, 1))
        steps = em.const("steps", np.arange(s, dtype=np.int64).reshape(1, s))
        return em.op("gather", (em.f32(table), em.op("add", (start, steps))), axis=0), 1
    return em.op("gather", (em.f32(table), positions), axis=0), batch


def rotate(em: Emitter, x: str, rows: tuple, heads_first: bool, interleaved: int) -> str:
    """rotary_embedding of x [B, S, N, H] (or [B, N, S, H] if heads_first) by the
    (cos, sin) rows [lead, S, R/2]."""
    tables = []
    for t in rows[:2]:
        lead, s, half = rows[2], *rows[3:]
        tables.append(em.op("reshape", (t,), shape=(lead, 1, s, half) if heads_first
                            else (lead, s, 1, half)))
    return em.op("rotary_embedding", (x, *tables), interleaved=interleaved)


@onnx_op(MS + "RotaryEmbedding", 1, emits=("rotary_embedding", "reshape", "gather", "cast",
                                            "add", "identity"),
         limits=(Limit("is_packed_batching", lambda v: bool(v.attrs.get("is_packed_batching"))),))
def _ms_rotary(ctx, n):
    """input [B, S, hidden] or [B, N, S, H]; position_ids [B, S] or one start position."""
    em = Emitter(ctx, n)
    shape = ctx.type(n.inputs[0]).shape
    half = ctx.type(n.inputs[2]).shape[-1]
    s = shape[1] if len(shape) == 3 else shape[2]
    cos, lead = positions_table(em, n.inputs[2], n.inputs[1], s, shape[0])
    sin, _ = positions_table(em, n.inputs[3], n.inputs[1], s, shape[0])
    x = em.f32(n.inputs[0])
    if len(shape) == 3:
        heads = int(n.attrs.get("num_heads", 0)) or shape[2] // (2 * half)
        x = em.op("reshape", (x,), shape=(shape[0], s, heads, shape[2] // heads))
    y = rotate(em, x, (cos, sin, lead, s, half), len(shape) == 4,
               int(n.attrs.get("interleaved", 0)))
    if len(shape) == 3:
        y = em.op("reshape", (y,), shape=shape)
    em.result(y, n.outputs[0], n.inputs[0])
    return em.nodes
