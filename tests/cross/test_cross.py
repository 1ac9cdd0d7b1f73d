"""Cross targets: libraries for aarch64 and riscv64 built on this machine.

Covers the target parser (generic cpu for another triple), the config keys
cc/run/pack and their errors, devc.o for each target (our ELF writer and the
C fallback) against the target compiler's own objects, the doit build of the
cross matrix (configs/cross.yaml) with the toolchain as a tracked input, the
Python export API (.so/.tar/.o, cc, options, fcompile) and the error for a
foreign library. Kernels of the cross libraries run under qemu-user through
tests/cross/kernel_runner.c, node by node, against onnxruntime.

Tests needing a cross compiler or qemu skip when it is missing, except under
CI=true (tests/support/toolchains.py).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

import pipeline
from models import build as build_model
from pipeline.errors import ConfigError
from pipeline.frontend import from_onnx
from pipeline.ir.target import TargetError, parse_target
from pipeline.link.blob import BLOB_MAGIC, BLOB_VERSION, devc_checksum
from pipeline.link.cc import ToolchainError, create_shared
from pipeline.link.elf import machine_name
from pipeline.link.export import pack_devc
from pipeline.link.runtime_c import build_pipeline_run
from pipeline.runtime import GraphModule, load_module
from pipeline.runtime.machine import ForeignLibraryError, host_machine
from pipeline.tasks.config import load_config
from pipeline.transform import PassContext
from tests.support import REPO
from tests.support.doit_runner import doit
from tests.support.onnx_models import tiny_convnet
from tests.support.toolchains import require_tools

CROSS = yaml.safe_load((REPO / "configs" / "cross.yaml").read_text())["targets"]
# arch -> (its entry in configs/cross.yaml, e_machine)
KERNEL_RUNNER = Path(__file__).with_name("kernel_runner.c")
ARCHES = {"aarch64": ("arm64", 183), "riscv64": ("rv64", 243)}


def elf_header(path: Path) -> tuple[int, int]:
    """(e_machine, e_flags) of a little-endian ELF64 file."""
    head = path.read_bytes()[:52]
    assert head[:4] == b"\x7fELF", path
    return struct.unpack_from("<H", head, 18)[0], struct.unpack_from("<I", head, 48)[0]


def cross(arch: str) -> dict:
    """The configs/cross.yaml entry for arch, after checking its tools exist."""
    entry = CROSS[ARCHES[arch][0]]
    require_tools(entry["cc"])
    return entry


# -- targets ------------------------------------------------------------------

def test_foreign_triple_gets_the_generic_cpu_never_the_hosts():
    host = parse_target("llvm")
    assert host.is_host and host == parse_target("llvm -mcpu=native")
    for triple in ("aarch64-linux-gnu", "riscv64-linux-gnu"):
        t = parse_target(f"llvm -mtriple={triple}")
        assert (t.cpu, t.is_host, t.object_format) == ("generic", False, "elf")
    # riscv64 Linux without -mattr is RV64GC (double-float ABI), as clang assumes.
    assert parse_target("llvm -mtriple=riscv64-linux-gnu") == parse_target(CROSS["rv64"]["target"])
    assert parse_target("llvm -mtriple=riscv64-linux-gnu").elf_flags() == 0x5  # RVC, lp64d
    with pytest.raises(TargetError, match=r"-mcpu=native names this machine's cpu .* "
                                          r"aarch64-linux-gnu; name a cpu of aarch64"):
        parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=native")


def test_vector_width_follows_the_target():
    assert parse_target(CROSS["arm64"]["target"]).vector_width == 4  # NEON: 128 bits
    assert parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1").vector_width == 4
    assert parse_target(CROSS["rv64"]["target"]).vector_width == 4
    assert parse_target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell").vector_width == 8
    assert parse_target("llvm -mtriple=x86_64-linux-gnu -mcpu=x86-64").vector_width == 4


# -- config -------------------------------------------------------------------

def _config(tmp: Path, targets: str) -> Path:
    tiny_convnet(tmp / "nets" / "tiny.onnx")
    cfg = tmp / "matrix.yaml"
    cfg.write_text("models:\n  tiny: {path: nets/tiny.onnx}\ntargets:\n" + targets)
    return cfg


@pytest.mark.parametrize("targets, error", [
    ('  arm64: {target: "llvm -mtriple=aarch64-linux-gnu"}\n',
     r"targets\.arm64\.cc: required for target aarch64-linux-gnu, which is not this "
     r"machine .*Debian package "
     r"gcc-aarch64-linux-gnu"),
    ('  rv64: {target: "llvm -mtriple=riscv64-linux-gnu", cc: [gcc]}\n',
     r"targets\.rv64\.cc: must be a command"),
    ('  native: {target: "llvm", pack: asm}\n', r"targets\.native\.pack: 'asm' is not a pack; "
                                                r"allowed: elf, c"),
])
def test_config_errors_name_the_key(tmp_path: Path, targets: str, error: str):
    with pytest.raises(ConfigError, match=error) as err:
        load_config(_config(tmp_path, targets))
    assert len(str(err.value).splitlines()) == 1


def test_cc_defaults_to_the_hosts_and_run_is_kept(tmp_path: Path):
    cfg = load_config(_config(tmp_path, '  native: {target: "llvm", run: "env"}\n'
                                        '  arm64: {target: "llvm -mtriple=aarch64-linux-gnu", '
                                        "cc: aarch64-linux-gnu-gcc, pack: c}\n"))
    native, arm = cfg.targets["native"], cfg.targets["arm64"]
    assert (native.cc, native.run, native.pack) == (None, "env", None)
    assert (arm.cc, arm.pack) == ("aarch64-linux-gnu-gcc", "c")
    assert native.packing() == {"pack": "elf"}
    ident = native.toolchain()
    assert set(ident) == {"cc", "path", "version"} and Path(ident["path"]).is_file()


def test_missing_compiler_stops_doit_with_one_line_only_when_selected(tmp_path: Path):
    _config(tmp_path, '  native: {target: "llvm"}\n'
                      '  arm64: {target: "llvm -mtriple=aarch64-linux-gnu", cc: no-such-gcc}\n')
    code, _, out = doit(tmp_path, "list", "config=matrix.yaml")
    assert code != 0 and "Traceback" not in out, out
    assert ("targets.arm64.cc: compiler 'no-such-gcc' not found on PATH; install the Debian "
            "package gcc-aarch64-linux-gnu") in out
    code, _, out = doit(tmp_path, "list", "config=matrix.yaml", "target=native")
    assert code == 0, out


# -- devc.o -------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["aarch64", "riscv64"])
def test_devc_objects_match_the_target_compiler_and_link(tmp_path: Path, arch: str):
    """Our ELF writer's devc.o carries what the target's gcc writes in e_machine and
    e_flags (the float ABI on RISC-V); the C fallback's devc.o holds the same blob;
    both link into a shared library with the target's cc."""
    entry = cross(arch)
    (tmp_path / "x.c").write_text("int x;\n")
    subprocess.run([entry["cc"], "-c", "-fPIC", "-o", str(tmp_path / "x.o"),
                    str(tmp_path / "x.c")], check=True)
    gcc_header = elf_header(tmp_path / "x.o")
    assert gcc_header[0] == ARCHES[arch][1]
    graph = ('{"nodes": [], "arg_nodes": [], "heads": [], "node_row_ptr": [0], "attrs": '
             '{"shape": ["list_shape", []], "dltype": ["list_str", []], '
             '"storage_id": ["list_int", []]}}')  # empty, but whole: the plan reads it
    for pack in ("elf", "c"):
        devc = tmp_path / f"devc_{pack}.o"
        pack_devc(graph, b"params", [], entry["target"], devc, pack, entry["cc"])
        assert elf_header(devc) == gcc_header, pack
        create_shared(tmp_path / f"lib_{pack}.so", [devc], cc=entry["cc"])
        assert elf_header(tmp_path / f"lib_{pack}.so")[0] == ARCHES[arch][1]
    assert devc_checksum(tmp_path / "devc_elf.o") == devc_checksum(tmp_path / "devc_c.o")


