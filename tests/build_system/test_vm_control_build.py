"""Control flow in the doit build (docs/vm.md): a model with a Loop and an If as a VM
entry builds (its subgraphs imported, its kernels compiled by the kernel tasks),
runs like onnxruntime, rebuilds to the same bytes (also under `doit -n 2`), a rerun
runs nothing, `doit validate` and `doit bench` run it, `doit explain` names why the
.ro changed, and the action cache (local and remote tier) restores every artifact
in a clean checkout. A graph entry of such a model fails with one line naming the
node."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.runtime.vm import VirtualMachine, is_vm_library
from pipeline.vm.format import RO_MAGIC, read_ro
from tests.support.build_outputs import build_report, how
from tests.support.checkouts import matrix
from tests.support.doit_runner import doit
from tests.support.onnx_models import tiny_loop_if
from tests.support.servers import nginx
from tests.support.toolchains import require_tools

VM_TARGET = 'vmt: {target: "llvm -mcpu=native", executor: vm}\n'
LOOP = "loop: {path: nets/loop.onnx, validate: {reference: onnxruntime}}\n"
OUT = Path("out/loop/vmt")
ARTIFACTS = ("loop.ro", "devc.o", "lib0.o", "loop.so", "loop.json", "loop.params",
             "kernels.json")


def _checkout(folder: Path, extra: str = "") -> Path:
    tiny_loop_if(folder / "nets" / "loop.onnx")
    matrix(folder, LOOP, VM_TARGET)
    if extra:
        with open(folder / "matrix.yaml", "a") as f:
            f.write(extra)
    return folder


def _build(folder: Path, *args: str, command: str = "build", workers: int = 1) -> set[str]:
    code, executed, out = doit(folder, "-n", str(workers), command, "config=matrix.yaml", *args)
    assert code == 0 and "Traceback" not in out, out[-3000:]
    return executed


def _bytes(folder: Path) -> dict[str, bytes]:
    return {name: (folder / OUT / name).read_bytes() for name in ARTIFACTS}


def test_loop_if_entry_builds_validates_and_rebuilds(tmp_path: Path):
    ort = pytest.importorskip("onnxruntime")
    one = _checkout(tmp_path / "one")
    executed = _build(one, f"cache={tmp_path / 'cache1'}")
    kernels = [t for t in executed if t.startswith("kernel:")]
    assert {"import:loop", "optimize:loop@vmt", "devc:loop@vmt", "export:loop@vmt"} <= executed
    assert len(kernels) >= 4, executed  # the loop body's and the branches' kernels too
    ro = (one / OUT / "loop.ro").read_bytes()
    assert ro[:8] == RO_MAGIC and len(read_ro(ro).functions) >= 4  # main, body, branches
    assert is_vm_library(one / OUT / "loop.so")

    # Both branches of the If against onnxruntime (scan outputs [3, 1, 4] included).
    session = ort.InferenceSession(str(one / "nets" / "loop.onnx"))
    vm = VirtualMachine(one / OUT / "loop.so")
    branches = set()
    for x in (np.full((1, 4), 3, np.float32), np.full((1, 4), -3, np.float32),
              np.random.default_rng(2).standard_normal((1, 4), dtype=np.float32)):
        want = session.run(None, {"x": x})
        branches.add(bool(want[1][-1].sum() > 0))
        for got, ref in zip(vm.run(x), want, strict=True):
            assert got.shape == ref.shape and got.dtype == ref.dtype
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert branches == {True, False}

    assert _build(one, f"cache={tmp_path / 'cache1'}") == set()  # nothing changed
    _build(one, f"cache={tmp_path / 'cache1'}", command="validate")
    report = json.loads((one / OUT / "validation.json").read_text())
    assert report["passed"] and [o["name"] for o in report["outputs"]] == ["y", "hs"]
    assert sorted(p.name for p in (one / OUT / "validation").iterdir()) == [
        "in_x.npy", "output_0.npy", "output_1.npy"]
    assert np.load(one / OUT / "validation" / "output_1.npy").shape == (3, 1, 4)
    _build(one, f"cache={tmp_path / 'cache1'}", "threads=1", "rounds=1", "runs=2", "warmup=0",
           command="bench")
    row = json.loads((one / OUT / "bench.json").read_text())["threads"]["1"]
    assert row["ours_ms"] > 0 and row["onnxruntime_ms"] > 0

    # Another folder, its own cache, two workers: the same bytes.
    two = _checkout(tmp_path / "two")
    _build(two, f"cache={tmp_path / 'cache2'}", workers=2)
    assert _bytes(two) == _bytes(one)

    # New weights: the .ro changes, and doit explain says why.
    tiny_loop_if(one / "nets" / "loop.onnx", seed=1)
    executed = _build(one, f"cache={tmp_path / 'cache1'}")
    assert {"import:loop", "optimize:loop@vmt", "devc:loop@vmt"} <= executed
    assert not any(t.startswith("kernel:") for t in executed)  # same kernels
    assert (one / OUT / "loop.ro").read_bytes() != ro
    why = {i["task"]: " | ".join(i["why"]) for i in build_report(one)["executed"]}
    assert "model file changed: nets/loop.onnx" in why["import:loop"]
    assert "loop.params" in why["devc:loop@vmt"], why
    code, _, out = doit(one, "explain", "config=matrix.yaml")
    lines = out.splitlines()
    at = next(k for k, ln in enumerate(lines) if ln.startswith("devc:loop@vmt"))
    assert code == 0 and "because" in lines[at + 1] and "loop.params" in lines[at + 1], out


def test_clean_checkout_restores_the_ro_from_the_caches(tmp_path: Path):
    """A warm local cache, then a remote tier: a clean checkout compiles nothing and
    gets the same .ro and library."""
    one = _checkout(tmp_path / "one")
    _build(one, f"cache={tmp_path / 'cache'}")
    clone = _checkout(tmp_path / "clone")
    _build(clone, f"cache={tmp_path / 'cache'}", "downloads=all")
    assert set(how(build_report(clone)).values()) == {"restored from cache (local)"}
    assert _bytes(clone) == _bytes(one)

    with nginx(tmp_path / "nginx") as (url, _):
        first = _checkout(tmp_path / "first", f'cache: {{url: "{url}", timeout: 5}}\n')
        _build(first)
        fresh = _checkout(tmp_path / "fresh", f'cache: {{url: "{url}", timeout: 5}}\n')
        _build(fresh, "downloads=all")
    ran = how(build_report(fresh))
    assert "devc:loop@vmt" in ran and set(ran.values()) == {"restored from cache (remote)"}, ran
    assert _bytes(fresh) == _bytes(one)


def test_graph_entries_of_a_control_flow_model_fail_naming_the_node(tmp_path: Path):
    tiny_loop_if(tmp_path / "nets" / "loop.onnx")
    # No VM entry: the import refuses it, as it always has.
    matrix(tmp_path, "loop: {path: nets/loop.onnx}\n")
    code, _, out = doit(tmp_path, "build", "config=matrix.yaml")
    lines = [ln for ln in out.splitlines() if "control flow" in ln]
    assert code != 0 and "Traceback" not in out, out
    assert lines and "Loop (control flow: subgraphs are not compiled) at node(s) rnn" \
        in lines[0] and "If (control flow" in lines[0], out
    # A VM entry elsewhere: imported with its subgraphs, the graph entry refused.
    matrix(tmp_path, "loop: {path: nets/loop.onnx}\n",
           f'llvm: {{target: "llvm -mcpu=native"}}\n{VM_TARGET}')
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml", "target=llvm")
    lines = [ln for ln in out.splitlines() if "control flow" in ln]
    assert code != 0 and "Traceback" not in out, out
    assert lines and "control flow at node(s) rnn (loop), choose (if)" in lines[0], out
    assert "executor='vm'" in lines[0]


def test_arm64_entry_validates_under_qemu(tmp_path: Path):
    """The Loop/If model for arm64: `doit validate` runs the VM library with the
    target's pipeline-run under qemu, against onnxruntime here."""
    require_tools("aarch64-linux-gnu-gcc", "qemu-aarch64")
    tiny_loop_if(tmp_path / "nets" / "loop.onnx")
    matrix(tmp_path, "loop: {path: nets/loop.onnx, executor: vm, validate: {reference: "
           "onnxruntime}}\n",
           'arm64: {target: "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76", '
           'cc: aarch64-linux-gnu-gcc, run: "qemu-aarch64 -L /usr/aarch64-linux-gnu"}\n')
    _build(tmp_path, command="validate")
    report = json.loads((tmp_path / "out/loop/arm64/validation.json").read_text())
    assert report["passed"] and report["ran_on"] == "target", report
    assert [o["name"] for o in report["outputs"]] == ["y", "hs"]
    assert (tmp_path / "out/loop/arm64/loop.ro").read_bytes()[:8] == RO_MAGIC
