"""A kernel's epilogue: the elementwise chain fused after its anchor op, applied to
each output value before it is stored (render.py builds it, lowerings call it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.ir as ir

from pipeline.dsl.builder import Buffer, KernelBuilder


@dataclass(frozen=True, eq=False)
class Epilogue:
    """The chain after the anchor: `source` is the anchor's output name, `chain` the
    elementwise nodes, `args` the kernel's argument buffers by tensor name,
    `scalar_of(op name)` the op's scalar lowering (the DSL does not import the
    lowering table) and `dtypes` each tensor's dtype (a float16 result is rounded
    to half before the next op uses it, kb.narrow)."""

    kb: KernelBuilder
    source: str
    chain: tuple
    args: dict[str, Buffer]
    scalar_of: Callable
    dtypes: dict[str, str]

    def __call__(self, value: ir.Value, index: list) -> ir.Value:
        """The chain's result for the anchor's `value` at output `index`."""
        kb, dtypes = self.kb, self.dtypes
        env = {self.source: kb.narrow(value, dtypes[self.source])}
        for node in self.chain:
            operands = [env[i] if i in env else kb.load_broadcast(self.args[i], index)
                        for i in node.inputs]
            env[node.outputs[0]] = kb.narrow(self.scalar_of(node.op)(kb, operands, node),
                                             dtypes[node.outputs[0]])
        return env[self.chain[-1].outputs[0]]
