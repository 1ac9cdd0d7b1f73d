"""The fusions of transformer blocks as exporters write them, unfused: FuseLayerNorm's
RMSNorm, FuseGelu's tanh form, FuseAttention's rotary embedding, pre-scaled operands
(scaled_dot_product_attention) and masked_fill masks. A real torch export
(tests/tools/data/torch_gpt_block.onnx, made by make_torch_gpt_block.py) must compile
to the fused kernels and match onnxruntime; small hand-written graphs check each
spelling and that near misses are left alone."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from pipeline.frontend import from_onnx
from pipeline.ops import infer_types
from pipeline.transform import PassContext, optimize
from tests.support.compare import assert_matches_ort
from tests.support.onnx_models import make_model, rand

node = helper.make_node
GPT_BLOCK = Path(__file__).parents[1] / "tools" / "data" / "torch_gpt_block.onnx"


def optimized_ops(model, **ctx) -> collections.Counter:
    graph, params = from_onnx(model)
    with PassContext(opt_level=3, disabled_pass=["FuseOps"], **ctx):
        out, _ = optimize(graph, params)
    out.verify(infer_types)
    return collections.Counter(n.op for n in out.nodes)


def test_torch_gpt_block_compiles_to_the_fused_kernels():
    """Two decoder blocks (GPT: decomposed LayerNorm, SDPA, erf GELU; LLaMA: RMSNorm,
    rotary, masked_fill attention, tanh GELU): every block's pieces are one kernel each."""
    model = onnx.load(GPT_BLOCK)
    ops = optimized_ops(model)
    assert ops["layer_norm"] == 2 and ops["rms_norm"] == 2 and ops["gelu"] == 2
    assert ops["rotary_embedding"] == 2 and ops["attention"] == 2
    for unfused in ("softmax", "matmul", "erf", "tanh", "pow", "sqrt", "neg", "concat",
                    "where", "reduce_mean", "div", "mul"):
        assert ops[unfused] == 0, (unfused, ops)
    x = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)
    for level in (0, 3):
        assert_matches_ort(model, {"x": x}, opt_level=level)


# -- RMSNorm -----------------------------------------------------------------------------


def rms_norm(spelling: str, gamma: bool = True, eps: float = 1e-6, casts: bool = False):
    """x * rsqrt(mean(x^2) + eps) [* w], spelled as torch (Div(1, .) then Mul), with
    Reciprocal, or as Div(x, sqrt); with `casts`, x and the result cast to float32 first
    as LLaMA's RMSNorm does (a no-op on float32)."""
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(eps, np.float32),
             "one": np.array(1.0, np.float32), "w": rand(16, seed=2, low=0.5, high=1.5)}
    nodes = [node("Pow", ["x", "two"], ["sq"]),
             node("ReduceMean", ["sq"], ["m"], axes=[-1], keepdims=1),
             node("Add", ["m", "eps"], ["a"]), node("Sqrt", ["a"], ["s"])]
    last = "y" if not gamma else "n"
    if spelling == "div":
        nodes.append(node("Div", ["x", "s"], [last]))
    else:
        nodes.append(node("Div", ["one", "s"], ["r"]) if spelling == "torch" else
                     node("Reciprocal", ["s"], ["r"]))
        nodes.append(node("Mul", ["x", "r"], [last]))
    if gamma:
        nodes.append(node("Mul", ["w", "nc" if casts else "n"], ["y"]))
    if casts:
        nodes.insert(0, node("Cast", ["x0"], ["x"], to=onnx.TensorProto.FLOAT))
        nodes.insert(-1, node("Cast", ["n"], ["nc"], to=onnx.TensorProto.FLOAT))
    return make_model(nodes, [("x0" if casts else "x", [2, 5, 16])], [("y", [2, 5, 16])],
                      inits)


@pytest.mark.parametrize("spelling, gamma, casts", [
    ("torch", True, False), ("reciprocal", True, False), ("div", False, False),
    ("torch", True, True)])
def test_rms_norm_spellings_become_one_rms_norm(spelling, gamma, casts):
    model = rms_norm(spelling, gamma, casts=casts)
    assert optimized_ops(model) == {"rms_norm": 1}
    x = rand(2, 5, 16, low=-2, high=3)
    assert_matches_ort(model, {"x0" if casts else "x": x}, opt_level=3)


def test_rms_norm_with_a_read_intermediate_is_left():
    model = rms_norm("torch")
    model.graph.output.append(helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT,
                                                            [2, 5, 1]))
    assert "rms_norm" not in optimized_ops(model)


