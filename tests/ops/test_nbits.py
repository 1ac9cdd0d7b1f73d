"""com.microsoft.MatMulNBits (4 and 8 bits, block sizes 16..256, zero points packed,
float or absent, bias) against onnxruntime on models its own quantizer code made from
float MatMul weights: batch 1 (a decoder step's matrix-vector product) and batch > 1
(rows in tiles and a remainder), K a multiple of the block size or not."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.compare import run_ort, run_ours
from tests.support.nbits_models import int8_kernel_on_this_machine, nbits_model, nbits_node

pytest.importorskip("onnxruntime")


def _check(model, x, opt_level=3):
    want = run_ort(model, {"x": x})[0]
    got = run_ours(model, {"x": x}, opt_level=opt_level)[0]
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


CASES = [  # bits, block, zero points, bias, K, N, x shape (without K)
    (4, 32, "packed", False, 256, 64, (1,)),
    (4, 32, "none", True, 256, 48, (2, 7)),
    (4, 16, "packed", True, 100, 40, (1,)),       # a partial last block
    (4, 64, "float", False, 192, 24, (5,)),
    (4, 32, "float", True, 128, 32, (3,)),        # the cols16 layout, float zero points
    (4, 128, "packed", False, 384, 32, (9,)),
    (4, 256, "none", False, 300, 16, (1,)),       # one whole block and a partial one
    (8, 32, "packed", True, 160, 56, (1,)),
    (8, 64, "none", False, 256, 32, (3, 4)),
    (8, 16, "packed", False, 72, 8, (6,)),   # (8 bits with float zero points: not in ORT)
    # many rows (a prefill): the blocked form, tiles of rows and a remainder, K in
    # panels of whole blocks (one or several), columns past the
    # last whole item column by column
    (4, 32, "packed", True, 256, 80, (2, 19)),
    (4, 64, "float", False, 640, 64, (16,)),
    (8, 16, "packed", True, 512, 128, (17,)),
    (4, 128, "none", False, 384, 144, (1, 32)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:4])))
def test_matches_onnxruntime(case):
    bits, block, zp, with_bias, k, n, lead = case
    rng = np.random.default_rng(k * n + bits)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    node, inits = nbits_node("mm", "x", "y", w, bits, block, zp, bias)
    model = nbits_model([node], inits, [*lead, k], [*lead, n])
    _check(model, rng.standard_normal((*lead, k)).astype(np.float32))


@pytest.mark.parametrize(("opt_level", "rows", "level"),
                         [(0, 4, 0), (3, 4, 0), (0, 20, 0), (3, 20, 0), (3, 3, 4), (3, 20, 4)])
def test_two_layers_with_a_fused_epilogue(opt_level, rows, level):
    """MatMulNBits -> Relu -> MatMulNBits: the Relu fuses into the first kernel (20
    rows: into the blocked form's outputs; accuracy_level 4: the int8 kernel's, with
    VNNI, against onnxruntime's level 4)."""
    from onnx import helper

    if level == 4 and not int8_kernel_on_this_machine():
        pytest.skip("no AVX-512 VNNI on this machine")

    rng = np.random.default_rng(7)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((128, 96), (96, 64)))
    n1, i1 = nbits_node("up", "x", "h", w1, 4, 32, "packed", accuracy_level=level)
    n2, i2 = nbits_node("down", "r", "y", w2, 4, 32, "none", accuracy_level=level)
    model = nbits_model([n1, helper.make_node("Relu", ["h"], ["r"]), n2], i1 + i2,
                        [rows, 128], [rows, 64])
    _check(model, rng.standard_normal((rows, 128)).astype(np.float32), opt_level)


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_symbolic_rows_in_blocks_of_128_and_32(tmp_path, accuracy_level):
    """Over symbolic rows (the VM) the 4-bit kernel takes blocks of 128 rows, then of
    32 (both the blocked form; at accuracy_level 4 with VNNI the int8 kernel), 8 and
    the rest (with VNNI: the int8 kernel, three parts at level 0): 170 = 128 + 32 +
    8 + 2 and 45 rows, one library, against onnxruntime."""
    import pipeline
    from pipeline.frontend import from_onnx
    from pipeline.runtime.vm import VirtualMachine

    if accuracy_level == 4 and not int8_kernel_on_this_machine():
        pytest.skip("no AVX-512 VNNI on this machine")
    rng = np.random.default_rng(9)
    w, bias = rng.standard_normal((256, 80)).astype(np.float32), rng.standard_normal(80)
    node, inits = nbits_node("mm", "x", "y", w, 4, 32, "packed", bias.astype(np.float32),
                             accuracy_level)
    model = nbits_model([node], inits, ["rows", 256], ["rows", 80])
    graph, params = from_onnx(model, symbolic=True)
    so = tmp_path / "nbits.so"
    with pipeline.transform.PassContext(opt_level=3):  # AlterOpLayout: cols16(x4)
        pipeline.build(graph, "llvm -mcpu=native", params=params, executor="vm",
                       dims={"rows": (1, 256)}).export_library(str(so))
    vm = VirtualMachine(str(so))
    for rows in (170, 45):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        want = run_ort(model, {"x": x})[0]
        np.testing.assert_allclose(vm.run(x)[0], want, rtol=1e-4,
                                   atol=1e-5 * np.abs(want).max())


