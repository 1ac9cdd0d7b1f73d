"""Debug execution: time every node of a graph (TVM: debug_executor).

    rows = profile_nodes(gmod, runs=10)
    print(format_profile(rows, top=10))

After one warm-up run, the graph is run `runs` times node by node in graph order
(so each kernel meets the caches as in a real run: its weights, for one, come
from memory), timing every node; each node's median is kept. The rows come back
slowest first with the kernel name (the operator chain, without the hash) and
the shapes it reads and writes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pipeline.runtime.graph_executor import GraphExecutor, GraphModule


@dataclass(frozen=True)
class NodeTime:
    node: str
    kernel: str              # function name without its hash suffix
    inputs: list[tuple]
    outputs: list[tuple]
    ms: float                # median over the runs

    def to_dict(self) -> dict:
        return {"node": self.node, "kernel": self.kernel, "ms": round(self.ms, 4),
                "inputs": [list(s) for s in self.inputs],
                "outputs": [list(s) for s in self.outputs]}


def _kernel_name(func_name: str) -> str:
    base, sep, tail = func_name.rpartition("_")
    return base if sep and len(tail) == 20 and all(c in "0123456789abcdef" for c in tail) \
        else func_name


def profile_nodes(module: GraphModule | GraphExecutor, runs: int = 10) -> list[NodeTime]:
    """Per-node median times (ms), slowest first. Inputs must already be set."""
    ex = module.module if isinstance(module, GraphModule) else module
    if runs < 1:
        raise ValueError(f"profile_nodes: runs must be >= 1, got {runs}")
    ex.run()  # warm-up
    # Whole passes in graph order (caches as in a real run), timed in C per node.
    times = list(zip(*(ex.run_timed() for _ in range(runs)), strict=True))
    rows = []
    for (name, func_name), ts in zip(ex.node_names(), times, strict=True):
        ins, outs = ex.node_shapes(name)
        rows.append(NodeTime(name, _kernel_name(func_name), ins, outs,
                             statistics.median(ts) * 1e3))
    return sorted(rows, key=lambda r: -r.ms)


def format_profile(rows: list[NodeTime], top: int = 10) -> str:
    """A text table of the `top` slowest nodes and their share of the total."""
    total = sum(r.ms for r in rows) or 1.0
    lines = [f"{'ms':>8} {'%':>5}  {'kernel':<40} shapes (inputs -> output)"]
    for r in rows[:top]:
        shapes = " ".join("x".join(map(str, s)) for s in r.inputs) + " -> " + \
            " ".join("x".join(map(str, s)) for s in r.outputs)
        lines.append(f"{r.ms:8.3f} {100 * r.ms / total:5.1f}  {r.kernel[:40]:<40} {shapes}")
    lines.append(f"{total:8.3f} 100.0  total of {len(rows)} nodes")
    return "\n".join(lines)
