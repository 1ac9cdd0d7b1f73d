"""The c target on this machine: every kernel rendered as for LLVM, translated to
C99 (pipeline/codegen/c_source.py) and built by the host's compiler into the graph
executor's .so; the default models and every operator family against onnxruntime,
the C warning-free with `-std=c99 -O2 -Wall` (also under arm-none-eabi-gcc), the same
bytes when built again, and the kernel cache keyed by the compiler."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import pipeline
from models import build as build_model
from pipeline.codegen.c_source import CFLAGS, CSourceError, c_object, c_source
from pipeline.driver.build import lower_graph
from pipeline.ir.target import parse_target
from pipeline.lower.kernel import KernelSpec
from pipeline.transform import PassContext
from tests.support.aot_models import kws_cnn, quantized, tiny_cnn
from tests.support.compare import assert_matches_ort, run_graph, run_ort, run_ours
from tests.support.op_cases.families import CASES, DOUBLE_CASES

pytest.importorskip("onnxruntime")
# The C compiles without a warning: a CompileWarning (the compiler's) fails the test.
pytestmark = pytest.mark.filterwarnings("error::pipeline.codegen.compile.CompileWarning")

C = "c"
M4C = "c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4"


def _inputs(model: onnx.ModelProto, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == TensorProto.FLOAT:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        else:  # token ids
            feeds[i.name] = rng.integers(0, 100, shape).astype(np.int64)
    return feeds


def _lowered(model: onnx.ModelProto, target: str, cc: str | None = None):
    graph, params = pipeline.frontend.from_onnx(model)
    with PassContext(opt_level=3):
        return lower_graph(graph, params, parse_target(target, cc), 3, None)


# resnet50 is not among them: its kernels are the families resnet18's are (7x7/3x3/1x1
# convolutions with their strides, pools, Gemm), which the C translation sees as
# the same IR at other sizes; the LLVM target validates it (tests/build_system).
@pytest.mark.parametrize("name", [
    "mlp", "bert_encoder", "unet",
    pytest.param("resnet18", marks=pytest.mark.slow),
    pytest.param("mobilenet_v2", marks=pytest.mark.slow)])
def test_default_models_match_onnxruntime(name: str):
    model = build_model(name, {})
    rtol = 1e-3 if name in ("bert_encoder", "unet") else 1e-4
    assert_matches_ort(model, _inputs(model), target=C, rtol=rtol, atol=1e-4)


@pytest.mark.parametrize("case", sorted(CASES))
def test_operator_families_match_onnxruntime(case: str):
    model, feeds = CASES[case]()
    assert_matches_ort(model, feeds, target=C)


@pytest.mark.parametrize("case", sorted(set(DOUBLE_CASES) - {"hardmax"}))
def test_float64_families_match_onnxruntime(case: str):
    model, feeds = DOUBLE_CASES[case]()
    for got, want in zip(run_ours(model, feeds, target=C), run_ort(model, feeds), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_half_conversions_round_to_nearest_even():
    """float32 -> float16 -> float32 through the C helpers (pl_f2h, pl_h2f): every
    class of value, subnormals, ties and overflow included, against numpy."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
         helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)], "half", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(5)
    values = np.concatenate([
        rng.standard_normal(1024) * 10.0 ** rng.integers(-9, 6, 1024),
        np.arange(65536, step=32, dtype=np.uint16).view(np.float16).astype(np.float64),
        (np.arange(1024, dtype=np.float64) + 0.5) * 2.0 ** -24,   # subnormal ties
        np.full(1024, 65520.0) * rng.choice([-1, 1], 1024)])[:4096]
    with np.errstate(invalid="ignore"):
        values = values.clip(-1e30, 1e30).astype(np.float32)
    values[:3] = [np.inf, -np.inf, np.nan]
    graph, params = pipeline.frontend.from_onnx(model)
    (got,) = run_graph(graph, params, {"x": values}, target=C)
    with np.errstate(over="ignore"):  # numpy's cast to float16 overflows to inf, as ours
        want = values.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cc,target", [("gcc", C), ("arm-none-eabi-gcc", M4C)])
