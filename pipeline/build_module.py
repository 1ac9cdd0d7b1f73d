"""The build driver (TVM: relay.build -> GraphExecutorFactoryModule).

    with PassContext(opt_level=3):
        factory = build(graph, target="llvm -mcpu=native", params=params)
    factory.export_library("out/net.so")   # or "out/net.tar"

`build` optimises the graph, lowers every kernel node to a KernelSpec and
compiles each distinct spec once. The doit tasks run the same functions one
stage at a time (pipeline/stages.py).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.codegen.compile import compile_ir
from pipeline.codegen.render import render
from pipeline.codegen.target import Target, parse_target
from pipeline.contrib import cc
from pipeline.ir.graph import Graph
from pipeline.lower.kernel import KernelSpec, kernel_spec
from pipeline.plan import MemoryPlan, graph_json, plan_memory
from pipeline.runtime.pack import pack_blob, write_devc
from pipeline.runtime.params import save_params
from pipeline.transform import PassContext, optimize


@dataclass(frozen=True)
class LoweredGraph:
    """An optimised graph ready for export: executor JSON, params, kernel specs."""

    graph: Graph
    params: dict[str, np.ndarray]
    specs: dict[str, KernelSpec]  # node name -> spec (several nodes may share one)
    graph_json: str
    memory: MemoryPlan


def lower_graph(graph: Graph, params: dict, target: Target, opt_level: int) -> LoweredGraph:
    """Optimise under the current PassContext and describe every kernel."""
    graph, params = optimize(graph, params, target=target)
    specs = {node.name: kernel_spec(node, graph, target, opt_level) for node in graph.nodes}
    plan = plan_memory(graph)
    text = graph_json(graph, {name: s.symbol for name, s in specs.items()}, plan)
    return LoweredGraph(graph, params, specs, text, plan)


def compile_kernel(spec: KernelSpec) -> tuple[str, bytes]:
    """(LLVM IR text, object bytes) of one kernel."""
    text = render(spec)
    return text, compile_ir(text, spec.target, spec.opt_level, name=spec.symbol)


def unique_specs(specs) -> list[KernelSpec]:
    """Distinct specs ordered by symbol: the order objects are linked in."""
    return sorted({s.hash: s for s in specs}.values(), key=lambda s: s.symbol)


class GraphExecutorFactory:
    """What `build` returns: graph JSON, params and compiled kernel objects."""

    def __init__(self, lowered: LoweredGraph, target_text: str,
                 objects: dict[str, bytes]):
        self.lowered = lowered
        self.target_text = target_text
        self.objects = objects  # symbol -> object bytes

    def get_graph_json(self) -> str:
        return self.lowered.graph_json

    def get_params(self) -> dict[str, np.ndarray]:
        return dict(self.lowered.params)

    @property
    def kernels(self) -> list[KernelSpec]:
        return unique_specs(self.lowered.specs.values())

    def export_library(self, path: str | Path) -> Path:
        """Write lib0.o + devc.o and link them into `path` (.so), or pack them (.tar)."""
        path = Path(path)
        if path.suffix not in (".so", ".tar"):
            raise ValueError(f"{path}: export_library writes .so or .tar files")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            kernel_objs = []
            for spec in self.kernels:
                obj = Path(tmp, f"{spec.hash}.o")
                obj.write_bytes(self.objects[spec.symbol])
                kernel_objs.append(obj)
            lib0, devc = Path(tmp, "lib0.o"), Path(tmp, "devc.o")
            # A graph whose outputs are all build-time constants has no kernel.
            objects = [lib0, devc] if kernel_objs else [devc]
            if kernel_objs:
                cc.link_relocatable(lib0, kernel_objs)
            blob = pack_blob(self.lowered.graph_json, save_params(self.lowered.params),
                             [s.symbol for s in self.kernels], self.target_text)
            write_devc(blob, parse_target(self.target_text), devc)
            if path.suffix == ".so":
                cc.create_shared(path, objects)
            else:
                cc.create_tar(path, objects)
        return path


def build(graph: Graph, target: str = "llvm", params: dict | None = None,
          opt_level: int | None = None,
          kernel_cache: dict[str, bytes] | None = None) -> GraphExecutorFactory:
    """Optimise and compile `graph` for `target` under the current PassContext.

    opt_level is LLVM's (0..3); it defaults to the PassContext's opt_level.
    kernel_cache (kernel hash -> object bytes) is read and filled: a kernel
    found there is not compiled again (its hash names everything that decides
    its machine code, as for the doit kernel cache).
    """
    cfg = PassContext.current()
    resolved = parse_target(target)
    llvm_level = cfg.opt_level if opt_level is None else opt_level
    lowered = lower_graph(graph, dict(params or {}), resolved, llvm_level)
    cache = {} if kernel_cache is None else kernel_cache
    objects = {}
    for spec in unique_specs(lowered.specs.values()):
        if spec.hash not in cache:
            cache[spec.hash] = compile_kernel(spec)[1]
        objects[spec.symbol] = cache[spec.hash]
    return GraphExecutorFactory(lowered, target, objects)
