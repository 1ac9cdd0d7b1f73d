"""Which source files decide what: read with `ast`, never imported, so doit's task
loading can use it without loading the compiler. Results are cached per process
and, by `remembered`, in pipeline/__pycache__ until a source file changes.

Two users:
  - a kernel's version (pipeline/lower/kernel.py): `kernel_sources` lists the code
    generator plus the kernels modules that registered the kernel's lowerings,
    each with every pipeline module it imports, and `source_digest` hashes them.
    Operator definitions (shape rules, numpy references, samples) and ONNX
    converters live in other modules, which kernels never import, so editing
    them recompiles no kernel;
  - the doit tasks' `file_dep` (pipeline/tasks/deps.py), through `module_file`,
    `parse` and `import_targets`.

Validation, runtime and tools code never enters a kernel version: nothing the
code generator imports reaches it.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

from pipeline.files import atomic_write

PKG = Path(__file__).resolve().parent.parent  # pipeline/
# Importing a facade registers every family: a kernel's sources never follow one.
FACADES = ("pipeline.ops", "pipeline.kernels")
# Where a kernel's code comes from besides its operators' lowerings.
CODEGEN_ROOTS = ("pipeline.codegen.render", "pipeline.codegen.compile", "pipeline.lower.kernel")


@cache
def module_file(name: str) -> Path | None:
    """The file of pipeline module `name` ("pipeline.ops.conv"), None if there is none."""
    if name != "pipeline" and not name.startswith("pipeline."):
        return None
    rel = Path(*name.split(".")[1:])
    for path in (PKG / rel).with_suffix(".py"), PKG / rel / "__init__.py":
        if path.is_file():
            return path
    return None


@cache
def parse(path: Path) -> ast.Module:
    """The file's syntax tree without docstrings (they never change what code does,
    and no reader here needs them)."""
    tree = ast.parse(path.read_bytes(), str(path))
    todo = [tree]
    while todo:
        node = todo.pop()
        body = node.body
        if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.copy_location(ast.Pass(), body[0])]
        todo += [s for s in node.body if isinstance(s, _DEFINITION)]
    return tree


_COMPOUND = (ast.For, ast.If, ast.With, ast.Try, ast.While)
_DEFINITION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@cache
def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _resolve(module: str, node: ast.ImportFrom, in_package: bool) -> str:
    """The absolute module a `from ... import` in `module` reads from."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if in_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _first_line(stmt: ast.stmt) -> int:
    return min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])


def substatements(stmt: ast.stmt) -> list[ast.stmt]:
    """The statements directly inside a compound statement or definition."""
    inner = [*getattr(stmt, "body", ()), *getattr(stmt, "orelse", ()),
             *getattr(stmt, "finalbody", ())]
    for handler in getattr(stmt, "handlers", ()):
        inner += handler.body
    return [s for s in inner if isinstance(s, ast.stmt)]


def _header_end(stmt: ast.stmt) -> int:
    """The last line of a compound statement's header (`for x in ...:`, `if ...:`)."""
    parts = [v for f, v in ast.iter_fields(stmt)
             if f not in ("body", "orelse", "finalbody", "handlers")]
    ends = [n.end_lineno for v in parts for n in (v if isinstance(v, list) else [v])
            if isinstance(n, ast.AST) and getattr(n, "end_lineno", None)]
    return max([stmt.lineno, *ends])


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
@cache  # statements hash by identity
def names(module: str, stmt: ast.stmt) -> frozenset[str]:
    """The identifiers in a statement of `module`'s source: a superset of the names
    it uses (also attributes and words in strings), read from the text because
    walking the syntax tree costs ten times more. A compound statement whose body
    is read header plus body."""
    lines = _lines(module_file(module))
    inner = substatements(stmt) if isinstance(stmt, _COMPOUND) else []
    if inner:
        header = lines[_first_line(stmt) - 1:_header_end(stmt)]
        found = frozenset(_IDENTIFIER.findall("\n".join(header))).union(
            *(names(module, s) for s in inner))
    else:
        found = frozenset(_IDENTIFIER.findall(
            "\n".join(lines[_first_line(stmt) - 1:stmt.end_lineno])))
    return found