def test_kernels_compile_without_warnings(cc: str, target: str):
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    flags = ["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard"] if "thumb" in target else []
    for model in (tiny_cnn(), quantized(kws_cnn()), build_model("bert_encoder", {})):
        lowered = _lowered(model, target, cc)
        for text in lowered.ir.values():
            proc = subprocess.run([cc, *CFLAGS, "-Wextra", "-Wno-unused-parameter", *flags,
                                   "-Werror", "-x", "c", "-c", "-", "-o", "/dev/null"],
                                  input=c_source(text), capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[:2000]


def test_c_is_byte_stable_and_objects_rebuild_identical():
    lowered = _lowered(tiny_cnn(), C)
    spec = next(iter(lowered.specs.values()))
    text = lowered.ir[spec.hash]
    assert c_source(text) == c_source(text)
    assert c_object(text, spec.target, spec.symbol) == c_object(text, spec.target, spec.symbol)
    assert "#include <math.h>" in c_source(text) and "__attribute__" not in c_source(text)


def test_kernel_hash_names_the_target_kind_and_the_compiler():
    """The c target's kernels differ from LLVM's; the compiler command and version
    enter the hash (the kernel cache key), and a spec read back is the same spec."""
    llvm_spec = next(iter(_lowered(tiny_cnn(), "llvm -mcpu=generic").specs.values()))
    c_spec = next(iter(_lowered(tiny_cnn(), C).specs.values()))
    assert c_spec.target.kind == "c" and c_spec.target.cc and c_spec.target.cc_version
    assert "+c" in c_spec.version and "+c" not in llvm_spec.version
    assert KernelSpec.from_json(c_spec.to_json()) == c_spec
    other = replace(c_spec, target=replace(c_spec.target, cc="clang"))
    newer = replace(c_spec, target=replace(c_spec.target, cc_version="0" * 16))
    assert len({c_spec.hash, other.hash, newer.hash}) == 3
    assert "kind" not in llvm_spec.to_json()  # LLVM kernels' hashes are as before


def test_c_target_kernels_are_single_threaded():
    for text in _lowered(build_model("mlp", {}), C).ir.values():
        for name in ("GOMP_parallel", "omp_get_max_threads", "pl_parallel", "atomicrmw"):
            assert name not in text


def test_parallel_copy_of_phis_and_unsupported_ir(tmp_path: Path):
    """Phis that read each other (a swap) are assigned through temporaries; what the
    translation does not handle fails naming the instruction."""
    swap = """define i32 @k(ptr %args) {
entry:
  br label %loop
loop:
  %a = phi i32 [ 1, %entry ], [ %b, %loop ]
  %b = phi i32 [ 2, %entry ], [ %a, %loop ]
  %i = phi i64 [ 0, %entry ], [ %n, %loop ]
  %n = add i64 %i, 1
  %c = icmp slt i64 %n, 3
  br i1 %c, label %loop, label %done
done:
  %r = sub i32 %a, %b
  ret i32 %r
}
"""
    source = c_source(swap)
    assert "_t = " in source
    exe = tmp_path / "swap"
    main = source + "int main(void) { return k((void *)0) == -1 ? 0 : 1; }\n"
    subprocess.run(["gcc", *CFLAGS, "-x", "c", "-", "-o", str(exe), "-lm"], input=main,
                   text=True, check=True)
    # (a, b) is (1, 2), then swapped on each of the two back edges: a - b == -1
    assert subprocess.run([str(exe)]).returncode == 0
    atomic = "define void @k(ptr %p) {\n  %x = atomicrmw add ptr %p, i64 1 monotonic\n" \
             "  ret void\n}\n"
    with pytest.raises(CSourceError, match="atomicrmw"):
        c_source(atomic)


def test_c_target_needs_a_compiler_off_this_machine():
    spec = next(iter(_lowered(tiny_cnn(), M4C).specs.values()))
    with pytest.raises(CSourceError, match="needs its C compiler"):
        c_object("", spec.target, spec.symbol)


def test_vector_lanes_shuffles_and_signed_integers(tmp_path: Path):
    """Lane by lane: a shuffle of a vector with an i32 vector constant (the mask is the
    last operand), an inserted and an extracted lane, a sign extension of i1 and a
    signed division, run and checked in C."""
    mask = "<4 x i32> <i32 4, i32 0, i32 7, i32 3>"
    ir = """define void @k(ptr %p) {
entry:
  %v = load <4 x i32>, ptr %p, align 4
  %s = shufflevector <4 x i32> %v, <4 x i32> <i32 9, i32 8, i32 7, i32 6>, MASK
  %e = extractelement <4 x i32> %s, i32 1
  %i = insertelement <4 x i32> %s, i32 %e, i32 2
  store <4 x i32> %i, ptr %p, align 4
  %c = icmp slt i32 %e, 0
  %m = sext i1 %c to i32
  %d = sdiv i32 %e, -2
  %q = getelementptr inbounds i32, ptr %p, i64 4
  store i32 %m, ptr %q, align 4
  %r = getelementptr inbounds i32, ptr %p, i64 5
  store i32 %d, ptr %r, align 4
  ret void
}
""".replace("MASK", mask)
    main = c_source(ir) + """#include <stdio.h>
int main(void) {
    int32_t x[6] = {-5, 1, 2, 3, 0, 0};
    k(x);
    printf("%d %d %d %d %d %d\\n", x[0], x[1], x[2], x[3], x[4], x[5]);
    return 0;
}
"""
    exe = tmp_path / "lanes"
    subprocess.run(["gcc", *CFLAGS, "-Werror", "-x", "c", "-", "-o", str(exe), "-lm"],
                   input=main, text=True, check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    # s = [9, -5, 6, 3]; lane 2 <- s[1] = -5; -5 < 0 -> -1; -5 / -2 -> 2 (toward zero)
    assert out.split() == ["9", "-5", "-5", "3", "-1", "2"]