# -- the Python API on the host -----------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> tuple[Path, dict, np.ndarray]:
    """(ONNX path, input feed, onnxruntime's output) of support.onnx_models.tiny_convnet."""
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    tiny_convnet(path, seed=3)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    return path, {"x": x}, ort.InferenceSession(str(path)).run(None, {"x": x})[0]


def _factory(onnx_path: Path, target: str):
    graph, params = from_onnx(onnx_path)
    with PassContext(opt_level=3):
        return pipeline.build(graph, target=target, params=params)


def _run(path: Path, feed: dict) -> np.ndarray:
    m = GraphModule(load_module(path)["default"]())
    for name, value in feed.items():
        m.set_input(name, value)
    m.run()
    return m.get_output(0)


def test_export_library_so_tar_o_with_options_and_fcompile(tmp_path: Path, tiny_model):
    onnx_path, feed, expected = tiny_model
    factory = _factory(onnx_path, "llvm -mcpu=native")
    for suffix in (".so", ".tar", ".o"):
        lib = factory.export_library(tmp_path / f"tiny{suffix}")
        np.testing.assert_allclose(_run(lib, feed), expected, rtol=1e-4, atol=1e-5)
    assert elf_header(tmp_path / "tiny.o")[0] == host_machine()

    calls = []

    def fcompile(output, objects, options):
        calls.append((output, [Path(o).name for o in objects], options))
        create_shared(output, objects, options)

    lib = factory.export_library(tmp_path / "f.so", options=["-Wl,-z,now"], fcompile=fcompile)
    assert calls == [(str(lib), ["lib0.o", "devc.o", "executor.o"], ["-Wl,-z,now"])]
    dynamic = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    assert "NOW" in dynamic  # the option reached the linker
    np.testing.assert_allclose(_run(lib, feed), expected, rtol=1e-4, atol=1e-5)


