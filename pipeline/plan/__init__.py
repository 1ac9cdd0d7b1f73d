"""Layer 4, the executor plan: its graph JSON and its storage plan. Imports ir only."""

from pipeline.plan.graph_json import graph_json
from pipeline.plan.plan_memory import MemoryPlan, plan_memory

__all__ = ["MemoryPlan", "graph_json", "plan_memory"]