# -- GELU, tanh form -----------------------------------------------------------------------


def gelu_tanh(cube: str = "muls", inner: float = math.sqrt(2 / math.pi)):
    """0.5 * x * (1 + tanh(inner * (x + 0.044715 x^3))) after a dense layer."""
    inits = {"w": rand(24, 40, seed=1) * np.float32(0.5), "b": rand(40, seed=2),
             "c": np.array(0.044715, np.float32), "k": np.array(inner, np.float32),
             "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32),
             "three": np.array(3.0, np.float32)}
    nodes = [node("MatMul", ["a", "w"], ["m"]), node("Add", ["b", "m"], ["x"])]
    nodes += [node("Pow", ["x", "three"], ["x3"])] if cube == "pow" else \
        [node("Mul", ["x", "x"], ["x2"]), node("Mul", ["x", "x2"], ["x3"])]
    nodes += [node("Mul", ["c", "x3"], ["cx3"]), node("Add", ["x", "cx3"], ["s"]),
              node("Mul", ["k", "s"], ["t"]), node("Tanh", ["t"], ["th"]),
              node("Add", ["one", "th"], ["p"]), node("Mul", ["x", "p"], ["xp"]),
              node("Mul", ["half", "xp"], ["y"])]
    model = make_model(nodes, [("a", [3, 7, 24])], [("y", None)], inits)
    return model, {"a": rand(3, 7, 24, seed=3, low=-3, high=3)}


@pytest.mark.parametrize("cube", ["muls", "pow"])
def test_tanh_gelu_becomes_one_gelu(cube):
    model, feeds = gelu_tanh(cube)
    assert optimized_ops(model) == {"dense": 1, "add": 1, "gelu": 1}
    assert_matches_ort(model, feeds, opt_level=3)


def test_tanh_gelu_with_another_constant_is_left():
    model, feeds = gelu_tanh(inner=0.8)
    assert "gelu" not in optimized_ops(model)
    assert_matches_ort(model, feeds, opt_level=3)


# -- rotary embedding and attention ----------------------------------------------------------


