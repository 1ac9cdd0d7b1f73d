"""No test module imports another: what tests share lives in tests/support.

Read with `ast`, nothing imported: every Python file under tests/ (test modules,
conftest.py, tests/support) is checked for imports of a test module (a
tests/**/test_*.py, by any spelling: `test_x`, `tests.area.test_x`, `from
tests.area import test_x`, relative, or a constant `importlib.import_module`
name) or of conftest, whose helpers moved to tests/support.
"""

from __future__ import annotations

import ast

from tests.support import REPO

TESTS = REPO / "tests"


def imported_names(tree: ast.AST) -> list[tuple[str, int]]:
    """(dotted module name, line) for every import in `tree`; `from m import a`
    gives both m and m.a (a may be a module)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            found.append((module, node.lineno))
            found += [(f"{module}.{a.name}".lstrip("."), node.lineno) for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.args[0].value, node.lineno))
    return found


def imports_of_test_modules(files: dict[str, str], test_modules: set[str]) -> list[str]:
    """"path:line: name" for each line of `files` (path -> source) that imports a
    module whose dotted name has a part in `test_modules` or named conftest."""
    forbidden = test_modules | {"conftest"}
    bad = {}  # (path, line) -> the first forbidden name imported there
    for path, source in sorted(files.items()):
        for name, line in imported_names(ast.parse(source, path)):
            if forbidden & set(name.split(".")):
                bad.setdefault((path, line), name)
    return [f"{path}:{line}: {name}" for (path, line), name in sorted(bad.items())]

def test_no_test_module_imports_another():
    files = {str(p.relative_to(REPO)): p.read_text() for p in TESTS.rglob("*.py")}
    test_modules = {p.stem for p in TESTS.rglob("test_*.py")}
    bad = imports_of_test_modules(files, test_modules)
    assert not bad, ("test modules imported (move what they share to tests/support):\n  "
                     + "\n  ".join(bad))


def test_check_catches_planted_imports():
    planted = {
        "a.py": "from test_b import helper\n",
        "c.py": "import tests.ops.test_b\n",
        "d.py": "from tests.ops import test_b\n",
        "e.py": "from .test_b import helper\n",
        "f.py": "from conftest import make_model\n",
        "g.py": "importlib.import_module('tests.ops.test_b')\n",
        "ok.py": "from tests.support.compare import run_ours\nimport pytest\n",
    }
    assert imports_of_test_modules(planted, {"test_b"}) == [
        "a.py:1: test_b", "c.py:1: tests.ops.test_b", "d.py:1: tests.ops.test_b",
        "e.py:1: test_b", "f.py:1: conftest", "g.py:1: tests.ops.test_b"]
