"""The package's layers point one way: every import (module-level or inside a
function) goes to a package in the same layer or below, no two packages import
each other, directly or through others, and no two modules do (within one
package too).

Read with `ast`, nothing imported: a node is a top-level subpackage or root
module of pipeline/ (`pipeline.ops.conv` counts as `ops`). Constant-string
`importlib.import_module("pipeline...")` calls count as imports too.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

PKG = REPO / "pipeline"

# Bottom first; the packages of one entry may import each other (without cycles).
LAYERS = [
    ["errors", "files", "ir"],
    ["dsl"],
    ["ops"],
    ["kernels"],
    ["frontend", "transform", "lower", "plan", "vm"],
    ["codegen"],
    ["link"],
    ["runtime"],
    ["driver"],
    ["tasks"],
    ["tools"],
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}
ROOT = "pipeline"  # the package facade (pipeline/__init__.py): above every layer


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (REPO / rel).with_suffix(".py").is_file() or (REPO / rel / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported pipeline module, line) for every import in the file at path."""
    tree = ast.parse(path.read_text(), str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.append((sub if _is_module(sub) else module, node.lineno))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.args[0].value, node.lineno))
    return [(m, line) for m, line in found if m == ROOT or m.startswith(ROOT + ".")]


def _node(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _edges() -> list[tuple[str, str, str]]:
    """(importing module, imported module, where) for every import in pipeline/."""
    edges = []
    for path in sorted(PKG.rglob("*.py")):
        me = _module_name(path)
        for target, line in _imports(path):
            edges.append((me, target, f"{path.relative_to(REPO)}:{line}"))
    return edges


def test_every_package_is_in_a_layer():
    nodes = {p.stem for p in PKG.glob("*.py") if p.name != "__init__.py"}
    nodes |= {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert nodes == set(LEVEL), ("add new packages to LAYERS, remove gone ones: "
                                 f"{sorted(nodes ^ set(LEVEL))}")


def upward_edges(edges) -> list[str]:
    bad = []
    for src, dst, where in edges:
        a, b = _node(src), _node(dst)
        if a == b or a == ROOT:
            continue
        if b == ROOT or LEVEL[b] > LEVEL[a]:
            bad.append(f"{src} -> {dst} (upward: {a} is below {b}) at {where}")
    return bad


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected sets of more than one node (Tarjan's algorithm)."""
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(scc)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sccs


def _cycles(edges, node) -> list[str]:
    """One line per strongly connected set of nodes (`node(module)`: its package,
    or the module itself), with one example edge per pair of nodes inside it."""
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges:
        a, b = node(src), node(dst)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
    lines = []
    for scc in _strongly_connected(graph):
        first: dict[tuple[str, str], str] = {}
        for s, d, where in sorted(edges):
            pair = (node(s), node(d))
            if pair[0] in scc and pair[1] in scc and pair[0] != pair[1]:
                first.setdefault(pair, f"{s} -> {d}" + ("" if node is _node else f" at {where}"))
        lines.append(f"cycle between {sorted(scc)}: " + "; ".join(
            first[pair] for pair in sorted(first)))
    return lines


def package_cycles(edges) -> list[str]:
    """One line per strongly connected set of packages, with the edges inside it."""
    return _cycles(edges, _node)


def module_cycles(edges) -> list[str]:
    """One line per strongly connected set of modules, with the imports inside it:
    every import counts (module-level or inside a function, which only hides a
    circle), within one package as between packages. A package's __init__ is the
    module named like the package; importing a submodule does not count as
    importing its package's __init__ (Python runs it first, but that order is
    the package's own business)."""
    return _cycles(edges, lambda module: module)


def test_no_upward_imports():
    bad = upward_edges(_edges())
    assert not bad, "imports against the layer order:\n  " + "\n  ".join(bad)


def test_no_cycles_between_packages():
    cycles = package_cycles(_edges())
    assert not cycles, "\n".join(cycles)


def test_no_cycles_between_modules():
    cycles = module_cycles(_edges())
    assert not cycles, "import circles between modules:\n" + "\n".join(cycles)


def test_module_check_catches_a_circle_inside_a_package():
    planted = [("pipeline.tasks.cache", "pipeline.tasks.cluster", "a.py:3"),
               ("pipeline.tasks.cluster", "pipeline.tasks.cache", "b.py:9"),
               ("pipeline.tasks.cache", "pipeline.files", "a.py:1")]
    assert module_cycles(planted) == [
        "cycle between ['pipeline.tasks.cache', 'pipeline.tasks.cluster']: "
        "pipeline.tasks.cache -> pipeline.tasks.cluster at a.py:3; "
        "pipeline.tasks.cluster -> pipeline.tasks.cache at b.py:9"]
    assert package_cycles(planted) == []


def test_checks_catch_a_planted_upward_edge_and_cycle():
    planted = [("pipeline.ir.graph", "pipeline.ops.registry", "x.py:1"),
               ("pipeline.ops.registry", "pipeline.ir.graph", "y.py:1")]
    assert upward_edges(planted) == ["pipeline.ir.graph -> pipeline.ops.registry "
                                     "(upward: ir is below ops) at x.py:1"]
    assert package_cycles(planted) == ["cycle between ['ir', 'ops']: pipeline.ir.graph -> "
                                       "pipeline.ops.registry; pipeline.ops.registry -> "
                                       "pipeline.ir.graph"]


def _fresh_import(module: str, absent: list[str]) -> list[str]:
    code = (f"import sys, {module}\n"
            f"print(' '.join(m for m in {absent!r} if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_every_pipeline_import_names_a_module_here():
    """A stale module path must fail here, not resolve elsewhere: an editable
    install of another checkout would quietly serve the old module."""
    files = [*PKG.rglob("*.py"), *(REPO / "tests").rglob("*.py"),
             *(REPO / "models").rglob("*.py"), REPO / "dodo.py"]
    facade = {"build", "frontend", "runtime", "transform"}  # pipeline.__getattr__
    bad = []
    for path in sorted(files):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
                if node.module == ROOT:
                    names += [f"{ROOT}.{a.name}" for a in node.names if a.name not in facade]
            else:
                continue
            bad += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names
                    if (n == ROOT or n.startswith(ROOT + ".")) and not _is_module(n)]
    bad += [f"{where}: {dst}" for _, dst, where in _edges() if not _is_module(dst)]
    assert not bad, "imports of modules that do not exist here:\n  " + "\n  ".join(bad)


def test_run_stage_names_exist():
    """The doit tasks name their stages as strings ("tasks.stages:import_model",
    and the tools they run, "tools.validate:validate_library"): each must exist."""
    names = {n.value for path in (PKG / "tasks").rglob("*.py")
             for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
             and isinstance(n.value, str) and re.fullmatch(r"[a-z_.]+:[a-z_]+", n.value)}
    assert "tasks.stages:import_model" in names
    for name in sorted(names):
        module, _, fn = name.partition(":")
        path = PKG.joinpath(*module.split(".")).with_suffix(".py")
        assert path.is_file(), f"{name}: no {path.relative_to(REPO)}"
        # run_body takes the name from the module: a function defined there, or
        # one it imports (a stage moved to another module and re-exported).
        body = ast.parse(path.read_text()).body
        defined = {d.name for d in body if isinstance(d, ast.FunctionDef)}
        defined |= {a.asname or a.name for d in body if isinstance(d, ast.ImportFrom)
                    for a in d.names}
        assert fn in defined, f"{name}: {path.relative_to(REPO)} defines no {fn}()"


@pytest.mark.parametrize("module, absent", [
    ("pipeline.dsl.vector", ["onnx", "pipeline.ops"]),
    ("pipeline.runtime", ["llvmlite", "onnx", "pipeline.ops"]),
    ("pipeline.ops", ["onnx", "pipeline.kernels", "pipeline.frontend"]),
    ("pipeline.kernels", ["onnx", "pipeline.frontend"]),
    ("pipeline.frontend", ["pipeline.kernels", "pipeline.codegen"]),
])
def test_fresh_import_loads_nothing_above(module, absent):
    assert _fresh_import(module, absent) == []


def _registers_operators(module: str) -> bool:
    """Whether the pipeline.ops module calls `register(...)`: an operator family's
    definitions (shape rules, numpy references, samples)."""
    tree = ast.parse((REPO / Path(*module.split("."))).with_suffix(".py").read_text())
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "register"
               for n in ast.walk(tree))


def test_kernels_import_no_definitions_or_converters():
    """A kernel's version hashes what its kernels module imports: an operator's
    definitions (numpy reference, samples) or ONNX converters must not be among
    them, and converters never reach a lowering."""
    bad = []
    for src, dst, where in _edges():
        if src.startswith("pipeline.kernels.") and (
                dst.startswith("pipeline.frontend") or dst == "pipeline.ops"
                or dst.startswith("pipeline.ops.") and _registers_operators(dst)):
            bad.append(f"{src} -> {dst} at {where}")
        if src.startswith("pipeline.frontend") and dst.startswith("pipeline.kernels"):
            bad.append(f"{src} -> {dst} at {where}")
    assert not bad, "\n  ".join(bad)
