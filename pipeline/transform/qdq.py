"""FuseQDQ: DequantizeLinear -> Conv / MatMul / Gemm -> QuantizeLinear as one integer kernel.

A QDQ model (onnxruntime's quantizer, QuantFormat.QDQ) computes in float between
dequantize_linear and quantize_linear nodes. This pass rewrites

    x_q -> dequantize_linear(sx, zx) --+
    w_q -> dequantize_linear(sw, 0)  --+-> conv2d / dense / matmul [+ bias]
                                           -> quantize_linear(sy, zy)

into conv2d_integer / matmul_integer(x_q, w_q, zx, 0, bias_q, multiplier, zy): uint8 or
int8 operands, int32 accumulation, then saturate(roundeven((acc + bias_q) *
multiplier) + zy) with multiplier = sx * sw / sy (per output channel when sw is)
and bias_q = rint(bias / (sx * sw)) (the quantizer's int32 bias, exactly). It
applies when the quantized weight, every scale and zero point are constants,
sx, zx, sy and zy are per tensor, the weight's zero point is 0 (symmetric, as the
quantizer writes int8 weights) and the float result feeds only the quantize_linear.

A max pool of one scale takes the max of the bytes. On a bare-metal target
(Target.bare_metal: a microcontroller, whose RAM the float input of a small CNN's
pool would dominate) a global average pool, or an average pool without padding,
between them becomes a depthwise conv2d_integer of all-one weights over the window
(multiplier sx / (sy * window size)).
Everything else stays as it was: elementwise ops between a dequantize_linear and a
quantize_linear (Add, Mul, a Relu the quantizer kept) fuse into one kernel in
FuseOps, other pools and Concat compute on the dequantized values, and unmatched
quantize/dequantize nodes stay explicit kernels. It runs before FoldConstant,
which would otherwise turn the weights' dequantize_linear into float weights.
"""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import Graph, Node, add_param
from pipeline.ops.quant import dequantize_np
from pipeline.transform.context import PassConfig
from pipeline.transform.util import prune

_ANCHORS = ("conv2d", "dense", "matmul")  # and max_pool2d, on the bytes


