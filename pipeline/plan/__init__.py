"""The executor plan: its's graph JSON and its storage plan."""

from pipeline.plan.graph_json import graph_json
from pipeline.plan.plan_memory import MemoryPlan, plan_memory

__all__ = ["MemoryPlan", "graph_json", "plan_memory"]
