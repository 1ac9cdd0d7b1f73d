"""Which sources each doit task and each kernel version depend on, derived from
the code (pipeline/tasks/deps.py, pipeline/lower/sources.py). The rebuilds these
lists cause are tested through real doit in test_incremental.py."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from pipeline.lower.kernel import kernel_version, version_sources
from pipeline.lower.sources import PKG, kernel_view
from pipeline.ops import OPS, get
from pipeline.tasks import make_tasks
from pipeline.tasks.config import ModelEntry, TargetEntry


@pytest.fixture(scope="module")
def file_deps() -> dict[str, set[str]]:
    """Task kind -> its file_dep (paths relative to pipeline/) for one model x target."""
    tasks = make_tasks(None, [ModelEntry("m", Path("m.onnx"), None)],
                       [TargetEntry("t", "llvm -mcpu=native")])
    found = {}
    for kind in ("import", "optimize", "lib0", "devc", "export", "validate"):
        (task,) = tasks[f"task_{kind}"]()
        found[kind] = {os.path.relpath(os.path.abspath(p), PKG) for p in task["file_dep"]
                       if os.path.abspath(p).startswith(str(PKG))}
    return found


def test_each_task_lists_the_code_its_stage_runs(file_deps):
    expect = {
        "import": {"tasks/stages.py", "frontend/onnx.py", "ops/elementwise.py", "ops/conv.py",
                   "ops/registry.py", "ir/graph.py", "runtime/params.py", "files.py"},
        "optimize": {"tasks/stages.py", "transform/passes.py", "transform/fuse.py",
                     "transform/layout.py", "driver/build.py", "lower/kernel.py",
                     "plan/plan_memory.py", "ops/pool.py", "codegen/render.py",
                     "codegen/compile.py", "dsl/vector.py", "lower/sources.py"},
        "lib0": {"tasks/stages.py", "link/cc.py", "tasks/cache.py"},
        "devc": {"tasks/stages.py", "link/blob.py", "link/elf.py"},
        "export": {"tasks/stages.py", "link/cc.py"},
        "validate": {"tools/validate.py", "runtime/module.py", "runtime/graph_executor.py"},
    }
    for kind, files in expect.items():
        assert files <= file_deps[kind], (kind, files - file_deps[kind])


def test_tasks_do_not_list_code_they_do_not_run(file_deps):
    def under(kind, *folders):
        return {f for f in file_deps[kind] if f.startswith(folders)}

    assert not under("import", "transform/", "codegen/", "driver/", "tools/")
    assert not under("optimize", "frontend/", "tools/")
    # Linking and packing never run the compiler: lib0 stops at the kernel
    # compile that a corrupted cache entry triggers (the spec hash covers it).
    for kind in ("lib0", "devc", "export"):
        assert not under(kind, "ops/", "codegen/", "dsl/", "transform/", "frontend/",
                         "driver/build.py", "tools/"), kind
    assert not under("validate", "ops/", "codegen/", "transform/", "tasks/")


def _kernel_files(*ops: str) -> set[str]:
    """The files entering the version of a kernel made of `ops`."""
    return {str(Path(*m.split(".")[1:]).with_suffix(".py")) for m in version_sources(ops)}


def test_kernel_versions_cover_generator_and_own_families_only():
    for op in OPS:
        files = _kernel_files(op)
        assert {"codegen/render.py", "codegen/compile.py", "lower/kernel.py",
                "dsl/builder.py", "ops/registry.py"} <= files, op
        assert not [f for f in files if f.startswith(("tools/", "runtime/", "tasks/",
                                                       "frontend/", "transform/", "link/",
                                                       "driver/"))], (op, files)
    pool = _kernel_files("max_pool2d")
    assert "ops/pool.py" in pool and "ops/nn.py" in pool and "ops/linalg.py" not in pool
    dense = _kernel_files("dense", "add", "relu")
    assert {"ops/linalg.py", "ops/elementwise.py", "ops/unary.py",
            "dsl/gemm_tile.py"} <= dense
    assert not {"ops/pool.py", "ops/conv.py", "ops/shape.py"} & dense
    assert _kernel_files("conv2d_nchwc") >= {"ops/conv_blocked.py", "dsl/vector.py"}
    # The version follows the operator set, not the order or repetitions.
    assert kernel_version(("dense", "add")) == kernel_version(("add", "dense", "add"))
    assert kernel_version(("dense",)) != kernel_version(("max_pool2d",))


def test_a_wrapped_lowering_counts_the_module_it_wraps():
    # max_pool1d's lowering is nn.as_1d's closure around pool.py's 2-D lowering.
    assert get("max_pool1d").lower.__module__ == "pipeline.ops.nn"
    assert {"ops/nn.py", "ops/pool.py"} <= _kernel_files("max_pool1d")
    assert "ops/pool.py" not in _kernel_files("conv1d")


def _defined(tree: ast.Module) -> set[str]:
    return {s.name for s in tree.body if isinstance(s, ast.FunctionDef)}


def test_kernel_view_drops_converters_and_what_only_they_use():
    for module in ("pipeline.ops.elementwise", "pipeline.ops.linalg", "pipeline.ops.pool",
                   "pipeline.ops.registry"):
        text = ast.unparse(kernel_view(module))
        assert "onnx_op" not in text, module
    pool = _defined(kernel_view("pipeline.ops.pool"))
    assert {"_pool_lower", "_global_pool_lower", "_pool_infer"} <= pool
    assert not {"_pool_converter", "_global_converter"} & pool  # converter factories
    assert "_gemm" not in _defined(kernel_view("pipeline.ops.linalg"))
    assert "_cast" not in _defined(kernel_view("pipeline.ops.elementwise"))
    # nn.py registers nothing: it keeps what other families' lowerings import
    # from it (as_1d), not what only their converters do (spatial_attrs).
    nn = _defined(kernel_view("pipeline.ops.nn"))
    assert "as_1d" in nn and "spatial_attrs" not in nn
    assert "need_const" not in _defined(kernel_view("pipeline.ops.shape"))
    assert "register" in _defined(kernel_view("pipeline.ops.registry"))
