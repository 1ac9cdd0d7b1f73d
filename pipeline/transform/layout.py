"""AlterOpLayout: move convolutions and what follows them to channel-blocked layouts.

(Targets narrower than 8 floats keep plain layouts, except for the int8 convolutions of
an AArch64 target with +dotprod, which run blocked on sdot, and of an Arm M-profile core
with the DSP extension or MVE, on smlad or mve; see qconv below.)

With b the target's vector width (16 floats on AVX-512, 8 on AVX2):
  - conv2d (groups 1, no dilation, constant float weights, C a multiple of b, at
    most b, or of a block between b/2 and b; OC padded with zero filters to a
    multiple of b) becomes conv2d_nchwc on NCHW{ib}c input with ib = b (or ib = C
    for a narrow first layer, or that block) and NCHW{b}c output; its weights
    are repacked here as a new param (ops/conv_blocked.py pack_weight), so a
    weight change still changes only params, never a kernel; a 3x3 stride-1 one
    where Winograd is faster (kernels/conv_winograd.py worth_it; pass option
    AlterOpLayout.winograd) becomes conv2d_winograd_nchwc, its weights transformed
    here; a depthwise conv2d
    (groups = channels = filters, more than b: padded to whole blocks of b) becomes
    depthwise_conv2d_nchwc; another grouped conv2d whose groups' channels and filters
    are multiples of b becomes conv2d_nchwc with attr groups;
    a 1x1 stride-1 unpadded conv that does not block (other groups, channel counts
    not a multiple of b) becomes conv2d_pointwise on the plain tensors;
  - elementwise ops whose activation inputs all have the output's 4-D shape and
    one of which is blocked run blocked too; their constant operands (bias,
    per-channel scale) are repacked to broadcast in the blocked layout;
  - a concat along channels of blocked tensors concatenates the blocked tensors;
  - max/avg pools and global average pooling of a blocked tensor use their blocked
    variants (ops/pool_blocked.py);
  - dense with a constant weight uses the packed-weight kernel (ops/dense_packed.py);
  - matmul_nbits with constant 4-bit weights takes them in the cols16(x4) layout (ops/nbits.py);
  - every other consumer, and every graph output, sees the plain NCHW tensor:
    a layout_transform is inserted (once per tensor) where layouts meet;
  - last, on a vnni/sdot target, an int8 conv whose only reader is the next conv's
    qpad_nchwc writes that padded layout itself (transform/padded_outputs.py).
Blocked tensors are named `<plain name>.nchw<b>c`; plain names keep their meaning.
"""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import Graph, Node, add_param, fresh_name
from pipeline.ir.target import Target
from pipeline.kernels import conv_winograd
from pipeline.kernels.conv_blocked import pack_weight, tiling
from pipeline.kernels.dense_packed import pack_dense_weight
from pipeline.kernels.depthwise_blocked import pack_depthwise_weight
from pipeline.kernels.layout import layout_name, to_blocked
from pipeline.kernels.qconv_blocked import (
    corrected_bias,
    dot_kind,
    input_block,
    offset_of,
    pack_qdepthwise,
    pack_qweight,
    tile,
)
from pipeline.kernels.qdense_packed import pack_qdense
from pipeline.ops import OpKind, get, infer_types
from pipeline.ops.geometry import QTYPES
from pipeline.ops.nbits import RUNS, nbits_layout, to_cols16
from pipeline.transform.context import PassConfig
from pipeline.transform.layout_arrays import (
    columns_as_channels,
    pad_channels,
    pad_columns,
    pad_filters,
)
from pipeline.transform.padded_outputs import write_padded_outputs
from pipeline.transform.util import prune

# The float types the blocked kernels take (float16 loads and stores convert: dsl/builder.py).
_FLOATS = ("float32", "float16")
_POOLS = {"max_pool2d": "max_pool2d_nchwc", "avg_pool2d": "avg_pool2d_nchwc",
          "global_avg_pool": "global_avg_pool_nchwc", "global_max_pool": "global_max_pool_nchwc"}


