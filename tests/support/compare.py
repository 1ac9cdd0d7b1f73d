"""A model through our pipeline (import -> build -> export .so -> load -> run) and
through onnxruntime as the reference, and the comparison of the two."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np

TARGET = "llvm -mcpu=native"
RTOL, ATOL = 1e-4, 1e-5

_TMP: tempfile.TemporaryDirectory | None = None
_COUNTER = itertools.count()


def remove_libraries() -> None:
    """Delete every .so lib_path handed out (at the end of the session)."""
    global _TMP
    if _TMP is not None:
        _TMP.cleanup()
        _TMP = None


def lib_path() -> Path:
    """A fresh .so path (dlopen caches by path, so never reuse one)."""
    global _TMP
    if _TMP is None:
        _TMP = tempfile.TemporaryDirectory(prefix="pipeline-tests-")
    return Path(_TMP.name, f"lib{next(_COUNTER)}.so")


def build_and_load(graph, params, target: str = TARGET, opt_level: int = 3, **ctx_kwargs):
    """Build `graph` under PassContext(opt_level, **ctx_kwargs), export a .so, load
    it and return (GraphModule, factory)."""
    from pipeline import build
    from pipeline.runtime import GraphModule, load_module
    from pipeline.transform import PassContext

    with PassContext(opt_level=opt_level, **ctx_kwargs):
        factory = build(graph, target=target, params=params)
    path = factory.export_library(lib_path())
    return GraphModule(load_module(path)["default"]()), factory


def run_graph(graph, params, inputs: dict, **kwargs) -> list[np.ndarray]:
    gmod, _ = build_and_load(graph, params, **kwargs)
    gmod.run(**inputs)
    return [gmod.get_output(k) for k in range(gmod.get_num_outputs())]


def run_ours(model, inputs: dict, opt_level: int = 3, shape=None, **kwargs) -> list[np.ndarray]:
    """Outputs of `model` compiled by the pipeline, in graph-output order."""
    from pipeline.frontend import from_onnx

    graph, params = from_onnx(model, shape=shape)
    return run_graph(graph, params, inputs, opt_level=opt_level, **kwargs)


def run_ort(model, inputs: dict) -> list[np.ndarray]:
    """Reference outputs from onnxruntime (CPU, graph optimisations off)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def assert_matches_ort(model, inputs: dict, opt_level: int = 3, rtol: float = RTOL,
                       atol: float = ATOL, **kwargs) -> None:
    want = run_ort(model, inputs)
    got = run_ours(model, inputs, opt_level=opt_level, **kwargs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
