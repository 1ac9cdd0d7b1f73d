"""Runtime dimensions in a kernel: the shapes of a kernel with symbolic dimensions with
each symbol replaced by an i64 Index, so strides and loop bounds become runtime
products (dsl/index.py: Index arithmetic mixes with ints).

Such a kernel's body is `i32 @f.body(ptr %args)` whose args hold its buffers and,
last, the dims array (codegen/rows.py's wrapper `f(args, dims)` builds that array):
the dims then travel like a buffer, so a parallel_for body (another function, whose
buffers are re-read from the same args) re-reads them with `reload_shapes`. An Index
is a value of the function that made it: inside a parallel_for, use that function's.
"""

from __future__ import annotations

from pipeline.dsl.index import I64, Index, raw
from pipeline.dsl.types import PTR
from pipeline.ir.dims import dim_terms
from pipeline.ir.graph import TensorType


def _apply(kb, dims_ptr, params: list[TensorType], symbols: tuple[str, ...]
           ) -> list[TensorType]:
    values = {name: Index(kb, kb.b.load(kb.b.gep(dims_ptr, [raw(k)], source_etype=I64),
                                        typ=I64, name=name))
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


def runtime_shapes(kb, params: list[TensorType], symbols: tuple[str, ...]
                   ) -> list[TensorType]:
    """The buffer types of a kernel body (module doc) in kb's entry block: `params`
    with Index shapes, then the dims array's own type."""
    slot = kb.b.gep(kb.function.args[0], [raw(len(params))], source_etype=PTR, inbounds=True)
    dims_ptr = kb.b.load(slot, typ=PTR, name="dims")
    return [*_apply(kb, dims_ptr, params, symbols), TensorType((len(symbols),), "int64")]


def reload_shapes(kb, params: list[TensorType], symbols: tuple[str, ...]
                  ) -> list[TensorType]:
    """`params` with Index shapes valid in the function kb builds now (inside a
    parallel_for body: from its rebound dims buffer)."""
    return _apply(kb, kb.buffers[len(params)].ptr, params, symbols)


def dim_value(kb, d) -> Index:
    """Dimension expression `d` of a kernel's attributes (its symbols renamed s0,
    s1... by kernel_spec) as an Index: the symbols' values are the dims array, the
    kernel's last buffer; an int is a constant."""
    if not isinstance(d, str):
        return kb.i64(int(d))
    dims = kb.buffers[-1]
    total = kb.i64(0)
    for names, coeff in dim_terms(d):
        term = kb.i64(coeff)
        for name in names:
            term = term * kb.index(kb.load(dims, int(name[1:])))
        total = total + term
    return total