class _Rewriter:
    """Rebuilds the node list, tracking which layouts of each tensor exist."""

    def __init__(self, graph: Graph, params: dict, vw: int, dot: str = "portable",
                 int8_only: bool = False, winograd: bool = False):
        self.graph, self.vw, self.dot, self.int8_only = graph, vw, dot, int8_only
        self.winograd = winograd
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
            _, cb, _, _, block = self.types[src].shape
            channels = self.types[name].shape[1]
            crop = {"channels": channels} if channels != cb * block else {}
            self.emit(Node.make("layout_transform", f"{name}.to_nchw", (src,), (name,),
                                src_layout=layout_name(block), dst_layout="NCHW", **crop))
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

    def padded(self, name: str) -> bool:
        """Whether the blocked `name` carries padding channels (padded filters)."""
        return self.types[name].shape[1] % self.vw != 0

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
        x, w, weight = node.inputs[0], node.inputs[1], self.params.get(node.inputs[1])
        if (weight is None or weight.dtype not in _FLOATS or weight.ndim != 4
                or tuple(node.attr("dilations")) != (1, 1)):
            return False
        if node.attr("groups") != 1:
            return (self.depthwise(node, weight) or self.pointwise(node, weight)
                    or self.grouped(node, weight))
        oc, c = weight.shape[:2]
        ib = _input_block(c, self.vw)
        if not ib:
            return self.pointwise(node, weight)
        # Filters not a multiple of b: padded with zero filters (their channels are
        # dropped where the tensor goes plain; blocked consumers need whole blocks, so
        # none takes it), unless the input is plain and a 1x1 conv can run plain.
        if oc % self.vw and (oc < self.vw or node.inputs[2:] and node.inputs[2] not in
                             self.params or not self.has_blocked(x) and weight.shape[2:] == (1, 1)):
            return self.pointwise(node, weight)
        pad = -oc % self.vw
        oh, ow = self.types[node.outputs[0]].shape[2:]
        if self.winograd and conv_winograd.worth_it(node, weight, oh, ow, self.vw):
            return self.conv_winograd(node, weight, oh, ow)
        k = tiling(oh, ow, (oc + pad) // self.vw, self.vw)[0]
        packed = self.param(("conv", w, ib, k), f"{w}.packed",
                            lambda: pack_weight(pad_filters(weight, pad), ib, self.vw, k))
        bias = [self.param(("pad", b, pad), f"{b}.padded",
                           lambda b=b: pad_filters(self.params[b], pad)) if pad else b
                for b in node.inputs[2:]]
        self.blocked_output(node, "conv2d_nchwc", [self.need_blocked(x, ib), packed, *bias],
                            oc_block=self.vw)
        return True

    def conv_winograd(self, node: Node, weight: np.ndarray, oh: int, ow: int) -> bool:
        """A 3x3 stride-1 conv2d as conv2d_winograd_nchwc (kernels/conv_winograd.py)."""
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
        """groups == channels == filters: one filter per channel, blocked likewise.
        Channels no multiple of b (more than b of them) are padded to whole blocks:
        zero channels in (layout_transform), zero filters and bias, cropped where the
        tensor goes plain (shufflenet's 136-channel ones ran the plain conv2d)."""
        oc, icg = weight.shape[:2]
        if node.attr("groups") != oc or icg != 1 or oc < self.vw:
            return False
        pad = -oc % self.vw
        w = node.inputs[1]
        packed = self.param(("depthwise", w, self.vw), f"{w}.packed",
                            lambda: pack_depthwise_weight(pad_filters(weight, pad), self.vw))
        bias = [self.param(("pad", b, pad), f"{b}.padded",
                           lambda b=b: pad_filters(self.params[b], pad)) if pad else b
                for b in node.inputs[2:]]
        inputs = [self.need_blocked(node.inputs[0], self.vw), packed, *bias]
        attrs = {k: v for k, v in node.attrs if k in ("strides", "pads")}
        out = node.outputs[0]
        self.emit(Node.make("depthwise_conv2d_nchwc", node.name, inputs,
                            (f"{out}.nchw{self.vw}c",), **attrs))
        self.blocked[(out, self.vw)] = f"{out}.nchw{self.vw}c"
        return True

    def grouped(self, node: Node, weight: np.ndarray) -> bool:
        """A grouped conv2d whose groups' channels and filters are whole blocks of b
        (alexnet's two-group 5x5 and 3x3 convs): conv2d_nchwc with attr groups, each
        channel tile inside one group (the plain conv2d ran them at half the speed)."""
        oc, c = weight.shape[:2]
        groups = node.attr("groups")
        if c % self.vw or oc % groups or (oc // groups) % self.vw:
            return False
        oh, ow = self.types[node.outputs[0]].shape[2:]
        k = tiling(oh, ow, oc // groups // self.vw, self.vw)[0]
        w = node.inputs[1]
        packed = self.param(("conv", w, self.vw, k), f"{w}.packed",
                            lambda: pack_weight(weight, self.vw, self.vw, k))
        inputs = [self.need_blocked(node.inputs[0], self.vw), packed, *node.inputs[2:]]
        self.blocked_output(node, "conv2d_nchwc", inputs, oc_block=self.vw)
        return True

    def pointwise(self, node: Node, weight: np.ndarray) -> bool:
        """A 1x1, stride-1, unpadded conv that does not block: conv2d_pointwise on
        the plain tensors (any groups and channel counts)."""
        if (weight.shape[2:] != (1, 1) or tuple(node.attr("strides")) != (1, 1)
                or any(node.attr("pads"))):
            return False
        inputs = tuple(self.need_plain(i) for i in node.inputs)
        self.emit(Node.make("conv2d_pointwise", node.name, inputs, node.outputs,
                            groups=node.attr("groups"), lanes=self.vw))
        self.plain.update(node.outputs)
        return True

    def qconv(self, node: Node) -> bool:
        """A requantizing conv2d_integer with constant symmetric weights ->
        qpad_nchwc + qconv2d_nchwc (ops/qconv_blocked.py) with the target's dot product."""
        if len(node.inputs) != 7 or node.attr("out") not in QTYPES \
                or not all(i in self.params for i in node.inputs[1:]) \
                or tuple(node.attr("dilations")) != (1, 1):
            return False
        x, w_name, xzp, wzp, bias, mult, yzp = node.inputs
        weight = self.params[w_name]
        oc, c = weight.shape[:2]
        depthwise = node.attr("groups") == oc == self.types[x].shape[1] and c == 1
        # Output channels per vector: the target's width, or half of it for a layer
        # whose channels are no multiple of it (24 in MobileNetV2), which then hands
        # its consumers a plain tensor.
        ob = self.vw if oc % self.vw == 0 else self.vw // 2
        if oc % ob or ob < 4 or (depthwise and ob != self.vw) \
                or np.any(self.params[wzp] != 0) or self.params[xzp].size != 1 \
                or weight.dtype != np.int8 or (node.attr("groups") != 1 and not depthwise):
            return False
        zx = int(self.params[xzp].reshape(()))
        offset = 0 if depthwise else offset_of(self.dot, self.types[x].dtype)
        # One input channel on an M-profile core: a word holds four columns (qpad's
        # window), not one channel and three of padding.
        window = weight.shape[3] if c == 1 and weight.shape[3] <= 4 and not depthwise \
            and self.dot in ("smlad", "mve") else 0
        if window:
            weight, c = columns_as_channels(weight), 4
        if depthwise:
            c = oc
        ib = self.vw if depthwise else input_block(c, self.vw)
        ow = self.types[node.outputs[0]].shape[3]
        k = tile(ow, oc // ob, ob, self.dot)[0]
        packed = self.param(("qconv", w_name, ib, ob, k, depthwise, window), f"{w_name}.packed",
                            lambda: pack_qdepthwise(weight, self.vw) if depthwise
                            else pack_qweight(weight, ib, ob, k))
        bias_c = self.param(("qbias", bias, w_name, zx, offset), f"{bias}.corrected",
                            lambda: corrected_bias(weight, self.params[bias], zx, offset))
        mults = self.param(("qmult", mult, oc), f"{mult}.per_channel",
                           lambda: np.ascontiguousarray(np.broadcast_to(
                               self.params[mult].reshape(-1), (oc,)), np.float32))
        pads = tuple(node.attr("pads"))
        src = self.blocked[(x, self.vw)] if self.has_blocked(x) and not self.padded(x) \
            else self.need_plain(x)
        # The depthwise kernel on the DSP extension pads by itself: the padded copy
        # would be the largest tensor of a keyword spotter's workspace.
        borders = {"pads": pads, "fill": zx} if depthwise and self.dot in ("smlad", "mve") \
            and any(pads) else {}
        if window:
            padded = fresh_name(f"{x}.columns", self.types)
            self.emit(Node.make("qpad_nchwc", f"{node.name}.pad", (self.need_plain(x),),
                                (padded,), block=ib, pads=pads, channels=1, fill=zx,
                                window=window))
        elif not ((any(pads) and not borders) or c % ib or len(self.types[src].shape) != 5
                  or self.types[src].shape[4] != ib):
            padded = src
        else:
            borders = {}
            padded = fresh_name(f"{x}.padded", self.types)
            self.emit(Node.make("qpad_nchwc", f"{node.name}.pad", (src,), (padded,),
                                block=ib, pads=pads, channels=c, fill=zx))
        inputs = [padded, packed, bias_c, mults, yzp]
        plain = Node.make("conv2d_integer", node.name, (), node.outputs)
        if depthwise:
            dsp = {"dot": self.dot} if self.dot in ("smlad", "mve") else {}  # others: one
            self.blocked_output(plain, "qdepthwise_conv2d_nchwc", inputs,
                                strides=tuple(node.attr("strides")), out=node.attr("out"),
                                **dsp, **borders)
        elif ob == self.vw:
            self.blocked_output(plain, "qconv2d_nchwc", inputs,
                                strides=tuple(node.attr("strides")), oc_block=ob,
                                dot=self.dot, offset=offset, out=node.attr("out"))
        else:  # blocked by ob: its consumers read it plain (need_plain)
            out = fresh_name(f"{node.outputs[0]}.nchw{ob}c", self.types)
            self.emit(Node.make("qconv2d_nchwc", node.name, inputs, (out,),
                                strides=tuple(node.attr("strides")), oc_block=ob,
                                dot=self.dot, offset=offset, out=node.attr("out")))
            self.blocked[(node.outputs[0], ob)] = out
        return True

    def qdense(self, node: Node) -> bool:
        """matmul_integer by a constant symmetric int8 [K, N] -> qdense_packed, the
        columns zero-padded to whole blocks (attr units = N)."""
        a, b, azp, bzp = node.inputs[:4]
        weight = self.params.get(b)
        lanes = self.vw
        if (weight is None or weight.dtype != np.int8 or weight.ndim != 2
                or bzp not in self.params or np.any(self.params[bzp] != 0)
                or weight.shape[0] % 4
                or node.attr("out") not in ("int32", *QTYPES)
                or not all(i in self.params for i in node.inputs[4:])):
            return False
        n = weight.shape[1]
        padded = n + -n % lanes
        packed = self.param(("qdense", b, lanes), f"{b}.packed",
                            lambda: pack_qdense(pad_columns(weight, padded), lanes)[0])
        colsum = self.param(("qcolsum", b, padded), f"{b}.colsum",
                            lambda: pack_qdense(pad_columns(weight, padded), lanes)[1])
        extra = list(node.inputs[4:])
        if extra:  # per-column multiplier, as the kernel loads vectors of it
            extra[1] = self.param(("qmult", extra[1], padded), f"{extra[1]}.per_column",
                                  lambda: pad_columns(np.broadcast_to(
                                      self.params[node.inputs[5]].reshape(-1), (n,)),
                                      padded).astype(np.float32))
            extra[0] = self.param(("qbias", extra[0], padded), f"{extra[0]}.per_column",
                                  lambda: pad_columns(np.broadcast_to(
                                      self.params[node.inputs[4]].reshape(-1), (n,)),
                                      padded).astype(np.int32))
        self.emit(Node.make("qdense_packed", node.name,
                            [self.need_plain(a), packed, colsum, self.need_plain(azp), *extra],
                            node.outputs, out=node.attr("out"), dot=self.dot,
                            offset=offset_of(self.dot, self.types[a].dtype), units=n))
        self.plain.update(node.outputs)
        return True

    def elementwise(self, node: Node) -> bool:
        out_type = self.types[node.outputs[0]]
        acts = [i for i in node.inputs if i not in self.params]
        # Any dtype: the int8 chains of a quantized model (dequantize -> add -> quantize)
        # stay blocked between its blocked convolutions.
        if (len(out_type.shape) != 4
                or not any(self.has_blocked(i) for i in acts)
                or any(self.types[i].shape != out_type.shape for i in acts)
                or any(self.params[i].ndim > 4 for i in node.inputs if i in self.params)):
            return False
        # Channels not a multiple of b: only on tensors blocked with padding channels
        # (padded filters); the constants are padded to match.
        pad = -out_type.shape[1] % self.vw
        if pad and not all(self.has_blocked(i) for i in acts):
            return False
        inputs = [self.param(("bcast", i, self.vw), f"{i}.nchw{self.vw}c",
                             lambda i=i: to_blocked(pad_channels(self.params[i],
                                                                  out_type.shape[1], pad),
                                                    self.vw))
                  if i in self.params else self.need_blocked(i, self.vw)
                  for i in node.inputs]
        self.blocked_output(node, node.op, inputs)
        return True

    def pool(self, node: Node) -> bool:
        if not self.has_blocked(node.inputs[0]):
            return False
        self.blocked_output(node, _POOLS[node.op], [self.blocked[(node.inputs[0], self.vw)]])
        return True

    def concat(self, node: Node) -> bool:
        """Along the channels of 4-D tensors that block (each a multiple of b
        channels), one of them already blocked: the same concat of the blocked
        tensors along their channel-block axis (1), so a fire module's or dense
        block's convs read and write blocked tensors without transforms."""
        types = [self.types[i] for i in node.inputs]
        if (node.attr("axis") != 1 or any(len(t.shape) != 4 or t.shape[1] % self.vw
                                           or t.dtype != "float32" for t in types)
                or not any(self.has_blocked(i) for i in node.inputs)):
            return False
        self.blocked_output(node, "concat", [self.need_blocked(i, self.vw)
                                             for i in node.inputs])
        return True

    def dense(self, node: Node) -> bool:
        weight = self.params.get(node.inputs[1])
        if (weight is None or weight.dtype not in _FLOATS or weight.ndim != 2
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

    def nbits(self, node: Node) -> bool:
        n_w = 3 if node.attr("zero_points") == "none" else 4  # a, then what is reordered
        consts = [self.params.get(i) for i in node.inputs[1:n_w]]
        layout = nbits_layout(node, consts, self.dot == "vnni" and self.vw == 16)
        if layout is None:
            return False
        moved = [self.param((layout, i), f"{i}.{layout}", lambda c=c, r=r: to_cols16(c, r))
                 for i, c, r in zip(node.inputs[1:n_w], consts, RUNS[layout], strict=False)]
        inputs, n = [node.inputs[0], *moved, *node.inputs[n_w:]], consts[0].shape[0]
        self.emit(Node.make(node.op, node.name, inputs, node.outputs, **dict(node.attrs),
                            layout=layout, **({"units": n} if n % 16 else {})))
        self.plain.update(node.outputs)
        return True

    def run(self) -> tuple[Graph, dict]:
        for node in self.graph.nodes:
            if node.op == "conv2d_integer":
                done = self.qconv(node)
            elif node.op == "matmul_integer":
                done = self.qdense(node)
            elif self.int8_only and node.op != "fused" and get(node.op).kind == OpKind.ELEMENTWISE:
                done = self.elementwise(node)
            elif self.int8_only:
                done = False
            elif node.op == "conv2d":
                done = self.conv(node)
            elif node.op in _POOLS:
                done = self.pool(node)
            elif node.op == "dense":
                done = self.dense(node)
            elif node.op == "matmul_nbits":
                done = self.nbits(node)
            elif node.op == "concat":
                done = self.concat(node)
            elif node.op != "fused" and get(node.op).kind == OpKind.ELEMENTWISE:
                done = self.elementwise(node)
            else:
                done = False
            if not done:
                self.keep(node)
        for name in self.graph.outputs:
            self.need_plain(name)
        graph = self.graph.replace(nodes=tuple(self.nodes), types=self.types)
        return prune(write_padded_outputs(graph) if self.dot in ("vnni", "sdot") else graph,
                     self.params)


def _input_block(c: int, vw: int) -> int:
    """Input channels per block of a blocked conv of `c` channels: vw if it divides c,
    all of them in a narrow first layer, else the largest divisor of c between vw/2
    and vw (24 channels: 12; such a conv was a plain, single-threaded conv2d, a fifth
    of inception_v1's time); 0: the conv does not block."""
    if c % vw == 0 or c <= vw:
        return vw if c % vw == 0 else c
    return next((d for d in range(vw, vw // 2 - 1, -1) if c % d == 0), 0)


def alter_op_layout(graph: Graph, params: dict, cfg: PassConfig, target: Target | None = None):
    """Rewrite `graph` to blocked layouts for `target` (see the module docstring);
    without a target (graph-only optimisation) the graph is returned unchanged."""
    if target is None:
        return graph, params
    if target.vector_width < 8:  # only the int8 convolutions, on a dot-product target
        if dot_kind(target) not in ("sdot", "smlad", "mve"):
            return graph, params
        return _Rewriter(graph, params, target.vector_width, dot_kind(target),
                         int8_only=True).run()
    return _Rewriter(graph, params, target.vector_width, dot_kind(target),
                     winograd=cfg.option("AlterOpLayout.winograd")).run()
