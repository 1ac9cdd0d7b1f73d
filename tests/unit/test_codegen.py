"""KernelSpec identity (hash, symbol, JSON), LLVM IR rendering, object emission
and target parsing."""

from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from onnx import helper

from pipeline.codegen.compile import compile_ir, optimize_ir
from pipeline.codegen.render import render
from pipeline.driver.build import lower_graph
from pipeline.frontend import from_onnx
from pipeline.ir.target import TargetError, parse_target
from pipeline.lower.kernel import KernelSpec, kernel_spec
from pipeline.transform import PassContext, optimize
from tests.support.compare import assert_matches_ort
from tests.support.onnx_models import make_model, rand

node = helper.make_node
NATIVE = parse_target("llvm -mcpu=native")


def conv_model(x_shape=(1, 4, 8, 8), pads=(1, 1, 1, 1), seed=1, prefix="", after=None):
    """x -> Conv [-> after]; names carry `prefix` so two models differ in naming."""
    p = prefix
    nodes = [node("Conv", [f"{p}x", f"{p}w", f"{p}b"], [f"{p}c"], name=f"{p}conv",
                  pads=list(pads))]
    out = f"{p}c"
    if after:
        nodes.append(node(after, [out], [f"{p}y"], name=f"{p}after",
                          **({"kernel_shape": [2, 2]} if after == "MaxPool" else {})))
        out = f"{p}y"
    inits = {f"{p}w": rand(4, x_shape[1], 3, 3, seed=seed), f"{p}b": rand(4, seed=seed + 1)}
    return make_model(nodes, [(f"{p}x", x_shape)], [(out, None)], inits)


def conv_spec(target=NATIVE, opt_level=3, **kw) -> KernelSpec:
    graph, _ = from_onnx(conv_model(**kw))
    return kernel_spec(graph.nodes[0], graph, target, opt_level)


def test_spec_hash_is_stable_for_equal_specs():
    a, b = conv_spec(), conv_spec(seed=5, prefix="other_")  # weights, names differ
    assert a == b
    assert a.hash == b.hash
    assert re.fullmatch(r"[0-9a-f]{20}", a.hash)


@pytest.mark.parametrize("change", [
    {"x_shape": (1, 4, 9, 8)},
    {"pads": (0, 0, 0, 0)},
    {"target": parse_target("llvm -mcpu=haswell")},
    {"target": parse_target("llvm -mcpu=native -mattr=-avx2")},
    {"opt_level": 2},
])
def test_spec_hash_changes_with_what_decides_code(change):
    assert conv_spec(**change).hash != conv_spec().hash


def test_same_conv_layer_in_two_models_shares_a_kernel():
    def specs(model):
        graph, params = from_onnx(model)
        with PassContext(opt_level=3):
            lowered = lower_graph(graph, params, NATIVE, 3)
        return {s.name: s.hash for s in lowered.specs.values()}

    a = specs(conv_model(after="MaxPool"))
    b = specs(conv_model(after="GlobalAveragePool", seed=9, prefix="net2_"))
    assert set(a) == {"conv2d", "max_pool2d"} and set(b) == {"conv2d", "global_avg_pool"}
    assert a["conv2d"] == b["conv2d"]


def test_symbol_embeds_hash():
    spec = conv_spec()
    assert spec.symbol == f"{spec.name}_{spec.hash}"
    assert spec.hash in render(spec)


def test_spec_json_round_trip():
    with PassContext(opt_level=3):
        fused, _ = optimize(*from_onnx(conv_model(after="Relu")))
    spec = kernel_spec(fused.nodes[0], fused, NATIVE, 3)
    assert [n.op for n in spec.ops] == ["conv2d", "relu"]
    again = KernelSpec.from_json(spec.to_json())
    assert again == spec
    assert again.hash == spec.hash and again.symbol == spec.symbol


def test_rendered_ir_parses_and_verifies():
    spec = conv_spec()
    text = render(spec)
    module = llvm.parse_assembly(text)
    module.verify()
    assert module.get_function(spec.symbol) is not None


def test_ir_uses_opaque_pointers_and_gep():
    text = render(conv_spec())
    assert "getelementptr" in text
    assert re.search(r"\bptr\b", text)
    assert "inttoptr" not in text and "ptrtoint" not in text
    assert not re.search(r"(float|i8|i32|i64)\*", text)  # no typed pointers


def test_compile_ir_emits_elf_relocatable():
    spec = conv_spec()
    obj = compile_ir(render(spec), spec.target, spec.opt_level)
    assert obj[:4] == b"\x7fELF"
    assert int.from_bytes(obj[16:18], "little") == 1  # e_type ET_REL
    assert spec.symbol.encode() in obj


def test_haswell_target_uses_avx2_only():
    spec = conv_spec(target=parse_target("llvm -mcpu=haswell"))
    assert spec.target.cpu == "haswell" and spec.target.vector_width == 8
    module = optimize_ir(render(spec), spec.target, 3)
    asm = spec.target.target_machine(3).emit_assembly(module)
    assert "ymm" in asm
    assert "zmm" not in asm


def test_haswell_target_builds_and_runs():
    pytest.importorskip("onnxruntime")
    if "avx2" not in llvm.get_host_cpu_features().flatten():
        pytest.skip("host has no AVX2")
    model = conv_model(after="Relu")
    assert_matches_ort(model, {"x": rand(1, 4, 8, 8)}, target="llvm -mcpu=haswell")


@pytest.mark.parametrize("text", [
    "llvm -mfoo=bar",
    "llvm -mcpu",
    "llvm --mcpu=haswell",
    "cuda",
    "c -mcpu=native",
    "c -mattr=+avx2",
    "",
    "llvm -mattr=avx2",
    "llvm -mtriple=nonsense-unknown-nowhere",
])
def test_parse_target_errors(text):
    with pytest.raises(TargetError):
        parse_target(text)


def test_parse_target_native_resolves_cpu():
    t = parse_target("llvm -mcpu=native -mattr=-avx512f")
    assert t.cpu == llvm.get_host_cpu_name() != "native"
    assert "-avx512f" in t.features.split(",")
    assert t.key() == {"triple": t.triple, "cpu": t.cpu, "features": t.features}


def test_spec_params_are_types_only():
    spec = conv_spec()
    assert [p.shape for p in spec.params] == [(1, 4, 8, 8), (4, 4, 3, 3), (4,), (1, 4, 8, 8)]
    assert not any(isinstance(p, np.ndarray) for p in spec.params)
