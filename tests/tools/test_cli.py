"""The `pipeline` command, run as a user runs it: a subprocess per command.

The model is tests/tools/data/torch_cnn.onnx, exported by PyTorch's own exporter
(tests/tools/data/make_torch_cnn.py) with a symbolic batch: a file the compiler was
not written around. Its outputs are compared with onnxruntime's. Error cases
call main() in this process (same code, no interpreter start).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline.link.blob import BLOB_VERSION
from pipeline.tasks.cache import is_valid
from pipeline.tools import cli
from tests.support import REPO
from tests.support.cli_runner import pipeline
from tests.support.toolchains import require_tools

MODEL = Path(__file__).parent / "data" / "torch_cnn.onnx"
BATCH_SHAPE = (2, 3, 32, 32)


def test_the_console_script_is_this_module():
    # [project.scripts] of pyproject.toml (tomllib is Python 3.11+; we support 3.10)
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    module, _, function = re.search(r'^pipeline = "([^"]+)"', section, re.M)[1].partition(":")
    assert getattr(importlib.import_module(module), function) is cli.main
    assert module == "pipeline.tools.cli"  # what the tests run with python -m


def test_the_installed_console_script_runs():
    """`pip install -e .` (the README's install line, .ci/run) puts `pipeline` on PATH."""
    exe = shutil.which("pipeline")
    if exe is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but no `pipeline` on PATH: pip install -e . installs it")
        pytest.skip("the console script is not installed (pip install -e .)")
    proc = subprocess.run([exe, "info", "--help"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "usage: pipeline info" in proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """torch_cnn.onnx compiled at batch 2 by `pipeline compile`, twice: (folder, the
    two runs, the cache folder)."""
    tmp = tmp_path_factory.mktemp("cli")
    cache = tmp / "kcache"
    first = pipeline("compile", str(MODEL), "-o", "cnn.so", "--input",
                     "x=" + ",".join(map(str, BATCH_SHAPE)), "--cache", str(cache), cwd=tmp)
    # The second compile finds the cache through the environment, as doit would.
    second = pipeline("compile", str(MODEL), "-o", "cnn.tar", "--input",
                      "x=" + ",".join(map(str, BATCH_SHAPE)), cwd=tmp,
                      env={"PIPELINE_KERNEL_CACHE": str(cache)})
    return tmp, (first, second), cache


def test_compile_fills_the_kernel_cache_and_a_second_compile_reuses_it(compiled):
    tmp, (first, second), cache = compiled
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    n = int(first.stdout.split(": ")[1].split()[0])
    assert f"({n} compiled, 0 reused from {cache})" in first.stdout
    assert f"(0 compiled, {n} reused from {cache})" in second.stdout
    hashes = {p.stem for p in cache.glob("*.o")}
    assert len(hashes) == n and all(is_valid(str(cache), h) for h in hashes)
    assert (tmp / "cnn.so").is_file() and (tmp / "cnn.tar").is_file()


def test_run_gives_onnxruntimes_outputs(compiled):
    ort = pytest.importorskip("onnxruntime")
    tmp = compiled[0]
    x = np.random.default_rng(5).standard_normal(BATCH_SHAPE).astype(np.float32)
    np.save(tmp / "x.npy", x)
    proc = pipeline("run", "cnn.so", "--input", "x=x.npy", "--output-dir", "outs", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert "outs/output_0.npy  [2, 10]  float32" in proc.stdout
    want = ort.InferenceSession(str(MODEL)).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp / "outs" / "output_0.npy"), want,
                               rtol=1e-4, atol=1e-6)


def test_compile_executor_vm_and_run(compiled):
    """`pipeline compile --executor vm` links a VM library (its kernels from the cache);
    `pipeline run` runs it through the VM, matching onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    tmp, _, cache = compiled
    proc = pipeline("compile", str(MODEL), "-o", "cnn_vm.so", "--executor", "vm", "--input",
                    "x=" + ",".join(map(str, BATCH_SHAPE)), "--cache", str(cache), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert "(0 compiled," in proc.stdout
    x = np.random.default_rng(6).standard_normal(BATCH_SHAPE).astype(np.float32)
    np.save(tmp / "xv.npy", x)
    proc = pipeline("run", "cnn_vm.so", "--input", "x=xv.npy", "--output-dir", "vm_outs",
                    cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert "vm_outs/output_0.npy  [2, 10]  float32" in proc.stdout
    want = ort.InferenceSession(str(MODEL)).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp / "vm_outs" / "output_0.npy"), want,
                               rtol=1e-4, atol=1e-6)
    np.save(tmp / "xbad.npy", x[:1])
    proc = pipeline("run", "cnn_vm.so", "--input", "x=xbad.npy", cwd=tmp)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "expected float32 [2, 3, 32, 32], given float32 [1, 3, 32, 32]" in proc.stderr


def test_compile_executor_vm_builds_control_flow(tmp_path):
    """An If model: `pipeline compile --executor vm` builds it, the default refuses it."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    t = h.make_tensor_value_info
    branch = {op: h.make_graph([h.make_node(op, ["x"], ["y"])], op, [], [t("y", T.FLOAT, [3])])
              for op in ("Neg", "Relu")}
    model = h.make_model(h.make_graph(
        [h.make_node("If", ["c"], ["y"], then_branch=branch["Neg"], else_branch=branch["Relu"])],
        "g", [t("c", T.BOOL, []), t("x", T.FLOAT, [3])], [t("y", T.FLOAT, [3])]),
        opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "if.onnx")
    np.save(tmp_path / "c.npy", np.array(False))
    np.save(tmp_path / "x.npy", np.array([1, -2, 3], np.float32))
    proc = pipeline("compile", "if.onnx", "-o", "if.so", "--executor", "vm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = pipeline("run", "if.so", "--input", "c=c.npy", "--input", "x=x.npy", "--output-dir",
                    "o", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "output_0.npy"), [1, 0, 3])
    proc = pipeline("compile", "if.onnx", "-o", "g.so", cwd=tmp_path)
    assert proc.returncode == 1 and "If (control flow: subgraphs are not compiled)" in proc.stderr


def test_validate_passes_and_info_describes_the_library(compiled, capsys):
    tmp = compiled[0]
    proc = pipeline("validate", str(MODEL), "cnn.tar", "--reference", "onnx", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert "probs: max abs error" in proc.stdout and "matches onnx on seed 0" in proc.stdout
    proc = pipeline("info", "cnn.so", "--json", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["target"] == cli.DEFAULT_TARGET and info["blob_version"] == BLOB_VERSION
    assert info["inputs"] == [{"name": "x", "shape": list(BATCH_SHAPE), "dtype": "float32"}]
    assert [(o["shape"], o["dtype"]) for o in info["outputs"]] == [([2, 10], "float32")]
    assert len(info["build_id"]) == 40 and info["params"]["bytes"] > 0
    from pipeline.runtime import load_module

    lib = load_module(tmp / "cnn.so")
    assert [k["symbol"] for k in info["kernels"]] == list(lib.kernels)
    # Per-kernel metadata recorded by the build (pipeline.runtime.metadata) is shown.
    calls = {k["symbol"]: k["calls"] for k in info["kernels"]}
    assert sum(calls.values()) == sum(
        1 for n in json.loads(lib.graph_json)["nodes"]
        if n["op"] == "tvm_op" and n["attrs"]["func_name"] != "__nop")
    assert all(k["flops"] is not None and k["bytes_moved"] > 0 for k in info["kernels"])
    # The stack scratch is the kernel's own IR's (its spec, in the cache, rendered now).
    from pipeline.codegen.render import render
    from pipeline.lower.cost import stack_bytes
    from pipeline.lower.kernel import KernelSpec

    for k in info["kernels"]:
        spec = (compiled[2] / (k["symbol"].rsplit("_", 1)[1] + ".json")).read_text()
        assert k["stack_bytes"] == stack_bytes(render(KernelSpec.from_json(spec))), k
    assert any(k["stack_bytes"] > 0 for k in info["kernels"] if "dense" in k["symbol"])
    assert cli.main(["info", str(tmp / "cnn.tar")]) == 0  # the text form, in process
    text = capsys.readouterr().out
    assert "target    llvm -mcpu=native" in text and "input     x  [2, 3, 32, 32]" in text
    assert "FLOPs/call" in text and "stack bytes" in text


def test_bench_times_against_onnxruntime(compiled):
    pytest.importorskip("onnxruntime")
    tmp = compiled[0]
    proc = pipeline("bench", str(MODEL), "cnn.so", "--threads", "1", "--rounds", "1",
                    "--runs", "2", "--warmup", "0", "--report", "bench.json", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp / "bench.json").read_text())
    row = report["threads"]["1"]
    assert row["ours_ms"] > 0 and row["onnxruntime_ms"] > 0 and row["ratio"] > 0
    assert "ratio" in proc.stdout


def test_an_error_is_one_line_naming_the_file_with_a_nonzero_exit(tmp_path):
    proc = pipeline("compile", str(MODEL), "-o", "x.so", cwd=tmp_path)  # symbolic batch
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: {MODEL}: ")
    assert "'batch'" in proc.stderr and "--input x=" in proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["compile", "nope.onnx", "-o", "x.so"], "error: nope.onnx: model file not found"),
    (["compile", str(MODEL), "-o", "x.bin"], "error: x.bin: a library is a .so"),
    (["compile", str(MODEL), "-o", "x.so", "--input", "x=2,a"], "error: --input x=2,a: "),
    (["compile", str(MODEL), "-o", "x.so", "--input", "z=1,2"], "unknown input(s) ['z']"),
    (["compile", str(MODEL), "-o", "x.so", "--target", "cuda"], "error: --target 'cuda': "),
    (["compile", str(MODEL), "-o", "x.so", "--opt-level", "7"], "error: --opt-level 7: "),
    (["run", "nope.so", "--input", "x=x.npy"], "error: nope.so: no such file"),
    (["info", "nope.so"], "error: nope.so: no such file"),
    (["validate", str(MODEL), "nope.so"], "error: nope.so: no such file"),
])
def test_mistakes_are_one_line_errors(argv, message, capsys):
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: ")


