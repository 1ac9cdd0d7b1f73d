"""Per-kernel metadata (TVM: the FunctionInfo of relay.build's metadata): arithmetic
operations, bytes moved and stack scratch of one kernel call, from its KernelSpec
and LLVM IR. Estimates from shapes, stated as such:

  flops: multiply-adds count 2 (int8 ones too: the profile's GFLOP/s of a quantized
    kernel is its GOP/s) — convolutions (2 x output elements x weight elements per
    output channel, zero-padded input channels included; transposed: 2 x input elements
    x weight elements per input channel), dense/matmul (2 x output elements x the
    reduced dimension); a bias (an int8 kernel's requantization) is one more per output
    element; windowed pools one per window element
    per output; elementwise ops (the fused epilogue too) one per output element;
    data movement (transpose, slice, gather, pad, tile, reshape, concat, layout
    transforms, ...) none; any other op (reductions, normalisations, softmax,
    scans, ...) one per element of its largest operand.
  bytes_moved: every argument read once and the output written once (the least
    traffic a call can have).
  stack_bytes, from the kernel's LLVM IR (pipeline.driver.build.lower_graph
    renders each kernel once and records it beside the others): the stack arrays
    it allocates with an element count (the GEMM's packed panel, local buffers,
    the thread team's argument block); scalar and vector slots, which LLVM keeps
    in registers, and register spills are not counted.
"""

from __future__ import annotations

import math
import re

from pipeline.ir.graph import TensorType, nbytes
from pipeline.lower.kernel import KernelSpec
from pipeline.ops import OpKind, get, infer_types

_CONV = ("conv1d", "conv2d", "conv3d", "conv2d_nchwc", "depthwise_conv2d_nchwc",
         "qconv2d_nchwc", "qdepthwise_conv2d_nchwc")
_CONV_T = ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_GEMM = ("dense", "dense_packed", "matmul", "matmul_integer", "qdense_packed")
_WINDOWED = ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d",
             "avg_pool3d", "lp_pool1d", "lp_pool2d", "lp_pool3d", "max_pool2d_nchwc",
             "avg_pool2d_nchwc")
_MOVEMENT = ("transpose", "tile", "depth_to_space", "space_to_depth", "gather", "slice",
             "pad", "reshape", "concat", "layout_transform", "expand", "identity",
             "gather_elements", "resize", "cast")


def _op_flops(op, args: list[TensorType], out: TensorType) -> int:
    name = op.op
    if name == "conv2d_winograd_nchwc":  # counted as the direct 3x3 conv it computes
        return 2 * out.size * 9 * args[1].shape[2] + (out.size if len(args) > 2 else 0)
    if name in _CONV:
        w, size = args[1], _computed(op, out)
        per_out = w.size // _out_channels(name, out)
        return 2 * size * per_out + (size if len(args) > 2 else 0)
    if name in _CONV_T:
        w = args[1]
        return 2 * args[0].size * (w.size // w.shape[0]) + (out.size if len(args) > 2 else 0)
    if name in _GEMM:
        a = args[0]
        k = a.shape[-1] if a.shape else 1
        return 2 * out.size * k + (out.size if len(args) > 2 else 0)
    if name in _WINDOWED:
        return out.size * math.prod(op.attr("kernel"))
    if name in _MOVEMENT:
        return 0
    if get(name).kind == OpKind.ELEMENTWISE:
        return out.size
    return max([out.size, *(a.size for a in args)])


def _computed(op, out: TensorType) -> int:
    """The outputs a conv computes: out's, less the border of a padded output (an
    int8 conv's attr out_pads, transform/padded_outputs.py), which it only fills."""
    if not op.attr("out_pads"):
        return out.size
    pt, pl, pb, pr = op.attr("out_pads")
    h, w = out.shape[2], out.shape[3]
    return out.size // (h * w) * (h - pt - pb) * (w - pl - pr)


def _out_channels(name: str, out: TensorType) -> int:
    """Output channels: NCHW{b}c outputs of the blocked convolutions hold C/b x b."""
    if name in ("conv2d_nchwc", "depthwise_conv2d_nchwc", "qconv2d_nchwc",
                "qdepthwise_conv2d_nchwc"):
        return out.shape[1] * out.shape[-1]
    return out.shape[1]


def kernel_flops(spec: KernelSpec) -> int:
    """Arithmetic operations of one call of the kernel (module docstring)."""
    env = {f"a{i}": t for i, t in enumerate(spec.params[:-1])}
    total = 0
    for k, op in enumerate(spec.ops):
        out = spec.params[-1] if k == len(spec.ops) - 1 else None
        if out is None:
            (out,) = infer_types(op, [env[i] for i in op.inputs])
        env[op.outputs[0]] = out
        total += _op_flops(op, [env[i] for i in op.inputs], out)
    return int(total)


def _nbytes(t: TensorType) -> int:
    return nbytes(t.dtype, t.size)


def bytes_moved(spec: KernelSpec) -> int:
    """Bytes of every argument and of the output of one call."""
    return sum(_nbytes(t) for t in spec.params)


_SCALAR_BYTES = {"float": 4, "double": 8, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "i1": 1,
                 "ptr": 8, "half": 2}
_ALLOCA = re.compile(r"= alloca (\[\d+ x \w+\]|<\d+ x \w+>|\w+), i\d+ (\d+)")


def _type_bytes(typ: str) -> int:
    m = re.fullmatch(r"[\[<](\d+) x (\w+)[\]>]", typ)
    return int(m.group(1)) * _SCALAR_BYTES[m.group(2)] if m else _SCALAR_BYTES[typ]


def stack_bytes(llvm_ir: str) -> int:
    """Bytes of the counted allocas (`alloca T, iN count`) of a kernel's LLVM IR."""
    return sum(_type_bytes(t) * int(n) for t, n in _ALLOCA.findall(llvm_ir))