class _Fuser:
    def __init__(self, graph: Graph, params: dict, integer_pools: bool = False):
        self.graph, self.params = graph, dict(params)
        self.integer_pools = integer_pools  # average pools too (module doc)
        self.types = dict(graph.types)
        self.producer = {o: n for n in graph.nodes for o in n.outputs}
        self.users = graph.consumers()

    def dequantized(self, name: str, weight: bool = False):
        """(q tensor, scale array, zero point array) if `name` is a dequantize_linear
        of constant scale and zero point (and, for a weight, a constant q), else None."""
        node = self.producer.get(name)
        if node is None or node.op != "dequantize_linear":
            return None
        q, scale, zp = node.inputs
        if scale not in self.params or zp not in self.params:
            return None
        if weight and q not in self.params:
            return None
        return q, self.params[scale], self.params[zp]

    def constant(self, name: str):
        """The float value of a bias: a param, or the dequantize_linear of one."""
        if name in self.params:
            return self.params[name].astype(np.float32)
        node = self.producer.get(name)
        if node is not None and node.op == "dequantize_linear" and \
                all(i in self.params for i in node.inputs):
            return dequantize_np(*(self.params[i] for i in node.inputs))
        return None

    def max_pool(self, q_node: Node, pool: Node) -> Node | None:
        """dequantize -> max_pool2d -> quantize with one scale and zero point: the
        max of the bytes (dequantization is monotonic)."""
        x = self.dequantized(pool.inputs[0])
        _, sy, zy = q_node.inputs
        if x is None or sy not in self.params or zy not in self.params or \
                np.size(x[1]) != 1 or not np.array_equal(x[1], self.params[sy]) or \
                not np.array_equal(x[2], self.params[zy]):
            return None
        return Node(pool.op, pool.name, (x[0],), q_node.outputs, pool.attrs)

    def avg_pool(self, q_node: Node, pool: Node) -> Node | None:
        """dequantize -> global_avg_pool, or avg_pool2d without padding, -> quantize of
        an image (per-tensor scales and zero points): a depthwise conv2d_integer whose
        weights are 1 over the window, multiplier sx / (sy * window size), the pool on
        the bytes with no float copy of its input (on a microcontroller, the biggest
        tensor of a small CNN)."""
        x = self.dequantized(pool.inputs[0])
        shape = self.types[pool.inputs[0]].shape
        _, sy, zy = q_node.inputs
        if x is None or len(shape) != 4 or sy not in self.params or zy not in self.params \
                or any(np.size(v) != 1 for v in (x[1], x[2], self.params[sy],
                                                  self.params[zy])):
            return None
        c, window, strides = shape[1], tuple(shape[2:]), (1, 1)
        if pool.op == "avg_pool2d":
            if any(pool.attr("pads")) or pool.attr("ceil_mode") or \
                    any(d != 1 for d in pool.attr("dilations")):
                return None
            window, strides = tuple(pool.attr("kernel")), tuple(pool.attr("strides"))
        scale = np.float32(np.asarray(x[1]).reshape(())) / (
            np.float32(np.asarray(self.params[sy]).reshape(())) * np.float32(np.prod(window)))

        def new(hint, value):
            return add_param(self.types, self.params, f"{pool.name}.{hint}", value)

        ints = [new("weight_q", np.ones((c, 1, *window), np.int8)),
                self.producer[pool.inputs[0]].inputs[2],
                new("weight_zero_point", np.zeros((), np.int8)),
                new("bias_q", np.zeros(c, np.int32)),
                new("multiplier", np.full(1, scale, np.float32)),
                new("y_zero_point",
                    np.asarray(self.params[zy]).reshape(()).astype(q_node.attr("dtype")))]
        return Node.make("conv2d_integer", pool.name, (x[0], *ints), q_node.outputs,
                         out=q_node.attr("dtype"), strides=strides, dilations=(1, 1),
                         pads=(0, 0, 0, 0), groups=c)

    def rewrite(self, q_node: Node) -> Node | None:
        anchor = self.producer.get(q_node.inputs[0])
        alone = len(self.users.get(q_node.inputs[0], ())) == 1 and \
            q_node.inputs[0] not in self.graph.outputs
        if anchor is not None and anchor.op in ("global_avg_pool", "avg_pool2d") and \
                alone and self.integer_pools:
            return self.avg_pool(q_node, anchor)
        if anchor is not None and anchor.op == "max_pool2d" and \
                len(self.users[q_node.inputs[0]]) == 1 and \
                q_node.inputs[0] not in self.graph.outputs:
            return self.max_pool(q_node, anchor)
        if anchor is None or anchor.op not in _ANCHORS or \
                len(self.users[q_node.inputs[0]]) != 1 or q_node.inputs[0] in self.graph.outputs:
            return None
        _, sy_name, zy_name = q_node.inputs
        if sy_name not in self.params or zy_name not in self.params:
            return None
        sy, zy = self.params[sy_name], self.params[zy_name]
        x = self.dequantized(anchor.inputs[0])
        w = self.dequantized(anchor.inputs[1], weight=True)
        if x is None or w is None or np.size(x[1]) != 1 or np.size(x[2]) != 1 \
                or np.size(sy) != 1 or np.size(zy) != 1 or np.any(w[2] != 0):
            return None
        if anchor.op == "matmul" and (anchor.attr("trans_a") or anchor.attr("trans_b")
                                      or len(self.types[anchor.inputs[1]].shape) != 2):
            return None
        xq, sx, zx = x
        wq = self.params[w[0]]
        channels = wq.shape[0] if anchor.op in ("conv2d", "dense") else wq.shape[-1]
        sw = np.asarray(w[1], np.float32).reshape(-1)
        if sw.size not in (1, channels) or (sw.size > 1 and anchor.op == "matmul"
                                           and w[1].shape[-1] != channels):
            return None
        bias = None
        if len(anchor.inputs) > 2:
            bias = self.constant(anchor.inputs[2])
            if bias is None or bias.size not in (1, channels):
                return None
        ints = self._params(anchor, q_node, wq, sx, sw, sy, zy, bias, channels)
        attrs = {"out": q_node.attr("dtype")}
        if anchor.op == "conv2d":
            op = "conv2d_integer"
            attrs.update({k: anchor.attr(k) for k in ("strides", "dilations", "pads",
                                                      "groups")})
        else:
            op = "matmul_integer"
        zx_name = self.producer[anchor.inputs[0]].inputs[2]
        return Node.make(op, anchor.name, (xq, ints[0], zx_name, *ints[1:]), q_node.outputs,
                         **attrs)

    def _params(self, anchor, q_node, wq, sx, sw, sy, zy, bias, channels) -> list[str]:
        """Names of the new params: weight (as the kernel reads it), weight zero point,
        int32 bias, multiplier, output zero point."""
        if anchor.op == "dense":  # [N, K] -> [K, N]
            wq = np.ascontiguousarray(wq.T)
        sx = np.float32(np.asarray(sx).reshape(()))
        acc_scale = (sx * sw).astype(np.float32)
        bias_q = np.zeros(channels, np.int32) if bias is None else \
            np.rint(np.broadcast_to(bias.reshape(-1), (channels,)) / acc_scale).astype(np.int32)
        mult = (acc_scale / np.float32(np.asarray(sy).reshape(()))).astype(np.float32)

        def new(hint, value):
            return add_param(self.types, self.params, f"{anchor.name}.{hint}", value)

        return [new("weight_q", wq), new("weight_zero_point", np.zeros((), wq.dtype)),
                new("bias_q", bias_q), new("multiplier", mult),
                new("y_zero_point", np.asarray(zy).reshape(()).astype(q_node.attr("dtype")))]

    def run(self) -> tuple[Graph, dict]:
        replaced: dict[str, Node] = {}  # quantize_linear name -> the integer node
        dropped: set[str] = set()       # the float anchors it replaces
        for node in self.graph.nodes:
            if node.op == "quantize_linear":
                fused = self.rewrite(node)
                if fused is not None:
                    replaced[node.name] = fused
                    dropped.add(self.producer[node.inputs[0]].name)
        if not replaced:
            return self.graph, self.params
        nodes = [replaced.get(n.name, n) for n in self.graph.nodes if n.name not in dropped]
        graph = self.graph.replace(nodes=tuple(nodes), types=self.types)
        return _dead_code(*prune(graph, self.params))


def _dead_code(graph: Graph, params: dict) -> tuple[Graph, dict]:
    """Drop nodes whose outputs nothing uses (the weights' dequantize_linear)."""
    needed, kept = set(graph.outputs), []
    for node in reversed(graph.nodes):
        if needed & set(node.outputs):
            kept.append(node)
            needed.update(node.inputs)
    return prune(graph.replace(nodes=tuple(kept[::-1])), params)


def fuse_qdq(graph: Graph, params: dict, cfg: PassConfig, target=None):
    """The FuseQDQ pass (see the module docstring): (graph, params) -> (graph, params);
    target: the codegen Target (its bare_metal decides the average pools)."""
    return _Fuser(graph, params, target is not None and target.bare_metal).run()
