"""The VM (`executor: vm`, docs/vm.md): a VM library built by pipeline.build(...,
executor="vm") runs through the Python API (VirtualMachine, Executable.load_exec) and
through pipeline-run, matching onnxruntime; bad inputs and foreign .ro files give one
clear error."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import weakref
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import pipeline
from models import build as build_model
from pipeline.errors import FormatError, PipelineError
from pipeline.link.integrity import elf_sections
from pipeline.link.runtime_c import build_pipeline_run
from pipeline.runtime import vm as vm_module
from pipeline.runtime.vm import Executable, VirtualMachine, VMError
from pipeline.vm.format import RO_MAGIC

TARGET = "llvm -mcpu=native"


def _ort(model, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _vm_library(model, path: Path, shape=None) -> Path:
    graph, params = pipeline.frontend.from_onnx(model, shape)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params, executor="vm")
    factory.export_library(path)
    (path.with_suffix(".ro")).write_bytes(factory.get_ro())
    return path


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """(the mlp model of the default matrix, its VM library, a seeded input)."""
    out = tmp_path_factory.mktemp("vm")
    model = build_model("mlp")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    return model, _vm_library(model, out / "mlp.so"), x


def test_vm_library_matches_onnxruntime(mlp):
    model, so, x = mlp
    vm = VirtualMachine(so)
    got = vm.run(x)
    want = _ort(model, {"data": x})
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    # set_input then invoke, by name: the same values again
    vm.set_input("main", data=x)
    np.testing.assert_allclose(vm.invoke("main")[0], want[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("take_bytes", [0, None], ids=["handed-over", "copied"])
def test_outputs_the_caller_holds_are_never_reused(mlp, monkeypatch, take_bytes):
    """An output's storage (handed over: every output, the threshold lowered to 0) or
    array (copied) is reused by a later run only once the caller let go of it: held
    arrays (and views of them) keep the values of their own run."""
    if take_bytes is not None:
        monkeypatch.setattr(vm_module, "_TAKE_BYTES", take_bytes)
    model, so, x = mlp
    vm = VirtualMachine(so)
    x2 = -x
    want, want2 = _ort(model, {"data": x})[0], _ort(model, {"data": x2})[0]
    held = vm.run(x2)[0]
    view = vm.run(x2)[0][:, :3]  # the run's array lives on in its view
    assert isinstance(held.base, vm_module._Lease) == (take_bytes == 0)
    # one let go of is reused: the same storage (handed over), the same array (copied)
    first = vm.run(x)[0]
    address, alive = first.ctypes.data, weakref.ref(first)
    del first
    second = vm.run(x)[0]
    assert second.ctypes.data == address and (take_bytes == 0 or second is alive())
    del second
    for _ in range(3):  # arrays dropped at once: reused, each run's values right
        np.testing.assert_allclose(vm.run(x)[0], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(held, want2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(view, want2[:, :3], rtol=1e-4, atol=1e-4)
    assert not np.allclose(want[:, :3], want2[:, :3])  # the check can tell them apart


def test_outputs_given_back_from_another_thread(mlp, monkeypatch):
    """Handed-over outputs freed by another thread, also while the VM runs, come back
    to the VM's pool: 2,000 runs cycle through a few storages (a storage never given
    back would make each run's output a new one) and every value stays right."""
    monkeypatch.setattr(vm_module, "_TAKE_BYTES", 0)
    model, so, x = mlp
    vm, want = VirtualMachine(so), _ort(model, {"data": x})[0]
    arrays: queue.Queue = queue.Queue()

    def drop() -> None:
        while arrays.get() is not None:
            pass  # the array is freed here, on this thread

    dropper = threading.Thread(target=drop)
    dropper.start()
    addresses = set()
    for k in range(2000):
        out = vm.run(x)[0]
        addresses.add(out.ctypes.data)
        if k % 200 == 0:
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        arrays.put(out)
        del out
    arrays.put(None)
    dropper.join()
    assert len(addresses) < 100, len(addresses)


