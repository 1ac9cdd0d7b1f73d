"""Every operator family compiled end to end and compared with onnxruntime,
at pass opt_level 0 (no fusion, no folding) and 3 (everything).
The cases: tests/support/op_cases/families.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.compare import assert_matches_ort, run_ort, run_ours
from tests.support.op_cases.families import CASES, DOUBLE_CASES

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_onnxruntime(case, opt_level):
    model, feeds = CASES[case]()
    assert_matches_ort(model, feeds, opt_level=opt_level)


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("case", sorted(DOUBLE_CASES))
def test_float64_matches_onnxruntime(case, opt_level):
    """Same dtype as onnxruntime (onnx.reference for Hardmax, which onnxruntime has
    in float only), and far below float32's resolution from it."""
    from onnx.reference import ReferenceEvaluator

    model, feeds = DOUBLE_CASES[case]()
    got = run_ours(model, feeds, opt_level=opt_level)
    want = ReferenceEvaluator(model).run(None, feeds) if case == "hardmax" else \
        run_ort(model, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)
