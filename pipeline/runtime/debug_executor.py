"""The debug executor (TVM: tvm.contrib.debugger.debug_executor): a graph run
node by node, recording each node's output and time.

    lib = pipeline.runtime.load_module("model.so")
    gmod = debug_executor.create(lib.graph_json, lib, "cpu")
    # (or: debug_executor.GraphModuleDebug(lib["default"]()))
    gmod.run(data=x)                         # times every node, records every output
    gmod.node_outputs["fused_conv2d_relu"]   # that node's outputs in the run
    gmod.debug_get_output(7)                 # graph node 7 (or a name), run up to it now
    gmod.display_debug_result()              # per-node times, slowest first

Node indices are the graph JSON's (inputs and params included), as TVM's are.
The memory plan hands a node's output storage to later nodes, so outputs are
copied right after their node runs (GraphExecutor.run_node, node_outputs; C:
pl_run_node, pl_get_node_output in debug.c).
A reshape or a concat the plan writes in place runs nothing (`__nop`): its output is
its inputs' bytes, one after the other, in its own shape. Times come from
pipeline.runtime.profile.profile_nodes (separate whole passes, so copying outputs does
not disturb them).

With dump_root, each run() also writes there (unlike TVM, nothing without it):
output_tensors.params, every node output as a TVM param dict keyed
"<node>:<output index>", and execution_trace.json, the nodes' median times in run
order as a Chrome trace (chrome://tracing, Perfetto).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from pipeline.files import atomic_write
from pipeline.runtime.graph_executor import GraphExecutor, GraphModule, check_device
from pipeline.runtime.params import save_params
from pipeline.runtime.profile import NodeTime, format_profile, profile_nodes

__all__ = ["GraphModuleDebug", "create"]


def create(graph_json_str: str | None, libmod: Any, device: Any = None,
           dump_root: str | os.PathLike | None = None, timing_runs: int = 10,
           ) -> GraphModuleDebug:
    """A GraphModuleDebug over a new executor of the loaded library `libmod`
    (pipeline.runtime.Module), TVM's arguments. The library runs its own graph:
    graph_json_str may be None, else it must be that graph (ValueError)."""
    check_device(device)
    if graph_json_str is not None and json.loads(graph_json_str) != json.loads(libmod.graph_json):
        raise ValueError(f"debug_executor.create: graph_json_str is not the graph of "
                         f"{libmod.path}; a library runs the graph it was built with")
    return GraphModuleDebug(libmod["default"](device), device, dump_root, timing_runs)


class GraphModuleDebug(GraphModule):
    """A GraphModule whose run() records every node's outputs and time.

    After run(): node_outputs maps each op node's name to copies of its outputs,
    node_times each executed node's name to its NodeTime (median of timing_runs
    passes).
    """

    def __init__(self, module: GraphExecutor, device: Any = None,
                 dump_root: str | os.PathLike | None = None, timing_runs: int = 10,
                 num_threads: int | None = None):
        super().__init__(module, num_threads)
        check_device(device)
        if isinstance(timing_runs, bool) or not isinstance(timing_runs, int) or timing_runs < 1:
            raise ValueError(f"GraphModuleDebug: timing_runs must be an integer >= 1, got "
                             f"{timing_runs!r}")
        self.timing_runs, self.dump_root = timing_runs, dump_root
        graph = json.loads(module.graph_json)
        self._nodes, self._row_ptr = graph["nodes"], graph["node_row_ptr"]
        self._shapes = graph["attrs"]["shape"][1]
        self._step = {name: k for k, (name, _) in enumerate(module.node_names())}
        self.node_outputs: dict[str, list[np.ndarray]] = {}
        self.node_times: dict[str, NodeTime] = {}

    def _node_index(self, node: int | str) -> int:
        if isinstance(node, str):
            for nid, graph_node in enumerate(self._nodes):
                if graph_node["name"] == node:
                    return nid
            raise KeyError(f"no node named {node!r} in this graph")
        if isinstance(node, (int, np.integer)) and not isinstance(node, bool):
            if not 0 <= node < len(self._nodes):
                raise IndexError(f"node index {node} out of range: the graph has "
                                 f"{len(self._nodes)} nodes")
            return int(node)
        raise TypeError(f"debug_get_output: a node index or name, got {node!r}")

    def _sources(self, nid: int, index: int) -> list[tuple[int, int]]:
        """The (node, output) pairs, inputs or executed nodes, whose bytes one after the
        other are output `index` of node nid: itself, unless nid runs nothing (`__nop`:
        a reshape the plan aliases, a concat written in place)."""
        if self._nodes[nid]["op"] == "null" or self._nodes[nid]["name"] in self._step:
            return [(nid, index)]
        return [src for i, idx, *_ in self._nodes[nid]["inputs"] for src in self._sources(i, idx)]

    def _joined(self, nid: int, index: int, value_of) -> np.ndarray:
        """Output `index` of node nid in its shape, from `value_of((node, output))` of
        each of its sources (a copy unless nid is its own source)."""
        sources = self._sources(nid, index)
        value = (value_of(sources[0]) if sources == [(nid, index)] else
                 np.concatenate([value_of(src).reshape(-1) for src in sources]))
        return value.reshape(self._shapes[self._row_ptr[nid] + index])

    # -- the TVM debug executor interface --------------------------------------

    def run(self, **inputs: Any) -> None:
        """Set the given inputs, time every node (median of timing_runs passes, after
        a warm-up), then run once node by node copying every node's outputs."""
        for name, value in inputs.items():  # not set_input(**inputs): inputs named key, value
            self.module.set_input(name, value)
        self.node_times = {row.node: row for row in profile_nodes(self.module, self.timing_runs)}
        by_step = []  # per executed node: copies of its outputs, taken right after it ran
        for k in range(len(self._step)):
            self.module.run_node(k)
            by_step.append(self.module.node_outputs(k))

        def value_of(src: tuple[int, int]) -> np.ndarray:
            name = self._nodes[src[0]]["name"]
            return (self.module.get_input(name) if self._nodes[src[0]]["op"] == "null"
                    else by_step[self._step[name]][src[1]])

        self.node_outputs = {}
        for nid, node in enumerate(self._nodes):
            if node["op"] == "null":
                continue
            self.node_outputs[node["name"]] = [
                self._joined(nid, index, value_of)
                for index in range(self._row_ptr[nid + 1] - self._row_ptr[nid])]
        if self.dump_root is not None:
            self._dump(self.dump_root)

    def _dump(self, root: str | os.PathLike) -> None:
        os.makedirs(root, exist_ok=True)
        tensors = {f"{name}:{j}": value for name, outs in self.node_outputs.items()
                   for j, value in enumerate(outs)}
        atomic_write(os.path.join(root, "output_tensors.params"), save_params(tensors))
        events, start = [], 0.0  # microseconds
        for name in self._step:  # run order
            row = self.node_times[name]
            # Each start is the sum of the rounded durations before it, so one event ends
            # where the next begins (rounding start and duration apart could overlap them).
            dur = round(row.ms * 1e3, 3)
            events.append({"name": name, "cat": row.kernel, "ph": "X", "pid": 1, "tid": 1,
                           "ts": round(start, 3), "dur": dur})
            start += dur
        atomic_write(os.path.join(root, "execution_trace.json"),
                     json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode())

    def debug_get_output(self, node: int | str, out: np.ndarray | None = None) -> np.ndarray:
        """Run the graph up to `node` (a graph node index or name) with the current
        inputs and return a copy of its first output (also copied into `out`), as
        TVM's debug executor does. An input or param node gives its value."""
        nid = self._node_index(node)
        sources = self._sources(nid, 0)
        steps = {self._step[self._nodes[i]["name"]]: i for i, _ in sources
                 if self._nodes[i]["op"] != "null"}
        copies = {}  # source node -> its outputs, copied right after it ran
        for step in range(max(steps, default=-1) + 1):
            self.module.run_node(step)
            if step in steps:
                copies[steps[step]] = self.module.node_outputs(step)
        value = self._joined(nid, 0, lambda src: (
            self.module.get_input(self._nodes[src[0]]["name"]) if src[0] not in copies
            else copies[src[0]][src[1]]))
        if out is not None:
            np.copyto(out, value)
            return out
        return value

    def display_debug_result(self, top: int | None = None) -> None:
        """Print the per-node times of the last run(), slowest first."""
        print(self.format_node_times(top))

    def format_node_times(self, top: int | None = None) -> str:
        """The per-node time table of the last run() (profile.format_profile)."""
        if not self.node_times:
            raise RuntimeError("no times yet: call run() first")
        rows = sorted(self.node_times.values(), key=lambda r: -r.ms)
        return format_profile(rows, top=len(rows) if top is None else top)
