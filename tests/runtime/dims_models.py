"""Small models with symbolic dimensions for tests/runtime/test_vm_dims.py, written with
onnx.helper (no torch on the machine's Python): a BERT-style encoder layer (embedding
Gather, LayerNorm, multi-head attention with MatMul and Softmax, GELU through Erf,
residuals) and a token MLP without attention, their inputs declared
[batch, seq] as an exporter with dynamic axes declares them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.support.onnx_models import GraphParts

VOCAB, HIDDEN, HEADS = 50, 32, 4


class _Net(GraphParts):
    """Nodes and initializers being collected."""

    def weight(self, *shape, scale=0.2) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self.k += 1
        out = f"t{self.k}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], f"n{self.k}", **attrs))
        return out

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        return self.op("Add", self.op("MatMul", x, self.weight(n_in, n_out)),
                       self.weight(n_out, scale=0.1))

    def layer_norm(self, x: str) -> str:
        return self.op("LayerNormalization", x, self.const(np.ones(HIDDEN, np.float32)),
                       self.weight(HIDDEN, scale=0.1), axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        erf = self.op("Erf", self.op("Div", x, self.const(np.float32(np.sqrt(2.0)))))
        half = self.op("Mul", x, self.const(np.float32(0.5)))
        return self.op("Mul", half, self.op("Add", erf, self.const(np.float32(1.0))))

    def model(self, out: str, mask: bool = False) -> onnx.ModelProto:
        inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])]
        if mask:
            inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT,
                                                        ["batch", "seq"]))
        graph = helper.make_graph(
            self.nodes, "dims", inputs,
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def encoder(mask: bool = False, shape_ops: bool = False) -> onnx.ModelProto:
    """A BERT-style encoder layer over ids [batch, seq] (the heads split with Reshape
    [0, 0, heads, d] as exporters write it); with `mask`, a second input
    attention_mask [batch, seq] (1 keep, 0 pad) added to the scores as
    (1 - mask) * -10000 over [batch, 1, 1, seq]; with `shape_ops` the Reshapes' targets
    come from Shape -> Gather -> Unsqueeze -> Concat, as torch.onnx exports `view`."""
    net = _Net(0)
    d = HIDDEN // HEADS
    x = net.layer_norm(net.op("Gather", net.weight(VOCAB, HIDDEN, scale=1.0), "ids", axis=0))
    if shape_ops:  # torch.onnx's x.view(x.size(0), x.size(1), heads, d)
        size = net.op("Shape", x)
        batch, seq = (net.op("Unsqueeze", net.op("Gather", size, net.const(np.int64(k)), axis=0),
                             net.const(np.array([0], np.int64))) for k in (0, 1))
        split = net.op("Concat", batch, seq, net.const(np.array([HEADS, d], np.int64)), axis=0)
        merge = net.op("Concat", batch, seq, net.op(
            "Mul", net.const(np.array([HEADS], np.int64)), net.const(np.array([d], np.int64))),
            axis=0)
    else:
        split = net.const(np.array([0, 0, HEADS, d], np.int64))
        merge = net.const(np.array([0, 0, HIDDEN], np.int64))
    q, k, v = (net.op("Reshape", net.linear(x, HIDDEN, HIDDEN), split) for _ in range(3))
    q = net.op("Transpose", q, perm=[0, 2, 1, 3])
    kt = net.op("Transpose", k, perm=[0, 2, 3, 1])
    v = net.op("Transpose", v, perm=[0, 2, 1, 3])
    scores = net.op("Div", net.op("MatMul", q, kt), net.const(np.float32(np.sqrt(d))))
    if mask:
        m = net.op("Unsqueeze", "attention_mask", net.const(np.array([1, 2], np.int64)))
        m = net.op("Mul", net.op("Sub", net.const(np.float32(1.0)), m),
                   net.const(np.float32(-10000.0)))
        scores = net.op("Add", scores, m)
    attn = net.op("MatMul", net.op("Softmax", scores, axis=-1), v)
    merged = net.op("Reshape", net.op("Transpose", attn, perm=[0, 2, 1, 3]), merge)
    x = net.layer_norm(net.op("Add", x, net.linear(merged, HIDDEN, HIDDEN)))
    ffn = net.linear(net.gelu(net.linear(x, HIDDEN, 4 * HIDDEN)), 4 * HIDDEN, HIDDEN)
    return net.model(net.layer_norm(net.op("Add", x, ffn)), mask)


def token_mlp() -> onnx.ModelProto:
    """Embedding, LayerNorm, a GELU MLP with a residual and a Softmax over the hidden
    axis: every kernel is row by row over [batch, seq]."""
    net = _Net(1)
    x = net.layer_norm(net.op("Gather", net.weight(VOCAB, HIDDEN, scale=1.0), "ids", axis=0))
    h = net.linear(net.gelu(net.linear(x, HIDDEN, 2 * HIDDEN)), 2 * HIDDEN, HIDDEN)
    y = net.layer_norm(net.op("Add", x, h))
    y = net.op("Reshape", net.op("Softmax", y, axis=-1),
               net.const(np.array([0, -1, HIDDEN], np.int64)))
    return net.model(net.op("Cast", y, to=TensorProto.FLOAT))


def decoder_step() -> onnx.ModelProto:
    """One decode step with a KV cache: x [batch, 1, hidden] attends over the cache
    past_k, past_v [batch, heads, past, d] plus its own key and value; outputs y and
    the grown cache present_k, present_v [batch, heads, past + 1, d]."""
    net = _Net(2)
    d = HIDDEN // HEADS
    split = net.const(np.array([0, 0, HEADS, d], np.int64))
    heads = [net.op("Transpose", net.op("Reshape", net.linear("x", HIDDEN, HIDDEN), split),
                    perm=[0, 2, 1, 3]) for _ in range(3)]
    q, k, v = heads
    k_all = net.op("Concat", "past_k", k, axis=2)
    v_all = net.op("Concat", "past_v", v, axis=2)
    scores = net.op("Div", net.op("MatMul", q, net.op("Transpose", k_all, perm=[0, 1, 3, 2])),
                    net.const(np.float32(np.sqrt(d))))
    attn = net.op("MatMul", net.op("Softmax", scores, axis=-1), v_all)
    merged = net.op("Reshape", net.op("Transpose", attn, perm=[0, 2, 1, 3]),
                    net.const(np.array([0, 0, HIDDEN], np.int64)))
    y = net.linear(merged, HIDDEN, HIDDEN)
    f = TensorProto.FLOAT
    cache = ["batch", HEADS, "past", d]
    grown = ["batch", HEADS, "past_plus_1", d]
    graph = helper.make_graph(
        net.nodes, "decode",
        [helper.make_tensor_value_info("x", f, ["batch", 1, HIDDEN]),
         helper.make_tensor_value_info("past_k", f, cache),
         helper.make_tensor_value_info("past_v", f, cache)],
        [helper.make_tensor_value_info(y, f, ["batch", 1, HIDDEN]),
         helper.make_tensor_value_info(k_all, f, grown),
         helper.make_tensor_value_info(v_all, f, grown)], net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def spatial_convnet(stride: int = 1) -> onnx.ModelProto:
    """A fully convolutional net over x [batch, 3, h, w]: a 3x3 conv with bias and
    ReLU, a padded 3x3 AveragePool, a dilated depthwise conv, a SAME MaxPool (the
    stride of the first conv is `stride`); outputs the map m [batch, 4, h, w] and its
    GlobalMaxPool y [batch, 4, 1, 1]."""
    net = _Net(5)
    c = net.op("Conv", "x", net.weight(4, 3, 3, 3), net.weight(4), kernel_shape=[3, 3],
               pads=[1, 1, 1, 1], strides=[stride, stride])
    p = net.op("AveragePool", net.op("Relu", c), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    q = net.op("Conv", p, net.weight(4, 1, 3, 3), kernel_shape=[3, 3], pads=[2, 2, 2, 2],
               dilations=[2, 2], group=4)
    m = net.op("MaxPool", q, kernel_shape=[3, 3], auto_pad="SAME_UPPER")
    y = net.op("GlobalMaxPool", m)
    graph = helper.make_graph(net.nodes, "spatial", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (m, y)], net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
