"""The build's arithmetic estimate (pipeline.lower.cost) of the int8 kernels: their
multiply-adds count like the float kernels' (2 each), not by the fallback rule (one
per element of the largest operand), which put their GOP/s far too low and made the
profile call them memory-bound."""

from __future__ import annotations

from pipeline.ir.graph import Node, TensorType
from pipeline.ir.target import parse_target
from pipeline.lower.cost import kernel_flops
from pipeline.lower.kernel import KernelSpec


def _flops(op: str, params: list[tuple], **attrs) -> int:
    """kernel_flops of a one-op kernel with (shape, dtype) params, the output last."""
    types = tuple(TensorType(tuple(s), d) for s, d in params)
    names = [f"a{i}" for i in range(len(types) - 1)]
    node = Node.make(op, "n", names, ["y"], **attrs)
    spec = KernelSpec((node,), types, parse_target("llvm"), 3, "test")
    return kernel_flops(spec)


def test_qconv_counts_its_multiply_adds():
    """[1, 4 blocks of 16, 10, 10] padded input, 64 filters of 64 x 3 x 3, 8 x 8 out."""
    out = (1, 4, 8, 8, 16)
    flops = _flops("qconv2d_nchwc", [((1, 4, 10, 10, 16), "uint8"),
                                     ((2, 4, 3, 3, 4, 32, 4), "int8"), ((64,), "int32"),
                                     ((64,), "float32"), ((), "uint8"), (out, "uint8")])
    size = 4 * 8 * 8 * 16
    assert flops == 2 * size * 64 * 9 + size


def test_a_padded_output_counts_only_what_the_conv_computes():
    """attr out_pads (transform/padded_outputs.py): the 8 x 8 outputs of a 10 x 10
    padded tensor, not its border."""
    params = [((1, 4, 10, 10, 16), "uint8"), ((2, 4, 3, 3, 4, 32, 4), "int8"),
              ((64,), "int32"), ((64,), "float32"), ((), "uint8"), ((1, 4, 10, 10, 16), "uint8")]
    size = 4 * 8 * 8 * 16
    assert _flops("qconv2d_nchwc", params, out_pads=(1, 1, 1, 1), out_fill=0) == \
        2 * size * 64 * 9 + size


def test_qdepthwise_counts_its_taps():
    out = (1, 2, 8, 8, 16)
    flops = _flops("qdepthwise_conv2d_nchwc", [((1, 2, 10, 10, 16), "uint8"),
                                               ((2, 3, 3, 16), "int8"), ((32,), "int32"),
                                               ((32,), "float32"), ((), "uint8"),
                                               (out, "uint8")])
    size = 2 * 8 * 8 * 16
    assert flops == 2 * size * 9 + size


def test_int8_matrix_products_count_the_reduced_dimension():
    packed = _flops("qdense_packed", [((1, 64), "uint8"), ((4, 16, 16, 4), "int8"),
                                      ((64,), "int32"), ((), "uint8"), ((1, 64), "int32")])
    assert packed == 2 * 64 * 64 + 64
    plain = _flops("matmul_integer", [((3, 64), "uint8"), ((64, 32), "int8"), ((), "uint8"),
                                      ((), "int8"), ((3, 32), "int32")])
    assert plain == 2 * 3 * 32 * 64 + 3 * 32
