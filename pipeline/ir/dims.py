"""Symbolic dimensions: a TensorType's shape may hold a named dimension (a `str`,
`"batch"`) beside the integers, for the VM executor (docs/vm.md).

The expression type is as small as the shape rules need: a dimension is an int, a
symbol name, or a sum of products of ints and symbols written canonically as
`"2*batch*seq"` or `"past+1"` (factors sorted, a coefficient first and omitted when
1, the constant term last): Reshape multiplies and divides, Concat adds. A shape's symbols get
values at run time; `bounds` give each symbol's [low, high] at build time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from pipeline.errors import GraphError

__all__ = ["check_bounds", "dim_difference", "dim_product", "dim_quotient", "dim_sum",
           "dim_terms", "is_symbol", "is_symbolic", "parse_bounds", "rename_dim", "substitute",
           "symbols_of"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _terms(d) -> dict[tuple[str, ...], int]:
    """A dimension as a polynomial: sorted symbol names of each term -> coefficient."""
    if not isinstance(d, str):
        return {(): int(d)} if int(d) else {}
    terms: dict[tuple[str, ...], int] = {}
    for term in str(d).split("+"):
        coeff, names = 1, []
        for part in term.split("*"):
            if part.isdigit():
                coeff *= int(part)
            elif _NAME.match(part):
                names.append(part)
            else:
                raise GraphError(f"dimension {d!r}: a symbol is a name of letters, digits "
                                 "and _")
        key = tuple(sorted(names))
        terms[key] = terms.get(key, 0) + coeff
    return {k: c for k, c in terms.items() if c}


def _make(terms: dict[tuple[str, ...], int]):
    """The canonical dimension of a polynomial: an int, or "2*a*b+c+1" (terms sorted,
    the constant last, a coefficient of 1 omitted)."""
    if not any(terms):
        return terms.get((), 0)
    parts = ["*".join(([str(c)] if c != 1 else []) + list(k))
             for k, c in sorted(terms.items()) if k]
    return "+".join(parts + ([str(terms[()])] if terms.get(()) else []))


def dim_terms(d) -> list[tuple[tuple[str, ...], int]]:
    """Dimension d as its terms: (symbol names, coefficient) each, () for the constant."""
    return sorted(_terms(d).items())


def is_symbol(d) -> bool:
    """Whether d is one bare symbol ("seq"; not "2*seq", "seq+1")."""
    return isinstance(d, str) and _NAME.match(d) is not None


def rename_dim(d, rename: Mapping[str, str]):
    """Dimension d with its symbols renamed by `rename`, canonical again."""
    out: dict[tuple[str, ...], int] = {}
    for key, c in _terms(d).items():
        new = tuple(sorted(rename.get(n, n) for n in key))
        out[new] = out.get(new, 0) + c
    return _make(out)


def is_symbolic(shape) -> bool:
    """Whether `shape` has a dimension that is not an int."""
    return any(isinstance(d, str) for d in shape)


def symbols_of(*shapes) -> list[str]:
    """The symbol names in `shapes`, each once, in order of first appearance."""
    found: dict[str, None] = {}
    for shape in shapes:
        for d in shape:
            for key in _terms(d):
                found.update(dict.fromkeys(key))
    return list(found)


def dim_product(dims: Iterable) -> int | str:
    """The product of `dims` (ints and symbolic dimensions), canonical."""
    acc: dict[tuple[str, ...], int] = {(): 1}
    for d in dims:
        nxt: dict[tuple[str, ...], int] = {}
        for ka, ca in acc.items():
            for kb, cb in _terms(d).items():
                key = tuple(sorted(ka + kb))
                nxt[key] = nxt.get(key, 0) + ca * cb
        acc = {k: c for k, c in nxt.items() if c}
    return _make(acc)


def dim_sum(dims: Iterable) -> int | str:
    """The sum of `dims`, canonical (a Concat along a symbolic axis)."""
    acc: dict[tuple[str, ...], int] = {}
    for d in dims:
        for key, c in _terms(d).items():
            acc[key] = acc.get(key, 0) + c
    return _make({k: c for k, c in acc.items() if c})


def dim_difference(a, b) -> int | str | None:
    """a - b when no coefficient of the result is negative (Range's length
    `past+seq - past`), else None: the expression type has no subtraction."""
    acc = _terms(a)
    for key, c in _terms(b).items():
        acc[key] = acc.get(key, 0) - c
    if any(c < 0 for c in acc.values()):
        return None
    return _make({k: c for k, c in acc.items() if c})


def dim_quotient(a, b) -> int | str | None:
    """a / b when it is exact in this expression type (b one term whose symbols are
    in every term of a and whose coefficient divides theirs), else None."""
    tb = _terms(b)
    if len(tb) != 1:
        return None
    ((kb, cb),) = tb.items()
    out = {}
    for ka, ca in _terms(a).items():
        rest = list(ka)
        for name in kb:
            if name not in rest:
                return None
            rest.remove(name)
        if ca % cb:
            return None
        out[tuple(rest)] = ca // cb
    return _make(out)


def substitute(shape, values: Mapping[str, int]) -> tuple[int, ...]:
    """`shape` with every symbol replaced by its value in `values` (GraphError
    naming a symbol that has none)."""
    out = []
    for d in shape:
        total = 0
        for names, coeff in _terms(d).items():
            missing = [n for n in names if n not in values]
            if missing:
                raise GraphError(f"symbolic dimension {missing[0]!r} has no value")
            total += coeff * math.prod(int(values[n]) for n in names)
        out.append(total)
    return tuple(out)


def parse_bounds(spec, where: str = "dims") -> dict[str, tuple[int, int]]:
    """Bounds per symbol from a mapping {name: [low, high]} (YAML `dims:`, Python
    `dims=`) or the command line's "name=low:high" strings; ValueError naming
    the entry when one is malformed."""
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        items = []
        for text in spec or ():
            name, _, rng = str(text).partition("=")
            low, _, high = rng.partition(":")
            items.append((name, (low, high) if high else (None, None)))
    out = {}
    for name, rng in items:
        try:
            low, high = (int(v) for v in rng)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {name!r} needs bounds [low, high] (name=low:high on "
                             f"the command line), got {rng!r}") from None
        if not _NAME.match(str(name)) or not 0 <= low <= high:
            raise ValueError(f"{where}: {name!r}: bounds {low}..{high} must be a name and "
                             "0 <= low <= high")
        out[str(name)] = (low, high)
    return out


def check_bounds(names: Iterable[str], bounds: Mapping[str, tuple[int, int]]) -> None:
    """GraphError naming the first symbol in `names` that has no bound."""
    for name in names:
        if name not in bounds:
            raise GraphError(f"symbolic dimension {name!r} has no bounds: give them (config: "
                             f"models.<name>.dims: {{{name}: [low, high]}}; command line: "
                             f"--dims {name}=low:high; Python: build(..., dims=...))")