def test_pack_c_and_elf_give_the_same_outputs(tmp_path: Path, tiny_model):
    onnx_path, feed, expected = tiny_model
    factory = _factory(onnx_path, "llvm -mcpu=native")
    outs = [_run(factory.export_library(tmp_path / f"{pack}.so", pack=pack), feed)
            for pack in ("elf", "c")]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], expected, rtol=1e-4, atol=1e-5)


def test_foreign_library_says_its_architecture_and_how_to_run_it(tmp_path: Path, tiny_model):
    entry = cross("aarch64")
    here = machine_name(host_machine())
    factory = _factory(tiny_model[0], entry["target"])
    with pytest.raises(ToolchainError, match=r"export_library\(cc=\.\.\.\): required for target "
                                             r"aarch64-linux-gnu, .*gcc-aarch64-linux-gnu"):
        factory.export_library(tmp_path / "nocc.so")
    for suffix in (".so", ".o", ".tar"):
        lib = factory.export_library(tmp_path / f"arm{suffix}", cc=entry["cc"])
        with pytest.raises(ForeignLibraryError, match=r"built for aarch64, this machine is "
                                                      rf"{here}: .*qemu-aarch64 -L"):
            load_module(lib)
    # Every object is the target's, the C executor's included (compiled by its cc).
    with tarfile.open(tmp_path / "arm.tar") as tar:
        assert sorted(tar.getnames()) == ["devc.o", "executor.o", "lib0.o"]
        tar.extractall(tmp_path / "arm", filter="data")
    for name in ("devc.o", "executor.o", "lib0.o"):
        assert elf_header(tmp_path / "arm" / name)[0] == ARCHES["aarch64"][1], name


# -- doit: the cross matrix ---------------------------------------------------

