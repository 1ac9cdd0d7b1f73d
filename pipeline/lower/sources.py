"""Which source files decide what: read with `ast`, never imported, so doit's task
loading can use it without loading the compiler. Results are cached per process
and, by `remembered`, in pipeline/__pycache__ until a source file changes.

Two users:
  - a kernel's version (pipeline/lower/kernel.py): `kernel_sources` lists the code
    generator plus only the operator modules that lower the kernel's operators,
    and `source_digest` hashes them, each operator module WITHOUT its ONNX
    converters (`kernel_view`), so a converter edit recompiles no kernel;
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
OPS = "pipeline.ops"  # the operators' facade: importing it registers every family
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
    was rebuilt (`_without_converter_calls`) is read header plus kept body."""
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

def _is_converter_call(stmt: ast.stmt) -> bool:
    """`onnx_op(type, since)(fn)` as a statement: a converter registration."""
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Call)
            and getattr(stmt.value.func.func, "id", None) == "onnx_op")


def _without_converter_calls(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """Top-level statements minus converter registrations, also those inside loops
    and conditionals (`for op in ...: register(...); onnx_op(...)(...)`)."""
    kept = []
    for stmt in stmts:
        if _is_converter_call(stmt):
            continue
        if isinstance(stmt, _COMPOUND):
            body = _without_converter_calls(stmt.body)
            orelse = _without_converter_calls(getattr(stmt, "orelse", []))
            if not body and not orelse:
                continue
            if (body, orelse) != (stmt.body, getattr(stmt, "orelse", [])):
                stmt = _replace(stmt, body=body or [ast.copy_location(ast.Pass(), stmt)],
                                **({"orelse": orelse} if hasattr(stmt, "orelse") else {}))
        kept.append(stmt)
    return kept


def _replace(stmt: ast.stmt, **fields) -> ast.stmt:
    """A copy of `stmt` (same position) with some fields replaced."""
    new = type(stmt)(**{**{f: getattr(stmt, f) for f in stmt._fields}, **fields})
    return ast.copy_location(new, stmt)


def _defines(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, _DEFINITION):
        return stmt.name
    return None


def _strip(module: str, needed: frozenset[str]) -> ast.Module:
    """What of operator module `module` a kernel can reach.

    Roots are the statements that run at import other than converter
    registrations (register(...) calls, tables, wrappers like `as_1d(...)`),
    definitions carrying a decorator other than onnx_op (it may register), and
    `needed`, the names other kept code imports from this one ("*": all of it,
    imported as a module).
    Definitions reached from the roots stay; imports stay when a kept statement
    uses a name they bind. So converters, and helpers only converters call, drop out.
    """
    stmts = _without_converter_calls(parse(module_file(module)).body)
    defs, roots = {}, []
    for stmt in stmts:
        name = _defines(stmt)
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        if name is None:
            roots.append(stmt)
        else:
            defs[name] = stmt
            decorators = [getattr(d, "func", d) for d in getattr(stmt, "decorator_list", ())]
            if "*" in needed or decorators and not any(getattr(d, "id", None) == "onnx_op"
                                                       for d in decorators):
                roots.append(stmt)
    used = set(needed).union(*(names(module, s) for s in roots))
    kept = {id(s) for s in roots}
    todo = [n for n in used if n in defs]
    while todo:
        stmt = defs[todo.pop()]
        if id(stmt) in kept:
            continue
        kept.add(id(stmt))
        new = names(module, stmt) - used
        used |= new
        todo += [n for n in new if n in defs]
    body = []
    for stmt in stmts:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            kept_names = [a for a in stmt.names if (a.asname or a.name).split(".")[0] in used]
            if kept_names:
                body.append(_replace(stmt, names=kept_names))
        elif id(stmt) in kept:
            body.append(stmt)
    return ast.Module(body=body, type_ignores=[])


def _wanted_by_codegen() -> dict[str, set[str]]:
    """Names the code generator's own modules import from operator modules
    ("*": the whole module)."""
    wanted: dict[str, set[str]] = {}
    seen, todo = set(), list(CODEGEN_ROOTS)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for _, target, attr in import_targets(module, parse(module_file(module)).body):
            if target.startswith(OPS + "."):
                wanted.setdefault(target, set()).add(attr or "*")
            elif target != OPS:
                todo.append(target)
    return wanted


@cache
def _operator_views() -> dict[str, ast.Module]:
    """Every operator module's kernel view (see `_strip`). Computed for all of them
    together: what one module's kept code imports must stay in the module defining
    it, as must what the code generator imports."""
    modules = [f"{OPS}.{p.stem}" for p in sorted((PKG / "ops").glob("*.py"))
               if p.name != "__init__.py"]
    seed = _wanted_by_codegen()
    needed = {n: frozenset(seed.get(n, ())) for n in modules}
    while True:
        views = {n: _strip(n, needed[n]) for n in modules}
        wanted: dict[str, set[str]] = {n: set() for n in modules}
        for n, view in views.items():
            for _, source, attr in import_targets(n, view.body):
                if source in wanted:
                    wanted[source].add(attr or "*")
        if all(wanted[n] <= needed[n] for n in modules):
            return views
        needed = {n: needed[n] | frozenset(wanted[n]) for n in modules}


def kernel_view(module: str) -> ast.Module:
    """The part of `module` that can decide machine code: operator modules without
    their converters (`_strip`), any other module whole."""
    return _operator_views().get(module) or parse(module_file(module))


@cache
def kernel_sources(roots: tuple[str, ...]) -> tuple[str, ...]:
    """The modules reachable by imports from `roots` (code generator entry points
    and the modules defining a kernel's lowerings), reading operator modules as
    their kernel views. The operators' facade is not followed: importing it
    registers every family, but a kernel runs only its own operators' lowerings.
    """
    seen, todo = set(), [r for r in roots if r != OPS]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [m for _, m, _ in import_targets(module, kernel_view(module).body)
                 if m != OPS and m not in seen]
    return tuple(sorted(seen))


@cache
def _dump(module: str) -> str:
    return ast.dump(kernel_view(module))


def source_digest(modules: tuple[str, ...]) -> str:
    """A hash of the modules' kernel views as `ast.dump`s.

    Why the dump and not the file's bytes: a converter removed from the middle
    of a module must leave the rest identical, and the dump (without line
    numbers) does not depend on where statements sit. It also ignores comments,
    docstrings and formatting, which never change machine code. A new Python whose AST
    dumps differently changes every version: a one-off recompile, never a stale
    kernel.
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
