"""Shape values over symbolic dimensions read as data (frontend/onnx/symbolic.py):
a torch.onnx export of a GPT-style decoder with a KV cache and its causal mask made
from Range (`arange(past, past + s)`, `arange(s) + past`), Greater and an Expand to
[batch, 1, seq, past + seq], and a second layer's `full(...).triu(past + 1)`
(tests/tools/data/make_torch_decoder_mask.py); a BERT's expanded attention mask; built
once as a VM library for batch, seq and past in bounds, against onnxruntime at
several shapes and over a prefill and greedy decode steps."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import pipeline
from pipeline.link.runtime_c import build_pipeline_run
from pipeline.runtime.vm import VirtualMachine

MODEL = Path(__file__).parents[1] / "tools" / "data" / "torch_decoder_mask.onnx"
DIMS = {"batch": (1, 3), "seq": (1, 16), "past": (0, 24)}
LAYERS, HEADS, HEAD_DIM, VOCAB = 2, 2, 16, 64


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """(its VirtualMachine, an onnxruntime session, the library's path)."""
    graph, params = pipeline.frontend.from_onnx(onnx.load(MODEL), symbolic=True)
    ops = {n.op for n in graph.nodes}
    assert {"iota", "dim_values", "expand", "trilu"} <= ops and "range" not in ops
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target="llvm -mcpu=native", params=params,
                                 executor="vm", dims=DIMS)
    so = factory.export_library(tmp_path_factory.mktemp("symshape") / "decoder.so")
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    return VirtualMachine(so), session, so


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
    _check(*decoder[:2], _feeds(batch, seq, past, batch * 100 + seq * 10 + past))


def test_prefill_then_decode_steps(decoder):
    vm, session, _ = decoder
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


def test_gpt2_bias_sliced_by_past_and_seq(tmp_path):
    """GPT-2's causal table `bias[past:past + s, :past + s]` (a Slice whose starts
    and ends are shape values; onnx.helper as torch writes it) at several shapes."""
    from onnx import TensorProto, helper

    def gather(src: str, k: int, out: str) -> list:
        return [helper.make_node("Shape", [src], [f"{out}_s"]),
                helper.make_node("Gather", [f"{out}_s", f"i{k}"], [f"{out}_g"], axis=0),
                helper.make_node("Unsqueeze", [f"{out}_g", "zero1"], [out])]

    table = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    inits = [helper.make_tensor("i1", TensorProto.INT64, [], [1]),
             helper.make_tensor("zero1", TensorProto.INT64, [1], [0]),
             helper.make_tensor("axes", TensorProto.INT64, [2], [0, 1]),
             onnx.numpy_helper.from_array(table, "bias")]
    nodes = [*gather("x", 1, "seq"), *gather("cache", 1, "past"),
             helper.make_node("Add", ["past", "seq"], ["total"]),
             helper.make_node("Concat", ["past", "zero1"], ["starts"], axis=0),
             helper.make_node("Concat", ["total", "total"], ["ends"], axis=0),
             helper.make_node("Slice", ["bias", "starts", "ends", "axes"], ["mask"]),
             helper.make_node("Concat", ["cache", "x"], ["cache_all"], axis=1),
             helper.make_node("Transpose", ["cache_all"], ["cache_t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "cache_t"], ["scores"]),
             helper.make_node("Add", ["scores", "mask"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4]),
                     helper.make_tensor_value_info("cache", TensorProto.FLOAT,
                                                   ["batch", "past", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph, params = pipeline.frontend.from_onnx(model, symbolic=True)
    assert "gather" in {n.op for n in graph.nodes}
    factory = pipeline.build(graph, target="llvm -mcpu=native", params=params, executor="vm",
                             dims={"batch": (1, 2), "seq": (1, 16), "past": (0, 16)})
    vm = VirtualMachine(factory.export_library(tmp_path / "gpt2.so"))
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for batch, seq, past in ((1, 5, 0), (2, 3, 7), (1, 1, 16), (2, 16, 16)):
        x = rng.standard_normal((batch, seq, 4)).astype(np.float32)
        cache = rng.standard_normal((batch, past, 4)).astype(np.float32)
        (got,) = vm.run(x, cache)
        (want,) = session.run(None, {"x": x, "cache": cache})
        assert got.shape == want.shape == (batch, seq, past + seq)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pipeline_run_decode_step(decoder, tmp_path):
    """The C runtime alone (pipeline-run, .npy in and out) runs a decode step whose
    mask needs past and seq at run time."""
    _, session, so = decoder
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run)
    feeds = _feeds(2, 1, 9, 5)
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    proc = subprocess.run([run, so, *args, "--output-dir", tmp_path / "out"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for k, want in enumerate(session.run(None, feeds)):
        got = np.load(tmp_path / "out" / f"output_{k}.npy")
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_sdpa_is_causal(tmp_path):
    """torch's F.scaled_dot_product_attention(is_causal=True): Trilu over an Expand
    of ones to [seq, seq] built from a shape value."""
    path = MODEL.with_name("torch_sdpa_causal.onnx")
    graph, params = pipeline.frontend.from_onnx(onnx.load(path), symbolic=True)
    assert {"trilu", "expand"} <= {n.op for n in graph.nodes}
    factory = pipeline.build(graph, target="llvm -mcpu=native", params=params, executor="vm",
                             dims={"batch": (1, 3), "seq": (1, 40)})
    vm = VirtualMachine(factory.export_library(tmp_path / "sdpa.so"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for batch, seq in ((1, 5), (3, 17), (2, 40), (1, 1)):
        q, k, v = (rng.standard_normal((batch, HEADS, seq, HEAD_DIM)).astype(np.float32)
                   for _ in range(3))
        (got,) = vm.run(q, k, v)
        (want,) = session.run(None, {"q": q, "k": k, "v": v})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
