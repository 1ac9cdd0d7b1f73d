"""Symbolic dimensions: a TensorType's shape may hold a named dimension (a `str`,
`"batch"`) beside the integers, for the VM executor (docs/vm.md).

The expression type is as small as the shape rules need: a dimension is an int, a
symbol name, or a product of an int and symbols written canonically as
`"2*batch*seq"` (factors sorted, the coefficient first, omitted when 1). Sums are
not needed yet (Concat along a symbolic axis is refused). A shape's symbols get
values at run time; `bounds` give each symbol's [low, high] at build time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from pipeline.errors import GraphError

__all__ = ["check_bounds", "dim_product", "dim_quotient", "is_symbolic", "parse_bounds",
           "substitute", "symbols_of"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _factors(d) -> tuple[int, tuple[str, ...]]:
    """(coefficient, sorted symbol names) of a dimension."""
    if not isinstance(d, str):
        return int(d), ()
    coeff, names = 1, []
    for part in str(d).split("*"):
        if part.isdigit():
            coeff *= int(part)
        elif _NAME.match(part):
            names.append(part)
        else:
            raise GraphError(f"dimension {d!r}: a symbol is a name of letters, digits and _")
    return coeff, tuple(sorted(names))


def _make(coeff: int, names: Iterable[str]):
    names = tuple(sorted(names))
    if not names or coeff == 0:
        return coeff
    return "*".join(([str(coeff)] if coeff != 1 else []) + list(names))


def is_symbolic(shape) -> bool:
    """Whether `shape` has a dimension that is not an int."""
    return any(isinstance(d, str) for d in shape)


def symbols_of(*shapes) -> list[str]:
    """The symbol names in `shapes`, each once, in order of first appearance."""
    found: dict[str, None] = {}
    for shape in shapes:
        for d in shape:
            found.update(dict.fromkeys(_factors(d)[1]))
    return list(found)


def dim_product(dims: Iterable) -> int | str:
    """The product of `dims` (ints and symbolic dimensions), canonical."""
    coeff, names = 1, []
    for d in dims:
        c, n = _factors(d)
        coeff *= c
        names += n
    return _make(coeff, names)


def dim_quotient(a, b) -> int | str | None:
    """a / b when it is exact in this expression type (b's symbols all in a and its
    coefficient dividing a's), else None."""
    (ca, na), (cb, nb) = _factors(a), _factors(b)
    rest = list(na)
    for name in nb:
        if name not in rest:
            return None
        rest.remove(name)
    if cb == 0 or ca % cb:
        return None
    return _make(ca // cb, rest)


def substitute(shape, values: Mapping[str, int]) -> tuple[int, ...]:
    """`shape` with every symbol replaced by its value in `values` (GraphError
    naming a symbol that has none)."""
    out = []
    for d in shape:
        coeff, names = _factors(d)
        missing = [n for n in names if n not in values]
        if missing:
            raise GraphError(f"symbolic dimension {missing[0]!r} has no value")
        out.append(coeff * math.prod(int(values[n]) for n in names))
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
        if not _NAME.match(str(name)) or not 1 <= low <= high:
            raise ValueError(f"{where}: {name!r}: bounds {low}..{high} must be a name and "
                             "1 <= low <= high")
        out[str(name)] = (low, high)
    return out


def check_bounds(names: Iterable[str], bounds: Mapping[str, tuple[int, int]]) -> None:
    """GraphError naming the first symbol in `names` that has no bound."""
    for name in names:
        if name not in bounds:
            raise GraphError(f"symbolic dimension {name!r} has no bounds: give them (config: "
                             f"models.<name>.dims: {{{name}: [low, high]}}; command line: "
                             f"--dims {name}=low:high; Python: build(..., dims=...))")
