"""The executor's arena (weights and activations) from 2 MiB on asks for transparent
huge pages (runtime/c/executor.c arena_alloc): a batch-1 dense layer streams its
weights from memory, and on 4 KiB pages every page of them is a TLB miss (on a VM a
two-level page walk: a 144 MiB read ran at 12-21 GB/s, 30-34 GB/s on huge pages).
Checked where the kernel offers them to whoever asks (THP "always" or "madvise")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import pipeline
from pipeline.frontend import from_onnx
from pipeline.transform import PassContext
from tests.support import REPO
from tests.support.compare import TARGET, run_ort
from tests.support.onnx_models import make_model, rand

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


_PROBE = """
import sys
import os
import subprocess
import sys
from pathlib import Path
import numpy as np
from pipeline.runtime import GraphModule, load_module


def anon_huge_kib():
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


lib = load_module(sys.argv[1])
before = anon_huge_kib()
gm = GraphModule(lib["default"]())
print(anon_huge_kib() - before)
gm.run(a=np.load(sys.argv[2]))
np.save(sys.argv[3], gm.get_output(0))
"""


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="no transparent huge pages on this machine")
def test_large_arena_is_on_huge_pages(tmp_path):
    """In a fresh process (no earlier allocation to reuse), creating the executor of a
    library with 16 MiB of weights maps at least 8 MiB of them on huge pages."""
    k, n = 1024, 4096  # 16 MiB of weights
    inits = {"w": rand(n, k, seed=1), "b": rand(n, seed=2)}
    nodes = [helper.make_node("Gemm", ["a", "w", "b"], ["g"], transB=1),
             helper.make_node("Relu", ["g"], ["y"])]
    model = make_model(nodes, [("a", (1, k))], [("y", None)], inits)
    graph, params = from_onnx(model)
    with PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params)
    factory.export_library(tmp_path / "dense.so")
    feeds = {"a": rand(1, k, seed=3)}
    np.save(tmp_path / "a.npy", feeds["a"])
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path / "dense.so"),
                           str(tmp_path / "a.npy"), str(tmp_path / "y.npy")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    gained = int(proc.stdout.split()[-1])
    assert gained >= 8 << 10, f"{gained} KiB of huge pages for a 16 MiB arena"
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)