def rotary(equal_halves: bool = True):
    """q * cos + rotate_half(q) * sin on q [B, H, S, D] from a Transpose, as torch
    exports LLaMA's apply_rotary_pos_emb."""
    b, h, s, d = 2, 3, 5, 8
    angles = np.arange(s)[:, None] * (10000.0 ** (-np.arange(d // 2) / (d // 2)))[None, :]
    table = np.concatenate([angles, angles if equal_halves else angles * 2], axis=-1)
    inits = {"cos": np.cos(table).astype(np.float32), "sin": np.sin(table).astype(np.float32),
             "lo": np.array([0]), "mid": np.array([d // 2]), "hi": np.array([d]),
             "ax": np.array([3])}
    nodes = [node("Transpose", ["x"], ["q"], perm=[0, 2, 1, 3]),
             node("Mul", ["q", "cos"], ["qc"]),
             node("Slice", ["q", "lo", "mid", "ax"], ["q1"]),
             node("Slice", ["q", "mid", "hi", "ax"], ["q2"]), node("Neg", ["q2"], ["nq2"]),
             node("Concat", ["nq2", "q1"], ["rot"], axis=-1), node("Mul", ["rot", "sin"], ["rs"]),
             node("Add", ["qc", "rs"], ["y"])]
    model = make_model(nodes, [("x", [b, s, h, d])], [("y", None)], inits)
    return model, {"x": rand(b, s, h, d, seed=4)}


@pytest.mark.parametrize("equal_halves", [True, False])
def test_rotate_half_becomes_rotary_embedding(equal_halves):
    model, feeds = rotary(equal_halves)
    assert (optimized_ops(model)["rotary_embedding"] == 1) == equal_halves
    assert_matches_ort(model, feeds, opt_level=3)


def masked_fill_attention(prescale: bool):
    """softmax(masked_fill(Q Kᵀ / sqrt(d), ~causal, -inf)) V, or with Q and Kᵀ each
    scaled by d^-1/4 first (scaled_dot_product_attention's export)."""
    b, h, s, d = 2, 2, 6, 8
    inits = {"keep": np.tril(np.ones((s, s), bool)), "fill": np.array(-np.inf, np.float32),
             "root": np.array(d ** -0.25 if prescale else math.sqrt(d), np.float32)}
    nodes = [node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    if prescale:
        nodes += [node("Mul", ["q", "root"], ["qs"]), node("Mul", ["kt", "root"], ["kts"]),
                  node("MatMul", ["qs", "kts"], ["sc"])]
    else:
        nodes += [node("MatMul", ["q", "kt"], ["qk"]), node("Div", ["qk", "root"], ["sc"])]
    nodes += [node("Where", ["keep", "sc", "fill"], ["ms"]),
              node("Softmax", ["ms"], ["p"], axis=-1), node("MatMul", ["p", "v"], ["y"])]
    feeds = {n: rand(b, h, s, d, seed=k) for k, n in enumerate("qkv")}
    return make_model(nodes, [(n, [b, h, s, d]) for n in "qkv"], [("y", None)], inits), feeds


@pytest.mark.parametrize("prescale", [False, True])
def test_masked_fill_attention_becomes_one_attention(prescale):
    model, feeds = masked_fill_attention(prescale)
    assert optimized_ops(model) == {"attention": 1}
    assert_matches_ort(model, feeds, opt_level=3)


def repeat_kv_attention(group: int = 4):
    """LLaMA's repeat_kv before attention: K and V [B, Hkv, S, D] unsqueezed, expanded
    `group` times and merged to [B, Hkv * group, S, D], as torch exports it."""
    b, hkv, s, d = 1, 2, 5, 16
    inits = {"root": np.array(math.sqrt(d), np.float32)}
    nodes = []
    for x in "kv":
        inits[f"{x}_split"] = np.array([b, hkv, 1, s, d])
        inits[f"{x}_spread"] = np.array([b, hkv, group, s, d])
        inits[f"{x}_merge"] = np.array([b, hkv * group, s, d])
        nodes += [node("Reshape", [x, f"{x}_split"], [f"{x}1"]),
                  node("Expand", [f"{x}1", f"{x}_spread"], [f"{x}2"]),
                  node("Reshape", [f"{x}2", f"{x}_merge"], [f"{x}r"])]
    nodes += [node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
              node("MatMul", ["q", "kt"], ["qk"]), node("Div", ["qk", "root"], ["sc"]),
              node("Softmax", ["sc"], ["p"], axis=-1), node("MatMul", ["p", "vr"], ["y"])]
    shapes = {"q": (b, hkv * group, s, d), "k": (b, hkv, s, d), "v": (b, hkv, s, d)}
    feeds = {n: rand(*shape, seed=k) for k, (n, shape) in enumerate(shapes.items())}
    return make_model(nodes, [(n, list(v)) for n, v in shapes.items()], [("y", None)],
                      inits), feeds


def test_repeat_kv_becomes_the_attention_group():
    model, feeds = repeat_kv_attention()
    assert optimized_ops(model) == {"attention": 1}
    assert_matches_ort(model, feeds, opt_level=3)


def test_split_kv_cache_attention_becomes_one_attention():
    """The test decoder's split form (scores against the cache and the masked new keys
    joined before the Softmax, tests/support/decoder_models.py) with symbolic lengths:
    per layer one attention over the cache and the new keys apart (appended: not the
    present Concats', which stream their copies past the caches, nothing else reading
    them), its mask on the last keys, no product, Softmax or scale Mul left; with
    static lengths it is left alone (the static kernel has no such mask)."""
    from tests.support.decoder_models import decoder

    graph, params = from_onnx(decoder(), symbolic=True)
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        out, _ = optimize(graph, params)
    ops = collections.Counter(n.op for n in out.nodes)
    assert ops["attention"] == 2 and not ops["matmul"] and not ops["softmax"], ops
    fused = [n for n in out.nodes if n.op == "attention"]
    assert [n.inputs[1:3] for n in fused] == [(f"past_key_{i}", f"past_value_{i}")
                                              for i in range(2)]
    present = {n.outputs[0]: n for n in out.nodes if n.op == "concat"}
    for i, n in enumerate(fused):
        keys, values = present[f"present_key_{i}"], present[f"present_value_{i}"]
        assert n.attr("appended") and n.inputs[-2:] == (keys.inputs[1], values.inputs[1])
        assert keys.attr("streamed") and values.attr("streamed")
    for n in fused:
        assert n.attr("mask_keys") == "last", n
        assert math.isclose(n.attr("scale"), 32 ** -0.5, rel_tol=1e-6), n
    shapes = {"input_ids": (1, 4), "position_ids": (1, 4),
              **{f"past_{k}_{i}": (1, 4, 3, 32) for k in ("key", "value") for i in range(2)}}
    graph, params = from_onnx(decoder(), shapes)
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        out, _ = optimize(graph, params)
    ops = collections.Counter(n.op for n in out.nodes)
    assert not ops["attention"] and ops["softmax"] == 2, ops