def test_run_checks_its_inputs(compiled, capsys):
    tmp = compiled[0]
    lib = str(tmp / "cnn.so")
    np.save(tmp / "wrong.npy", np.zeros((1, 3, 32, 32), np.float32))
    cases = [([], "input 'x' not given (--input x=FILE.npy)"),
             (["--input", "y=wrong.npy"], "no input named 'y'; inputs: ['x']"),
             (["--input", f"x={tmp / 'wrong.npy'}"],
              "the library was built for shape [2, 3, 32, 32] float32, given shape "
              "[1, 3, 32, 32]"),
             (["--input", f"x={tmp / 'none.npy'}"], "none.npy: no such file")]
    for extra, message in cases:
        assert cli.main(["run", lib, *extra, "--output-dir", str(tmp / "o")]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_every_command_has_help(capsys):
    for command in ("compile", "run", "validate", "bench", "info"):
        with pytest.raises(SystemExit) as done:
            cli.main([command, "--help"])
        assert done.value.code == 0
        assert f"usage: pipeline {command}" in capsys.readouterr().out
    proc = pipeline("--help", cwd=REPO)
    assert proc.returncode == 0 and "compile" in proc.stdout and "info" in proc.stdout


def test_another_machines_library_points_to_pipeline_run(tmp_path, capsys):
    require_tools("aarch64-linux-gnu-gcc")
    lib = str(tmp_path / "arm.so")
    assert cli.main(["compile", str(MODEL), "-o", lib, "--input", "x=1,3,8,8",
                     "--target", "llvm -mtriple=aarch64-linux-gnu",
                     "--cc", "aarch64-linux-gnu-gcc", "--cache", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    assert cli.main(["run", lib, "--input", "x=x.npy"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "built for aarch64" in err
    assert "out/runtime/<target>/pipeline-run" in err and "qemu-aarch64" in err
    # info reads a foreign library from the file
    assert cli.main(["info", lib]) == 0
    assert "llvm -mtriple=aarch64-linux-gnu" in capsys.readouterr().out
