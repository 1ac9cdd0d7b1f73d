"""Debug execution: time every node of a graph (TVM: debug_executor).

    rows = profile_nodes(gmod, runs=10)
    print(format_profile(rows, top=10))
    print(format_profile(rows, top=10, peak_gflops=120.0, read_gbps=24.0))

After one warm-up run, the graph is run `runs` times node by node in graph order
(so each kernel meets the caches as in a real run: its weights, for one, come
from memory), timing every node; each node's median is kept. The rows come back
slowest first with the kernel name (the operator chain, without the hash), the
shapes it reads and writes, and the FLOPs and bytes moved of its call that the
build recorded in the graph JSON (pipeline/lower/cost.py; None in a library built
without them), from which each row's GFLOP/s and GB/s follow.

Given the machine's FMA peak and streaming read bandwidth at the thread count the
profile ran with (pipeline.tools.peak), format_profile also says which roof bounds
each kernel: memory when its FLOPs per byte are below the machine's (peak GFLOP/s
over GB/s), else the FMA peak, and how close to that roof it ran.
"""

from __future__ import annotations

import json
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
    flops: int | None = None        # per call, as the build estimated it
    bytes_moved: int | None = None  # every argument read once, the output written once

    @property
    def gflops(self) -> float | None:
        """GFLOP/s achieved (None without the FLOP count or a time)."""
        return self.flops / self.ms / 1e6 if self.flops is not None and self.ms > 0 else None

    @property
    def gbps(self) -> float | None:
        """GB/s (1e9 bytes) of bytes_moved achieved (None without them or a time)."""
        return self.bytes_moved / self.ms / 1e6 \
            if self.bytes_moved is not None and self.ms > 0 else None

    def roof(self, peak_gflops: float, read_gbps: float) -> tuple[str, float] | None:
        """("memory", % of read_gbps) if the kernel's FLOPs per byte moved are below the
        machine's balance (peak_gflops / read_gbps), else ("compute", % of
        peak_gflops); None without the kernel's figures."""
        if self.gflops is None or self.gbps is None or not self.bytes_moved:
            return None
        if self.flops / self.bytes_moved < peak_gflops / read_gbps:
            return "memory", 100 * self.gbps / read_gbps
        return "compute", 100 * self.gflops / peak_gflops

    def to_dict(self, peak_gflops: float | None = None,
                read_gbps: float | None = None) -> dict:
        """The row as JSON; with both roofs, also "bound" and "bound_pct" (roof)."""
        row = {"node": self.node, "kernel": self.kernel, "ms": round(self.ms, 4),
               "inputs": [list(s) for s in self.inputs],
               "outputs": [list(s) for s in self.outputs]}
        if self.flops is not None and self.bytes_moved is not None:
            row.update({"flops": self.flops, "bytes_moved": self.bytes_moved,
                        "gflops": round(self.gflops or 0.0, 2),
                        "gbps": round(self.gbps or 0.0, 2)})
        bound = self.roof(peak_gflops, read_gbps) if peak_gflops and read_gbps else None
        if bound:
            row.update({"bound": bound[0], "bound_pct": round(bound[1], 1)})
        return row


def _kernel_name(func_name: str) -> str:
    base, sep, tail = func_name.rpartition("_")
    return base if sep and len(tail) == 20 and all(c in "0123456789abcdef" for c in tail) \
        else func_name


def _call_costs(graph_json: str) -> dict[str, tuple[int | None, int | None]]:
    """Node name -> (flops, bytes_moved) of its call, from the graph JSON's attrs."""
    costs = {}
    for node in json.loads(graph_json)["nodes"]:
        attrs = node.get("attrs") or {}
        costs[node["name"]] = tuple(int(attrs[k]) if k in attrs else None
                                    for k in ("flops", "bytes_moved"))
    return costs


def profile_nodes(module: GraphModule | GraphExecutor, runs: int = 10) -> list[NodeTime]:
    """Per-node median times (ms), slowest first. Inputs must already be set."""
    ex = module.module if isinstance(module, GraphModule) else module
    if runs < 1:
        raise ValueError(f"profile_nodes: runs must be >= 1, got {runs}")
    ex.run()  # warm-up
    # Whole passes in graph order (caches as in a real run), timed in C per node.
    times = list(zip(*(ex.run_timed() for _ in range(runs)), strict=True))
    costs = _call_costs(ex.graph_json)
    rows = []
    for (name, func_name), ts in zip(ex.node_names(), times, strict=True):
        ins, outs = ex.node_shapes(name)
        rows.append(NodeTime(name, _kernel_name(func_name), ins, outs,
                             statistics.median(ts) * 1e3, *costs.get(name, (None, None))))
    return sorted(rows, key=lambda r: -r.ms)


def format_profile(rows: list[NodeTime], top: int = 10, peak_gflops: float | None = None,
                   read_gbps: float | None = None) -> str:
    """A text table of the `top` slowest nodes, their share of the total, GFLOP/s and
    GB/s; given the machine's peak and bandwidth (at the profile's thread count), the
    roof bounding each ("mem" or "fma") and the % of it reached."""
    total = sum(r.ms for r in rows) or 1.0
    lines = [f"{'ms':>8} {'%':>5} {'GFLOP/s':>8} {'GB/s':>7} {'roof':>9}  {'kernel':<40} "
             "shapes (inputs -> output)"]
    for r in rows[:top]:
        shapes = " ".join("x".join(map(str, s)) for s in r.inputs) + " -> " + \
            " ".join("x".join(map(str, s)) for s in r.outputs)
        bound = r.roof(peak_gflops, read_gbps) if peak_gflops and read_gbps else None
        roof = f"{'mem' if bound[0] == 'memory' else 'fma'} {bound[1]:3.0f}%" if bound else ""
        lines.append(f"{r.ms:8.3f} {100 * r.ms / total:5.1f} "
                     f"{'' if r.gflops is None else f'{r.gflops:8.1f}':>8} "
                     f"{'' if r.gbps is None else f'{r.gbps:7.1f}':>7} {roof:>9}  "
                     f"{r.kernel[:40]:<40} {shapes}")
    lines.append(f"{total:8.3f} 100.0  total of {len(rows)} nodes")
    if peak_gflops and read_gbps:
        lines.append(f"roof: mem = % of {read_gbps:.1f} GB/s streaming read, fma = % of "
                     f"{peak_gflops:.0f} GFLOP/s (bytes moved and FLOPs per call as the "
                     "build estimated them)")
    return "\n".join(lines)
