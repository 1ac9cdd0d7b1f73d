"""A GPT-style decoder with a KV cache (tests/support/decoder_models.py), float32 and
with its MatMuls and token embeddings quantized to 4 bits by onnxruntime's quantizer
(MatMulNBits and GatherBlockQuantized, block 32, zero points): one VM library per
model, built once by `pipeline compile --executor vm --dims` (and by doit from a
`dims:` entry), runs the prefill (16 tokens) and 8 greedy decode steps (1 token, the
past growing by one), each step's present cache fed back as the next step's past,
through the Python VirtualMachine (inputs copied or zero-copy) and through
pipeline-run (.npy in and out), matching onnxruntime's logits and present keys and
values at every step.

The prefill starts from an empty cache (past 0: `past=0:64`, zero-size past inputs
[batch, 4, 0, 32]), the prompt at positions 0..15."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pipeline.link.runtime_c import build_pipeline_run
from pipeline.runtime import empty_aligned
from pipeline.runtime import vm as vm_module
from pipeline.runtime.vm import VirtualMachine
from tests.support.decoder_models import HEAD_DIM, HEADS, VOCAB, decoder, initial_cache, step_feeds

TARGET = "llvm -mcpu=native"
DIMS = ["batch=1:2", "seq=1:32", "past=0:64"]
PREFILL, STEPS = 16, 8


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> dict[int, tuple[Path, Path]]:
    """bits (0: float32, 4) -> (the .onnx, its VM library), built by the CLI's path."""
    from pipeline.tools.cli import compile_model

    folder = tmp_path_factory.mktemp("decoder")
    built = {}
    for bits in (0, 4):
        path = folder / f"gpt{bits}.onnx"
        onnx.save(decoder(bits, quantized_embeddings=True), path)
        so = folder / f"gpt{bits}.so"
        compile_model(str(path), str(so), TARGET, executor="vm", cache=str(folder / "cache"),
                      dims=DIMS)
        built[bits] = path, so
    return built


def _decode(model: Path, run, batch: int, seed: int, int8: bool = False) -> list[tuple]:
    """Prefill and STEPS greedy decode steps, each by `run(feeds) -> outputs` and by
    onnxruntime, compared; the next token is onnxruntime's argmax. Returns the
    (batch, seq, past) of every call. `int8`: activations quantized to int8 (accuracy
    level 4) on both sides, where a value a hair from a rounding boundary on one side
    rounds the other way and moves the logits by ~1e-3 of their range: most steps
    must match at 1e-5 of it, every one within 4e-3 (the float product is ~1e-2 off)."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    cache, past = initial_cache(batch, 0, seed), 0
    ids = rng.integers(0, VOCAB, (batch, PREFILL)).astype(np.int64)
    calls, errors = [], []
    for step in range(1 + STEPS):
        feeds = step_feeds(ids, past, cache)
        got, want = run(feeds), session.run(None, feeds)
        seq = ids.shape[1]
        assert want[0].shape == (batch, seq, VOCAB)
        assert want[1].shape == (batch, HEADS, past + seq, HEAD_DIM)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.shape == w.shape, (step, k)
            if int8:
                errors.append(np.abs(g - w).max() / np.abs(w).max())
                continue
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"step {step} "
                                       f"output {k}")
        calls.append((batch, seq, past))
        cache = {name: w for name, w in zip(list(cache), want[1:], strict=True)}
        past += seq
        ids = np.argmax(want[0][:, -1:], axis=-1).astype(np.int64)
    if int8:
        assert max(errors) < 4e-3 and np.median(errors) < 1e-5, errors
    return calls


def _zero_copy(vm: VirtualMachine):
    """A run(feeds) giving the VM every input in place (an empty past too)."""
    def run(feeds):
        for name, value in feeds.items():
            aligned = empty_aligned(value.shape, value.dtype)
            aligned[...] = value
            vm.set_input_zero_copy(name, aligned)
        return vm.invoke("main")
    return run


@pytest.mark.parametrize("bits", [0, 4])
def test_prefill_and_decode_in_the_vm(libraries, bits):
    model, so = libraries[bits]
    vm = VirtualMachine(so)
    for batch, seed in ((1, 0), (2, 1)):  # batch 2 x 16 rows: whole 32-row blocks
        calls = _decode(model, lambda feeds: vm.run(**feeds), batch, seed)
        assert calls[0] == (batch, PREFILL, 0) and calls[-1] == (batch, 1, PREFILL + STEPS - 1)
    _decode(model, _zero_copy(VirtualMachine(so)), 1, 4)


def test_a_decode_loop_feeds_its_own_present_back_without_a_copy(libraries, monkeypatch):
    """The loop a user writes: each step's present keys and values, the VM's own
    storages handed over (every output: the threshold lowered to 0), become the next
    step's past in place (set_input_zero_copy); onnxruntime runs on the same arrays and
    every output matches, though the VM writes each step's present while it reads the
    last one's."""
    monkeypatch.setattr(vm_module, "_TAKE_BYTES", 0)
    model, so = libraries[4]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    vm = VirtualMachine(so)
    rng = np.random.default_rng(5)
    cache, past = initial_cache(1, 0), 0
    ids = rng.integers(0, VOCAB, (1, PREFILL)).astype(np.int64)
    for step in range(1 + STEPS):
        feeds = step_feeds(ids, past, cache)
        want = session.run(None, feeds)
        for name, value in feeds.items():
            if step and name.startswith("past_"):
                vm.set_input_zero_copy(name, value)
            else:
                vm.set_input("main", **{name: value})
        got = vm.invoke("main")
        assert all(isinstance(g.base, vm_module._Lease) for g in got)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"step {step} "
                                       f"output {k}")
        cache = dict(zip(cache, got[1:], strict=True))
        past += ids.shape[1]
        ids = np.argmax(got[0][:, -1:], axis=-1).astype(np.int64)


