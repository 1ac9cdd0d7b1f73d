"""ONNX's official backend test suite over pipeline.backend, at opt_level 0 and 3.

onnx.backend.test.BackendTest generates the node tests in Python (about 1,900)
and reads the model suites the wheel ships (pytorch-converted,
pytorch-operator, simple); it compares our outputs with the stored reference
outputs. A test is skipped only when pipeline.backend.unsupported() names a
reason (an operator without a converter, a dtype the IR lacks, or a declared
LIMITS entry); every other test runs and a failure is a failure.

The small model suites (simple, pytorch-operator) at opt_level 3 run by
default; the node suite (~2 minutes of compiling per opt level on 2 cores),
pytorch-converted and everything at opt_level 0 are marked slow. The "real"
suite (full-size model-zoo networks on dummy inputs) is left out.
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("onnx.backend.test")

from pipeline.conformance import SUITES, make_backend_tests  # noqa: E402

with warnings.catch_warnings():
    # The node-case generators overflow casts on purpose (the Cast tests).
    warnings.simplefilter("ignore", RuntimeWarning)
    for _level in (3, 0):
        for _name, _case in make_backend_tests(_level, SUITES).items():
            if _level == 0 or _case.suite not in ("Simple", "PyTorchOperator"):
                _case = pytest.mark.slow(_case)
            globals()[_name] = _case


@pytest.mark.slow
def test_no_declared_limit_is_stale():
    """Every LIMITS entry must still be needed: of the node tests it skips, at least
    one fails when run anyway (else it only hides passing tests)."""
    from pipeline.conformance import audit_limits

    stale = {r: v["passed"] for r, v in audit_limits().items() if not v["failed"]}
    assert not stale, f"limits in pipeline/backend.py that hide only passing tests: {stale}"
