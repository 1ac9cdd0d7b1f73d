"""ONNX Attention (opset 23/24), RotaryEmbedding (23) and FlexAttention's inlined
modifier subgraphs compiled end to end and compared with onnx.reference, on shapes
the node suite does not reach: head sizes and key lengths of whole vectors plus a
tail, query lengths that are not a multiple of the kernel's row tile, a KV cache
longer than the new keys, large grouped heads. The node suite
(tests/tools/test_onnx_backend.py) covers every attribute on small shapes."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.support.compare import run_ours

FLOAT, BOOL, INT64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64


def _model(op_type: str, feeds: dict, outputs: list[str], opset: int = 23, **attrs):
    names = list(feeds)
    node = helper.make_node(op_type, names, outputs, **attrs)
    types = {np.dtype(np.float32): FLOAT, np.dtype(bool): BOOL, np.dtype(np.int64): INT64}
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, types[v.dtype], v.shape)
                      for k, v in feeds.items() if k],
        [helper.make_tensor_value_info(o, FLOAT, None) for o in outputs if o])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(op_type: str, feeds: dict, outputs: list[str], opt_level: int, opset=23, **attrs):
    m = _model(op_type, feeds, outputs, opset, **attrs)
    given = {k: v for k, v in feeds.items() if k}
    want = ReferenceEvaluator(m).run(None, given)
    got = run_ours(m, given, opt_level=opt_level)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _qkv(b, hq, hkv, sq, sk, d, dv, three_d=False):
    q, k, v = _rand(b, hq, sq, d, seed=1), _rand(b, hkv, sk, d, seed=2), \
        _rand(b, hkv, sk, dv, seed=3)
    if three_d:
        q, k, v = (x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)
                   for x in (q, k, v))
    return {"Q": q, "K": k, "V": v}


CASES = {
    # name: (feeds, outputs, attributes)
    "4d_long_keys": (_qkv(1, 4, 4, 5, 37, 64, 48), ["Y"], {}),
    "4d_gqa_causal_softcap": (_qkv(2, 8, 2, 6, 6, 32, 32), ["Y"],
                              {"is_causal": 1, "softcap": 3.0}),
    "3d_gqa_scaled": (_qkv(2, 6, 3, 7, 20, 16, 16, three_d=True), ["Y"],
                      {"q_num_heads": 6, "kv_num_heads": 3, "scale": 0.3}),
    "4d_bool_mask_broadcast": ({**_qkv(2, 3, 3, 4, 17, 8, 8),
                                "attn_mask": _rand(2, 1, 4, 17, seed=5) > -0.5}, ["Y"], {}),
    "4d_float_mask_short": ({**_qkv(1, 2, 2, 3, 21, 16, 16),
                             "attn_mask": _rand(3, 9, seed=6)}, ["Y"], {}),
    # 600 keys of 64: beyond the kernel's stack panels, so matmul + softmax instead
    "4d_gqa_long_keys_decomposed": ({**_qkv(1, 4, 2, 3, 600, 64, 64),
                                     "attn_mask": _rand(3, 600, seed=7)}, ["Y"],
                                    {"is_causal": 1, "softcap": 4.0}),
}


def _with_past(three_d: bool):
    """A decode-like step: 2 new tokens onto a cache of 33, causal, present outputs."""
    feeds = _qkv(1, 4, 2, 2, 2, 16, 16, three_d=three_d)
    feeds.update({"attn_mask": np.zeros((2, 35), np.float32), "past_key": _rand(1, 2, 33, 16),
                  "past_value": _rand(1, 2, 33, 16, seed=4)})
    attrs = {"is_causal": 1, **({"q_num_heads": 4, "kv_num_heads": 2} if three_d else {})}
    return feeds, ["Y", "present_key", "present_value"], attrs


CASES["4d_past_causal_gqa"] = _with_past(False)
CASES["3d_past_causal_gqa"] = _with_past(True)


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_matches_reference(case, opt_level):
    feeds, outputs, attrs = CASES[case]
    _check("Attention", feeds, outputs, opt_level, **attrs)


@pytest.mark.parametrize("mode", [0, 2, 3])
def test_attention_qk_matmul_output(mode):
    feeds = {**_qkv(1, 2, 2, 3, 19, 8, 8), "attn_mask": _rand(3, 19, seed=7)}
    _check("Attention", feeds, ["Y", "", "", "qk"], 3, qk_matmul_output_mode=mode,
           softcap=2.0)


def test_attention_nonpad_kv_seqlen_runtime():
    """opset 24's per-batch valid key lengths, a run-time input."""
    feeds = {**_qkv(3, 2, 2, 2, 24, 8, 8), "attn_mask": _rand(2, 24, seed=8),
             "nonpad_kv_seqlen": np.array([24, 9, 2], np.int64)}
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Attention", ["Q", "K", "V", "attn_mask", "", "",
                                        "nonpad_kv_seqlen"], ["Y"], is_causal=1)], "g",
        [helper.make_tensor_value_info(k, INT64 if v.dtype == np.int64 else FLOAT, v.shape)
         for k, v in feeds.items()],
        [helper.make_tensor_value_info("Y", FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 24)])
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    (got,) = run_ours(m, feeds, opt_level=3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


ROTARY = {
    "4d_positions": ({"input": _rand(2, 4, 5, 64), "cos_cache": _rand(40, 32, seed=2),
                      "sin_cache": _rand(40, 32, seed=3),
                      "position_ids": np.array([[0, 1, 2, 3, 4], [7, 9, 11, 13, 39]])}, {}),
    "3d_interleaved_partial": ({"input": _rand(2, 5, 4 * 48), "cos_cache": _rand(40, 8, seed=2),
                                "sin_cache": _rand(40, 8, seed=3),
                                "position_ids": np.arange(10).reshape(2, 5)},
                               {"num_heads": 4, "interleaved": 1, "rotary_embedding_dim": 16}),
    "4d_tables_per_position": ({"input": _rand(1, 3, 6, 32), "cos_cache": _rand(1, 6, 16),
                                "sin_cache": _rand(1, 6, 16, seed=4)}, {}),
}


@pytest.mark.parametrize("case", sorted(ROTARY))
def test_rotary_embedding_matches_reference(case):
    feeds, attrs = ROTARY[case]
    _check("RotaryEmbedding", feeds, ["Y"], 3, **attrs)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_matches_reference(rule):
    """Longer than the node suite's 4 steps, two query heads per key head, a past state;
    inputs named query, key, value (GraphModule.run takes them as keywords)."""
    bn, t, hkv, dk, dv = 2, 7, 2, 16, 24
    feeds = {"query": _rand(bn, t, 2 * hkv * dk, seed=1), "key": _rand(bn, t, hkv * dk, seed=2),
             "value": _rand(bn, t, hkv * dv, seed=3), "past_state": _rand(bn, hkv, dk, dv)}
    names = ["query", "key", "value", "past_state", "", ""]
    if rule.startswith("gated"):
        feeds["decay"] = _rand(bn, t, hkv * dk, seed=4) * np.float32(0.3) - np.float32(0.3)
        names[4] = "decay"
    if rule.endswith("delta"):
        feeds["beta"] = _rand(bn, t, hkv, seed=5) * np.float32(0.5) + np.float32(0.5)
        names[5] = "beta"
    m = helper.make_model(helper.make_graph(
        [helper.make_node("LinearAttention", names, ["y", "state"], q_num_heads=2 * hkv,
                          kv_num_heads=hkv, update_rule=rule)], "g",
        [helper.make_tensor_value_info(k, FLOAT, v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, FLOAT, None) for o in ("y", "state")]),
        opset_imports=[helper.make_opsetid("", 27)])
    want = ReferenceEvaluator(m).run(None, feeds)
    got = run_ours(m, feeds, opt_level=3)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


def _flex_model(score_nodes, prob_nodes=None, hq=4, hkv=2, sq=5, sk=7, d=8):
    """FlexAttention (ai.onnx.preview 1) over Q [1, hq, sq, d], K, V [1, hkv, sk, d] with
    a score_mod (and prob_mod) of the given nodes, each from "x" to "Y"."""
    def mod(nodes):
        return helper.make_graph(nodes, "mod", [helper.make_tensor_value_info("x", FLOAT, None)],
                                 [helper.make_tensor_value_info("Y", FLOAT, None)])

    attrs = {"score_mod": mod(score_nodes)} | ({"prob_mod": mod(prob_nodes)} if prob_nodes
                                               else {})
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview",
                            **attrs)
    feeds = _qkv(1, hq, hkv, sq, sk, d, d)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, FLOAT, v.shape)
                                            for k, v in feeds.items()],
                              [helper.make_tensor_value_info("Y", FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26),
                                                   helper.make_opsetid("ai.onnx.preview", 1)]), \
        feeds


