"""The conv operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/conv.py
Their ONNX converters: pipeline/frontend/onnx/conv.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import GraphError, ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import causal_parts
from pipeline.ops.registry import OpKind, register
from pipeline.ops.windows import infer_1d, window_out


def _conv_infer(types, node):
    """(N, C, spatial...) with weights (OC, C/groups, kernel...) -> (N, OC, outputs...)."""
    x, w = types[0], types[1]
    n, c, *spatial = x.shape
    oc, icg, *kernel = w.shape
    strides, dilations, pads = node.attr("strides"), node.attr("dilations"), node.attr("pads")
    groups, d = node.attr("groups"), len(spatial)
    if c != icg * groups or oc % groups:
        raise ModelError(f"node {node.name!r} ({node.op}): {c} input channels do not match "
                         f"weights {list(w.shape)} with groups={groups}")
    try:
        out = [window_out(size, k, s, pads[i], pads[d + i], dl) for i, (size, k, s, dl)
               in enumerate(zip(spatial, kernel, strides, dilations, strict=True))]
    except GraphError as err:  # a symbolic size this window cannot take
        raise GraphError(f"node {node.name!r} ({node.op}): {err}") from None
    if min((o for o in out if isinstance(o, int)), default=1) < 1:
        raise ModelError(f"node {node.name!r} ({node.op}): kernel {kernel} does not fit "
                         f"the padded input {list(x.shape)}")
    return [TensorType((n, oc, *out), x.dtype)]


register("conv2d", OpKind.ANCHOR, _conv_infer)

register("conv3d", OpKind.ANCHOR, _conv_infer)


_conv1d_infer = infer_1d(_conv_infer)


register("conv1d", OpKind.ANCHOR, _conv1d_infer)


def _causal_conv_infer(types, node):
    """x [B, C, L], weight [C, 1, k], bias [C], past state [B, C, k - 1] -> [B, C, L]."""
    x, w, bias, past = causal_parts(types, node)
    if len(x.shape) != 3 or w.shape[:2] != (x.shape[1], 1) or len(w.shape) != 3 or \
            (bias is not None and bias.shape != x.shape[1:2]) or \
            (past is not None and past.shape != (*x.shape[:2], w.shape[2] - 1)):
        raise ModelError(f"node {node.name!r} ({node.op}): input {list(x.shape)}, weight "
                         f"{list(w.shape)}, bias, past state do not make a causal depthwise "
                         "conv (x [B, C, L], weight [C, 1, k], bias [C], past [B, C, k - 1])")
    return [x]


def _padded(x, past, state: int):
    """The past state (zeros without one) then x along the last axis."""
    if past is None:
        past = np.zeros((*x.shape[:2], state), x.dtype)
    return np.concatenate([past, x], axis=2)


def _causal_conv_np(xs, node):
    x, w, bias, past = causal_parts(xs, node)
    k, length = w.shape[2], x.shape[2]
    padded = _padded(x, past, k - 1).astype(np.float64)
    out = sum(w[None, :, 0, j, None] * padded[:, :, j:j + length] for j in range(k))
    if bias is not None:
        out = out + bias[None, :, None]
    return [out.astype(x.dtype)]


def _causal_conv_sample(rng, dtype):
    x, w, b, past = (rng.uniform(-1, 1, s).astype(dtype)
                     for s in ((2, 3, 5), (3, 1, 4), (3,), (2, 3, 3)))
    return [x, w, b, past], {"bias": 1, "past": 1}


register("causal_conv", OpKind.ANCHOR, _causal_conv_infer, numpy=_causal_conv_np,
         sample=_causal_conv_sample)
"""causal_conv: ONNX CausalConvWithState's output. A depthwise 1-D conv over the past
state (zeros without one) followed by x, no padding: out[b, c, t] = bias[c] +
sum_j weight[c, 0, j] * padded[b, c, t + j]. Attrs bias, past (0/1) say which
optional inputs follow x and weight."""


def _causal_state_infer(types, node):
    x, _, _, past = causal_parts(types, node)
    state = node.attr("state")
    if len(x.shape) != 3 or (past is not None and past.shape != (*x.shape[:2], state)):
        raise ModelError(f"node {node.name!r} ({node.op}): input {list(x.shape)} and past "
                         f"state must be [B, C, L] and [B, C, {state}]")
    return [TensorType((*x.shape[:2], state), x.dtype)]


def _causal_state_np(xs, node):
    x, _, _, past = causal_parts(xs, node)
    padded = _padded(x, past, node.attr("state"))
    return [padded[:, :, padded.shape[2] - node.attr("state"):]]


register("causal_conv_state", OpKind.OPAQUE, _causal_state_infer, numpy=_causal_state_np,
         sample=lambda rng, dtype: ([rng.uniform(-1, 1, (2, 3, 2)).astype(dtype),
                                     rng.uniform(-1, 1, (2, 3, 3)).astype(dtype)],
                                    {"past": 1, "state": 3}))
"""causal_conv_state: ONNX CausalConvWithState's present_state, the last `state`
(k - 1) positions of the past state (zeros without one, attr past 0) followed by x."""