def test_load_exec_from_ro_bytes(mlp):
    """Executable.load_exec(ro_bytes, lib): the .ro file beside the library."""
    model, so, x = mlp
    ro = so.with_suffix(".ro").read_bytes()
    assert ro[:8] == RO_MAGIC and Executable.load(so).save()[0] == ro  # the packed one
    exe = Executable.load_exec(ro, so)
    assert exe.save() == (ro, str(so)) and "InvokePacked" in exe.bytecode
    np.testing.assert_allclose(VirtualMachine(exe).run(x)[0], _ort(model, {"data": x})[0],
                               rtol=1e-4, atol=1e-4)
    result = VirtualMachine(exe).benchmark("main", x, number=2, repeat=3)
    assert len(result.results) == 3 and min(result.results) > 0


def test_bad_inputs_are_one_line_errors(mlp):
    _, so, x = mlp
    vm = VirtualMachine(so)
    for bad, needle in ((x.astype(np.float64), "expected float32 [1, 3, 224, 224]"),
                        (x[:, :2], "given float32 [1, 2, 224, 224]")):
        with pytest.raises(VMError, match=re.escape(needle)) as err:
            vm.run(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(VMError, match="inputs not set"):
        VirtualMachine(so).invoke("main")
    with pytest.raises(VMError, match="no input 'nope'"):
        vm.set_input("main", nope=x)


def test_foreign_ro_refused_in_one_line(mlp):
    _, so, _ = mlp
    ro = bytearray(so.with_suffix(".ro").read_bytes())
    for at, value, needle in ((0, b"XLVMEXE\0", "not a pipeline VM executable"),
                              (8, (99).to_bytes(4, "little"), "format version 99"),
                              (len(ro) - 40, b"\xff", "checksum mismatch")):
        bad = bytearray(ro)
        bad[at:at + len(value)] = value
        with pytest.raises(FormatError, match=needle) as err:
            Executable.load_exec(bytes(bad), so)
        assert "\n" not in str(err.value)
    with pytest.raises(FormatError, match="truncated"):
        Executable.load_exec(bytes(ro[:-1]), so)


def test_changed_code_is_refused_before_loading(mlp, tmp_path):
    """The link stamps the code digest after the .ro; a changed code byte is refused."""
    _, so, _ = mlp
    raw = bytearray(so.read_bytes())
    text = next(s for s in elf_sections(raw, "x") if s[0] == ".text")
    raw[text[4] + 100] ^= 0xFF
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(raw))
    with pytest.raises(PipelineError, match="code digest mismatch"):
        VirtualMachine(bad)


def test_pipeline_run_runs_a_vm_library(mlp, tmp_path):
    model, so, x = mlp
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run)
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([run, so, "--input", f"data={tmp_path / 'x.npy'}", "--output-dir",
                           tmp_path / "y", "--repeat", "3", "--print-time"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"time: median \S+ ms, min \S+ ms over 3 runs\n", proc.stdout)
    np.testing.assert_allclose(np.load(tmp_path / "y" / "output_0.npy"),
                               _ort(model, {"data": x})[0], rtol=1e-4, atol=1e-4)
    np.save(tmp_path / "bad.npy", x[:, :1])
    proc = subprocess.run([run, so, "--input", f"data={tmp_path / 'bad.npy'}", "--output-dir",
                           tmp_path / "z"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "has shape (1,1,224,224), expected (1, 3, 224, 224)" in proc.stderr
    assert not (tmp_path / "z").exists()


@pytest.mark.slow
def test_resnet18_vm_matches_onnxruntime(tmp_path):
    model = build_model("resnet18")
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    got = VirtualMachine(_vm_library(model, tmp_path / "resnet18.so")).run(x)
    np.testing.assert_allclose(got[0], _ort(model, {model.graph.input[0].name: x})[0],
                               rtol=1e-4, atol=1e-4)