@pytest.mark.parametrize("accuracy_level", [None, 4])
def test_decoder_quantized_by_onnxruntimes_matmul_nbits_quantizer(libraries, tmp_path,
                                                                  accuracy_level):
    """The float decoder quantized by onnxruntime's own MatMulNBitsQuantizer (its
    defaults: round to nearest, 4 bits; its MatMuls and, as uint4 GatherBlockQuantized,
    its two embedding tables), with the accuracy level unset or 4 (int8 activations,
    what onnxruntime-genai's CPU int4 models ask for; our int8 kernel on AVX-512 VNNI,
    kernels/nbits_int8.py): one VM library runs its prefill and decode steps as
    onnxruntime does (at that level)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from pipeline.tools.cli import compile_model
    from tests.support.nbits_models import int8_kernel_on_this_machine

    if accuracy_level == 4 and not int8_kernel_on_this_machine():
        pytest.skip("no AVX-512 VNNI on this machine (the float kernel would run)")
    quantizer = MatMulNBitsQuantizer(decoder(0), block_size=32, is_symmetric=False,
                                     accuracy_level=accuracy_level,
                                     op_types_to_quantize=("MatMul", "Gather"))
    quantizer.process()
    model = quantizer.model.model
    ops = [n.op_type for n in model.graph.node]
    # the embeddings: uint4 tables with uint4 zero points
    assert ops.count("MatMulNBits") == 13 and ops.count("GatherBlockQuantized") == 2
    levels = [next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
              for n in model.graph.node if n.op_type == "MatMulNBits"]
    # at level 4 the outputs (compared at 1e-4) differ from the float product's by the
    # int8 rounding of the activations: matching them needs the int8 kernel
    assert set(levels) == {accuracy_level or 0}
    path, so = tmp_path / "gpt_q.onnx", tmp_path / "gpt_q.so"
    onnx.save(model, path)
    cache = libraries[4][1].parent / "cache"  # the same kernels as this module's 4-bit one
    compile_model(str(path), str(so), TARGET, executor="vm", cache=str(cache), dims=DIMS)
    vm = VirtualMachine(so)
    calls = _decode(path, lambda feeds: vm.run(**feeds), 1, 5, int8=accuracy_level == 4)
    assert calls[-1] == (1, 1, PREFILL + STEPS - 1)


def _max_rss_kib(stderr: str) -> int | None:
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    return int(found.group(1)) if found else None


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 instructions")
def test_present_caches_are_written_past_the_caches(libraries):
    """The present Concats nothing in the step reads (the attention reads the past and
    the new keys apart) store their lines non-temporally, then fence them: the
    library's code has vmovnt* stores and an sfence (the outputs matching onnxruntime
    is checked above)."""
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", libraries[4][1]],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(r"\svmovnt(ps|dq)\s", code) and re.search(r"\ssfence", code)


def test_prefill_and_decode_through_pipeline_run(libraries, tmp_path):
    """Each call is one pipeline-run process (under /usr/bin/time -v when the machine
    has it, for the peak RSS); prints the library sizes and the peak RSS of the loop."""
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run)
    timer = ["/usr/bin/time", "-v"] if os.access("/usr/bin/time", os.X_OK) else []
    figures = {}
    for bits, (model, so) in sorted(libraries.items()):
        peak = []

        def run_step(feeds, so=so, peak=peak, bits=bits):
            folder = tmp_path / f"step{bits}_{len(peak)}"
            folder.mkdir()
            args = []
            for name, value in feeds.items():
                np.save(folder / f"{name}.npy", value)
                args += ["--input", f"{name}={folder / f'{name}.npy'}"]
            proc = subprocess.run([*timer, run, so, *args, "--output-dir", folder / "y"],
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            peak.append(_max_rss_kib(proc.stderr) or 0)
            return [np.load(folder / "y" / f"output_{k}.npy") for k in range(5)]

        _decode(model, run_step, 1, 2)
        figures[bits] = so.stat().st_size, max(peak)
    (size32, rss32), (size4, rss4) = figures[0], figures[4]
    print(f"\ndecoder library: float32 {size32} bytes, 4-bit {size4} bytes "
          f"(ratio {size4 / size32:.3f}); peak RSS of a pipeline-run step: float32 "
          f"{rss32} KiB, 4-bit {rss4} KiB")
    # The weights stay packed in the library: the MatMul weights (458,752 floats,
    # 1.75 MiB) and the token embeddings (65,536, 256 KiB) shrink to 5/32 of their
    # bytes; the position embeddings stay float32.
    assert size4 < size32 - 1_500_000, figures
    if timer:
        assert 0 < rss4 < rss32, figures


def test_doit_builds_the_4bit_decoder_from_a_dims_entry(libraries, tmp_path):
    """A config entry `executor: vm, dims: {...}` builds the 4-bit decoder through doit;
    its library runs the prefill and decode steps as the CLI's does. (The kernels come
    from the CLI's kernel cache: the same kernels, not compiled twice.)"""
    from tests.support.checkouts import matrix
    from tests.support.doit_runner import doit

    (tmp_path / "nets").mkdir()
    onnx.save(decoder(4, quantized_embeddings=True), tmp_path / "nets" / "gpt4.onnx")
    matrix(tmp_path, "gpt4: {path: nets/gpt4.onnx, executor: vm, "
                     "dims: {batch: [1, 2], seq: [1, 32], past: [0, 64]}}\n")
    cache = libraries[4][1].parent / "cache"
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml", f"cache={cache}")
    assert code == 0, out
    vm = VirtualMachine(tmp_path / "out" / "gpt4" / "llvm" / "gpt4.so")
    assert vm.executable.content.dims["past+seq"] == (1, 96)
    _decode(tmp_path / "nets" / "gpt4.onnx", lambda feeds: vm.run(**feeds), 2, 3)


