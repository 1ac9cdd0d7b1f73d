"""ONNX converters to the movement operators (defined in pipeline/ops/movement.py)."""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.shape import const_or_runtime, need_const
from pipeline.ir.graph import Node


@onnx_op("Transpose", 1, emits=("transpose",))
def _transpose(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    perm = [int(p) for p in n.attrs.get("perm", range(rank - 1, -1, -1))]
    if sorted(perm) != list(range(rank)):
        raise ModelError(f"node {n.name!r} (Transpose): perm {perm} is not a permutation "
                         f"of {rank} axes")
    return [Node.make("transpose", n.name, n.inputs[:1], n.outputs[:1], perm=perm)]


@onnx_op("Tile", 6, emits=("tile", "tile_to"), build_time_inputs=(1,))
def _tile(ctx, n):
    if const_or_runtime(ctx, n.inputs[1], n) is None:  # runtime repeats: only the VM runs it
        return [Node.make("tile_to", n.name, n.inputs[:2], n.outputs[:1])]
    reps = need_const(ctx, n, 1, "the repeats input").tolist()
    if len(reps) != len(ctx.type(n.inputs[0]).shape) or min(reps, default=0) < 0:
        raise ModelError(f"node {n.name!r} (Tile): repeats {reps} do not fit input "
                         f"{list(ctx.type(n.inputs[0]).shape)}")
    return [Node.make("tile", n.name, n.inputs[:1], n.outputs[:1], repeats=reps)]


def _block_converter(op: str):
    def convert(ctx, n):
        if len(ctx.type(n.inputs[0]).shape) != 4:
            raise ModelError(f"node {n.name!r} ({n.op_type}): only 4-D (NCHW) inputs are "
                             "supported")
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1],
                          blocksize=int(n.attrs["blocksize"]),
                          mode=n.text("mode", "DCR"))]  # SpaceToDepth's from opset 28
    return convert


onnx_op("DepthToSpace", 1, emits=("depth_to_space",))(_block_converter("depth_to_space"))

onnx_op("SpaceToDepth", 1, emits=("space_to_depth",))(_block_converter("space_to_depth"))
