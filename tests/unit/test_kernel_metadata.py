"""Per-kernel metadata (flops, bytes moved, stack scratch, constant bytes in every
library's graph JSON), checked against counts made independently from the ONNX
model, and the stack against the kernel's own IR, rendered once per build."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import helper

import pipeline.driver.build as build_module
from pipeline import build
from pipeline.codegen.render import render
from pipeline.frontend import from_onnx
from pipeline.lower.cost import stack_bytes
from pipeline.lower.kernel import KernelSpec
from pipeline.runtime import load_module
from pipeline.runtime.metadata import kernel_metadata
from pipeline.tasks import cache, paths, stages
from pipeline.transform import PassContext
from tests.support.compare import build_and_load
from tests.support.onnx_models import make_model, rand

node = helper.make_node
N, C, H, W, OC, CLASSES = 1, 3, 12, 12, 16, 10


def model():
    """conv(3->16, 3x3, bias) -> relu -> maxpool 2x2 -> flatten -> gemm(+bias)."""
    inits = {"w": rand(OC, C, 3, 3, seed=1), "b": rand(OC, seed=2),
             "fc": rand(CLASSES, OC * (H // 2) * (W // 2), seed=3), "fcb": rand(CLASSES)}
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             node("Relu", ["c"], ["r"]),
             node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Flatten", ["p"], ["f"]),
             node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1)]
    return make_model(nodes, [("x", (N, C, H, W))], [("y", None)], inits), inits


def onnx_flops() -> int:
    """The same rules as pipeline/lower/cost.py, applied to the ONNX nodes."""
    conv_out = N * OC * H * W
    conv = 2 * conv_out * C * 3 * 3 + conv_out          # multiply-adds + bias
    relu = conv_out
    pool = N * OC * (H // 2) * (W // 2) * 2 * 2           # one per window element
    k = OC * (H // 2) * (W // 2)
    gemm = 2 * N * CLASSES * k + N * CLASSES               # + bias
    return conv + relu + pool + gemm


@pytest.fixture(scope="module", params=[3, 0], ids=["opt3", "opt0"])
def built(request):
    onnx_model, inits = model()
    graph, params = from_onnx(onnx_model)
    gmod, factory = build_and_load(graph, params, opt_level=request.param)
    return factory, inits


def test_flops_match_the_onnx_count(built):
    factory, _ = built
    kernels = kernel_metadata(factory.get_graph_json())
    assert sum(k["flops"] * k["calls"] for k in kernels) == onnx_flops()


def test_constant_bytes_are_the_weights_read(built):
    factory, inits = built
    kernels = kernel_metadata(factory.get_graph_json())
    # At opt_level 0 the weights are the ONNX initializers; at 3 they are repacked
    # (the dense weight padded to whole vectors): the library's params then.
    expected = inits if _opt_level(factory) == 0 else factory.get_params()
    assert sum(k["constant_bytes"] for k in kernels) == sum(v.nbytes for v in expected.values())


def _opt_level(factory) -> int:
    return factory.kernels[0].opt_level


def test_bytes_moved_and_the_library_carries_it(built, tmp_path):
    factory, _ = built
    path = factory.export_library(str(tmp_path / "m.so"))
    from_library = kernel_metadata(load_module(path).graph_json)
    assert from_library == kernel_metadata(factory.get_graph_json())
    gemm = next(k for k in from_library if "dense" in k["symbol"])
    k = OC * (H // 2) * (W // 2)
    # x [1, k], the weight (k x CLASSES floats; packed into whole vectors at opt 3),
    # bias, output [1, CLASSES].
    weight = k * CLASSES if _opt_level(factory) == 0 else max(
        v.size for v in factory.get_params().values())
    assert gemm["bytes_moved"] == 4 * (k + weight + CLASSES + CLASSES)


def test_stack_bytes_counts_arrays_not_slots():
    ir = """
  %panel = alloca float, i64 2304, align 64
  %acc = alloca <16 x float>, align 64
  %args = alloca ptr, i32 2, align 8
  %tile = alloca [8 x double], i64 3
