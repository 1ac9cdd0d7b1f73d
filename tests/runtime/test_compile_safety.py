"""An LLVM abort never takes down the caller (pipeline.codegen.compile).

The llvmlite wheel's LLVM 22 aborts on a loop-carried maxnum reduction of 121
floats compiled for znver4/znver5 (its loop vectorizer's two cost models
disagree). Our code generator no longer emits that pattern (the CPU sweep,
tests/cross/test_cpu_sweep.py, shows it for every kernel), so these tests feed the
raw IR to the compile step to exercise the worker, the fallback and the error.
"""

from __future__ import annotations

import hashlib
import warnings

import pytest

from pipeline.codegen.compile import CompileError, CompileWarning, compile_ir
from pipeline.ir.target import parse_target
from pipeline.tasks import cache

ZNVER5 = parse_target("llvm -mcpu=znver5")

MAXNUM_REDUCTION = """
define float @maxnum_reduction(ptr noalias %p) {
entry:
  br label %head
head:
  %k = phi i64 [0, %entry], [%kn, %body]
  %acc = phi float [0xfff0000000000000, %entry], [%m, %body]
  %c = icmp slt i64 %k, 121
  br i1 %c, label %body, label %exit
body:
  %g = getelementptr inbounds float, ptr %p, i64 %k
  %x = load float, ptr %g
  %m = call float @llvm.maxnum.f32(float %acc, float %x)
  %kn = add i64 %k, 1
  br label %head
exit:
  ret float %acc
}
declare float @llvm.maxnum.f32(float, float)
"""

NO_LONGER_ABORTS = ("this LLVM no longer aborts on the maxnum reduction: pick a new "
                    "trigger for these tests, or drop the fallback")


def test_abort_without_fallback_is_one_error_naming_kernel_target_and_llvm():
    with pytest.raises(CompileError) as err:
        compile_ir(MAXNUM_REDUCTION, ZNVER5, 3, name="maxnum_reduction", fallback=False)
    message = str(err.value)
    assert "\n" not in message
    assert "kernel maxnum_reduction for znver5" in message
    assert "LoopVectorize.cpp" in message and "cost model" in message
    # We are still here, and the next compile gets a fresh worker.
    assert compile_ir(MAXNUM_REDUCTION, parse_target("llvm -mcpu=haswell"))[:4] == b"\x7fELF"


def test_abort_falls_back_to_the_loop_vectorizer_off_and_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = compile_ir(MAXNUM_REDUCTION, ZNVER5, 3, name="maxnum_reduction")
    notes = [str(w.message) for w in caught if w.category is CompileWarning]
    assert notes, NO_LONGER_ABORTS
    assert "maxnum_reduction for znver5" in notes[0]
    assert "compiled with the loop vectorizer off" in notes[0]
    assert obj[:4] == b"\x7fELF" and b"maxnum_reduction" in obj


def test_ir_llvm_rejects_is_a_compile_error():
    with pytest.raises(CompileError, match="LLVM rejected the IR"):
        compile_ir("define i32 @f() {\n  ret i64 0\n}\n", ZNVER5)


def test_threads_compile_at_once_on_separate_workers():
    from concurrent.futures import ThreadPoolExecutor

    haswell = parse_target("llvm -mcpu=haswell")
    with ThreadPoolExecutor(4) as pool:
        objs = list(pool.map(lambda _: compile_ir(MAXNUM_REDUCTION, haswell), range(8)))
    assert len({hashlib.sha256(o).hexdigest() for o in objs}) == 1


def test_kernel_cache_entry_records_the_fallback_note(tmp_path, monkeypatch):
    """The doit kernel task's value carries the note the build output prints."""
    from onnx import helper

    from pipeline.driver import build as build_module
    from pipeline.frontend import from_onnx
    from pipeline.transform import PassContext
    from tests.support.onnx_models import make_model

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [121])],
                       [("y", [121])])
    graph, params = from_onnx(model)
    with PassContext(opt_level=3):
        spec = next(iter(build_module.lower_graph(graph, params, ZNVER5, 3).specs.values()))
    (tmp_path / f"{spec.hash}.json").write_text(spec.to_json())
    # The spec is real; its rendering is swapped for the IR LLVM aborts on.
    monkeypatch.setattr(build_module, "render", lambda s: MAXNUM_REDUCTION)
    result = cache.compile_entry(str(tmp_path), spec.hash)
    assert result["compiled"] is True
    assert "loop vectorizer off" in result.get("note", ""), NO_LONGER_ABORTS
    assert cache.is_valid(str(tmp_path), spec.hash)
