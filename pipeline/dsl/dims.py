"""Runtime dimensions in a kernel: the shapes of a kernel with symbolic dimensions
(`int32_t f(void **args, const int64_t *dims)`) with each symbol replaced by the i64
Index its `dims` argument holds, so strides and loop bounds become runtime products
(dsl/index.py: Index arithmetic mixes with ints). Such a kernel's loops must not be
parallel_for's: its outlined body is another function, which cannot see them."""

from __future__ import annotations

from pipeline.dsl.index import I64, Index, raw
from pipeline.ir.dims import dim_terms
from pipeline.ir.graph import TensorType


def runtime_shapes(kb, dims, params: list[TensorType], symbols: tuple[str, ...]
                   ) -> list[TensorType]:
    """`params` with symbol k (`symbols[k]`, also inside "2*s0*s1" or "s0+1") the Index
    of dims[k], loaded in the entry block of kb's function."""
    values = {name: Index(kb, kb.b.load(kb.b.gep(dims, [raw(k)], source_etype=I64), typ=I64,
                                        name=name))
              for k, name in enumerate(symbols)}

    def dim(d):
        if not isinstance(d, str):
            return d
        total = 0
        for names, coeff in dim_terms(d):
            term = coeff
            for name in names:
                term = term * values[name]
            total = total + term
        return total

    return [TensorType(tuple(dim(d) for d in t.shape), t.dtype) for t in params]
