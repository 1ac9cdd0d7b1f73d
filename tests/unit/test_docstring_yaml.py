"""The YAML examples in pipeline's docstrings parse, and a build-matrix example
loads with load_config: an example a user copies must work.

An example is a ```yaml fenced block, or an indented block that starts with a
config's top-level key (`models:`); every docstring (module, class, function) of
pipeline/**/*.py is read with `ast`.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from pipeline.tasks.config import ONNX_LIGHT, load_config
from tests.support import REPO

PKG = REPO / "pipeline"
CONFIG_START = re.compile(r"(models|targets):\s*$")


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return [inspect.cleandoc(d) for n in nodes if (d := ast.get_docstring(n, clean=False))]


def examples(doc: str) -> list[str]:
    """The YAML examples in one (cleaned) docstring."""
    found = re.findall(r"```ya?ml\n(.*?)```", doc, re.S)
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if indent and CONFIG_START.match(line.strip()):
            block = [line]
            i += 1
            while i < len(lines) and (not lines[i].strip() or
                                      len(lines[i]) - len(lines[i].lstrip()) >= indent):
                block.append(lines[i])
                i += 1
            found.append(textwrap.dedent("\n".join(block)))
        else:
            i += 1
    return found


def _all_examples() -> list[tuple[str, str]]:
    return [(f"{p.relative_to(PKG.parent)}#{n}", text)
            for p in sorted(PKG.rglob("*.py"))
            for doc in _docstrings(p) for n, text in enumerate(examples(doc))]


def test_examples_are_found():
    assert any(name.startswith("pipeline/tasks/config.py") for name, _ in _all_examples())
    assert examples("x:\n\n    models:\n      a: {generator: mlp}\n    targets: {}\n\nend") == [
        "models:\n  a: {generator: mlp}\ntargets: {}\n"]


@pytest.mark.parametrize("name, text", _all_examples())
def test_docstring_yaml_example(name, text, tmp_path):
    doc = yaml.safe_load(text)
    if not (isinstance(doc, dict) and "models" in doc and "targets" in doc):
        return
    # A matrix example: its model files are the user's; stand-ins will do.
    for spec in doc["models"].values():
        if "path" in spec and not spec["path"].startswith(ONNX_LIGHT):
            (tmp_path / spec["path"]).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / spec["path"]).write_bytes(b"")
    (tmp_path / "matrix.yaml").write_text(text)
    config = load_config(tmp_path / "matrix.yaml")
    assert set(config.models) == set(doc["models"])
    assert set(config.targets) == set(doc["targets"])
