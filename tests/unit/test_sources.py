"""Which sources each doit task and each kernel version depend on, derived from
the code (pipeline/tasks/deps.py, pipeline/lower/sources.py). The rebuilds these
lists cause are tested through real doit in test_incremental.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.kernels import lowering_of
from pipeline.lower.kernel import kernel_version, version_sources
from pipeline.lower.sources import PKG
from pipeline.ops import OPS
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
        "import": {"tasks/stages.py", "frontend/onnx/importer.py", "frontend/onnx/conv.py",
                   "ops/elementwise.py", "ops/conv.py",
                   "ops/registry.py", "ir/graph.py", "runtime/params.py", "files.py"},
        "optimize": {"tasks/stages.py", "transform/passes.py", "transform/fuse.py",
                     "transform/layout.py", "driver/build.py", "lower/kernel.py",
                     "plan/plan_memory.py", "kernels/pool.py", "codegen/render.py",
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
        assert not under(kind, "ops/", "kernels/", "codegen/", "dsl/", "transform/", "frontend/",
                         "driver/build.py", "tools/"), kind
    assert not under("validate", "ops/", "kernels/", "codegen/", "transform/", "tasks/")


# ops/ modules kernels may import: helpers shared with shape rules, no numpy reference.
SHARED = {"ops/geometry.py", "ops/index_tables.py", "ops/movement_tables.py",
          "ops/recurrent_layout.py", "ops/resize_taps.py", "ops/registry.py"}


def _kernel_files(*ops: str) -> set[str]:
    """The files entering the version of a kernel made of `ops`."""
    return {str(Path(*m.split(".")[1:]).with_suffix(".py")) for m in version_sources(ops)}


def test_kernel_versions_cover_generator_and_own_families_only():
    for op in OPS:
        files = _kernel_files(op)
        assert {"codegen/render.py", "codegen/compile.py", "lower/kernel.py",
                "dsl/builder.py", "kernels/registry.py"} <= files, op
        assert not [f for f in files if f.startswith(("tools/", "runtime/", "tasks/",
                                                       "frontend/", "transform/", "link/",
                                                       "driver/"))], (op, files)
    pool = _kernel_files("max_pool2d")
    assert "kernels/pool.py" in pool and "kernels/linalg.py" not in pool
    dense = _kernel_files("dense", "add", "relu")
    assert {"kernels/linalg.py", "kernels/elementwise.py", "kernels/unary.py",
            "dsl/gemm_tile.py"} <= dense
    assert not {"kernels/pool.py", "kernels/conv.py", "kernels/shape.py"} & dense
    assert _kernel_files("conv2d_nchwc") >= {"kernels/conv_blocked.py", "dsl/vector.py"}
    # The version follows the operator set, not the order or repetitions.
    assert kernel_version(("dense", "add")) == kernel_version(("add", "dense", "add"))
    assert kernel_version(("dense",)) != kernel_version(("max_pool2d",))


def test_a_wrapped_lowering_counts_the_module_that_registered_it():
    # max_pool1d's lowering is kernels/windows.py's lower_1d around pool.py's 2-D lowering,
    # registered by kernels/pool.py (which imports nn.py).
    assert lowering_of("max_pool1d").module == "pipeline.kernels.pool"
    assert {"kernels/windows.py", "kernels/pool.py"} <= _kernel_files("max_pool1d")
    assert "kernels/pool.py" not in _kernel_files("conv1d")


def test_kernel_versions_never_include_definitions_or_converters():
    for op in OPS:
        files = _kernel_files(op)
        defs = {f for f in files if f.startswith("ops/") and f not in SHARED}
        assert not defs, (op, defs)