@pytest.mark.parametrize("opt_level", [0, 3])
def test_flex_attention_inlines_modifiers_under_their_own_names(opt_level):
    """Grouped heads, a score_mod with a Constant and a bias built from the scores' shape
    (a mask of keys after the query), a prob_mod; both subgraphs name their tensors as
    the outer graph does ("Y")."""
    bias = np.where(np.arange(7)[None, :] > np.arange(5)[:, None] + 2, -np.inf, 0.0)
    score = [helper.make_node("Constant", [], ["b"], value=helper.make_tensor(
                 "b", FLOAT, (5, 7), bias.astype(np.float32).ravel())),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Expand", ["b", "s"], ["be"]),
             helper.make_node("Add", ["x", "be"], ["Y"])]
    prob = [helper.make_node("Constant", [], ["h"], value_float=0.5),
            helper.make_node("Pow", ["x", "h"], ["Y"])]
    m, feeds = _flex_model(score, prob)
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    got = run_ours(m, feeds, opt_level=opt_level)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


def test_flex_attention_modifier_without_converter_is_a_skip_reason():
    from pipeline.tools import backend

    m, _ = _flex_model([helper.make_node("NoSuchOp", ["x"], ["Y"])])
    assert backend.unsupported(m) == [
        "NoSuchOp (opset 26) in FlexAttention's score_mod: no converter"]


