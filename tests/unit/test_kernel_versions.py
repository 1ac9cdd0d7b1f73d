"""A kernel's version hashes the kernels modules that lower its operators (with what
they import) and the code generator: editing a copy of the package and counting the
per-operator versions that change shows which edits recompile which kernels."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

_VERSIONS = """
import json
from pipeline.lower.kernel import kernel_version
from pipeline.ops import OPS
print(json.dumps({op: kernel_version((op,)) for op in sorted(OPS)}))
"""


def _versions(root: Path) -> dict[str, str]:
    """Every operator's kernel version computed from the package copy at `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", _VERSIONS], cwd=root, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A copy of pipeline/ and its versions before any edit."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(REPO / "pipeline", root / "pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root, _versions(root)


def _changed_after(copy, rel: str, old: str, new: str) -> set[str]:
    """The operators whose kernel version changes when `old` becomes `new` in the
    file `rel` (under pipeline/) of the copy; the file is restored after."""
    root, before = copy
    path = root / "pipeline" / rel
    text = path.read_text()
    assert text.count(old) == 1, (rel, old)
    try:
        path.write_text(text.replace(old, new))
        after = _versions(root)
    finally:
        path.write_text(text)
    assert set(after) == set(before)
    return {op for op in before if after[op] != before[op]}


def test_a_converter_edit_recompiles_no_kernel(copy):
    assert not _changed_after(copy, "frontend/onnx/pool.py", "def _pool_converter(kind: str):",
                              "def _pool_converter(kind: str):\n    assert kind")


def test_a_numpy_reference_edit_recompiles_no_kernel(copy):
    assert not _changed_after(copy, "ops/elementwise.py",
                              "np.where(xs[0] < 0, xs[0] * xs[1], xs[0])",
                              "np.where(xs[0] <= 0, xs[0] * xs[1], xs[0])")


def test_a_sample_input_edit_recompiles_no_kernel(copy):
    assert not _changed_after(copy, "ops/pool.py", "rng.uniform(-2, 2, (2, 3, 4, 5))",
                              "rng.uniform(-3, 3, (2, 3, 4, 5))")


def test_a_lowering_edit_recompiles_only_its_familys_kernels(copy):
    changed = _changed_after(copy, "kernels/pool.py",
                             "def _global_pool_lower(kb, node, ins, out, epilogue):",
                             "def _global_pool_lower(kb, node, ins, out, epilogue):\n"
                             "    assert kb is not None")
    # pool.py's ops, and the blocked pooling that imports its int8 helpers
    assert changed == {op for op in copy[1] if "pool" in op}
