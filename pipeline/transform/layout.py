"""AlterOpLayout: move convolutions and what follows them to channel-blocked layouts.

With b the target's vector width (16 floats on AVX-512, 8 on AVX2):
  - conv2d (groups 1, no dilation, constant float weights, OC a multiple of b, C a
    multiple of b or at most b) becomes conv2d_nchwc on NCHW{ib}c input with
    ib = b (or ib = C for a narrow first layer) and NCHW{b}c output; its weights
    are repacked here as a new param (ops/conv_blocked.py pack_weight), so a
    weight change still changes only params, never a kernel; a 3x3 stride-1 one
    where Winograd is faster (ops/conv_winograd.py worth_it; pass option
    AlterOpLayout.winograd) becomes conv2d_winograd_nchwc, its weights transformed
    here; a depthwise conv2d
    (groups = channels = filters, a multiple of b) becomes depthwise_conv2d_nchwc;
  - elementwise ops whose activation inputs all have the output's 4-D shape and
    one of which is blocked run blocked too; their constant operands (bias,
    per-channel scale) are repacked to broadcast in the blocked layout;
  - max/avg pools and global average pooling of a blocked tensor use their blocked
    variants (ops/pool_blocked.py);
  - dense with a constant weight uses the packed-weight kernel (ops/dense_packed.py);
  - every other consumer, and every graph output, sees the plain NCHW tensor:
    a layout_transform is inserted (once per tensor) where layouts meet.
Blocked tensors are named `<plain name>.nchw<b>c`; plain names keep their meaning.
"""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import Graph, Node, add_param, fresh_name
from pipeline.ir.target import Target
from pipeline.ops import conv_winograd, get, infer_types
from pipeline.ops.conv_blocked import pack_weight, tiling
from pipeline.ops.dense_packed import pack_dense_weight
from pipeline.ops.depthwise_blocked import pack_depthwise_weight
from pipeline.ops.layout import layout_name, to_blocked
from pipeline.transform.context import PassConfig
from pipeline.transform.util import prune

_POOLS = {"max_pool2d": "max_pool2d_nchwc", "avg_pool2d": "avg_pool2d_nchwc",
          "global_avg_pool": "global_avg_pool_nchwc", "global_max_pool": "global_max_pool_nchwc"}