def import_targets(module: str, stmts: list[ast.stmt]) -> list[tuple[str, str, str | None]]:
    """Every pipeline import in `stmts` of `module`, nested ones too (inside
    functions, loops): (local name it binds, imported module, attribute or None
    for a whole module).

    `from pkg import sub` with sub a module counts as importing the module; a
    constant-string `importlib.import_module("pipeline...")` (the lazy facades)
    counts as a module import binding no name.
    """
    path = module_file(module)
    in_package = path.name == "__init__.py"
    found = []
    todo = list(stmts)
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Import):
            found += [((a.asname or a.name).split(".")[0], a.name, None) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            source = _resolve(module, n, in_package)
            for a in n.names:
                sub = f"{source}.{a.name}"
                found.append((a.asname or a.name, *((sub, None) if module_file(sub)
                                                      else (source, a.name))))
        elif substatements(n):
            todo += substatements(n)
        elif "import_module" in names(module, n):
            for c in ast.walk(n):
                if (isinstance(c, ast.Call) and c.args and isinstance(c.args[0], ast.Constant)
                        and getattr(c.func, "attr", getattr(c.func, "id", None))
                        == "import_module" and isinstance(c.args[0].value, str)):
                    found.append(("", c.args[0].value, None))
    return [f for f in found if module_file(f[1]) is not None]


# -- a kernel's sources ---------------------------------------------------------------

@cache
def kernel_sources(roots: tuple[str, ...]) -> tuple[str, ...]:
    """The modules reachable by imports from `roots` (code generator entry points
    and the kernels modules that registered a kernel's lowerings). The facades of
    the operators and of the kernels are not followed: importing one registers
    every family, but a kernel runs only its own operators' lowerings.
    """
    seen, todo = set(), [r for r in roots if r not in FACADES]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [m for _, m, _ in import_targets(module, parse(module_file(module)).body)
                 if m not in FACADES and m not in seen]
    return tuple(sorted(seen))


@cache
def _dump(module: str) -> str:
    return ast.dump(parse(module_file(module)))


def source_digest(modules: tuple[str, ...]) -> str:
    """A hash of the modules' syntax trees as `ast.dump`s.

    Why the dump and not the file's bytes: the dump (without line numbers, of a
    tree without docstrings) ignores comments, docstrings and formatting, which
    never change machine code. A new Python whose AST dumps differently changes
    every version: a one-off recompile, never a stale kernel.
    """
    h = hashlib.sha256()
    for module in modules:
        h.update(module.encode() + b"\0" + _dump(module).encode() + b"\0")
    return h.hexdigest()


def kernel_digest(roots: tuple[str, ...]) -> str:
    """source_digest(kernel_sources(roots)), remembered until a source file changes."""
    return remembered("kernel", roots, lambda: source_digest(kernel_sources(roots)))


# -- kept across processes: reading the sources costs more than a no-op build ---------

_STORE = PKG / "__pycache__" / "source-facts.json"


def _signature() -> str:
    """Every pipeline source file's path, inode, size, mtime and ctime: any edit,
    new or removed module changes it (ctime too, which no tool can set back)."""
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(PKG):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            st = os.stat(os.path.join(folder, name))
            h.update(f"{folder}/{name} {st.st_ino} {st.st_size} {st.st_mtime_ns} "
                     f"{st.st_ctime_ns}\n".encode())
    return h.hexdigest()


@cache
def _stored() -> tuple[str, dict]:
    """(the sources' signature now, the facts stored for it)."""
    signature = _signature()
    try:
        doc = json.loads(_STORE.read_text())
    except (OSError, ValueError):
        return signature, {}
    return signature, (doc.get("facts", {}) if doc.get("signature") == signature else {})


def remembered(kind: str, key, compute: Callable):
    """compute() (JSON-able), kept in pipeline/__pycache__ under (kind, key) for as
    long as no pipeline source file changes: a file of facts about the sources,
    shared by every process and project using this copy of the compiler."""
    signature, facts = _stored()
    name = f"{kind} {json.dumps(key)}"
    if name not in facts:
        facts[name] = compute()
        # Written whole by rename: a reader sees an old or a new file, never a torn
        # one; a fact another process added meanwhile may be lost (and recomputed).
        with contextlib.suppress(OSError):  # read-only install: computed every time
            atomic_write(_STORE, json.dumps({"signature": signature, "facts": facts}).encode())
    return facts[name]