def _cross_matrix(tmp: Path, arm_cc: str | None = None) -> None:
    targets = {**CROSS, "arm64": {**CROSS["arm64"], **({"cc": arm_cc} if arm_cc else {})}}
    tiny_convnet(tmp / "nets" / "tiny.onnx")
    (tmp / "matrix.yaml").write_text(yaml.safe_dump(
        {"models": {"tiny": {"path": "nets/tiny.onnx"}}, "targets": targets}))


def test_doit_builds_cross_libraries_and_tracks_each_targets_compiler(tmp_path: Path):
    require_tools(CROSS["arm64"]["cc"], CROSS["rv64"]["cc"])
    _cross_matrix(tmp_path)
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml")
    assert code == 0, out[-3000:]
    for target, machine in (("native", host_machine()), ("arm64", 183), ("rv64", 243)):
        assert elf_header(tmp_path / "out" / "tiny" / target / "tiny.so")[0] == machine
        for name in ("executor.o", "pipeline-run"):  # the C runtime: the target's too
            assert elf_header(tmp_path / "out" / "runtime" / target / name)[0] == machine
    assert elf_header(tmp_path / "out" / "tiny" / "rv64" / "tiny.so")[1] == 0x5  # RVC, lp64d

    # The arm64 library runs in its own executor under qemu, as the host's does here.
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    outs = []
    for target in ("native", "arm64"):
        run = [*(CROSS[target].get("run") or "").split(),
               str(tmp_path / "out" / "runtime" / target / "pipeline-run")]
        (tmp_path / target).mkdir()
        subprocess.run([*run, str(tmp_path / "out" / "tiny" / target / "tiny.so"),
                        "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                        str(tmp_path / target)], check=True, capture_output=True)
        outs.append(np.load(tmp_path / target / "output_0.npy"))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-5)

    # Another compiler for arm64 (same gcc behind a wrapper: another path):
    # arm64's lib0.o, runtime and .so are rebuilt, nothing else runs.
    wrapper = tmp_path / "bin" / "arm-cc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which(CROSS["arm64"]["cc"])} "$@"\n')
    wrapper.chmod(0o755)
    _cross_matrix(tmp_path, arm_cc=str(wrapper))
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml")
    assert code == 0, out[-3000:]
    assert executed == {"lib0:tiny@arm64", "runtime:arm64", "export:tiny@arm64"}, executed
    why = json.loads((tmp_path / "out" / "build-report.json").read_text())["executed"]
    assert all(any(w.startswith("toolchain cc: ") for w in i["why"]) for i in why), why
    code, executed, out = doit(tmp_path, "build", "config=matrix.yaml")
    assert code == 0 and executed == set(), executed


@pytest.mark.slow
def test_doit_builds_the_whole_cross_config(tmp_path: Path):
    """configs/cross.yaml as shipped: every model for native, arm64 and rv64."""
    require_tools(CROSS["arm64"]["cc"], CROSS["rv64"]["cc"])
    shutil.copy(REPO / "configs" / "cross.yaml", tmp_path / "cross.yaml")
    code, _, out = doit(tmp_path, "-n", "2", "build", "config=cross.yaml")
    assert code == 0, out[-3000:]
    models = yaml.safe_load((REPO / "configs" / "cross.yaml").read_text())["models"]
    for model in models:
        for target, machine in (("native", host_machine()), ("arm64", 183), ("rv64", 243)):
            so = tmp_path / "out" / model / target / f"{model}.so"
            assert elf_header(so)[0] == machine, so


# -- the kernels run on the target (qemu-user) --------------------------------

def _runner(tmp: Path, entry: dict) -> list[str]:
    """tests/cross/kernel_runner.c built with the target's cc; the command that runs it."""
    exe = tmp / "kernel_runner"
    subprocess.run([entry["cc"], "-O1", "-o", str(exe), str(KERNEL_RUNNER),
                    "-ldl"], check=True)
    return [*entry["run"].split(), str(exe)]


def _run_on_target(runner: list[str], lib: Path, graph_json: str, params: dict,
                   feed: dict, tmp: Path) -> np.ndarray:
    """Run the graph node by node, each kernel in one runner process on the target."""
    g = json.loads(graph_json)
    row, shapes = g["node_row_ptr"], g["attrs"]["shape"][1]
    dtypes = g["attrs"]["dltype"][1]
    values: dict[int, np.ndarray] = {}
    for nid, node in enumerate(g["nodes"]):
        if node["op"] == "null":
            values[row[nid]] = np.ascontiguousarray({**params, **feed}[node["name"]])
            continue
        ins = [values[row[i] + idx] for i, idx, *_ in node["inputs"]]
        outs = [np.zeros(shapes[e], dtypes[e]) for e in range(row[nid], row[nid + 1])]
        func = node["attrs"]["func_name"]
        if func in ("__nop", "__copy"):
            outs[0][...] = ins[0].reshape(outs[0].shape)
        else:
            files = []
            for k, array in enumerate(ins + outs):
                files.append(tmp / f"buf{k}.bin")
                array.tofile(files[-1])
            proc = subprocess.run([*runner, str(lib), func, *map(str, files)],
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            outs = [np.fromfile(f, o.dtype).reshape(o.shape)
                    for f, o in zip(files[len(ins):], outs, strict=True)]
        for e, array in zip(range(row[nid], row[nid + 1]), outs, strict=True):
            values[e] = array
    nid, idx, *_ = g["heads"][0]
    return values[row[nid] + idx]


@pytest.mark.parametrize("arch", ["aarch64", "riscv64"])
def test_cross_library_kernels_match_the_reference_under_qemu(tmp_path: Path, tiny_model,
                                                              arch: str):
    entry = cross(arch)
    require_tools(entry["run"].split()[0])
    onnx_path, feed, expected = tiny_model
    factory = _factory(onnx_path, entry["target"])
    lib = factory.export_library(tmp_path / "tiny.so", cc=entry["cc"])
    got = _run_on_target(_runner(tmp_path, entry), lib, factory.get_graph_json(),
                         factory.get_params(), feed, tmp_path)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


# -- doit validate / bench on the target (pipeline-run under qemu) ------------

def test_validate_and_bench_run_on_the_target_and_need_its_run_prefix(tmp_path: Path):
    """validate: the arm64 library runs in arm64's pipeline-run under qemu and is
    compared with the host's reference; a foreign target without `run` fails with one
    line naming the key. bench: the emulated median, labelled so, no onnxruntime ratio."""
    require_tools(CROSS["arm64"]["cc"], CROSS["arm64"]["run"].split()[0])
    tiny_convnet(tmp_path / "nets" / "tiny.onnx")
    bare = {k: v for k, v in CROSS["arm64"].items() if k != "run"}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(
        {"models": {"tiny": {"path": "nets/tiny.onnx"}},
         "targets": {"arm64": CROSS["arm64"], "bare": bare}}))
    code, executed, out = doit(tmp_path, "--continue", "validate", "config=matrix.yaml")
    assert code != 0 and "validate:tiny@arm64" in executed, out[-3000:]
    assert "matrix.yaml: targets.bare.run is not set: a library for aarch64 cannot run" \
        in out, out[-3000:]
    report = json.loads((tmp_path / "out/tiny/arm64/validation.json").read_text())
    assert report["passed"] and report["ran_on"] == "target", report
    assert report["run"] == CROSS["arm64"]["run"] and report["emulated_ms"] > 0, report
    assert 0 < report["outputs"][0]["max_abs_err"] < 1e-4, report

    code, _, out = doit(tmp_path, "bench", "config=matrix.yaml", "target=arm64",
                        "threads=1", "rounds=2", "runs=3")
    assert code == 0, out[-3000:]
    bench = json.loads((tmp_path / "out/tiny/arm64/bench.json").read_text())
    assert bench["emulated"] and bench["threads"]["1"]["emulated_ms"] > 0, bench
    assert "ratio" not in bench["threads"]["1"] and "EMULATED" in out, out[-3000:]
    summary = (tmp_path / "out/bench-summary.md").read_text()
    assert "| tiny | arm64 | 1 |" in summary and "Emulated" in summary, summary

    # A weight byte flipped in the arm64 library: the executor refuses it on the target.
    so = tmp_path / "out/tiny/arm64/tiny.so"
    raw = bytearray(so.read_bytes())
    start = raw.index(BLOB_MAGIC + BLOB_VERSION.to_bytes(4, "little"))
    offset, size = struct.unpack_from("<QQ", raw, start + 48)  # the params section
    raw[start + offset + size - 1] ^= 1
    so.write_bytes(bytes(raw))
    code, _, out = doit(tmp_path, "validate", "config=matrix.yaml", "target=arm64")
    assert code != 0 and "checksum mismatch: the blob's sha256 differs" in out, out[-3000:]


@pytest.mark.slow
def test_mobilenet_and_bert_validate_on_arm64_and_rv64_under_qemu(tmp_path: Path):
    """Issue 12's CI check: doit build + validate of mobilenet_v2 and the BERT-style
    encoder for both boards of configs/cross.yaml, each library run by its target's
    pipeline-run under qemu and compared with the host's reference (30 s cold on 2 cores)."""
    require_tools(*(CROSS[t][k].split()[0] for t in ("arm64", "rv64") for k in ("cc", "run")))
    config = yaml.safe_load((REPO / "configs" / "cross.yaml").read_text())
    config["models"] = {m: config["models"][m] for m in ("mobilenet_v2", "bert_encoder")}
    config["targets"] = {t: config["targets"][t] for t in ("arm64", "rv64")}
    (tmp_path / "cross.yaml").write_text(yaml.safe_dump(config))
    code, executed, out = doit(tmp_path, "-n", "2", "validate", "config=cross.yaml")
    assert code == 0, out[-3000:]
    for model in config["models"]:
        for target in config["targets"]:
            report = json.loads((tmp_path / "out" / model / target / "validation.json")
                                .read_text())
            assert report["passed"] and report["ran_on"] == "target", report
            assert report["emulated_ms"] > 0, report


# -- VM libraries (executor: vm) under qemu -------------------------------------

def _vm_on_target(tmp: Path, arch: str, model, feed: dict) -> list[np.ndarray]:
    """Build `model` as a VM library for arch and run it with pipeline-run under qemu."""
    entry = cross(arch)
    require_tools(entry["run"].split()[0])
    graph, params = from_onnx(model, control_flow=True)
    with PassContext(opt_level=3):
        factory = pipeline.build(graph, target=entry["target"], params=params, executor="vm")
    so = factory.export_library(tmp / f"{arch}.so", cc=entry["cc"])
    assert elf_header(so)[0] == ARCHES[arch][1]
    run = tmp / f"pipeline-run-{arch}"
    build_pipeline_run(run, entry["cc"])
    args = []
    for name, value in feed.items():
        np.save(tmp / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp / f'{name}.npy'}"]
    proc = subprocess.run([*entry["run"].split(), str(run), str(so), *args, "--output-dir",
                           str(tmp / "out"), "--print-time"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("time: median ")
    return [np.load(tmp / "out" / f"output_{k}.npy") for k in range(len(graph.outputs))]


@pytest.mark.parametrize("arch", ["aarch64", "riscv64"])
def test_vm_library_runs_under_qemu(tmp_path: Path, tiny_model, arch: str):
    onnx_path, feed, expected = tiny_model
    got = _vm_on_target(tmp_path, arch, onnx_path, feed)
    np.testing.assert_allclose(got[0], expected, rtol=1e-4, atol=1e-4)


def test_default_matrix_mlp_as_vm_library_on_arm64(tmp_path: Path):
    """The default matrix's mlp, executor vm, on arm64 under qemu, against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    model = build_model("mlp")
    x = np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"data": x})
    got = _vm_on_target(tmp_path, "aarch64", model, {"data": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["aarch64", "riscv64"])
def test_vm_control_flow_under_qemu(tmp_path: Path, arch: str):
    """A Loop (trip count, carried value, scan output) around an If, run by the VM
    interpreter of arch under qemu, against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    t = onnx.helper.make_tensor_value_info
    h = onnx.helper
    then = h.make_graph([h.make_node("Neg", ["acc"], ["n"])], "t", [],
                        [t("n", onnx.TensorProto.FLOAT, [3])])
    orelse = h.make_graph([h.make_node("Add", ["acc", "x"], ["n2"])], "e", [],
                          [t("n2", onnx.TensorProto.FLOAT, [3])])
    body = h.make_graph(
        [h.make_node("Mod", ["i", "two"], ["r"]),
         h.make_node("Cast", ["r"], ["odd"], to=onnx.TensorProto.BOOL),
         h.make_node("If", ["odd"], ["v"], then_branch=then, else_branch=orelse),
         h.make_node("Identity", ["v"], ["row"])], "body",
        [t("i", onnx.TensorProto.INT64, []), t("c", onnx.TensorProto.BOOL, []),
         t("acc", onnx.TensorProto.FLOAT, [3])],
        [t("c", onnx.TensorProto.BOOL, []), t("v", onnx.TensorProto.FLOAT, [3]),
         t("row", onnx.TensorProto.FLOAT, [3])])
    model = h.make_model(h.make_graph(
        [h.make_node("Loop", ["m", "", "x"], ["y", "rows"], body=body)], "loop",
        [t("x", onnx.TensorProto.FLOAT, [3])],
        [t("y", onnx.TensorProto.FLOAT, [3]), t("rows", onnx.TensorProto.FLOAT, [5, 3])],
        [h.make_tensor("m", onnx.TensorProto.INT64, [], [5]),
         h.make_tensor("two", onnx.TensorProto.INT64, [], [2])]),
        opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.array([0.5, -1.0, 2.0], np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    got = _vm_on_target(tmp_path, arch, model, {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("arch", ["aarch64", "riscv64"])
def test_symbolic_encoder_runs_at_two_shapes_under_qemu(tmp_path: Path, arch: str):
    """One VM library of the BERT-style encoder with dynamic [batch, seq], built for
    arch, run by pipeline-run under qemu at two shapes (the outputs take them),
    against onnxruntime; an input past the bounds is refused in one line."""
    ort = pytest.importorskip("onnxruntime")
    from tests.runtime.dims_models import VOCAB, encoder

    entry = cross(arch)
    require_tools(entry["run"].split()[0])
    model = encoder()
    graph, params = from_onnx(model, symbolic=True)
    with PassContext(opt_level=3):
        factory = pipeline.build(graph, target=entry["target"], params=params, executor="vm",
                                 dims={"batch": (1, 4), "seq": (1, 64)})
    so = factory.export_library(tmp_path / "bert.so", cc=entry["cc"])
    run = tmp_path / "pipeline-run"
    build_pipeline_run(run, entry["cc"])
    session = ort.InferenceSession(model.SerializeToString())
    for shape in ((1, 5), (3, 64), (1, 65)):
        ids = np.random.default_rng(shape[1]).integers(0, VOCAB, shape).astype(np.int64)
        np.save(tmp_path / "ids.npy", ids)
        out = tmp_path / f"out{shape[1]}"
        proc = subprocess.run([*entry["run"].split(), str(run), str(so), "--input",
                               f"ids={tmp_path / 'ids.npy'}", "--output-dir", str(out)],
                              capture_output=True, text=True, timeout=600)
        if shape[1] > 64:
            assert proc.returncode == 1 and "'seq' = 65 is outside its bounds 1..64" in \
                proc.stderr and proc.stderr.count("\n") == 1 and not out.exists()
            continue
        assert proc.returncode == 0, proc.stderr
        got = np.load(out / "output_0.npy")
        assert got.shape == (*shape, 32)
        np.testing.assert_allclose(got, session.run(None, {"ids": ids})[0], rtol=1e-4,
                                   atol=1e-5)
