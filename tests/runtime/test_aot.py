"""The AOT executor on this machine: the generated entry point and header, the static
workspace, lib<m>.a linked into a user's C program (against `pipeline run` on the
graph executor's .so), the Model Library Format tar, and the kernels of a bare-metal
target (single-threaded: no thread library, no atomics)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import pipeline
from pipeline.codegen.render import render
from pipeline.driver.build import lower_graph
from pipeline.ir.target import parse_target
from pipeline.link.aot import render_aot
from pipeline.link.cc import host_cc, link_relocatable
from pipeline.link.mlf import BudgetError, build_aot, check_budgets
from pipeline.plan.workspace import plan_workspace
from pipeline.transform import PassContext
from tests.support import REPO
from tests.support.aot_models import kws_cnn, quantized, tiny_cnn

TARGET = "llvm -mcpu=native"
M4 = "llvm -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4"

# A user's program: the struct API of the header, buffers of the header's sizes.
USER_PROGRAM = r"""
#include <stdio.h>
#include "tiny.h"
static float x[TVMGEN_TINY_INPUT_X_SIZE / 4], y[TVMGEN_TINY_OUTPUT_OUTPUT0_SIZE / 4];
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(x, 1, sizeof x, f) != sizeof x) return 3;
    fclose(f);
    struct tvmgen_tiny_inputs in = {.x = x};
    struct tvmgen_tiny_outputs out = {.output0 = y};
    int rc = tvmgen_tiny_run(&in, &out);
    if (rc) return rc;
    f = fopen(argv[2], "wb");
    fwrite(y, 1, sizeof y, f);
    fclose(f);
    printf("workspace %d\n", TVMGEN_TINY_WORKSPACE_SIZE);
    return 0;
}
"""


def _built(model: onnx.ModelProto, tmp: Path, name: str, target: str = TARGET) -> dict:
    """`model` built for executor aot into tmp: {"so", "header", "archive", "mlf",
    "metadata"}; the .so is the graph executor's library of the same build."""
    path = tmp / f"{name}.onnx"
    onnx.save(model, path)
    graph, params = pipeline.frontend.from_onnx(str(path))
    with PassContext(opt_level=3):
        factory = pipeline.build(graph, target=target, params=params)
    objects = []
    for spec in factory.kernels:
        obj = tmp / f"{spec.hash}.o"
        obj.write_bytes(factory.objects[spec.symbol])
        objects.append(obj)
    link_relocatable(tmp / "lib0.o", objects)
    out = {"header": tmp / f"{name}.h", "archive": tmp / f"lib{name}.a",
           "mlf": tmp / f"{name}.tar"}
    metadata = build_aot(name, factory.get_graph_json(), factory.get_params(), tmp / "lib0.o",
                         target, out)
    if parse_target(target).is_host:
        out["so"] = factory.export_library(tmp / f"{name}.so")
    return {**out, "metadata": metadata, "graph_json": factory.get_graph_json()}