INT8_CASES = [  # block, zero points, K, N, rows, threads
    (32, "packed", 256, 64, 1, 2),     # a decode step's matrix-vector product
    (16, "none", 200, 48, 3, 1),       # a partial last block (200 = 12 * 16 + 8)
    (64, "packed", 320, 32, 6, 2),     # a tile of 4 rows and one of 2
    (128, "none", 300, 16, 9, 1),      # a partial block; tiles 4 + 4 + 1
    (256, "packed", 512, 32, 2, 1),
    (32, "packed", 8192, 16, 150, 2),  # rows in chunks (QUANT_BYTES): 52 + 52 + 46
    (32, "packed", 96, 40, 3, 1),      # N not a multiple of 16: padded to 48
    (64, "float", 128, 32, 1, 1),      # float zero points: float (onnxruntime's too)
]


@pytest.mark.parametrize("case", INT8_CASES, ids=lambda c: "-".join(map(str, c)))
def test_accuracy_level_4_quantizes_activations_to_int8(case):
    """accuracy_level 4 on a target with AVX-512 VNNI: A quantized to int8 per block
    and multiplied on vpdpbusd (the kernel's IR calls it; a bias with odd row counts),
    matching onnxruntime's level 4 (its int8 path, same rounding) closely and the
    float product (onnxruntime at level 0) within the int8 rounding; 1 and 2 threads.
    With float zero points the float kernel runs: it matches onnxruntime's level 0
    closely (and its level 4, which for float zero points is float too)."""
    import pipeline
    from pipeline.codegen.render import render
    from tests.support.compare import build_and_load

    if not int8_kernel_on_this_machine():
        pytest.skip("no AVX-512 VNNI on this machine")
    block, zp, k, n, rows, threads = case
    rng = np.random.default_rng(k + n + block)
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if rows % 2 else None
    models = [nbits_model([node], inits, [rows, k], [rows, n]) for node, inits in
              (nbits_node("mm", "x", "y", w, 4, block, zp, bias, accuracy_level=level)
               for level in (0, 4))]
    float_y, int8_y = (run_ort(m, {"x": x})[0] for m in models)
    gm, factory = build_and_load(*pipeline.frontend.from_onnx(models[1]))
    int8 = zp != "float"
    assert any("vpdpbusd" in render(s) for s in factory.kernels) == int8
    scale = np.abs(float_y).max()
    if zp != "float":  # they differ by the int8 rounding: a tight test tells them apart
        assert np.abs(int8_y - float_y).max() > 1e-3 * scale
    for t in (1, threads):
        gm.set_num_threads(t)
        gm.run(x=x)
        got = gm.get_output(0)
        near, far = (int8_y, float_y) if int8 else (float_y, int8_y)
        np.testing.assert_allclose(got, near, rtol=1e-4, atol=2e-5 * scale)
        np.testing.assert_allclose(got, far, rtol=0, atol=2e-2 * scale)


