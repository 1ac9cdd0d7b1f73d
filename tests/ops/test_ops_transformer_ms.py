"""The com.microsoft transformer operators (pipeline/frontend/onnx/transformer_ms.py)
compiled end to end and compared with onnxruntime, the reference for the contrib
domain, over several shapes and attribute settings."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.support.compare import run_ort, run_ours

pytest.importorskip("onnxruntime")

FLOAT, INT32, INT64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
_TYPES = {np.dtype(np.float32): FLOAT, np.dtype(np.int32): INT32, np.dtype(np.int64): INT64}


def rand(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def ms_model(op_type: str, inputs: dict, outputs: list[str], inits: dict | None = None,
             **attrs):
    """One com.microsoft node over `inputs` (graph inputs) and `inits` (initializers);
    an input whose name starts with "-" is an absent optional input."""
    inits = inits or {}
    names = ["" if k.startswith("-") else k for k in inputs]
    node = helper.make_node(op_type, names, outputs, domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, _TYPES[v.dtype], v.shape) for k, v in inputs.items()
         if not k.startswith("-") and k not in inits],
        [helper.make_tensor_value_info(o, FLOAT if "index" not in o else INT32, None)
         for o in outputs if o],
        [helper.make_tensor(k, _TYPES[v.dtype], v.shape, v.reshape(-1).tolist())
         for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def check(op_type, inputs: dict, outputs, inits=None, opt_level=3, atol=2e-5, **attrs):
    m = ms_model(op_type, inputs, outputs, inits, **attrs)
    feeds = {k: v for k, v in inputs.items()
             if not k.startswith("-") and k not in (inits or {})}
    want = run_ort(m, feeds)
    got = run_ours(m, feeds, opt_level=opt_level)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=atol)


ACTIVATIONS = {
    "gelu": ("Gelu", {"X": rand(2, 5, 33, low=-4, high=4)}, {}),
    "bias_gelu": ("BiasGelu", {"A": rand(2, 5, 33, low=-4, high=4), "B": rand(33, seed=1)}, {}),
    "fast_gelu": ("FastGelu", {"X": rand(3, 40, low=-5, high=5)}, {}),
    "fast_gelu_bias": ("FastGelu", {"X": rand(2, 3, 24, low=-5, high=5),
                                    "bias": rand(24, seed=2)}, {}),
    "quick_gelu": ("QuickGelu", {"X": rand(4, 17, low=-6, high=6)}, {}),
    "quick_gelu_alpha": ("QuickGelu", {"X": rand(4, 17, low=-6, high=6)}, {"alpha": 1.2}),
}


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(ACTIVATIONS))
def test_activation_matches_onnxruntime(case, opt_level):
    op_type, inputs, attrs = ACTIVATIONS[case]
    check(op_type, inputs, ["Y"], opt_level=opt_level, **attrs)


SKIP_LN = {
    "full": (lambda: {"input": rand(2, 7, 48), "skip": rand(2, 7, 48, seed=1),
                      "gamma": rand(48, seed=2), "beta": rand(48, seed=3),
                      "bias": rand(48, seed=4)}, ["Y", "", "", "sum"], {"epsilon": 1e-5}),
    "no_bias_broadcast_skip": (lambda: {"input": rand(2, 5, 32), "skip": rand(5, 32, seed=1),
                                        "gamma": rand(32, seed=2), "beta": rand(32, seed=3)},
                               ["Y"], {}),
    "stats": (lambda: {"input": rand(1, 4, 20), "skip": rand(1, 4, 20, seed=1),
                       "gamma": rand(20, seed=2)}, ["Y", "mean", "inv_std"], {}),
}


@pytest.mark.parametrize("case", sorted(SKIP_LN))
def test_skip_layer_norm_matches_onnxruntime(case):
    inputs, outputs, attrs = SKIP_LN[case]
    params = {k: v for k, v in inputs().items() if k in ("gamma", "beta", "bias")}
    check("SkipLayerNormalization", inputs(), outputs, inits=params, **attrs)


@pytest.mark.parametrize("bias", [False, True])
def test_skip_simplified_layer_norm_matches_onnxruntime(bias):
    inputs = {"input": rand(2, 6, 40), "skip": rand(2, 6, 40, seed=1),
              "gamma": rand(40, seed=2)}
    if bias:
        inputs["bias"] = rand(40, seed=3)
    params = {k: v for k, v in inputs.items() if k in ("gamma", "bias")}
    check("SkipSimplifiedLayerNormalization", inputs, ["Y", "", "", "sum"], inits=params,
          epsilon=1e-6)


@pytest.mark.parametrize("segments", [False, True])
def test_embed_layer_norm_matches_onnxruntime(segments):
    b, s, h, vocab = 2, 6, 24, 30
    inputs = {"input_ids": np.random.default_rng(0).integers(0, vocab, (b, s)).astype(np.int32),
              "segment_ids": np.random.default_rng(1).integers(0, 2, (b, s)).astype(np.int32),
              "word": rand(vocab, h, seed=2), "position": rand(16, h, seed=3),
              "segment": rand(2, h, seed=4), "gamma": rand(h, seed=5), "beta": rand(h, seed=6),
              "mask": np.array([[1] * 6, [1] * 4 + [0] * 2], np.int32)}
    if not segments:
        inputs = {(k if k not in ("segment_ids", "segment") else f"-{k}"): v
                  for k, v in inputs.items()}
    params = {k: v for k, v in inputs.items() if k in ("word", "position", "segment", "gamma",
                                                       "beta")}
    check("EmbedLayerNormalization", inputs, ["Y", "mask_index", "sum"], inits=params,
          epsilon=1e-5)


ROTARY = {
    "3d_positions": ({"input": rand(2, 5, 4 * 16), "position_ids": np.array(
        [[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]], np.int64)}, 8, {}),
    "3d_start_interleaved": ({"input": rand(1, 6, 2 * 32),
                              "position_ids": np.array([5], np.int64)}, 16,
                             {"interleaved": 1}),
    "4d_positions_num_heads": ({"input": rand(2, 3, 4, 32), "position_ids": np.array(
        [[0, 1, 2, 3], [9, 8, 7, 6]], np.int64)}, 16, {"num_heads": 3}),
    "3d_partial": ({"input": rand(1, 4, 2 * 32), "position_ids": np.array([[0, 2, 4, 6]])},
                   8, {"num_heads": 2, "rotary_embedding_dim": 16}),
}


@pytest.mark.parametrize("case", sorted(ROTARY))
def test_rotary_embedding_matches_onnxruntime(case):
    inputs, half, attrs = ROTARY[case]
    angles = np.arange(20)[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
    params = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    check("RotaryEmbedding", {**inputs, **params}, ["Y"], inits=params, **attrs)


# -- MultiHeadAttention, GroupQueryAttention -------------------------------------------

def _mha_case(b=2, s=5, length=5, n=3, h=16, hv=16, past=0, bias=False, mask=None,
              attn_bias=False, kv_4d=False):
    inputs = {"q": rand(b, s, n * h, seed=1)}
    if kv_4d:
        inputs |= {"k": rand(b, n, length, h, seed=2), "v": rand(b, n, length, hv, seed=3)}
    else:
        inputs |= {"k": rand(b, length, n * h, seed=2), "v": rand(b, length, n * hv, seed=3)}
    inputs["bias"] = rand(2 * n * h + n * hv, seed=4) if bias else None
    total = length + past
    inputs["key_padding_mask"] = None if mask is None else (
        (np.random.default_rng(5).random((b, total) if mask == 2 else (b, s, total)) > 0.3)
        .astype(np.int32))
    inputs["attention_bias"] = rand(1, n, s, total, seed=6) if attn_bias else None
    inputs["past_key"] = rand(b, n, past, h, seed=7) if past else None
    inputs["past_value"] = rand(b, n, past, hv, seed=8) if past else None
    return {(k if v is not None else f"-{k}"): (v if v is not None else np.zeros(0))
            for k, v in inputs.items()}


MHA = {
    "self": (_mha_case(), {}),
    "cross_bias_scale": (_mha_case(s=4, length=9, bias=True, hv=8), {"scale": 0.2}),
    "mask_2d_attn_bias": (_mha_case(s=3, length=7, mask=2, attn_bias=True), {}),
    "mask_3d_unidirectional": (_mha_case(s=6, length=6, mask=3), {"unidirectional": 1}),
    "past_unidirectional": (_mha_case(s=2, length=2, past=19, n=4, h=8, hv=8),
                            {"unidirectional": 1}),
    "kv_4d": (_mha_case(s=3, length=11, kv_4d=True), {}),
}


@pytest.mark.parametrize("case", sorted(MHA))
def test_multi_head_attention_matches_onnxruntime(case):
    inputs, attrs = MHA[case]
    outputs = ["Y", "present_key", "present_value"] if "past_key" in inputs else ["Y"]
    heads = inputs["q"].shape[2] // (16 if case != "past_unidirectional" else 8)
    params = {"bias": inputs["bias"]} if "bias" in inputs else {}
    check("MultiHeadAttention", inputs, outputs, inits=params, num_heads=heads, **attrs)


def _gqa_case(b=1, s=4, past=0, hq=4, hkv=2, h=16, packed=False, rotary=False,
              positions=False, attn_bias=False):
    total = past + s
    inputs = {"q": rand(b, s, (hq + 2 * hkv) * h if packed else hq * h, seed=1)}
    inputs["k"] = None if packed else rand(b, s, hkv * h, seed=2)
    inputs["v"] = None if packed else rand(b, s, hkv * h, seed=3)
    inputs["past_key"] = rand(b, hkv, past, h, seed=4) if past else None
    inputs["past_value"] = rand(b, hkv, past, h, seed=5) if past else None
    inputs["seqlens_k"] = np.full(b, total - 1, np.int32)
    inputs["total_sequence_length"] = np.array(total, np.int32)
    half = h // 2
    angles = np.arange(64)[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
    inputs["cos_cache"] = np.cos(angles).astype(np.float32) if rotary else None
    inputs["sin_cache"] = np.sin(angles).astype(np.float32) if rotary else None
    inputs["position_ids"] = (np.arange(past, total)[None, :].repeat(b, 0) + 3) \
        if positions else None
    inputs["attention_bias"] = rand(b, 1, s, total, seed=6) if attn_bias else None
    return {(k if v is not None else f"-{k}"): (v if v is not None else np.zeros(0))
            for k, v in inputs.items()}


GQA = {
    "prompt": (_gqa_case(), {}),
    "prompt_packed_window": (_gqa_case(s=7, packed=True), {"local_window_size": 3}),
    "decode_window": (_gqa_case(s=1, past=8), {"local_window_size": 4}),
    "decode_past": (_gqa_case(b=2, s=1, past=21), {}),
    # beyond the attention kernel's stack panels: matmul + softmax instead
    "decode_long_past": (_gqa_case(s=1, past=700, h=64), {}),
    "decode_past_softcap_scale": (_gqa_case(s=2, past=9, hq=6, hkv=3),
                                  {"softcap": 2.0, "scale": 0.3}),
    "prompt_rotary": (_gqa_case(s=5, rotary=True), {"do_rotary": 1}),
    "decode_rotary_interleaved": (_gqa_case(s=1, past=6, rotary=True),
                                  {"do_rotary": 1, "rotary_interleaved": 1}),
    "prompt_rotary_position_ids": (_gqa_case(s=3, rotary=True, positions=True),
                                   {"do_rotary": 1}),
    "prompt_attention_bias": (_gqa_case(s=4, attn_bias=True, hq=2, hkv=1), {}),
}


@pytest.mark.parametrize("case", sorted(GQA))
def test_group_query_attention_matches_onnxruntime(case):
    inputs, attrs = GQA[case]
    hq = 6 if "softcap" in case else 2 if "bias" in case else 4
    hkv = hq // 2
    params = {k: inputs[k] for k in ("cos_cache", "sin_cache") if k in inputs}
    check("GroupQueryAttention", inputs, ["Y", "present_key", "present_value"], inits=params,
          num_heads=hq, kv_num_heads=hkv, **attrs)
