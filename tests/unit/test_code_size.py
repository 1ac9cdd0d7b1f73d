"""The house rules for pipeline/ that a reader can count: no module over 500 lines,
no function over 80 (docstring and comments included), so every file reads in one
sitting and every function on a screen or two."""

from __future__ import annotations

import ast

from tests.support import REPO

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _python_files():
    return sorted((REPO / "pipeline").rglob("*.py"))


def test_no_module_over_500_lines() -> None:
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in _python_files()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "split these modules:\n" + "\n".join(long)


def test_no_function_over_80_lines() -> None:
    long = []
    for p in _python_files():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "split these functions:\n" + "\n".join(long)
