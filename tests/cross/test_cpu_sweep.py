"""Every kernel we generate compiles at opt level 3 for the CPUs users build for.

The LLVM in the llvmlite wheel keeps its assertions, so a pass that trips one
on some CPU aborts the compiling process (LLVM 22's loop vectorizer did, on
znver4/znver5, for maxnum reductions). Here every compile runs in a worker
process with the loop-vectorizer fallback off (pipeline.codegen.compile), so an
abort fails only its CPU's case, listing every kernel that aborted, and the
sweep goes on. Compile only: no link, no run (aarch64 included).

Kernels: each op test case (CASES and DOUBLE_CASES of tests/support/op_cases, which
include the blocked conv/pool/dense kernels at opt level 3) and, marked slow,
the default models. Specs are lowered once per codegen class (triple and vector
width decide what lowering emits) and compiled once per distinct spec and CPU.
The QUICK CPUs compile every kernel; the others one kernel per code path (its
family, intrinsics, vector types and instructions: code_path), a model only the
paths the op cases lack -- the kernels of one path differ in shape constants.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import pytest

from pipeline.codegen.compile import CompileError, compile_ir
from pipeline.codegen.render import render
from pipeline.driver.build import lower_specs, unique_specs
from pipeline.errors import PipelineError
from pipeline.frontend import from_onnx
from pipeline.ir.target import Target, parse_target
from pipeline.transform import PassContext

X86, ARM = "x86_64-unknown-linux-gnu", "aarch64-linux-gnu"
CPUS = [(X86, cpu) for cpu in ("x86-64", "x86-64-v3", "haswell", "skylake-avx512",
                               "icelake-server", "sapphirerapids", "znver3", "znver4",
                               "znver5")] + [(ARM, "cortex-a76"), (ARM, "neoverse-v1")]
OP_MODULES = [f"tests.support.op_cases.{name}" for name in (
    "families", "conv", "elementwise", "index", "nn", "shape")]
DEFAULT_MODELS = ["mlp", "resnet18", "resnet50", "mobilenet_v2", "bert_encoder", "unet"]


def target_of(triple: str, cpu: str) -> Target:
    return parse_target(f"llvm -mtriple={triple} -mcpu={cpu}")


def op_models():
    for module in OP_MODULES:
        mod = importlib.import_module(module)
        for table in ("CASES", "DOUBLE_CASES"):
            for name, make in sorted(getattr(mod, table, {}).items()):
                yield f"{module}:{name}", make()[0]


@cache
def lowered_specs(source: str, triple: str, width: int) -> dict:
    """symbol -> KernelSpec for every kernel of `source` ("ops" or a model name),
    lowered for the first CPU of that (triple, vector width) class."""
    triple_cpus = [cpu for t, cpu in CPUS if t == triple]
    cpu = next(c for c in triple_cpus if target_of(triple, c).vector_width == width)
    target = target_of(triple, cpu)
    models = op_models() if source == "ops" else [(source, _default_model(source))]
    specs = {}
    for name, model in models:
        graph, params = from_onnx(model)
        with PassContext(opt_level=3):
            try:
                lowered = lower_specs(graph, params, target, 3)[3]  # (none rendered)
            except PipelineError as err:
                raise AssertionError(f"{name}: lowering for {cpu} failed: {err}") from err
        specs |= {s.symbol: s for s in unique_specs(lowered.values())}
    return specs


def _default_model(name: str):
    import models
    return models.build(name)


_OPCODE = re.compile(r"=\s+(?:(?:fast|nnan|nsw|nuw|exact|inbounds)\s+)*([a-z]+)")


def code_path(symbol: str, text: str) -> tuple:
    """What takes a kernel's IR down one path through LLVM's passes and instruction
    selection, its shape constants aside: the kernel family (the symbol's name before
    its hash), the intrinsics it calls, its vector types and its instructions."""
    return (symbol.rsplit("_", 1)[0], frozenset(re.findall(r'@"?(llvm\.[\w.]+)', text)),
            frozenset(re.findall(r"<\d+ x \w+>", text)), frozenset(_OPCODE.findall(text)))


@cache
def code_paths(source: str, triple: str, width: int) -> dict[str, tuple]:
    """symbol -> code_path of each kernel of `source` in that codegen class."""
    return {symbol: code_path(symbol, render(spec))
            for symbol, spec in lowered_specs(source, triple, width).items()}


@cache
def one_per_code_path(source: str, triple: str, width: int) -> frozenset[str]:
    """The kernels of `source` a CPU outside QUICK compiles: the first (by symbol) of
    each code path; of a model's, only paths no op case has."""
    seen = set() if source == "ops" else set(code_paths("ops", triple, width).values())
    chosen = set()
    for symbol, path in sorted(code_paths(source, triple, width).items()):
        if path not in seen:
            seen.add(path)
            chosen.add(symbol)
    return frozenset(chosen)


def aborted_kernels(source: str, triple: str, cpu: str) -> list[str]:
    """Compile the kernels of `source` for `cpu` (every one on a QUICK CPU, else
    one_per_code_path's); the CompileErrors, one per kernel."""
    target = target_of(triple, cpu)
    specs = lowered_specs(source, triple, target.vector_width)
    if cpu not in QUICK:
        chosen = one_per_code_path(source, triple, target.vector_width)
        specs = {symbol: spec for symbol, spec in specs.items() if symbol in chosen}
    specs = specs.values()

    def compile_one(spec):
        spec = dataclasses.replace(spec, target=target)
        try:
            compile_ir(render(spec), target, 3, name=spec.symbol, fallback=False)
        except CompileError as err:
            return str(err)
        return None

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return [e for e in pool.map(compile_one, sorted(specs, key=lambda s: s.symbol)) if e]


# Outside the slow set: the CPU that aborted, the baseline x86 and one aarch64.
QUICK = {"znver4", "x86-64", "cortex-a76"}


@pytest.mark.parametrize("triple, cpu", [
    pytest.param(t, c, marks=() if c in QUICK else pytest.mark.slow, id=c) for t, c in CPUS])
def test_op_kernels_compile_for_every_cpu(triple, cpu):
    failures = aborted_kernels("ops", triple, cpu)
    assert not failures, f"{len(failures)} kernels failed on {cpu}:\n" + "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("model", DEFAULT_MODELS)
@pytest.mark.parametrize("triple, cpu", CPUS, ids=[c for _, c in CPUS])
def test_default_model_kernels_compile_for_every_cpu(model, triple, cpu):
    failures = aborted_kernels(model, triple, cpu)
    assert not failures, f"{len(failures)} kernels failed on {cpu}:\n" + "\n".join(failures)
