"""The compiler sources a doit task runs, derived from the code (its `file_dep`).

`sources("pipeline.tasks.stages:link_lib0")` follows what the stage function
uses: each name it references that its module binds (a function or class of the
module, a constant, an import), then the same for what those use, across
pipeline modules, read with `ast` (pipeline.lower.sources), nothing imported.
So a task lists the files of its own stage function's code, not everything its
module happens to import: editing export's build id rebuilds the exports, not the
kernels, and a new stage needs no hand-written list to forget a file in.

Whole modules are taken where precision is not possible: a module imported as a
module (`from pipeline.link import cc`), a name a package's __init__ exports
(the facades: `pipeline.ops` registers every operator family, and `get(op)`
reaches any of them), a name bound by something other than a definition,
assignment or import. Names are read from the source text, so a word in a string
or an attribute named like a module-level name counts too: a file too many,
never one too few.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from pipeline.lower.sources import (
    PKG,
    import_targets,
    module_file,
    names,
    parse,
    remembered,
    substatements,
)

Key = tuple[str, str | None]  # (module, name in it; None: the whole module)


def _bound_by(stmt: ast.stmt) -> list[str]:
    """The module-level names a top-level statement binds; a compound one (if, try,
    for, with) binds what its inner statements and loop target bind."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    targets = {ast.Assign: lambda: stmt.targets, ast.For: lambda: [stmt.target]}.get(
        type(stmt), lambda: [getattr(stmt, "target", None)])()
    bound = [n.id for t in targets if t is not None for n in ast.walk(t)
             if isinstance(n, ast.Name)]
    for inner in substatements(stmt):
        bound += _bound_by(inner)
    return bound


@cache
def _bindings(module: str) -> dict[str, list[ast.stmt]]:
    """Module-level name -> the top-level statements that bind it."""
    found: dict[str, list[ast.stmt]] = {}
    for stmt in parse(module_file(module)).body:
        for name in _bound_by(stmt):
            found.setdefault(name, []).append(stmt)
    return found


def _uses(module: str, stmts: list[ast.stmt]) -> list[Key]:
    """What running `stmts` of `module` needs: the module-level names they mention,
    and what the imports among or inside them bring."""
    bound = _bindings(module)
    keys: list[Key] = [(m, attr) for _, m, attr in import_targets(module, stmts)]
    for stmt in stmts:
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            keys += [(module, n) for n in names(module, stmt) if n in bound]
    return keys


@cache
def _expand(key: Key) -> tuple[Path, tuple[Key, ...]]:
    """(the file `key` lives in, the keys it uses)."""
    module, name = key
    path = module_file(module)
    stmts = _bindings(module).get(name) if name is not None else None
    if stmts is None or path.name == "__init__.py":
        return path, tuple(_uses(module, parse(path).body))
    keys = []
    for stmt in stmts:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):  # only the import of `name`
            keys += [(m, attr) for local, m, attr in import_targets(module, [stmt])
                     if local == name]
        else:
            keys += _uses(module, [stmt])
    return path, tuple(k for k in keys if k != key)


def _key(root: str) -> Key:
    module, _, name = root.partition(":")
    return module, name or None


def _derive(roots: tuple[str, ...], stop: tuple[str, ...]) -> list[Path]:
    seen = {_key(s) for s in stop}
    todo, files = [_key(r) for r in roots], set()
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        path, uses = _expand(key)
        files.add(path)
        todo += [k for k in uses if k not in seen]
    return sorted(files)


@cache
def sources(*roots: str, stop: tuple[str, ...] = ()) -> tuple[Path, ...]:
    """The pipeline source files the code of `roots` runs ("pipeline.module:name", or
    "pipeline.module" for all of it), sorted. Keys in `stop` are not followed: code
    the task's inputs already version (see the lib0 task).

    Remembered until a source file changes (pipeline.lower.sources.remembered), so
    a no-op build does not parse the compiler."""
    found = remembered("task", [roots, stop],
                       lambda: [str(p.relative_to(PKG)) for p in _derive(roots, stop)])
    return tuple(PKG / p for p in found)
