"""bfloat16 and float8 operands of the operators that have no such kernels.

Kernels compute these dtypes in float32 anyway (loads decode, stores round:
dsl/minifloat.py), so an ONNX node reading a bfloat16 or float8 tensor converts
as its float32 twin: each such input is cast to float32 first, and each float32
output is rounded back to that dtype after (the first such input's, the type ONNX
gives such an operator's result). The casts are exact widenings and one rounding
per output, what a kernel computing in float32 and storing bfloat16 does. Only the
operators that read these dtypes themselves (casts, quantization, shape queries)
convert as they are; so does Range (its kernels compute in float32 and store the
dtype; a cast back could not read a Range allocated at run time, docs/vm.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from pipeline.dsl.minifloat import MINIFLOATS
from pipeline.ir.graph import Node, fresh_name

NATIVE = ("Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Shape", "Size", "Range")


def widen(ctx, onode) -> tuple[object, list[Node], Iterator[Node]] | None:
    """None if `onode` (an importer OnnxNode) converts as it is; else (its float32
    twin, the casts to float32 to add before it, the casts back to add after it: a
    generator to run once the twin's output types are recorded in ctx.types)."""
    wide = [i for i in dict.fromkeys(onode.inputs)
            if i and i in ctx.types and ctx.types[i].dtype in MINIFLOATS]
    if not wide or onode.op_type in NATIVE:
        return None
    dtype = ctx.types[wide[0]].dtype
    renamed, before = {}, []
    for k, name in enumerate(wide):
        renamed[name] = fresh_name(f"{name}.float32", ctx.types, ctx.params)
        before.append(Node.make("cast", f"{onode.name}.widen{k}", (name,),
                                (renamed[name],), to="float32"))
    outputs = {o: fresh_name(f"{o}.float32", ctx.types, ctx.params) for o in onode.outputs if o}
    twin = replace(onode, inputs=tuple(renamed.get(i, i) for i in onode.inputs),
                   outputs=tuple(outputs.get(o, o) for o in onode.outputs))

    def after() -> Iterator[Node]:
        for k, (name, inner) in enumerate(outputs.items()):
            to = dtype if ctx.types[inner].dtype == "float32" else ctx.types[inner].dtype
            yield Node.make("cast", f"{onode.name}.narrow{k}", (inner,), (name,), to=to)

    return twin, before, after()
