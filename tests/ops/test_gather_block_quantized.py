"""com.microsoft.GatherBlockQuantized (a decoder's embedding table quantized blockwise
along its rows) against onnxruntime, on tables quantized by onnxruntime's own code:
uint8 data two 4-bit values a byte (or one 8-bit value) with and without zero points
from its blockwise quantizer (tests/support/nbits_models.py), and the int4 / uint4
tables its MatMulNBitsQuantizer writes when asked to quantize a Gather. Indices int64
and int32, negative ones, a [batch, seq] index tensor, the graph executor and the VM
over symbolic [batch, seq]; the table stays packed in the library."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from pipeline.errors import ModelError
from tests.support.compare import run_ort, run_ours
from tests.support.nbits_models import quantize_weight

pytest.importorskip("onnxruntime")

VOCAB, HIDDEN = 96, 160


def _table(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((VOCAB, HIDDEN)).astype(np.float32)


def _model(inits, inputs, index_type=T.INT64, index_shape=("batch", "seq"),
           add_position=False, **attrs) -> onnx.ModelProto:
    """i [index_shape] -> y = GatherBlockQuantized(inputs)(i) (+ a float bias row, which
    fuses into the gather's kernel)."""
    nodes = [helper.make_node("GatherBlockQuantized", [inputs[0], "i", *inputs[1:]],
                              ["g" if add_position else "y"], "embed",
                              domain="com.microsoft", **attrs)]
    if add_position:
        bias = np.random.default_rng(3).standard_normal(HIDDEN).astype(np.float32)
        inits = [*inits, onnx.numpy_helper.from_array(bias, "pos")]
        nodes.append(helper.make_node("Add", ["g", "pos"], ["y"]))
    graph = helper.make_graph(
        nodes, "gbq", [helper.make_tensor_value_info("i", index_type, list(index_shape))],
        [helper.make_tensor_value_info("y", T.FLOAT, [*index_shape, HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def packed_table(w: np.ndarray, bits: int, block: int, zero_points: bool):
    """Initializers and input names of w [V, H] quantized along H by onnxruntime's
    blockwise quantizer (MatMulNBits' layout of w.T: row v's blocks), as uint8 rows of
    H values (a last partial block's padding cut off)."""
    packed, scales, zp = quantize_weight(w.T.copy(), bits, block, not zero_points)
    rows = packed.reshape(w.shape[0], -1)[:, :w.shape[1] * bits // 8]
    inits = [onnx.numpy_helper.from_array(np.ascontiguousarray(rows), "data"),
             onnx.numpy_helper.from_array(scales, "scales")]
    if zero_points:
        inits.append(onnx.numpy_helper.from_array(zp, "zp"))
    return inits, ["data", "scales", "zp"][:len(inits)]


def quantizer_model(block: int, symmetric: bool, **kwargs) -> onnx.ModelProto:
    """A Gather of a float table quantized by onnxruntime's MatMulNBitsQuantizer (Gather
    quantization on: int4 tables when symmetric, uint4 with uint4 zero points if not)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    float_model = _model([onnx.numpy_helper.from_array(_table(block), "wte")], ["wte"],
                         **kwargs)
    out = float_model.graph.node[0].output[0]
    float_model.graph.node[0].CopyFrom(helper.make_node("Gather", ["wte", "i"], [out], "embed",
                                                        axis=0))
    quantizer = MatMulNBitsQuantizer(float_model, block_size=block, is_symmetric=symmetric,
                                     op_types_to_quantize=("Gather",))
    quantizer.process()
    model = quantizer.model.model
    assert model.graph.node[0].op_type == "GatherBlockQuantized"
    return model


def _check(model, indices, **kwargs):
    want = run_ort(model, {"i": indices})[0]
    got = run_ours(model, {"i": indices}, **kwargs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize(("bits", "block", "zero_points", "index_type"), [
    (4, 32, True, T.INT64), (4, 64, False, T.INT32), (4, 128, True, T.INT32),
    (8, 32, True, T.INT64)])
def test_uint8_tables_match_onnxruntime(bits, block, zero_points, index_type):
    """160 values a row: 5 blocks of 32, 2.5 of 64 and 1.25 of 128 (a partial last one)."""
    inits, names = packed_table(_table(bits + block), bits, block, zero_points)
    model = _model(inits, names, index_type, (2, 3), block_size=block, bits=bits)
    dtype = np.int64 if index_type == T.INT64 else np.int32
    _check(model, np.array([[0, 5, -1], [VOCAB - 1, -VOCAB, 7]], dtype))


@pytest.mark.parametrize(("block", "symmetric"), [(32, False), (128, True)])
def test_onnxruntime_quantizer_tables_match(block, symmetric):
    """uint4 with zero points and int4 without, as the quantizer writes them, and a
    fused Add of a position row."""
    model = quantizer_model(block, symmetric, index_shape=(1, 4), add_position=True)
    _check(model, np.array([[3, 90, -2, 3]], np.int64))


def test_symbolic_batch_and_seq_in_the_vm(tmp_path):
    """One VM library over symbolic [batch, seq] indices: a prefill's 2 x 9 rows and a
    decode step's 1 x 1, against onnxruntime."""
    import pipeline
    from pipeline.frontend import from_onnx
    from pipeline.runtime.vm import VirtualMachine

    inits, names = packed_table(_table(1), 4, 32, True)
    model = _model(inits, names, block_size=32, bits=4, add_position=True)
    graph, params = from_onnx(model, symbolic=True)
    so = tmp_path / "gbq.so"
    pipeline.build(graph, "llvm -mcpu=native", params=params, executor="vm",
                   dims={"batch": (1, 2), "seq": (1, 16)}).export_library(str(so))
    vm = VirtualMachine(str(so))
    rng = np.random.default_rng(2)
    for shape in ((2, 9), (1, 1)):
        indices = rng.integers(-VOCAB, VOCAB, shape).astype(np.int64)
        np.testing.assert_allclose(vm.run(indices)[0], run_ort(model, {"i": indices})[0],
                                   rtol=1e-5, atol=1e-5)


def test_an_index_outside_the_table_fails():
    inits, names = packed_table(_table(), 4, 32, True)
    model = _model(inits, names, index_shape=(2,), block_size=32, bits=4)
    with pytest.raises(RuntimeError):
        run_ours(model, {"i": np.array([1, VOCAB], np.int64)})


def test_the_table_stays_packed():
    """The library's params: the 4-bit values (V * H / 2 bytes), float32 scales and
    packed zero points; no float copy of the table."""
    import pipeline

    model = quantizer_model(32, False, index_shape=(1, 4))
    graph, params = pipeline.frontend.from_onnx(model)
    lib = pipeline.build(graph, target="llvm -mcpu=native", params=params)
    sizes = sorted((str(v.dtype), np.asarray(v).nbytes) for v in lib.get_params().values())
    nb = HIDDEN // 32
    assert sizes == sorted([("uint8", VOCAB * HIDDEN // 2), ("float32", VOCAB * nb * 4),
                            ("uint8", VOCAB * -(-nb // 2))]), sizes


def test_other_axes_are_refused_naming_the_node():
    from pipeline.frontend import from_onnx
    from pipeline.tools.backend import unsupported

    inits, names = packed_table(_table(), 4, 32, True)
    model = _model(inits, names, index_shape=(2,), block_size=32, bits=4, gather_axis=1)
    assert unsupported(model) == ["GatherBlockQuantized: gather_axis other than 0"]
    with pytest.raises(ModelError, match="node 'embed' .*gather_axis 1"):
        from_onnx(model)
