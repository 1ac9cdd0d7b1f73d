"""The executor's arena (weights and activations) from 2 MiB on asks for transparent
huge pages (runtime/c/executor.c arena_alloc): a batch-1 dense layer streams its
weights from memory, and on 4 KiB pages every page of them is a TLB miss (on a VM a
two-level page walk: a 144 MiB read ran at 12-21 GB/s, 30-34 GB/s on huge pages).
Checked where the kernel offers them to whoever asks (THP "always" or "madvise")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from pipeline.frontend import from_onnx
from tests.support.compare import build_and_load, run_ort
from tests.support.onnx_models import make_model, rand

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="no transparent huge pages on this machine")
def test_large_arena_is_on_huge_pages():
    k, n = 1024, 4096  # 16 MiB of weights
    inits = {"w": rand(n, k, seed=1), "b": rand(n, seed=2)}
    nodes = [helper.make_node("Gemm", ["a", "w", "b"], ["g"], transB=1),
             helper.make_node("Relu", ["g"], ["y"])]
    model = make_model(nodes, [("a", (1, k))], [("y", None)], inits)
    graph, params = from_onnx(model)
    before = _anon_huge_kib()
    gm, _ = build_and_load(graph, params)
    gained = _anon_huge_kib() - before
    assert gained >= 8 << 10, f"{gained} KiB of huge pages for a 16 MiB arena"
    feeds = {"a": rand(1, k, seed=3)}
    gm.run(**feeds)
    np.testing.assert_allclose(gm.get_output(0), run_ort(model, feeds)[0], rtol=1e-4,
                               atol=1e-4)