def _split_attention(new_keys, head: int = 16) -> onnx.ModelProto:
    """The decoder's split attention alone (scores against the cache unmasked and
    against the new keys with an arbitrary additive mask [batch, 1, new, new], joined
    before the Softmax), heads of `head`, `new_keys` query rows and new keys (an int
    or "seq")."""
    from onnx import TensorProto, helper

    f, node = TensorProto.FLOAT, helper.make_node
    cache, grown = ["batch", 4, "past", head], ["batch", 4, "past+new", head]
    step = ["batch", 4, new_keys, head]
    nodes = [node("Concat", ["past_k", "k"], ["present_k"], axis=2),
             node("Concat", ["past_v", "v"], ["present_v"], axis=2),
             node("Transpose", ["past_k"], ["past_kt"], perm=[0, 1, 3, 2]),
             node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "past_kt"], ["old"]),
             node("MatMul", ["q", "kt"], ["new_raw"]),
             node("Add", ["new_raw", "mask"], ["new"]),
             node("Concat", ["old", "new"], ["scores"], axis=-1),
             node("Softmax", ["scores"], ["probs"], axis=-1),
             node("MatMul", ["probs", "present_v"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, f, s) for n, s in (
        ("q", step), ("k", step), ("v", step), ("past_k", cache), ("past_v", cache),
        ("mask", ["batch", 1, new_keys, new_keys]))]
    outputs = [helper.make_tensor_value_info("y", f, step),
               helper.make_tensor_value_info("present_k", f, grown),
               helper.make_tensor_value_info("present_v", f, grown)]
    model = helper.make_model(helper.make_graph(nodes, "split", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("new_keys,head", [(1, 16), ("seq", 16), ("seq", 5)])
def test_split_attention_mask_covers_only_the_new_keys(tmp_path, new_keys, head):
    """FuseAttention's split form (one attention, mask_keys="last") with a mask of
    random values: the cached keys take none of it, also where the mask is [.., 1, 1]
    (one new key: broadcast to the last key only, not to every key); pasts across
    a block of 64 keys (keys packed 16 at a time and one by one), batch 2, against
    onnxruntime. The attention reads the past and the new keys apart and the present
    Concats stream their copies: whole 64-byte lines with heads of 16 floats, with
    heads of 5 (20-byte rows) mostly memcpy's."""
    import pipeline
    from pipeline.frontend import from_onnx

    model = _split_attention(new_keys, head)
    graph, params = from_onnx(model, symbolic=True)
    so = tmp_path / "split.so"
    pipeline.build(graph, TARGET, params=params, executor="vm",
                   dims={"batch": (1, 2), "past": (0, 80), "seq": (1, 40)}
                   ).export_library(str(so))
    vm, rng = VirtualMachine(str(so)), np.random.default_rng(5)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for past, seq in ((0, 37), (61, 9), (70, 1)):
        seq = 1 if new_keys == 1 else seq
        step, cache = (2, 4, seq, head), (2, 4, past, head)
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in (
            ("q", step), ("k", step), ("v", step), ("past_k", cache), ("past_v", cache),
            ("mask", (2, 1, seq, seq)))}
        vm.set_input("main", **feeds)
        for got, want in zip(vm.invoke("main"), sess.run(None, feeds), strict=True):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def _grouped_attention(heads: int = 4, kv_heads: int = 2, head: int = 16) -> onnx.ModelProto:
    """LLaMA's grouped-query attention over a KV cache, as torch writes repeat_kv: the
    present cache (Concat of past and new along the symbolic key axis) unsqueezed,
    expanded to `heads // kv_heads` copies by a shape made from Shape, Slice and
    Concat, and reshaped to `heads` heads by another; no mask."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(op_type, inputs, out, **attrs):
        nodes.append(helper.make_node(op_type, inputs, [out], f"{out}_node", **attrs))
        return out

    for name, value in (("at0", 0), ("at1", 1), ("at2", 2), ("at4", 4)):
        const(name, np.array([value], np.int64))
    const("copies", np.array([heads // kv_heads], np.int64))
    const("heads", np.array([heads], np.int64))

    def repeat_kv(x: str) -> str:
        shape = op("Shape", [x], f"{x}_shape")
        lead, rest = (op("Slice", [shape, a, b], f"{x}_{a}{b}")
                      for a, b in (("at0", "at2"), ("at2", "at4")))
        batch = op("Slice", [shape, "at0", "at1"], f"{x}_batch")
        copies = op("Expand", [op("Unsqueeze", [x, "at2"], f"{x}_one"),
                               op("Concat", [lead, "copies", rest], f"{x}_wide", axis=0)],
                    f"{x}_copies")
        return op("Reshape", [copies, op("Concat", [batch, "heads", rest], f"{x}_merged",
                                         axis=0)], f"{x}_repeated")

    keys = repeat_kv(op("Concat", ["past_k", "k"], "present_k", axis=2))
    values = repeat_kv(op("Concat", ["past_v", "v"], "present_v", axis=2))
    scores = op("MatMul", ["q", op("Transpose", [keys], "kt", perm=[0, 1, 3, 2])], "s")
    scaled = op("Mul", [scores, const("scale", np.float32(head ** -0.5))], "scaled")
    op("MatMul", [op("Softmax", [scaled], "p", axis=-1), values], "y")
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(name, f, ["batch", n, length, head])
              for name, n, length in (("q", heads, "seq"), ("k", kv_heads, "seq"),
                                      ("v", kv_heads, "seq"), ("past_k", kv_heads, "past"),
                                      ("past_v", kv_heads, "past"))]
    outputs = [helper.make_tensor_value_info(name, f, ["batch", n, length, head])
               for name, n, length in (("y", heads, "seq"), ("present_k", kv_heads, "total"),
                                       ("present_v", kv_heads, "total"))]
    model = helper.make_model(helper.make_graph(nodes, "gqa", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_grouped_query_attention_reads_each_cache_head_in_place(tmp_path):
    """repeat_kv over runtime lengths folds into the attention's group (no Expand copy
    of the cache a step), which reads the past and the new keys apart while the
    present Concats stream; against onnxruntime at decode, prefill and mixed shapes,
    batch 1 and 2."""
    import pipeline
    from pipeline.frontend import from_onnx
    from pipeline.transform import PassContext, optimize

    model = _grouped_attention()
    graph, params = from_onnx(model, symbolic=True)
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        optimized, _ = optimize(graph, params)
    (fused,) = [n for n in optimized.nodes if n.op == "attention"]
    assert {n.op for n in optimized.nodes} == {"attention", "concat"}, optimized.nodes
    assert fused.attr("group") == 2 and fused.attr("appended")
    assert fused.inputs == ("q", "past_k", "past_v", "k", "v")
    so = tmp_path / "gqa.so"
    pipeline.build(graph, TARGET, params=params, executor="vm",
                   dims={"batch": (1, 2), "seq": (1, 40), "past": (0, 80)}
                   ).export_library(str(so))
    vm, rng = VirtualMachine(str(so)), np.random.default_rng(6)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for batch, seq, past in ((1, 1, 70), (2, 37, 0), (2, 9, 61), (1, 40, 80)):
        feeds = {name: rng.standard_normal((batch, n, length, 16)).astype(np.float32)
                 for name, n, length in (("q", 4, seq), ("k", 2, seq), ("v", 2, seq),
                                         ("past_k", 2, past), ("past_v", 2, past))}
        for got, want in zip(vm.invoke("main", **feeds), session.run(None, feeds),
                             strict=True):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