@pytest.mark.parametrize("op_type,domain,attrs,shapes", [
    ("Attention", "", {}, [["b", 8, "s", 16], ["b", 2, "s", 16], ["b", 2, "s", 16]]),
    ("MultiHeadAttention", "com.microsoft", {"num_heads": 2},
     [["b", "s", 32], ["b", "s", 32], ["b", "s", 32]]),
    ("GroupQueryAttention", "com.microsoft", {"num_heads": 4, "kv_num_heads": 2},
     [["b", "s", 64], ["b", "s", 32], ["b", "s", 32]])])
def test_attention_ops_over_symbolic_lengths_are_one_line_errors(op_type, domain, attrs,
                                                                 shapes):
    """The attention converters build masks for static lengths: a symbolic import (the
    VM's) with a symbolic sequence names the node and its symbols, where it used to
    fail on a TypeError; a symbolic batch alone is no error."""
    from pipeline.errors import ModelError
    from pipeline.frontend import from_onnx

    inputs = [helper.make_tensor_value_info(n, FLOAT, s) for n, s in
              zip("qkv", shapes, strict=True)]
    node = helper.make_node(op_type, list("qkv"), ["y"], "att", domain=domain, **attrs)
    opsets = [helper.make_opsetid("", 23)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", FLOAT, None)]),
        opset_imports=opsets)
    named = f"{domain}.{op_type}" if domain else op_type
    with pytest.raises(ModelError, match=re.escape(f"node 'att' ({named}): symbolic lengths "
                                                   "'s' are not supported yet")):
        from_onnx(model, symbolic=True)
    if op_type != "GroupQueryAttention":  # (its converter needs a static batch too)
        for shape, value in zip(shapes, model.graph.input, strict=True):
            value.type.tensor_type.shape.dim[shape.index("s")].dim_value = 5
        graph, _ = from_onnx(model, symbolic=True)
        assert graph.types["q"].shape[0] == "b" and "attention" in {n.op for n in graph.nodes}