"""
    assert stack_bytes(ir) == 2304 * 4 + 2 * 8 + 3 * 64



def test_stack_bytes_are_the_kernels_own_ir(built):
    factory, _ = built
    kernels = {k["symbol"]: k for k in kernel_metadata(factory.get_graph_json())}
    assert all(type(k["stack_bytes"]) is int for k in kernels.values()), kernels
    # The GEMM keeps a tile (opt 0: its accumulator row; opt 3: the thread team's
    # argument block) on the stack: counted from the IR the spec renders to now.
    gemm = next(s for s in factory.kernels if "dense" in s.symbol)
    assert kernels[gemm.symbol]["stack_bytes"] == stack_bytes(render(gemm)) > 0
    for spec in factory.kernels:
        assert kernels[spec.symbol]["stack_bytes"] == stack_bytes(render(spec))


def counting_render(monkeypatch) -> list[str]:
    """Count the renders of pipeline.driver.build (lowering's and compile's)."""
    rendered = []

    def counted(spec):
        rendered.append(spec.hash)
        return render(spec)
    monkeypatch.setattr(build_module, "render", counted)
    return rendered


def test_build_renders_each_kernel_once(monkeypatch):
    rendered = counting_render(monkeypatch)
    graph, params = from_onnx(model()[0])
    with PassContext(opt_level=0):
        factory = build(graph, params=params, opt_level=0)
    assert sorted(rendered) == sorted(s.hash for s in factory.kernels)
    assert set(factory.objects) == {s.symbol for s in factory.kernels}


def test_optimize_renders_once_and_the_kernel_compile_uses_its_ir(tmp_path, monkeypatch):
    """The doit stages called directly: optimize writes each kernel's IR beside its
    spec; compile_entry compiles that text (rendering would fail); a second
    optimize reads the IR it finds (out/specs, else the kernel cache)."""
    onnx.save(model()[0], str(tmp_path / "m.onnx"))
    ir, weights = str(tmp_path / "m.ir.json"), str(tmp_path / "m.weights.params")
    stages.import_model(str(tmp_path / "m.onnx"), {}, ir, weights)
    target = {"target": "llvm -mcpu=native", **PassContext(opt_level=0).pass_config.to_dict()}
    specs, root = tmp_path / "specs", str(tmp_path / "kernels")

    def optimize(tag: str) -> list[dict]:
        outs = [str(tmp_path / f"{tag}{suffix}") for suffix in (".json", ".params", ".k.json")]
        stages.optimize_model(ir, weights, target, str(specs), *outs, root)
        return json.loads(open(outs[2]).read())["kernels"]

    rendered = counting_render(monkeypatch)
    kernels = optimize("first")
    assert sorted(rendered) == sorted(k["hash"] for k in kernels)
    for k in kernels:
        spec = KernelSpec.from_json((specs / f"{k['hash']}.json").read_text())
        text = (specs / f"{k['hash']}.ll").read_text()
        assert text == render(spec) and k["stack_bytes"] == stack_bytes(text)
    assert any(k["stack_bytes"] > 0 for k in kernels if "dense" in k["symbol"])

    def no_render(spec):
        raise AssertionError(f"rendered {spec.symbol} again")
    monkeypatch.setattr(build_module, "render", no_render)
    for k in kernels:
        spec = paths.spec_path(str(specs), k["hash"])
        assert cache.compile_entry(root, k["hash"], spec)["compiled"] is True
        assert cache.is_valid(root, k["hash"])
        assert open(cache.entry_path(root, k["hash"], ".ll")).read() == open(
            paths.ir_path(spec)).read()
    assert optimize("again") == kernels  # the IR in out/specs
    for p in specs.glob("*.ll"):
        p.unlink()
    assert optimize("cached") == kernels  # the IR of the kernel cache's valid entries
    assert all((specs / f"{k['hash']}.ll").exists() for k in kernels)
