"""GridSample (opsets 16 and 20+) compiled end to end and compared with onnx.reference
(opset 16's mode names: onnxruntime) on grids reaching well outside [-1, 1] (every
padding rule folds or clamps), images larger than the node suite's, several channels
and batches, 2-D and 3-D."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.support.compare import run_ort, run_ours

CASES = [(mode, padding, align, rank)
         for mode, padding, align in itertools.product(
             ("nearest", "linear", "cubic"), ("zeros", "border", "reflection"), (0, 1))
         for rank in (2, 3) if not (rank == 3 and mode == "cubic")]


@pytest.mark.parametrize("mode, padding, align, rank, opset",
                         [(*c, 20) for c in CASES] + [("bilinear", "border", 0, 2, 16),
                                                      ("bicubic", "zeros", 1, 2, 16)])
def test_grid_sample_matches_reference(mode, padding, align, rank, opset):
    rng = np.random.default_rng(7)
    spatial = (5, 7) if rank == 2 else (3, 4, 5)
    out = (4, 6) if rank == 2 else (2, 3, 4)
    x = rng.uniform(-1, 1, (2, 3, *spatial)).astype(np.float32)
    grid = rng.uniform(-1.8, 1.8, (2, *out, rank)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode,
                            padding_mode=padding, align_corners=align)
    m = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                      helper.make_tensor_value_info("grid", TensorProto.FLOAT, grid.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", opset)])
    feeds = {"x": x, "grid": grid}
    # onnx.reference knows only opset 20's mode names: opset 16 against onnxruntime
    (want,) = ReferenceEvaluator(m).run(None, feeds) if opset >= 20 else run_ort(m, feeds)
    (got,) = run_ours(m, feeds, opt_level=3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
