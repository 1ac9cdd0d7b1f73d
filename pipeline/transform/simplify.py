"""Inference simplification: drop no-op nodes, turn BatchNormalization into a
per-channel scale and shift, and fold that scale and shift into the preceding
convolution (TVM: SimplifyInference + FoldScaleAxis)."""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import Graph, Node, add_param, fresh_name
from pipeline.transform.context import PassConfig
from pipeline.transform.util import prune, rename_inputs, sole_user


def simplify_inference(graph: Graph, params: dict, cfg: PassConfig):
    """Remove identity nodes (Identity, Dropout, a Cast to the dtype it has: LLaMA's
    RMSNorm casts float32 to float32 around its statistics) and rewrite batch_norm with
    constant statistics as mul(x, scale) -> add(., shift) with constant [C, 1, 1]
    scale and shift."""
    types, params = dict(graph.types), dict(params)
    outputs = set(graph.outputs)
    alias: dict[str, str] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        node = rename_inputs(node, alias)
        no_op = node.op == "identity" or node.op == "cast" and \
            types[node.inputs[0]].dtype == types[node.outputs[0]].dtype
        if no_op and node.outputs[0] not in outputs:
            alias[node.outputs[0]] = node.inputs[0]
            continue
        # With runtime statistics batch_norm stays, lowered as it is (ops/norm.py).
        if node.op == "batch_norm" and all(i in params for i in node.inputs[1:]):
            nodes.extend(_batch_norm_as_scale_shift(node, types, params))
            continue
        nodes.append(node)
    return prune(graph.replace(nodes=tuple(nodes), types=types), params)


def _batch_norm_as_scale_shift(node: Node, types: dict, params: dict) -> list[Node]:
    x, gamma, beta, mean, var = node.inputs
    gamma, beta, mean, var = (params[name].astype(np.float64)
                              for name in (gamma, beta, mean, var))
    scale = gamma / np.sqrt(var + node.attr("epsilon"))
    shift = beta - mean * scale
    rank = len(types[x].shape)
    per_channel = (-1,) + (1,) * (rank - 2)
    dtype = types[x].dtype  # computed in float64, stored in the input's float type
    scale_name = add_param(types, params, f"{node.name}.scale",
                           scale.astype(dtype).reshape(per_channel))
    shift_name = add_param(types, params, f"{node.name}.shift",
                           shift.astype(dtype).reshape(per_channel))
    mid = fresh_name(f"{node.outputs[0]}.scaled", types)
    types[mid] = types[node.outputs[0]]
    return [Node.make("mul", f"{node.name}.scale", (x, scale_name), (mid,)),
            Node.make("add", f"{node.name}.shift", (mid, shift_name), node.outputs)]


_FOLDABLE = ("conv2d", "conv1d", "conv3d", "conv_transpose2d", "conv_transpose1d",
             "conv_transpose3d")


def fold_batch_norm(graph: Graph, params: dict, cfg: PassConfig):
    """conv -> mul(per-channel constant) [-> add(per-channel constant)] becomes one
    conv with scaled weights and a bias, when the conv output has no other use
    (conv2d, conv1d and the transposed convolutions)."""
    types, params = dict(graph.types), dict(params)
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    removed: set[int] = set()
    nodes = list(graph.nodes)
    for k, conv in enumerate(nodes):
        # Only constant weights and bias fold (a bias computed at run time stays).
        if conv.op not in _FOLDABLE or any(i and i not in params for i in conv.inputs[1:]):
            continue
        out_shape = types[conv.outputs[0]].shape
        oc = out_shape[1]
        chain = _scale_shift_chain(conv, consumers, params, outputs, oc, len(out_shape))
        if chain is None:
            continue
        mul, add = chain
        scale = params[_other(mul, conv.outputs[0])].reshape(-1).astype(np.float64)
        weight = _scaled_weight(conv, params[conv.inputs[1]].astype(np.float64), scale)
        bias = (params[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2
                else np.zeros(oc)) * scale
        last = mul
        if add is not None:
            bias = bias + params[_other(add, mul.outputs[0])].reshape(-1)
            last = add
        dtype = params[conv.inputs[1]].dtype  # the conv's own float type
        w_name = add_param(types, params, f"{conv.name}.weight_folded", weight.astype(dtype))
        b_name = add_param(types, params, f"{conv.name}.bias_folded", bias.astype(dtype))
        nodes[k] = Node(conv.op, conv.name, (conv.inputs[0], w_name, b_name),
                        last.outputs, conv.attrs)
        removed |= {id(mul), id(add)}
    kept = tuple(n for n in nodes if id(n) not in removed)
    return prune(graph.replace(nodes=kept, types=types), params)


def _other(node: Node, name: str) -> str:
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _scaled_weight(conv: Node, w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """`w` with every weight of output channel k multiplied by scale[k]. A conv
    weight is [OC, C/g, k...]; a transposed one is [C, OC/g, k...], whose output
    channel is (group of the input channel) * OC/g + second index."""
    if conv.op.startswith("conv_transpose"):
        groups, (c, ocg) = conv.attr("groups"), w.shape[:2]
        return (w.reshape(groups, c // groups, ocg, -1)
                * scale.reshape(groups, 1, ocg, 1)).reshape(w.shape)
    return w * scale.reshape((-1,) + (1,) * (w.ndim - 1))


def _per_channel(params: dict, name: str, oc: int, rank: int) -> bool:
    v = params.get(name)
    # [C,1,1,1] has C elements too, but broadcasts [1,C,H,W] to [C,C,H,W]
    ones = (1,) * (rank - 2)
    return v is not None and v.shape in ((oc, *ones), (1, oc, *ones))


def _scale_shift_chain(conv: Node, consumers, params, outputs, oc, rank):
    """The (mul, add-or-None) following `conv`, or None if the pattern is absent."""
    mul = sole_user(consumers, outputs, conv.outputs[0])
    if mul is None or mul.op != "mul" or not _per_channel(
            params, _other(mul, conv.outputs[0]), oc, rank):
        return None
    add = sole_user(consumers, outputs, mul.outputs[0])
    if add is None or add.op != "add" or not _per_channel(
            params, _other(add, mul.outputs[0]), oc, rank):
        add = None
    return mul, add
