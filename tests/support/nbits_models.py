"""Models with com.microsoft.MatMulNBits, quantized by onnxruntime's own code.

Its default (round to nearest) algorithm is run here step by step as
onnxruntime.quantization.matmul_nbits_quantizer does: the C++ blockwise quantizers it
calls (quantize_matmul_4bits / _8bits of onnxruntime's bindings) on the float weight of
a MatMul, and the MatMulNBits node it writes in that MatMul's place; so one node can
take any bits, block size and zero-point form. The whole quantizer (which needs the
onnx-ir package, in the `ort` extra) quantizes the test decoder in
tests/runtime/test_vm_decoder.py."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper


def quantize_weight(w: np.ndarray, bits: int, block: int, symmetric: bool):
    """(packed [N, blocks, blob] uint8, scales [N, blocks], zero points [N, ...] uint8)
    of float32 w [K, N], as onnxruntime's quantizer computes them."""
    from onnxruntime.capi import _pybind_state as ort

    rows, cols = w.shape
    blocks = -(-rows // block)
    padded = np.zeros((blocks * block, cols), np.float32)
    padded[:rows] = w
    packed = np.zeros((cols, blocks, block * bits // 8), np.uint8)
    zero_points = np.zeros((cols, -(-blocks * bits // 8)), np.uint8)
    scales = np.zeros((cols, blocks), np.float32)
    quantize = ort.quantize_matmul_4bits if bits == 4 else ort.quantize_matmul_8bits
    quantize(packed, np.ascontiguousarray(padded), scales, zero_points, block, cols, rows,
             symmetric)
    return packed, scales, zero_points


def nbits_node(name: str, x: str, y: str, w: np.ndarray, bits: int, block: int,
               zero_points: str = "packed", bias: np.ndarray | None = None,
               accuracy_level: int = 0) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """A MatMulNBits node computing y = x @ w (+ bias) and its initializers;
    zero_points "packed" (asymmetric, uint8), "none" (symmetric) or "float" (the
    packed ones as float32, a layout onnxruntime also reads)."""
    packed, scales, zp = quantize_weight(w, bits, block, zero_points == "none")
    k, n = w.shape
    inits = [onnx.numpy_helper.from_array(packed, f"{name}.B"),
             onnx.numpy_helper.from_array(scales.reshape(-1), f"{name}.scales")]
    inputs = [x, f"{name}.B", f"{name}.scales"]
    if zero_points != "none":
        if zero_points == "float":
            blocks = scales.shape[1]
            nibbles = np.stack([zp & 15, zp >> 4], -1).reshape(n, -1) if bits == 4 else zp
            zp = nibbles[:, :blocks].astype(np.float32).reshape(-1)
        inits.append(onnx.numpy_helper.from_array(zp.reshape(-1), f"{name}.zp"))
        inputs.append(f"{name}.zp")
    if bias is not None:
        inputs += [""] * (5 - len(inputs)) + [f"{name}.bias"]  # input 5; g_idx is 4
        inits.append(onnx.numpy_helper.from_array(bias.astype(np.float32), f"{name}.bias"))
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
    if accuracy_level:
        attrs["accuracy_level"] = accuracy_level
    return (helper.make_node("MatMulNBits", inputs, [y], name=name, domain="com.microsoft",
                             **attrs), inits)


def nbits_model(nodes, inits, x_shape, y_shape) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "nbits",
                              [helper.make_tensor_value_info("x", T.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", T.FLOAT, y_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def int8_kernel_on_this_machine() -> bool:
    """Whether this machine's native target is one the int8 MatMulNBits kernel
    (accuracy_level 4, kernels/nbits_int8.py) takes: AVX-512 VNNI at 16 lanes."""
    from pipeline.ir.target import parse_target
    from pipeline.kernels.qconv_blocked import dot_kind

    native = parse_target("llvm -mcpu=native")
    return dot_kind(native) == "vnni" and native.vector_width == 16