class _Rewriter:
    """Rebuilds the node list, tracking which layouts of each tensor exist."""

    def __init__(self, graph: Graph, params: dict, vw: int, winograd: bool = False):
        self.graph, self.vw, self.winograd = graph, vw, winograd
        self.types, self.params = dict(graph.types), dict(params)
        self.nodes: list[Node] = []
        self.plain = {*graph.inputs, *graph.params}       # plain tensors defined so far
        self.blocked: dict[tuple[str, int], str] = {}    # (plain name, block) -> name
        self.packed: dict[tuple, str] = {}               # repacked params, shared

    def emit(self, node: Node) -> None:
        outs = infer_types(node, [self.types[i] for i in node.inputs])
        self.types.update(zip(node.outputs, outs, strict=True))
        self.nodes.append(node)

    def need_plain(self, name: str) -> str:
        if name not in self.plain:
            src = next(v for (k, _), v in self.blocked.items() if k == name)
            block = self.types[src].shape[-1]
            self.emit(Node.make("layout_transform", f"{name}.to_nchw", (src,), (name,),
                                src_layout=layout_name(block), dst_layout="NCHW"))
            self.plain.add(name)
        return name

    def need_blocked(self, name: str, block: int) -> str:
        if (name, block) not in self.blocked:
            out = fresh_name(f"{name}.nchw{block}c", self.types)
            self.emit(Node.make("layout_transform", f"{name}.to_nchw{block}c",
                                (self.need_plain(name),), (out,), src_layout="NCHW",
                                dst_layout=layout_name(block)))
            self.blocked[(name, block)] = out
        return self.blocked[(name, block)]

    def has_blocked(self, name: str) -> bool:
        return (name, self.vw) in self.blocked

    def param(self, key: tuple, hint: str, make) -> str:
        if key not in self.packed:
            self.packed[key] = add_param(self.types, self.params, hint, make())
        return self.packed[key]

    def blocked_output(self, node: Node, op: str, inputs: list[str], **extra) -> None:
        out = node.outputs[0]
        name = fresh_name(f"{out}.nchw{self.vw}c", self.types)
        attrs = dict(node.attrs) | extra
        self.emit(Node.make(op, node.name, inputs, (name,), **attrs))
        self.blocked[(out, self.vw)] = name

    def keep(self, node: Node) -> None:
        self.emit(Node(node.op, node.name, tuple(self.need_plain(i) for i in node.inputs),
                       node.outputs, node.attrs))
        self.plain.update(node.outputs)

    # -- per operator --

    def conv(self, node: Node) -> bool:
        x, w = node.inputs[0], node.inputs[1]
        weight = self.params.get(w)
        if (weight is None or weight.dtype != np.float32 or weight.ndim != 4
                or tuple(node.attr("dilations")) != (1, 1)):
            return False
        if node.attr("groups") != 1:
            return self.depthwise(node, weight)
        oc, c = weight.shape[:2]
        ib = self.vw if c % self.vw == 0 else c if c <= self.vw else 0
        if oc % self.vw or not ib:
            return False
        oh, ow = self.types[node.outputs[0]].shape[2:]
        if self.winograd and conv_winograd.worth_it(node, weight, oh, ow, self.vw):
            return self.conv_winograd(node, weight, oh, ow)
        k = tiling(oh, ow, oc // self.vw, self.vw)[0]
        packed = self.param(("conv", w, ib, k), f"{w}.packed",
                            lambda: pack_weight(weight, ib, self.vw, k))
        inputs = [self.need_blocked(x, ib), packed, *node.inputs[2:]]
        self.blocked_output(node, "conv2d_nchwc", inputs, oc_block=self.vw)
        return True

    def conv_winograd(self, node: Node, weight: np.ndarray, oh: int, ow: int) -> bool:
        """A 3x3 stride-1 conv2d as conv2d_winograd_nchwc (ops/conv_winograd.py)."""
        oc, c = weight.shape[:2]
        m = conv_winograd.TILE
        k = conv_winograd.plan(oh, ow, c, oc, m, self.vw)[0]
        w = node.inputs[1]
        packed = self.param(("winograd", w, m, k), f"{w}.winograd",
                            lambda: conv_winograd.pack_weight(weight, m, self.vw, k))
        inputs = [self.need_blocked(node.inputs[0], self.vw), packed, *node.inputs[2:]]
        attrs = {"pads": node.attr("pads"), "winograd_m": m, "oc_block": self.vw}
        out = node.outputs[0]
        name = fresh_name(f"{out}.nchw{self.vw}c", self.types)
        self.emit(Node.make("conv2d_winograd_nchwc", node.name, inputs, (name,), **attrs))
        self.blocked[(out, self.vw)] = name
        return True

    def depthwise(self, node: Node, weight: np.ndarray) -> bool:
        """groups == channels == filters: one filter per channel, blocked likewise."""
        oc, icg = weight.shape[:2]
        if node.attr("groups") != oc or icg != 1 or oc % self.vw:
            return False
        w = node.inputs[1]
        packed = self.param(("depthwise", w, self.vw), f"{w}.packed",
                            lambda: pack_depthwise_weight(weight, self.vw))
        inputs = [self.need_blocked(node.inputs[0], self.vw), packed, *node.inputs[2:]]
        attrs = {k: v for k, v in node.attrs if k in ("strides", "pads")}
        out = node.outputs[0]
        self.emit(Node.make("depthwise_conv2d_nchwc", node.name, inputs,
                            (f"{out}.nchw{self.vw}c",), **attrs))
        self.blocked[(out, self.vw)] = f"{out}.nchw{self.vw}c"
        return True

    def elementwise(self, node: Node) -> bool:
        out_type = self.types[node.outputs[0]]
        acts = [i for i in node.inputs if i not in self.params]
        if (len(out_type.shape) != 4 or out_type.dtype != "float32"
                or out_type.shape[1] % self.vw
                or not any(self.has_blocked(i) for i in acts)
                or any(self.types[i] != out_type for i in acts)
                or any(self.params[i].ndim > 4 for i in node.inputs if i in self.params)):
            return False
        inputs = [self.param(("bcast", i, self.vw), f"{i}.nchw{self.vw}c",
                             lambda i=i: to_blocked(self.params[i], self.vw))
                  if i in self.params else self.need_blocked(i, self.vw)
                  for i in node.inputs]
        self.blocked_output(node, node.op, inputs)
        return True

    def pool(self, node: Node) -> bool:
        if not self.has_blocked(node.inputs[0]):
            return False
        self.blocked_output(node, _POOLS[node.op], [self.blocked[(node.inputs[0], self.vw)]])
        return True

    def dense(self, node: Node) -> bool:
        weight = self.params.get(node.inputs[1])
        if (weight is None or weight.dtype != np.float32 or weight.ndim != 2
                or any(self.types[i].shape != weight.shape[:1] for i in node.inputs[2:])):
            return False  # the packed kernel takes a bias of shape [N] only
        w = node.inputs[1]
        packed = self.param(("dense", w, self.vw), f"{w}.packed",
                            lambda: pack_dense_weight(weight, self.vw))
        inputs = [self.need_plain(node.inputs[0]), packed, *map(self.need_plain,
                                                                node.inputs[2:])]
        self.emit(Node.make("dense_packed", node.name, inputs, node.outputs,
                            **dict(node.attrs), units=weight.shape[0]))
        self.plain.update(node.outputs)
        return True

    def run(self) -> tuple[Graph, dict]:
        for node in self.graph.nodes:
            if node.op == "conv2d":
                done = self.conv(node)
            elif node.op in _POOLS:
                done = self.pool(node)
            elif node.op == "dense":
                done = self.dense(node)
            elif node.op != "fused" and get(node.op).kind == "elementwise":
                done = self.elementwise(node)
            else:
                done = False
            if not done:
                self.keep(node)
        for name in self.graph.outputs:
            self.need_plain(name)
        graph = self.graph.replace(nodes=tuple(self.nodes), types=self.types)
        return prune(graph, self.params)


def alter_op_layout(graph: Graph, params: dict, cfg: PassConfig, target: Target | None = None):
    """Rewrite `graph` to blocked layouts for `target` (see the module docstring);
    without a target (graph-only optimisation) the graph is returned unchanged."""
    if target is None or target.vector_width < 8:
        return graph, params
    winograd = cfg.option("AlterOpLayout.winograd")
    return _Rewriter(graph, params, target.vector_width, winograd).run()
