"""Compile a graph with control flow (If, Loop, Scan nodes holding subgraphs,
pipeline/frontend/onnx/control.py) into VM functions (docs/vm.md).

A graph is cut at its control-flow nodes: each run of ordinary nodes between them
is a graph of its own, optimised, planned and lowered as any static graph (the
caller's `lower`), and becomes a VM function (compile.py). The graph's function
invokes those in order and runs each control-flow node with instructions: If as a
branch between two Invokes, Loop and Scan as a counted loop around the body's
Invoke, scan outputs written row by row into tensors allocated before the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from pipeline.ir.graph import Graph, Node
from pipeline.ops.dynamic import data_dependent
from pipeline.ops.sequence import SEQUENCE_OPS
from pipeline.vm import bytecode as bc
from pipeline.vm.compile import Executable, compile_plan
from pipeline.vm.control import emit_control
from pipeline.vm.dynamic import emit_data, row_outputs
from pipeline.vm.sequence import emit_sequence, value_kind

__all__ = ["CONTROL_OPS", "Lower", "compile_program", "has_control_flow"]

# (and the sequence and optional ops: instructions, not kernels; vm/sequence.py)
CONTROL_OPS = ("if", "loop", "scan", *SEQUENCE_OPS)
# (graph, its params) -> (graph JSON after the passes, its params, the kernel symbols)
Lower = Callable[[Graph, dict[str, np.ndarray]], tuple[str, dict[str, np.ndarray], list[str]]]


def has_control_flow(graph: Graph) -> bool:
    """Whether `graph` holds an If, Loop or Scan node or one whose output shape
    depends on values (only the VM runs it)."""
    return any(_vm_only(n) for n in graph.nodes)


def _vm_only(node: Node) -> bool:
    return node.op in CONTROL_OPS or data_dependent(node) is not None


class _Program:
    """The functions, constants and kernels collected so far; function 0 is main."""

    def __init__(self, lower: Lower):
        self.lower = lower
        self.functions: list[bc.Function | None] = [None]
        self.constants: dict[str, np.ndarray] = {}
        self.kernels: list[str] = []

    def add(self, fn: bc.Function, main: bool = False) -> int:
        """Add `fn` (as function 0 if main); its index."""
        if main:
            self.functions[0] = fn
            return 0
        self.functions.append(fn)
        return len(self.functions) - 1

    def constant(self, name: str, value: np.ndarray) -> int:
        """Add a constant to the pool; its LoadConst index."""
        key = f"{len(self.constants)}:{name}"  # unique: functions may reuse a name
        self.constants[key] = np.asarray(value)
        return len(self.constants) - 1

    def plan_function(self, graph: Graph, params: dict, name: str) -> int:
        """A function of a graph without control flow: lowered, then compile_plan."""
        text, lowered_params, symbols = self.lower(graph, params)
        part = compile_plan(text, lowered_params, symbols)
        kernels = [self.kernel_index(k) for k in part.kernels]
        consts = [self.constant(n, v) for n, v in part.constants.items()]

        def remap(ins):
            if isinstance(ins, bc.InvokePacked):
                return dataclasses.replace(ins, kernel=kernels[ins.kernel])
            if isinstance(ins, bc.LoadConst):
                return dataclasses.replace(ins, index=consts[ins.index])
            return ins

        fn = part.functions[0]
        return self.add(dataclasses.replace(fn, name=name,
                                            code=tuple(remap(i) for i in fn.code)))

    def kernel_index(self, symbol: str) -> int:
        """The index of kernel `symbol` in the executable's kernels (added if new)."""
        if symbol not in self.kernels:
            self.kernels.append(symbol)
        return self.kernels.index(symbol)


def _types(graph: Graph, names) -> tuple[bc.TensorType, ...]:
    out = []
    for n in names:
        kind, dtype, shape = value_kind(graph.types[n])
        out.append(bc.TensorType(n, dtype, shape, kind))
    return tuple(out)


def compile_program(graph: Graph, params: dict[str, np.ndarray], lower: Lower) -> Executable:
    """The executable of `graph` (which may hold If, Loop and Scan nodes): main takes
    the graph inputs and returns its outputs in order; `lower` turns each graph
    without control flow into (graph JSON, params, kernel symbols)."""
    program = _Program(lower)
    _graph_function(program, graph, params, "main", main=True)
    exe = Executable(tuple(program.functions), program.constants, tuple(program.kernels))
    exe.verify()
    return exe


