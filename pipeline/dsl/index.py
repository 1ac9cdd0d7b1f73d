"""Index: an i64 index value whose Python operators emit the integer IR.

Loop variables, `kb.i64(n)` and everything computed from them are Index values,
so a lowering writes offsets as arithmetic, `(n * c + ic) * plane + p`, and
Python ints mix in freely. What each operator emits (no nsw/nuw flags: LLVM
infers them where the loop bounds allow):

    a + b   add        a - b   sub (a - int: add a, -int, LLVM's canonical form)
    a * b   mul        -a      sub 0, a
    a // b  udiv       a % b   urem   (indices are never negative)
    a < b, a <= b, a > b, a >= b      icmp signed, an i1 llvmlite value
    a.below(n)                        icmp unsigned <: 0 <= a < n

A Python int operand is folded where the result is known without IR: a + 0,
0 + a, a - 0, a * 1, 1 * a, a * 0, 0 * a, a // 1 and a % 1 emit nothing. `==`
keeps its Python meaning (identity); use `kb.compare` for an IR equality.
"""

from __future__ import annotations

import llvmlite.ir as ir

I64 = ir.IntType(64)


class Index:
    """An i64 llvmlite value plus the KernelBuilder whose current IRBuilder its
    operators emit into (`parallel_for` swaps that builder while it builds)."""

    __slots__ = ("kb", "value")

    def __init__(self, kb, value: ir.Value):
        self.kb, self.value = kb, value

    @property
    def b(self) -> ir.IRBuilder:
        return self.kb.b

    def _wrap(self, value: ir.Value) -> Index:
        return Index(self.kb, value)

    def __repr__(self) -> str:
        return f"Index({self.value.get_reference()})"

    # -- arithmetic; `other` is an Index or a Python int --

    def __add__(self, other) -> Index:
        if isinstance(other, int) and other == 0:
            return self
        return self._wrap(self.b.add(self.value, raw(other)))

    def __radd__(self, other: int) -> Index:
        if other == 0:
            return self
        return self._wrap(self.b.add(raw(other), self.value))

    def __sub__(self, other) -> Index:
        if isinstance(other, int):
            return self + -other
        return self._wrap(self.b.sub(self.value, raw(other)))

    def __rsub__(self, other: int) -> Index:
        return self._wrap(self.b.sub(raw(other), self.value))

    def __neg__(self) -> Index:
        return self._wrap(self.b.neg(self.value))

    def __mul__(self, other):
        if isinstance(other, int) and other in (0, 1):
            return self if other else 0
        return self._wrap(self.b.mul(self.value, raw(other)))

    def __rmul__(self, other: int):
        if other in (0, 1):
            return self if other else 0
        return self._wrap(self.b.mul(raw(other), self.value))

    def __floordiv__(self, other) -> Index:
        if isinstance(other, int) and other == 1:
            return self
        return self._wrap(self.b.udiv(self.value, raw(other)))

    def __mod__(self, other):
        if isinstance(other, int) and other == 1:
            return 0
        return self._wrap(self.b.urem(self.value, raw(other)))

    # -- comparisons (signed), giving i1 llvmlite values --

    def __lt__(self, other) -> ir.Value:
        return self.b.icmp_signed("<", self.value, raw(other))

    def __le__(self, other) -> ir.Value:
        return self.b.icmp_signed("<=", self.value, raw(other))

    def __gt__(self, other) -> ir.Value:
        return self.b.icmp_signed(">", self.value, raw(other))

    def __ge__(self, other) -> ir.Value:
        return self.b.icmp_signed(">=", self.value, raw(other))

    def below(self, n) -> ir.Value:
        """i1: 0 <= self < n, as one unsigned comparison (a negative self wraps high)."""
        return self.b.icmp_unsigned("<", self.value, raw(n))

    __hash__ = object.__hash__


def raw(v) -> ir.Value:
    """The llvmlite value of an Index, an int (as an i64 constant) or an llvmlite value."""
    if isinstance(v, Index):
        return v.value
    if isinstance(v, int):
        return ir.Constant(I64, v)
    return v
