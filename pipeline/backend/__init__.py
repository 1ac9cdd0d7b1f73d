"""Graph codegen: the executor's graph JSON and its storage plan."""

from pipeline.backend.graph_json import graph_json
from pipeline.backend.plan_memory import MemoryPlan, plan_memory

__all__ = ["MemoryPlan", "graph_json", "plan_memory"]