def _graph_function(program: _Program, graph: Graph, params: dict, name: str,
                    main: bool = False) -> int:
    if not has_control_flow(graph) and not main:
        return program.plan_function(graph, {p: params[p] for p in graph.params}, name)
    emit = _Emitter(program, graph, params, name)
    segment: list[Node] = []
    for k, node in enumerate(graph.nodes):
        if not _vm_only(node):
            segment.append(node)
            continue
        emit.segment(segment, graph.nodes[k:])
        segment = []
        emit.control(node)
    emit.segment(segment, ())
    return program.add(emit.function(), main)


class _Emitter:
    """Code of one graph's function: registers by tensor name."""

    def __init__(self, program: _Program, graph: Graph, params: dict, name: str):
        self.p, self.graph, self.params, self.name = program, graph, params, name
        self.reg = {n: k for k, n in enumerate(graph.inputs)}
        self.next = len(graph.inputs)
        self.code: list = []
        self.count = 0
        # data-dependent tensors (vm/dynamic.py): -> (register, axis) of their runtime
        # row count if that is their only runtime dimension, else None; and the
        # registers of those held at their bound, which segments read
        self.dynamic: dict[str, tuple[int, int] | None] = {}
        self.bound: dict[str, int] = {}

    def new(self) -> int:
        """A fresh register."""
        self.next += 1
        return self.next - 1

    def get(self, name: str) -> int:
        """The register of tensor `name`, loading a param the first time."""
        if name not in self.reg:
            self.reg[name] = self.new()
            self.code.append(bc.LoadConst(self.reg[name],
                                          self.p.constant(name, self.params[name])))
        return self.reg[name]

    def function(self) -> bc.Function:
        """The function: its code so far, then Ret of the graph outputs."""
        results = tuple(self.get(o) for o in self.graph.outputs)
        self.code.append(bc.Ret(results))
        g = self.graph
        return bc.Function(self.name, _types(g, g.inputs), _types(g, g.outputs), self.next,
                           tuple(self.code))

    def segment(self, nodes: list[Node], rest) -> None:
        """Invoke a function of the ordinary nodes `nodes`; `rest`: the nodes after."""
        made = {o for n in nodes for o in n.outputs}
        later = {i for n in rest for i in n.inputs} | set(self.graph.outputs)
        outputs = [o for n in nodes for o in n.outputs if o in later]
        if not outputs:
            return
        reads = list(dict.fromkeys(i for n in nodes for i in n.inputs if i and i not in made))
        consts = [r for r in reads if r in self.params and r not in self.graph.inputs]
        inputs = [r for r in reads if r not in consts]
        sub = Graph(tuple(inputs), tuple(consts), tuple(outputs), tuple(nodes),
                    {k: t for k, t in self.graph.types.items()
                     if k in made or k in reads})
        rows = row_outputs(self, nodes, outputs)
        self.count += 1
        fn = self.p.plan_function(sub, {c: self.params[c] for c in consts},
                                  f"{self.name}/{self.count}")
        self.call(fn, [self.bound.get(i, self.get(i)) for i in inputs], outputs)
        for name, (like, axis) in rows.items():  # the first rows of what ran at the bound
            self.bound[name], self.reg[name] = self.reg[name], self.new()
            self.code.append(bc.ViewRows(self.reg[name], self.bound[name], like, axis))
            self.dynamic[name] = (self.reg[name], 0)

    def call(self, fn: int, args: list[int], outputs: list[str]) -> list[int]:
        """Invoke function `fn`; its results become the registers of `outputs`."""
        dsts = [self.new() for _ in outputs]
        self.code.append(bc.Invoke(fn, tuple(args), tuple(dsts)))
        self.reg.update(zip(outputs, dsts, strict=True))
        return dsts

    def body(self, node: Node, key: str, n_formal: int) -> tuple[int, list[int]]:
        """The function of subgraph `key` and the registers of its runtime captures;
        captured params become the body's own params."""
        g: Graph = node.attr(key)
        captures = g.inputs[n_formal:]
        consts = [c for c in captures if c in self.params and c not in self.reg]
        runtime = [c for c in captures if c not in consts]
        sub = g.replace(inputs=(*g.inputs[:n_formal], *runtime), params=tuple(consts))
        self.count += 1
        fn = _graph_function(self.p, sub, self.params, f"{self.name}/{node.name}.{key}")
        return fn, [self.get(c) for c in runtime]

    def control(self, node: Node) -> None:
        """The code of an If, Loop or Scan node (pipeline/vm/control.py) or of a
        data-dependent one (pipeline/vm/dynamic.py)."""
        if node.op in SEQUENCE_OPS:
            emit_sequence(self, node)
        elif node.op in CONTROL_OPS:
            emit_control(self, node)
        else:
            emit_data(self, node)
