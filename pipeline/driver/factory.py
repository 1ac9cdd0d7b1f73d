"""What `build` returns: GraphExecutorFactory (graph JSON, params, kernel objects)
and its export_library, which links lib0.o + devc.o into a .so or one .o, or packs
a .tar, through the same steps as the doit build (pipeline/link/export.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.ir.graph import Graph
from pipeline.ir.target import parse_target
from pipeline.link.cc import link_relocatable
from pipeline.link.export import LIBRARY_SUFFIXES, link_library, pack_devc, pack_ro, resolve_cc
from pipeline.lower.kernel import KernelSpec
from pipeline.plan import MemoryPlan
from pipeline.runtime.params import param_chunks
from pipeline.vm.compile import Executable, compile_plan
from pipeline.vm.format import write_ro

__all__ = ["EXECUTORS", "GraphExecutorFactory", "LoweredGraph", "unique_specs"]

EXECUTORS = ("graph", "vm")  # what runs a library: the graph executor or the VM


@dataclass(frozen=True)
class LoweredGraph:
    """An optimised graph ready for export: executor JSON, params, kernel specs."""

    graph: Graph
    params: dict[str, np.ndarray]
    specs: dict[str, KernelSpec]  # node name -> spec (several nodes may share one)
    graph_json: str
    memory: MemoryPlan
    ir: dict[str, str]  # kernel hash -> its LLVM IR (rendered once, compiled from)


def unique_specs(specs) -> list[KernelSpec]:
    """Distinct specs ordered by symbol: the order objects are linked in."""
    return sorted({s.hash: s for s in specs}.values(), key=lambda s: s.symbol)


class GraphExecutorFactory:
    """What `build` returns: graph JSON, params and compiled kernel objects."""

    def __init__(self, lowered: LoweredGraph | None, target_text: str,
                 objects: dict[str, bytes], executor: str = "graph",
                 program: Executable | None = None, specs: Sequence[KernelSpec] = ()):
        if executor not in EXECUTORS:
            raise ValueError(f"executor {executor!r}: allowed {', '.join(EXECUTORS)}")
        self.lowered = lowered
        self.target_text = target_text
        self.objects = objects  # symbol -> object bytes
        self.executor = executor  # "vm": export_library links the VM and the .ro
        # A graph with control flow: its VM executable (pipeline/vm/program.py) and the
        # kernels of all its parts, instead of one lowered graph (lowered is None).
        self.program = program
        self._specs = list(specs)

    def get_executable(self) -> Executable:
        """The VM executable of the graph (what a VM library's .ro holds)."""
        if self.program is not None:
            return self.program
        return compile_plan(self.lowered.graph_json, self.lowered.params,
                            [s.symbol for s in self.kernels])

    def get_ro(self) -> bytes:
        """The .ro bytes of get_executable() (pipeline/vm/format.py)."""
        return write_ro(self.get_executable())

    def _graph(self) -> LoweredGraph:
        if self.lowered is None:
            raise ValueError("a graph with control flow has no graph JSON or params of its "
                             "own: it runs in the VM (get_executable())")
        return self.lowered

    def get_graph_json(self) -> str:
        return self._graph().graph_json

    def get_params(self) -> dict[str, np.ndarray]:
        return dict(self._graph().params)

    @property
    def kernels(self) -> list[KernelSpec]:
        if self.lowered is None:
            return unique_specs(self._specs)
        return unique_specs(self.lowered.specs.values())

    def export_library(self, path: str | Path, cc: str | None = None,
                       options: Sequence[str] = (),
                       fcompile: Callable[[str, list[str], list[str]], object] | None = None,
                       *, pack: str | None = None) -> Path:
        """Link the kernels and the packed graph, params and kernel list into `path`:
        a shared library (.so), one relocatable object (.o), or lib0.o + devc.o in
        a tar (.tar); returns `path`.

        cc: the target's C compiler, which also links (default: the host's $CC or
        cc, allowed only for a target this machine runs); options: extra arguments
        for the final link; fcompile: a callable (output, objects, options) that
        links the .so/.o instead (TVM's export_library argument); pack: how devc.o
        is written ("elf", "c"; default: the ELF writer where it serves the target).
        The steps and their bytes are the doit build's (pipeline/link/export.py).
        With executor "vm" devc.o holds the .ro and the VM interpreter is linked in.
        ValueError for another suffix; ToolchainError for a missing cc;
        LinkError if the compiler fails.
        """
        path = Path(path)
        if path.suffix not in LIBRARY_SUFFIXES:
            raise ValueError(f"{path}: export_library writes "
                             f"{', '.join(LIBRARY_SUFFIXES)} files")
        cc = resolve_cc(parse_target(self.target_text), cc, "export_library(cc=...)")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            kernel_objs = []
            for spec in self.kernels:
                obj = Path(tmp, f"{spec.hash}.o")
                obj.write_bytes(self.objects[spec.symbol])
                kernel_objs.append(obj)
            # A graph whose outputs are all build-time constants has no kernel.
            lib0 = Path(tmp, "lib0.o") if kernel_objs else None
            if lib0 is not None:
                link_relocatable(lib0, kernel_objs, cc)
            devc = Path(tmp, "devc.o")
            if self.executor == "vm":
                pack_ro(self.get_ro(), self.target_text, devc, pack, cc)
            else:
                pack_devc(self._graph().graph_json, param_chunks(self.lowered.params),
                          [s.symbol for s in self.kernels], self.target_text, devc, pack, cc)
            link_library(lib0, devc, path, cc, options, fcompile, vm=self.executor == "vm")
        return path
