"""Render: KernelSpec -> LLVM IR text.

The anchor op lowers itself (its `lower` in pipeline/kernels); elementwise ops
after it form the epilogue, a function applied to each output value before
it is stored. A kernel whose anchor is itself elementwise is a parallel loop of
vectors over the output (dsl/elementwise.py) when its ops have vector forms, else a
loop nest applying the whole chain to each element.
"""

from __future__ import annotations

import llvmlite.ir as ir

from pipeline.codegen.rows import render_dims_call, render_rows
from pipeline.dsl.builder import KernelBuilder
from pipeline.dsl.dims import reload_shapes
from pipeline.dsl.elementwise import vector_elementwise, vectorizable
from pipeline.dsl.epilogue import Epilogue
from pipeline.dsl.vector import ELEMENT_WORK, parallel_nest
from pipeline.errors import GraphError
from pipeline.kernels import lowering_of
from pipeline.lower.kernel import KernelSpec
from pipeline.lower.rows import row_prefix
from pipeline.ops import OpKind, get, infer_types


def render(spec: KernelSpec) -> str:
    """LLVM IR text of a module that defines the kernel `spec.symbol`: `int32_t
    f(void **args)`, or for a spec with symbolic dimensions `int32_t f(void **args,
    const int64_t *dims)` over its rows (codegen/rows.py)."""
    module = ir.Module(name=spec.symbol)
    module.triple = spec.target.triple
    module.data_layout = str(spec.target.target_machine(spec.opt_level).target_data)
    if spec.symbols:
        _render_symbolic(module, spec)
    else:
        _render_static(module, spec, spec.symbol)
    return str(module)


def _render_symbolic(module: ir.Module, spec: KernelSpec) -> None:
    """A kernel with symbolic dimensions: over its symbolic rows (codegen/rows.py), or
    else with runtime dimensions inside: an elementwise chain as a loop nest, another
    anchor by its operator's `lower_dims` if it has one (else the rows' GraphError)."""
    try:
        row_prefix(spec)
    except GraphError:
        kind = get(spec.ops[0].op).kind
        if kind != OpKind.ELEMENTWISE and lowering_of(spec.ops[0].op).lower_dims is None:
            raise
        body = _render_static(module, spec, f"{spec.symbol}.body", spec.symbols)
        body.linkage = "internal"
        render_dims_call(module, spec, body)
        return
    render_rows(module, spec, _render_static)


def _render_static(module: ir.Module, spec: KernelSpec, symbol: str,
                   symbols: tuple[str, ...] = ()) -> ir.Function:
    """Define the kernel `spec` in `module` as function `symbol`: a static one, or
    with `symbols` (spec.symbols) one whose shapes are runtime (dsl/dims.py)."""
    kb = KernelBuilder(module, symbol, list(spec.params), symbols)
    kb.threads = spec.target.threaded
    kb.vector_width = spec.target.vector_width  # lanes a lowering may tile for
    n = len(spec.params)  # (a kernel with symbols has its dims as one buffer more)
    args = {f"a{i}": buf for i, buf in enumerate(kb.buffers[:n - 1])}
    out = kb.buffers[n - 1]
    anchor, chain = spec.ops[0], spec.ops[1:]
    # Each op's result dtype: a float16 / int8 / uint8 result is rounded to its dtype
    # before the next op of the chain uses it (kb.narrow), as unfused ops would store it.
    types = dict(zip(args, spec.params, strict=False))
    for node in spec.ops:
        types.update(zip(node.outputs, infer_types(node, [types[i] for i in node.inputs]),
                         strict=True))
    dtypes = {name: t.dtype for name, t in types.items()}

    def scalar_of(op: str):
        return lowering_of(op).scalar

    # Vector kernels apply the chain to whole vectors (dsl/vector.py apply_epilogue).
    epilogue = Epilogue(kb, anchor.outputs[0], chain, args, scalar_of, dtypes)

    kind = get(anchor.op).kind
    lowering = lowering_of(anchor.op)
    if symbols and kind == OpKind.ELEMENTWISE:  # runtime shapes: a plain loop nest
        with kb.nest(out.type.shape) as index:
            value = lowering.scalar(kb, [kb.load_broadcast(args[i], index)
                                         for i in anchor.inputs], anchor)
            kb.store(out, kb.dot(index, out.strides), epilogue(value, index) if chain
                     else value)
    elif symbols:
        lowering.lower_dims(kb, anchor, [args[i] for i in anchor.inputs], out,
                            epilogue if chain else None,
                            lambda: reload_shapes(kb, list(spec.params), symbols))
    elif kind == OpKind.ELEMENTWISE and out.type.shape and vectorizable(spec.ops, dtypes):
        vector_elementwise(kb, spec.ops, args, out, scalar_of, dtypes,
                           spec.target.vector_width)
    elif kind == OpKind.ELEMENTWISE:
        work = out.type.size * len(spec.ops) * ELEMENT_WORK
        with parallel_nest(kb, out.type.shape, "d", work=work) as index:
            value = lowering.scalar(kb, [kb.load_broadcast(args[i], index)
                                         for i in anchor.inputs], anchor)
            if chain:
                value = epilogue(value, index)
            kb.store(out, kb.dot(index, out.strides), value)
    else:
        lowering.lower(kb, anchor, [args[i] for i in anchor.inputs], out,
                    epilogue if chain else None)
    kb.finish()
    return kb.function