def test_user_c_program_links_the_static_library_and_matches_pipeline_run(tmp_path: Path):
    built = _built(tiny_cnn(), tmp_path, "tiny")
    program = tmp_path / "user.c"
    program.write_text(USER_PROGRAM)
    exe = tmp_path / "user"
    subprocess.run([host_cc(), "-O2", "-I", str(tmp_path), str(program), str(built["archive"]),
                    "-lm", "-lgomp", "-o", str(exe)], check=True)
    x = np.random.default_rng(3).standard_normal((1, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    x.tofile(tmp_path / "x.bin")
    run = subprocess.run([str(exe), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    workspace = built["metadata"]["modules"]["tiny"]["memory"]["functions"]["main"][0][
        "workspace_size_bytes"]
    assert run.stdout.strip() == f"workspace {workspace}"
    subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "run", str(built["so"]),
                    "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "y")],
                   check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    expected = np.load(tmp_path / "y" / "output_0.npy")
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y.bin", np.float32),
                                  expected.ravel())


@pytest.mark.parametrize("make", [tiny_cnn, kws_cnn, lambda: quantized(kws_cnn()),
                                  lambda: quantized(tiny_cnn())],
                         ids=["tiny_cnn", "kws_cnn", "kws_cnn_int8", "tiny_cnn_int8"])
def test_workspace_within_a_tenth_of_the_lower_bound(make, tmp_path: Path):
    graph, params = pipeline.frontend.from_onnx(make())
    with PassContext(opt_level=3):
        lowered = lower_graph(graph, params, parse_target(M4), 3, None)
    plan = plan_workspace(json.loads(lowered.graph_json))
    assert plan.lower_bound <= plan.size <= 1.1 * plan.lower_bound
    # Never more than the graph executor's storages.
    assert plan.size <= lowered.memory.planned_bytes


def test_workspace_buffers_alive_together_never_overlap():
    graph, params = pipeline.frontend.from_onnx(kws_cnn())
    with PassContext(opt_level=3):
        lowered = lower_graph(graph, params, parse_target(M4), 3, None)
    doc = json.loads(lowered.graph_json)
    plan = plan_workspace(doc)
    shapes, dtypes = doc["attrs"]["shape"][1], doc["attrs"]["dltype"][1]
    row_ptr = doc["node_row_ptr"]
    for nid, node in enumerate(doc["nodes"]):
        if node["op"] == "null" or node["attrs"]["func_name"] == "__nop":
            continue
        out = row_ptr[nid]
        if out not in plan.offset:
            continue
        lo = plan.offset[out]
        hi = lo + int(np.prod(shapes[out])) * np.dtype(dtypes[out]).itemsize
        for src, idx, *_ in node["inputs"]:
            e = row_ptr[src] + idx
            if e in plan.offset:  # a kernel never writes over what it reads
                size = int(np.prod(shapes[e])) * np.dtype(dtypes[e]).itemsize
                assert plan.offset[e] + size <= lo or hi <= plan.offset[e]


def test_model_library_format_tar_and_metadata(tmp_path: Path):
    built = _built(tiny_cnn(), tmp_path, "tiny")
    with tarfile.open(built["mlf"]) as tar:
        names = set(tar.getnames())
        metadata = json.load(tar.extractfile("metadata.json"))
    assert {"metadata.json", "codegen/host/include/tiny.h", "codegen/host/src/tiny_aot.c",
            "codegen/host/lib/lib0.o", "codegen/host/lib/tiny_aot.o",
            "codegen/host/lib/libtiny.a", "src/tiny.graph.json"} <= names
    module = metadata["modules"]["tiny"]
    main = module["memory"]["functions"]["main"][0]
    assert metadata["version"] == 7 and module["executors"] == ["aot"]
    assert module["target"] == [TARGET]
    assert main["io_size_bytes"] == 4 * (64 + 10)
    assert main["constants_size_bytes"] >= 4 * (8 * 9 + 8 + 8 * 8 * 9 + 8 + 10 * 128)
    assert 0 < main["workspace_size_bytes"] <= 4 * (8 * 8 * 8 + 8 * 4 * 4)
    header = built["header"].read_text()
    assert f"#define TVMGEN_TINY_WORKSPACE_SIZE {main['workspace_size_bytes']}" in header
    sizes = module["sizes"]
    assert sizes["flash_bytes"] >= main["constants_size_bytes"]
    assert sizes["ram_bytes"] >= main["workspace_size_bytes"] + main["io_size_bytes"]


def test_outputs_are_byte_identical_when_built_again(tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = (_built(tiny_cnn(), tmp_path / d, "tiny") for d in "ab")
    for key in ("header", "archive", "mlf"):
        assert first[key].read_bytes() == second[key].read_bytes(), key


def test_budget_error_names_the_biggest_consumers(tmp_path: Path):
    metadata = _built(tiny_cnn(), tmp_path, "tiny")["metadata"]
    check_budgets(metadata, {"ram_kib": 1024, "flash_kib": 1024})
    with pytest.raises(BudgetError, match=r"model tiny needs .* of RAM, the target's ram_kib "
                                          r"allows 1 KiB; biggest: (workspace|stack)"):
        check_budgets(metadata, {"ram_kib": 1})
    with pytest.raises(BudgetError, match="of FLASH.*biggest: .*constants"):
        check_budgets(metadata, {"flash_kib": 1})


def test_entry_point_calls_kernels_with_workspace_offsets_and_constants():
    graph, params = pipeline.frontend.from_onnx(tiny_cnn())
    with PassContext(opt_level=3):
        lowered = lower_graph(graph, params, parse_target(TARGET), 3, None)
    aot = render_aot("tiny", lowered.graph_json, lowered.params)
    assert "int32_t tvmgen_tiny_run(struct tvmgen_tiny_inputs *inputs" in aot.source
    assert "malloc" not in aot.source and "roundevenf" not in aot.source
    assert "(void *)(ws + " in aot.source and "(void *)(c + " in aot.source
    assert aot.memory["constants_size_bytes"] == len(aot.constants)
    assert render_aot("tiny", lowered.graph_json, lowered.params, bare_metal=True).source \
        .count("roundevenf") == 1


@pytest.mark.parametrize("make", [tiny_cnn, lambda: quantized(tiny_cnn())],
                         ids=["float", "int8"])
def test_bare_metal_kernels_are_single_threaded(make):
    graph, params = pipeline.frontend.from_onnx(make())
    with PassContext(opt_level=3):
        lowered = lower_graph(graph, params, parse_target(M4), 3, None)
    assert lowered.ir
    for spec in lowered.specs.values():
        text = render(spec)
        for name in ("GOMP_parallel", "omp_get_max_threads", "pl_parallel", "atomicrmw",
                     "omp_get_thread_num"):
            assert name not in text, (spec.symbol, name)


def test_bare_metal_triple_keeps_the_hard_float_abi():
    assert parse_target(M4).triple == "thumbv7em-unknown-none-eabihf"
    assert parse_target(M4).bare_metal and not parse_target(TARGET).bare_metal


def test_pipeline_compile_executor_aot_and_info(tmp_path: Path):
    onnx.save(tiny_cnn(), tmp_path / "tiny.onnx")
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "pipeline.tools.cli"]
    subprocess.run([*cli, "compile", str(tmp_path / "tiny.onnx"), "-o",
                    str(tmp_path / "out" / "tiny.tar"), "--executor", "aot", "--cache",
                    str(tmp_path / "cache")], check=True, env=env)
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"tiny.tar", "libtiny.a", "tiny.h"}
    info = subprocess.run([*cli, "info", str(tmp_path / "out" / "tiny.tar")], check=True,
                          env=env, capture_output=True, text=True).stdout
    assert "model     tiny, executor aot" in info and "\nflash " in info and "\nRAM " in info
    assert "(lower bound " in info
    wrong = subprocess.run([*cli, "compile", str(tmp_path / "tiny.onnx"), "-o",
                            str(tmp_path / "m4.so"), "--target", M4, "--cc",
                            "arm-none-eabi-gcc"], env=env, capture_output=True, text=True)
    assert wrong.returncode == 1 and "compile with --executor aot" in wrong.stderr


@pytest.mark.parametrize("pool", ["global", "average"])
def test_int8_average_pool_runs_on_the_bytes_on_bare_metal(pool: str):
    """On a microcontroller DQ -> GlobalAveragePool (or AveragePool) -> Q is a depthwise
    integer convolution (no float copy of the pool's input: the keyword spotter's
    workspace holds its two int8 activations); on a host the pool keeps its float form."""
    graph, params = pipeline.frontend.from_onnx(quantized(kws_cnn(pool=pool)))
    with PassContext(opt_level=3):
        board = lower_graph(graph, params, parse_target(M4), 3, None)
        host = lower_graph(graph, params, parse_target(TARGET), 3, None)
    ops = {t: [b.op for n in low.graph.nodes for b in (n.attr("body") or (n,))]
           for t, low in (("board", board), ("host", host))}
    assert not any("avg_pool" in op for op in ops["board"])
    assert any("avg_pool" in op for op in ops["host"])
    plan = plan_workspace(json.loads(board.graph_json))
    assert plan.size <= 2 * 64 * 25 * 5 <= 24 * 1024


def test_validate_keeps_the_inputs_and_outputs_for_every_executor(tmp_path: Path):
    from pipeline.tools.validate import validate_library

    built = _built(tiny_cnn(), tmp_path, "tiny")
    options = {"reference": "onnx", "rtol": 1e-4, "atol": 1e-4, "seed": 0}
    report = tmp_path / "graph" / "validation.json"
    validate_library(str(built["so"]), str(tmp_path / "tiny.onnx"), {}, options, "tiny",
                     "llvm", str(report))
    folder = report.parent / "validation"
    assert sorted(p.name for p in folder.iterdir()) == ["in_x.npy", "output_0.npy"]
    assert np.load(folder / "in_x.npy").shape == (1, 1, 8, 8)
    assert np.load(folder / "output_0.npy").shape == (1, 10)
