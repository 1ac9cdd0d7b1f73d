"""The pass pipeline, in the order it runs, and `optimize`, which runs it.

Each pass is `fn(graph, params, cfg) -> (graph, params)`; `optimize` runs the
ones the current PassContext enables and verifies the graph after each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.ir.graph import Graph
from pipeline.ops import infer_types
from pipeline.transform.attention import fuse_attention
from pipeline.transform.context import PASS_NAMES, PassConfig, PassContext
from pipeline.transform.fuse import fold_constant, fuse_ops
from pipeline.transform.instrument import PassInfo
from pipeline.transform.layout import alter_op_layout
from pipeline.transform.patterns import fuse_gelu, fuse_layer_norm
from pipeline.transform.qdq import fuse_qdq
from pipeline.transform.shuffle import fold_channel_shuffle
from pipeline.transform.simplify import fold_batch_norm, simplify_inference


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable
    opt_level: int  # runs when PassContext.opt_level >= this (or when required)
    needs_target: bool = False  # run(graph, params, cfg, target): decisions depend on the CPU


PIPELINE = (
    Pass("SimplifyInference", simplify_inference, 0),
    Pass("FuseQDQ", fuse_qdq, 1, needs_target=True),
    Pass("FoldConstant", fold_constant, 2),
    Pass("FuseLayerNorm", fuse_layer_norm, 1),
    Pass("FuseGelu", fuse_gelu, 1),
    Pass("FuseAttention", fuse_attention, 1),
    Pass("FoldBatchNorm", fold_batch_norm, 1),
    Pass("AlterOpLayout", alter_op_layout, 3, needs_target=True),
    Pass("FoldChannelShuffle", fold_channel_shuffle, 3),
    Pass("FuseOps", fuse_ops, 1),
)
assert PASS_NAMES == tuple(p.name for p in PIPELINE), "update context.PASS_NAMES"


def optimize(graph: Graph, params: dict, cfg: PassConfig | None = None, target=None):
    """Run the enabled passes of PIPELINE; returns (graph, params). `target` (a
    codegen Target) is handed to the passes that need one; without it they do nothing.
    The current PassContext's instruments see each enabled pass (should_run, before,
    after)."""
    cfg = cfg or PassContext.current()
    instruments = PassContext.current_instruments()
    for p in PIPELINE:
        if not cfg.enabled(p.name, p.opt_level):
            continue
        info = PassInfo(p.name, p.opt_level)
        if not all([i.should_run(graph, info) for i in instruments]):  # ask every one
            continue
        for i in instruments:
            i.run_before_pass(graph, info)
        graph, params = (p.run(graph, params, cfg, target) if p.needs_target
                         else p.run(graph, params, cfg))
        graph.verify(infer_types)
        for i in instruments:
            i.run_after_pass(graph, info)
    return graph, params

