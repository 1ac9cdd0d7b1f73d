"""The build driver (TVM: relay.build -> GraphExecutorFactoryModule).

    with PassContext(opt_level=3):
        factory = build(graph, target="llvm -mcpu=native", params=params)
    factory.export_library("out/net.so")   # or "out/net.tar"

`build` optimises the graph, lowers every kernel node to a KernelSpec, renders
and compiles each distinct spec once (what it returns, and export_library, are in
pipeline/driver/factory.py). The doit tasks run the same functions one stage at
a time (pipeline/tasks/stages.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.codegen.c_source import c_object
from pipeline.codegen.compile import compile_ir
from pipeline.codegen.render import render
from pipeline.driver.factory import EXECUTORS, GraphExecutorFactory, LoweredGraph, unique_specs
from pipeline.errors import GraphError, UnsupportedOperatorError
from pipeline.ir.dims import check_bounds, parse_bounds, symbols_of
from pipeline.ir.graph import Graph
from pipeline.ir.target import Target, parse_target
from pipeline.lower.cost import bytes_moved, kernel_flops, stack_bytes
from pipeline.lower.kernel import KernelSpec, kernel_spec
from pipeline.lower.rows import at_values
from pipeline.plan import MemoryPlan, graph_json, plan_memory
from pipeline.transform import PassContext, optimize
from pipeline.vm.compile import Executable
from pipeline.vm.program import CONTROL_OPS, compile_program, has_control_flow


def lower_specs(graph: Graph, params: dict, target: Target, opt_level: int,
                dims: dict[str, tuple[int, int]] | None = None
                ) -> tuple[Graph, dict, MemoryPlan, dict[str, KernelSpec]]:
    """Optimise under the current PassContext and describe every kernel: (the graph,
    its params, the memory plan, node name -> spec; the plan's aliases have none).
    Nothing is rendered (what a caller that only wants the specs needs). dims: the
    bounds of a symbolic graph's dimensions (the plan is made at the highs)."""
    graph, params = optimize(graph, params, target=target)
    plan = plan_memory(graph, {n: high for n, (_, high) in (dims or {}).items()})
    specs = {node.name: kernel_spec(node, graph, target, opt_level) for node in graph.nodes
             if node.name not in plan.aliases}
    return graph, params, plan, specs


def lower_graph(graph: Graph, params: dict, target: Target, opt_level: int,
                known_ir: Callable[[KernelSpec], str | None] | None = None,
                dims: dict[str, tuple[int, int]] | None = None) -> LoweredGraph:
    """Optimise under the current PassContext, describe every kernel and render each
    distinct one to LLVM IR once (its stack scratch is metadata; the kernel is
    compiled from that text: `ir` of the result, hash -> text).

    known_ir: spec -> its IR rendered earlier, None if not at hand (doit's out/specs,
    the kernel cache), so a warm rerun renders nothing. dims: bounds per symbolic
    dimension of the graph (GraphError naming one without), kept in the graph JSON
    for the VM (docs/vm.md).
    """
    names = symbols_of(*(graph.types[n].shape for n in graph.inputs))
    check_bounds(names, dims or {})
    dims = {n: tuple(dims[n]) for n in names}
    graph, params, plan, specs = lower_specs(graph, params, target, opt_level, dims)
    ir = {s.hash: (known_ir and known_ir(s)) or render(s) for s in unique_specs(specs.values())}
    symbols = {name: s.symbol for name, s in specs.items()}
    text = graph_json(graph, {**symbols, **dict.fromkeys(plan.aliases, "__nop")}, plan,
                      _metadata(graph, params, specs, ir, dims), dims)
    return LoweredGraph(graph, params, specs, text, plan, ir)


def _metadata(graph: Graph, params: dict, specs: dict[str, KernelSpec],
              ir: dict[str, str], dims: dict[str, tuple[int, int]]) -> dict[str, dict]:
    """Node name -> its call's flops, bytes_moved, stack_bytes (pipeline/lower/cost.py;
    the stack from the kernel's IR, `ir`: hash -> text) and constant_bytes (the
    parameters it reads); a kernel with symbolic dimensions counted at their highs."""
    nodes = {n.name: n for n in graph.nodes}
    stack = {h: stack_bytes(text) for h, text in ir.items()}
    high = {name: _at_highs(s, graph, nodes[name], dims) for name, s in specs.items()}
    return {name: {"flops": kernel_flops(high[name]), "bytes_moved": bytes_moved(high[name]),
                   "stack_bytes": stack[s.hash],
                   "constant_bytes": sum(np.asarray(params[i]).nbytes
                                         for i in set(nodes[name].inputs) if i in params)}
            for name, s in specs.items()}


def _at_highs(spec: KernelSpec, graph: Graph, node, dims: dict) -> KernelSpec:
    """`spec` with its symbols at their upper bounds (for its costs); a static spec
    as it is."""
    if not spec.symbols:
        return spec
    names = symbols_of(*(graph.types[i].shape for i in (*node.inputs, node.outputs[0])))
    return at_values(spec, {f"s{k}": dims[n][1] for k, n in enumerate(names)})


def compile_kernel(spec: KernelSpec, text: str | None = None) -> tuple[str, bytes]:
    """(LLVM IR text, object bytes) of one kernel; `text`: its IR if rendered already
    (lower_graph's), else it is rendered now."""
    text = render(spec) if text is None else text
    if spec.target.kind == "c":  # C source, built by the target's compiler
        return text, c_object(text, spec.target, spec.symbol)
    return text, compile_ir(text, spec.target, spec.opt_level, name=spec.symbol)


def build(graph: Graph, target: str = "llvm", params: dict | None = None,
          opt_level: int | None = None,
          kernel_cache: dict[str, bytes] | None = None,
          executor: str = "graph", dims=None,
          cc: str | None = None) -> GraphExecutorFactory:
    """Optimise and compile `graph` for `target` under the current PassContext.

    opt_level is LLVM's (0..3); it defaults to the PassContext's opt_level.
    kernel_cache (kernel hash -> object bytes) is read and filled: a kernel
    found there is not compiled again (its hash names everything that decides
    its machine code, as for the doit kernel cache). executor: "graph" (the graph
    executor) or "vm" (export_library links a VM library with the .ro, docs/vm.md).
    dims: bounds of the graph's symbolic dimensions, {"seq": (1, 512)} (or
    ["seq=1:512"]); a graph with symbolic dimensions runs in the VM only, and each
    of its symbols needs bounds (GraphError naming the first that has none).
    cc: the C compiler of a `c` target's kernels (None: the host's; needed for
    another machine's triple).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"executor {executor!r}: allowed {', '.join(EXECUTORS)}")
    cfg = PassContext.current()
    resolved = parse_target(target, cc)
    llvm_level = cfg.opt_level if opt_level is None else opt_level
    cache = {} if kernel_cache is None else kernel_cache
    names = symbols_of(*(graph.types[n].shape for n in graph.inputs))
    if names:
        return _build_symbolic(graph, dict(params or {}), target, llvm_level, cache, executor,
                               parse_bounds(dims or {}, "build(dims=...)"))
    if has_control_flow(graph):
        return _build_program(graph, dict(params or {}), resolved, target, llvm_level, cache,
                              executor)
    lowered = lower_graph(graph, dict(params or {}), resolved, llvm_level)
    objects = {}
    for spec in unique_specs(lowered.specs.values()):
        if spec.hash not in cache:
            cache[spec.hash] = compile_kernel(spec, lowered.ir[spec.hash])[1]
        objects[spec.symbol] = cache[spec.hash]
    return GraphExecutorFactory(lowered, target, objects, executor)


@dataclass(frozen=True)
class LoweredProgram:
    """A graph with If, Loop or Scan lowered for the VM: its executable and each part
    without control flow as lowered (their specs and IR are the program's kernels)."""

    program: Executable
    parts: tuple[LoweredGraph, ...]

    @property
    def specs(self) -> list[KernelSpec]:
        """The distinct kernels of all the parts, in link order."""
        return unique_specs(s for part in self.parts for s in part.specs.values())

    @property
    def ir(self) -> dict[str, str]:
        """Kernel hash -> its LLVM IR."""
        return {h: text for part in self.parts for h, text in part.ir.items()}


def lower_program(graph: Graph, params: dict, target: Target, opt_level: int,
                  known_ir: Callable[[KernelSpec], str | None] | None = None
                  ) -> LoweredProgram:
    """lower_graph for a graph with If, Loop or Scan nodes: each part without control
    flow is lowered as a graph of its own (known_ir as lower_graph's), and the VM
    executable joins them (pipeline/vm/program.py). Nothing is compiled."""
    parts: list[LoweredGraph] = []

    def lower(part: Graph, part_params: dict) -> tuple[str, dict, list[str]]:
        lowered = lower_graph(part, dict(part_params), target, opt_level, known_ir)
        parts.append(lowered)
        return (lowered.graph_json, lowered.params,
                [s.symbol for s in unique_specs(lowered.specs.values())])

    program = compile_program(graph, params, lower)
    return LoweredProgram(program, tuple(parts))


def refuse_vm_only_nodes(graph: Graph) -> None:
    """UnsupportedOperatorError naming the nodes of `graph` only the VM runs: If, Loop
    and Scan (control flow) and those whose output shapes depend on values; nothing if
    it has none."""
    found: dict[str, list[str]] = {}
    for n in graph.nodes:
        if has_control_flow(graph.replace(nodes=(n,))):
            kind = ("control flow" if n.op in CONTROL_OPS
                    else "data-dependent output shapes")
            found.setdefault(kind, []).append(f"{n.name} ({n.op})")
    if found:
        listing = "; ".join(f"{kind} at node(s) {', '.join(names[:5])}"
                            for kind, names in found.items())
        raise UnsupportedOperatorError(
            f"unsupported operator(s) for the graph executor: {listing}: only the VM runs "
            "them (executor='vm')")


def _build_program(graph: Graph, params: dict, resolved: Target, target: str, llvm_level: int,
                   cache: dict[str, bytes], executor: str) -> GraphExecutorFactory:
    """build() of a graph with If, Loop or Scan nodes (lower_program). Only the VM
    runs it: UnsupportedOperatorError for executor "graph", naming the nodes as the
    importer does."""
    if executor != "vm":
        refuse_vm_only_nodes(graph)
    lowered = lower_program(graph, params, resolved, llvm_level)
    objects = {}
    for spec in lowered.specs:
        if spec.hash not in cache:
            cache[spec.hash] = compile_kernel(spec, lowered.ir[spec.hash])[1]
        objects[spec.symbol] = cache[spec.hash]
    specs = [s for part in lowered.parts for s in part.specs.values()]
    return GraphExecutorFactory(None, target, objects, executor, lowered.program, specs)


def _build_symbolic(graph: Graph, params: dict, target: str, llvm_level: int,
                    cache: dict[str, bytes], executor: str,
                    bounds: dict[str, tuple[int, int]]) -> GraphExecutorFactory:
    """build() of a graph with symbolic dimensions (docs/vm.md): optimised as any
    graph (passes that need static shapes skip what has symbols), planned at the
    upper bounds, each kernel over its symbolic rows (pipeline/lower/rows.py), and
    one VM executable whose tensors take their runtime shapes."""
    names = symbols_of(*(graph.types[n].shape for n in graph.inputs))
    if executor != "vm":
        raise GraphError(f"symbolic dimension(s) {', '.join(map(repr, names))}: only the VM "
                         "executor runs them (executor='vm'), or fix them with a shape override")
    if has_control_flow(graph):
        raise GraphError("symbolic dimensions together with If/Loop/Scan are not supported "
                         "yet, nor with data-dependent shapes")
    lowered = lower_graph(graph, params, parse_target(target), llvm_level, dims=bounds)
    objects = {}
    for spec in unique_specs(lowered.specs.values()):
        if spec.hash not in cache:
            cache[spec.hash] = compile_kernel(spec, lowered.ir[spec.hash])[1]
        objects[spec.symbol] = cache[spec.hash]
    return GraphExecutorFactory(lowered, target, objects, executor)