LEVEL0_CASES = [  # block, zero points, K, N, rows
    (32, "packed", 768, 64, 1),    # a decode step's matrix-vector product
    (64, "none", 512, 32, 3),      # a tile of 3 rows
    (16, "packed", 320, 48, 6),    # tiles of 4 and 2 rows
    (256, "packed", 1024, 16, 1),
]


@pytest.mark.parametrize("case", LEVEL0_CASES, ids=lambda c: "-".join(map(str, c)))
def test_accuracy_level_0_splits_activations_into_three_int8_parts(case):
    """accuracy_level 0 (unset: onnxruntime computes in float32) on a VNNI target:
    for fewer than GEMM_ROWS rows the int8 kernel with `a` in three int8 parts (the
    kernel's IR has vpdpbusd), as accurate as onnxruntime's float32: against the
    product in float64, our error is at most a few times onnxruntime's level 0's own,
    where one int8 part (onnxruntime's level 4) is off by far more."""
    import pipeline
    from pipeline.codegen.render import render
    from pipeline.ops.nbits import dequantize_nbits
    from tests.support.compare import build_and_load

    if not int8_kernel_on_this_machine():
        pytest.skip("no AVX-512 VNNI on this machine")
    block, zp, k, n, rows = case
    rng = np.random.default_rng(k + n + block)
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    models = [nbits_model([node], inits, [rows, k], [rows, n]) for node, inits in
              (nbits_node("mm", "x", "y", w, 4, block, zp, accuracy_level=level)
               for level in (0, 4))]
    float_y, int8_y = (run_ort(m, {"x": x})[0] for m in models)
    graph, params = pipeline.frontend.from_onnx(models[0])
    gm, factory = build_and_load(graph, params)
    assert any("vpdpbusd" in render(s) for s in factory.kernels)
    node = graph.nodes[0]
    inputs = [params[i] for i in node.inputs[1:]]
    exact = x.astype(np.float64) @ dequantize_nbits(
        inputs[0], inputs[1], inputs[2] if zp != "none" else None, node).astype(np.float64)
    gm.run(x=x)
    ours, theirs = (np.abs(y - exact).max() for y in (gm.get_output(0), float_y))
    scale = np.abs(exact).max()
    assert ours <= 4 * theirs + 1e-7 * scale, (ours, theirs)
    assert np.abs(int8_y - exact).max() > 100 * ours


def test_params_stay_packed():
    """The library's params hold the 4-bit weights as the model stores them: K * N / 2
    bytes, no float copy."""
    import pipeline

    k, n = 256, 64
    w = np.random.default_rng(9).standard_normal((k, n)).astype(np.float32)
    node, inits = nbits_node("mm", "x", "y", w, 4, 32, "none")
    graph, params = pipeline.frontend.from_onnx(nbits_model([node], inits, [1, k], [1, n]))
    with pipeline.transform.PassContext(opt_level=3):
        lib = pipeline.build(graph, target="llvm -mcpu=native", params=params)
    kept = lib.get_params()
    assert sorted(str(v.dtype) for v in kept.values()) == ["float32", "uint8"]
    total = sum(np.asarray(v).nbytes for v in kept.values())
    assert total == k * n // 2 + 4 * n * (k // 32), total  # weights and scales


def _mlp_stack(rng, layers: int, width: int, hidden: int, quantized: bool):
    """A decoder-like MLP stack: per layer x + down(relu(up(x))), as float MatMuls or
    their MatMulNBits (4 bits, block 32, zero points) forms of the same weights."""
    from onnx import helper

    nodes, inits, x = [], [], "x"
    for i in range(layers):
        up = rng.standard_normal((width, hidden)).astype(np.float32) * 0.05
        down = rng.standard_normal((hidden, width)).astype(np.float32) * 0.05
        for name, w, a, y in ((f"up{i}", up, x, f"h{i}"), (f"down{i}", down, f"r{i}", f"d{i}")):
            if quantized:
                node, more = nbits_node(name, a, y, w, 4, 32, "packed")
                nodes.append(node)
                inits += more
            else:
                nodes.append(helper.make_node("MatMul", [a, f"{name}.w"], [y]))
                inits.append(helper.make_tensor(f"{name}.w", 1, w.shape, w.flatten()))
            if name.startswith("up"):
                nodes.append(helper.make_node("Relu", [y], [f"r{i}"]))
        out = "y" if i == layers - 1 else f"x{i + 1}"
        nodes.append(helper.make_node("Add", [x, f"d{i}"], [out]))
        x = out
    return nbits_model(nodes, inits, [1, width], [1, width])


