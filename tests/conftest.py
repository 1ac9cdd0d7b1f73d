"""pytest hooks for every test; the helpers the tests share are in tests/support."""

from __future__ import annotations

import pytest

# The helpers' asserts explain their failures as a test's own would.
pytest.register_assert_rewrite("tests.support")

from tests.support.compare import remove_libraries  # noqa: E402 (after the registration)


def pytest_unconfigure(config) -> None:
    remove_libraries()
