"""Shape values over symbolic dimensions read as data (frontend/onnx/symbolic.py):
a torch.onnx export of a GPT-style decoder with a KV cache and its causal mask made
from Range (`arange(past, past + s)`, `arange(s) + past`), Greater and an Expand to
[batch, 1, seq, past + seq], and a second layer's `full(...).triu(past + 1)`
(tests/tools/data/make_torch_decoder_mask.py); a BERT's expanded attention mask; built
once as a VM library for batch, seq and past in bounds, against onnxruntime at
several shapes and over a prefill and greedy decode steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import pipeline
from pipeline.runtime.vm import VirtualMachine

MODEL = Path(__file__).parents[1] / "tools" / "data" / "torch_decoder_mask.onnx"
DIMS = {"batch": (1, 3), "seq": (1, 16), "past": (0, 24)}
LAYERS, HEADS, HEAD_DIM, VOCAB = 2, 2, 16, 64


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """(its VirtualMachine, an onnxruntime session)."""
    graph, params = pipeline.frontend.from_onnx(onnx.load(MODEL), symbolic=True)
    ops = {n.op for n in graph.nodes}
    assert {"iota", "dim_values", "expand", "trilu"} <= ops and "range" not in ops
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target="llvm -mcpu=native", params=params,
                                 executor="vm", dims=DIMS)
    so = factory.export_library(tmp_path_factory.mktemp("symshape") / "decoder.so")
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    return VirtualMachine(so), session


def _feeds(batch: int, seq: int, past: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)}
    for k in range(LAYERS):
        for kv in "kv":
            feeds[f"past_{kv}_{k}"] = rng.standard_normal(
                (batch, HEADS, past, HEAD_DIM)).astype(np.float32)
    return feeds


def _check(vm, session, feeds) -> list[np.ndarray]:
    got = vm.run(*feeds.values())
    want = session.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    return want


@pytest.mark.parametrize("batch, seq, past", [(1, 7, 0), (2, 5, 3), (3, 16, 8), (1, 1, 24),
                                              (2, 1, 11)])
def test_causal_mask_at_every_shape(decoder, batch, seq, past):
    _check(*decoder, _feeds(batch, seq, past, batch * 100 + seq * 10 + past))


def test_prefill_then_decode_steps(decoder):
    vm, session = decoder
    feeds = _feeds(2, 6, 0, 1)
    for _ in range(6):  # a prefill, then tokens one by one, the cache fed back
        logits, *present = _check(vm, session, feeds)
        feeds = {"ids": logits[:, -1:].argmax(-1).astype(np.int64)}
        feeds.update({f"past_{kv}_{k}": present[2 * k + (kv == "v")]
                      for k in range(LAYERS) for kv in "kv"})


BERT = MODEL.with_name("torch_bert_mask.onnx")


def test_bert_attention_mask_expanded(tmp_path):
    """attention_mask [batch, seq] expanded to [batch, 1, seq, seq], positions sliced
    to seq from a buffer: one library, onnxruntime's output at every shape, padding
    masked out."""
    graph, params = pipeline.frontend.from_onnx(onnx.load(BERT), symbolic=True)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target="llvm -mcpu=native", params=params,
                                 executor="vm", dims={"batch": (1, 4), "seq": (1, 64)})
    vm = VirtualMachine(factory.export_library(tmp_path / "bert.so"))
    session = ort.InferenceSession(str(BERT), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for batch, seq in ((1, 7), (2, 33), (4, 64), (3, 1)):
        ids = rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[0, seq // 2 + 1:] = 0  # a padded row
        (got,) = vm.run(ids, mask)
        (want,) = session.run(None, {"ids": ids, "attention_mask": mask})
        assert got.shape == want.shape == (batch, seq, 32)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