def test_4bit_library_is_under_a_third_of_the_float32_one(tmp_path):
    """The libraries of a 4-layer MLP stack (width 256, hidden 1024: 2M weights) as
    float32 MatMuls and as MatMulNBits 4-bit block 32 with zero points (0.64 bytes a
    weight: values, float32 scales, packed zero points): sizes measured, the ratio
    bounded (deterministic; docs/quantized.md states the figures)."""
    import pipeline

    sizes = {}
    x = np.random.default_rng(11).standard_normal((1, 256)).astype(np.float32)
    for quantized in (False, True):
        model = _mlp_stack(np.random.default_rng(10), 4, 256, 1024, quantized)
        graph, params = pipeline.frontend.from_onnx(model)
        with pipeline.transform.PassContext(opt_level=3):
            lib = pipeline.build(graph, target="llvm -mcpu=native", params=params)
        path = lib.export_library(tmp_path / f"mlp{int(quantized)}.so")
        sizes[quantized] = path.stat().st_size
        if quantized:  # and it computes what onnxruntime does
            np.testing.assert_allclose(run_ours(model, {"x": x})[0],
                                       run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    ratio = sizes[True] / sizes[False]
    print(f"MLP stack library: float32 {sizes[False]} bytes, 4-bit {sizes[True]} bytes, "
          f"ratio {ratio:.3f}")
    assert ratio <= 0.35, f"4-bit {sizes[True]} bytes, float32 {sizes[False]}: {ratio:.3f}"


@pytest.mark.parametrize("zp, n, level", [("packed", 48, 0), ("float", 32, 0), ("none", 24, 0),
                                         ("packed", 40, 4), ("none", 32, 4), ("float", 32, 4)])
def test_constant_4bit_weights_take_the_cols16_layout(zp, n, level):
    """AlterOpLayout gives a constant 4-bit matmul_nbits its b, scales and zero points
    reordered into cols16 (N a multiple of 16 only: not 24), same shapes, or on a VNNI
    target (znver4) with zero points packed or none into cols16x4 (at accuracy_level 4
    N also padded to whole 16s: 40 -> 48, attr units 40); the op's numpy reference
    of the rewritten node gives what the original's does (onnxruntime checks the
    kernels: test_matches_onnxruntime, test_accuracy_level_4_...)."""
    from pipeline.frontend import from_onnx
    from pipeline.ir.target import parse_target
    from pipeline.ops import get
    from pipeline.transform import PASS_NAMES, PassContext, optimize

    rng = np.random.default_rng(n)
    w = rng.standard_normal((64, n)).astype(np.float32)
    node, inits = nbits_node("mm", "x", "y", w, 4, 32, zp, accuracy_level=level)
    graph, params = from_onnx(nbits_model([node], inits, [3, 64], [3, n]))
    others = [p for p in PASS_NAMES if p != "AlterOpLayout"]
    with PassContext(opt_level=0, required_pass=["AlterOpLayout"], disabled_pass=others):
        out, out_params = optimize(graph, params, target=parse_target("llvm -mcpu=znver4"))
    (before,), (after,) = graph.nodes, [m for m in out.nodes if m.op == "matmul_nbits"]
    int8 = zp != "float" and (level == 4 or n % 16 == 0)
    assert after.attr("layout") == ("cols16x4" if int8 else "cols16" if n % 16 == 0 else None)
    assert after.attr("units") == (n if n % 16 and int8 else None)
    x = rng.standard_normal((3, 64)).astype(np.float32)

    def reference(g, values, m):
        arrays = [x, *(values[i] for i in m.inputs[1:])]
        assert [values[i].shape for i in m.inputs[1:]] == \
            [g.types[i].shape for i in m.inputs[1:]]
        return get("matmul_nbits").numpy(arrays, m)[0]

    np.testing.assert_array_equal(reference(out, out_params, after),
                                  reference(graph, params, before))
