"""The reliability catalogue: each entry is a fault or a bad input, the outcome the
product promises, and the test that holds it (README, section "Guarantees").

| fault / input                               | promised outcome                           |
|---------------------------------------------|--------------------------------------------|
| SIGKILL after import/kernel/lib0/devc/export| next build: same bytes as a clean build,   |
|                                             | the same tasks an uninterrupted one runs,  |
|                                             | no committed kernel compiled again         |
| two `doit build` on one out/                | the second stops: "build already running"; |
|                                             | database intact, next build a no-op        |
| ENOSPC while writing an artifact            | one line naming the file; old file kept    |
| corrupted / truncated / foreign cache entry | recompiled, counted as compiled            |
| kernel spec missing from the cache          | one line naming the file                   |
| unexpected exception in a stage             | one line: task, exception, log under out/  |
| code bytes of a .so damaged after the build | load_module refuses it (code digest)       |
| ONNX external data via `..` or absolute path| refused, naming the tensor                 |
| shape over the element limit / overflowing  | LimitError before any allocation           |
| ONNX graph with a cycle / dangling input    | ModelError naming node and input           |
| YAML alias bomb / self-referencing alias    | ConfigError naming the file                |
| set_input: dtype, shape, name, strides      | clear error; strided arrays copied right   |
| .tar with links, absolute or `..` members   | FormatError naming the member              |
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pipeline
from pipeline import files
from pipeline.errors import (
    ConfigError,
    FormatError,
    LimitError,
    ModelError,
    OutputError,
    PipelineError,
)
from pipeline.runtime import GraphModule, load_module
from pipeline.runtime.blob import BlobError
from pipeline.tasks import cache
from pipeline.tasks.config import load_config
from tests.support import REPO
from tests.support.build_outputs import artifact_bytes, hashes, kernel_tasks
from tests.support.checkouts import matrix
from tests.support.doit_runner import doit, doit_process
from tests.support.onnx_models import tiny_convnet


def report(tmp: Path) -> dict:
    return json.loads((tmp / "out" / "build-report.json").read_text())


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    tiny_convnet(tmp_path / "nets" / "tiny.onnx")
    matrix(tmp_path, "tiny: {path: nets/tiny.onnx}\n")
    return tmp_path


def ok(tmp: Path, *args: str, env: dict | None = None) -> set[str]:
    code, executed, out = doit(tmp, "build", "config=matrix.yaml", *args, env=env)
    assert code == 0, out[-3000:]
    return executed


# -- SIGKILL at each stage ------------------------------------------------------

def killed_build(tmp: Path, at: str) -> tuple[int, str]:
    """`doit build` in tmp through kill_dodo.py beside this file, whose task `at` (a
    task-name prefix, ":before" to kill before the stage) SIGKILLs its process:
    (code, output)."""
    code, _, out = doit(tmp, "build", "config=matrix.yaml", dodo=Path(__file__).with_name(
        "kill_dodo.py"), env={"PIPELINE_TEST_KILL_AT": at})
    return code, out


@pytest.fixture(scope="module")
def changed_reference(tmp_path_factory) -> dict[str, bytes]:
    """The artifacts of a clean, uninterrupted build of the changed model."""
    d = tmp_path_factory.mktemp("reference")
    tiny_convnet(d / "nets" / "tiny.onnx", classes=5)
    matrix(d, "tiny: {path: nets/tiny.onnx}\n")
    ok(d)
    return artifact_bytes(d)


@pytest.mark.parametrize("stage", ["import:", "kernel:", "lib0:", "devc:", "export:"])
def test_sigkill_after_a_stage_then_rebuild(tiny: Path, stage: str, changed_reference):
    ok(tiny)
    old = hashes(tiny, "tiny", "llvm")
    tiny_convnet(tiny / "nets" / "tiny.onnx", classes=5)  # the last layer: every stage reruns
    code, out = killed_build(tiny, stage)
    assert code == -9, out[-3000:]  # killed by the hook, not failed
    assert not list((tiny / "out").rglob("*.tmp")), "a half-written file was left"
    committed = {p.stem for p in (tiny / "out" / "kernels").glob("*.sha256")}
    executed = ok(tiny)
    new = hashes(tiny, "tiny", "llvm") - old
    assert len(new) == 1
    # doit wrote no record for the killed run, so exactly the tasks an
    # uninterrupted rebuild runs run now, and nothing more.
    assert executed == {"import:tiny", "optimize:tiny@llvm", *(f"kernel:{h}" for h in new),
                        "lib0:tiny@llvm", "devc:tiny@llvm", "export:tiny@llvm"}
    ran = {i["task"]: i for i in report(tiny)["executed"]}
    kernel = ran[f"kernel:{next(iter(new))}"]
    # A kernel committed to the cache before the kill is not compiled again.
    # (the action cache restores it, or the kernel cache's entry is found valid)
    assert kernel["status"] in (("reused", "restored") if next(iter(new)) in committed
                                else ("ok",))
    if stage in ("kernel:", "lib0:", "export:"):  # these ran after the kernel compiled
        assert new <= committed
    assert artifact_bytes(tiny) == changed_reference
    assert ok(tiny) == set()


def test_sigkill_before_a_kernel_compiles(tiny: Path):
    code, out = killed_build(tiny, "kernel:before")
    assert code == -9, out[-3000:]
    assert not list((tiny / "out" / "kernels").glob("*.o"))
    executed = ok(tiny)
    assert kernel_tasks(executed) == hashes(tiny, "tiny", "llvm")
    assert ok(tiny) == set()


def test_temporaries_of_a_killed_write_are_removed(tiny: Path):
    ok(tiny)
    d = tiny / "out" / "tiny" / "llvm"
    stale = [d / ".tiny.so.x1y2.tmp", d / ".devc.o.abcd.tmp.old"]
    shared = tiny / "out" / "kernels" / ".0123.o.zz.tmp"  # maybe another checkout's
    for p in [*stale, shared]:
        p.write_bytes(b"half written")
    assert ok(tiny) == set()
    assert not any(p.exists() for p in stale) and shared.exists()


# -- two builds of one folder ------------------------------------------------------

def test_second_build_while_one_holds_the_lock_says_so(tiny: Path):
    (tiny / "out").mkdir(exist_ok=True)
    with open(tiny / "out" / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        code, executed, out = doit(tiny, "build", "config=matrix.yaml")
    assert code != 0 and "Traceback" not in out, out
    assert "a build is already running" in out and len(out.strip().splitlines()) == 1, out
    assert executed == set()
    ok(tiny)  # the lock is released with its holder


def test_two_builds_at_once_on_one_folder(tiny: Path):
    (tiny / "out").mkdir(exist_ok=True)
    procs = [doit_process(tiny, "build", "config=matrix.yaml", stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stdout.read()) for p in procs]
    for code, out in results:
        assert code == 0 or "a build is already running" in out, out[-3000:]
    assert any(code == 0 for code, _ in results)
    assert ok(tiny) == set()  # the database records the build that ran
    code, _, out = doit(tiny, "validate", "config=matrix.yaml")
    assert code == 0, out[-3000:]


# -- the disk fills up ----------------------------------------------------------------

def _full_disk(monkeypatch) -> None:
    """Every file atomic_write opens for writing is /dev/full: the kernel's ENOSPC."""
    real_open = open

    def full_open(path, mode="r", *args, **kwargs):
        return real_open("/dev/full" if "w" in mode else path, mode, *args, **kwargs)

    monkeypatch.setattr(files, "open", full_open, raising=False)


def test_enospc_keeps_the_old_artifact_and_names_it(tmp_path: Path, monkeypatch):
    target = tmp_path / "devc.o"
    target.write_bytes(b"old artifact")
    _full_disk(monkeypatch)
    with pytest.raises(OutputError, match=rf"^{target}: cannot write: No space left on device"):
        files.atomic_write(target, b"new bytes " * 10000)
    assert target.read_bytes() == b"old artifact"
    assert [p.name for p in tmp_path.iterdir()] == ["devc.o"]  # no temporary left


def test_enospc_during_a_build_is_one_line(tiny: Path):
    ok(tiny)
    before = artifact_bytes(tiny)
    # A sitecustomize (test code only) fills the disk for writes of devc.o.
    inject = tiny / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(textwrap.dedent("""
        import builtins
        import pipeline.files as files
        def full_open(path, mode="r", *args, **kwargs):
            if "w" in mode and ".devc.o." in str(path):
                path = "/dev/full"
            return builtins.open(path, mode, *args, **kwargs)
        files.open = full_open
        """))
    tiny_convnet(tiny / "nets" / "tiny.onnx", seed=1)  # new weights: devc.o is rewritten
    code, _, out = doit(tiny, "build", "config=matrix.yaml",
                        env={"PYTHONPATH": f"{inject}{os.pathsep}{REPO}"})
    assert code != 0 and "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if "No space left on device" in ln]
    assert len(lines) == 1 and "out/tiny/llvm/devc.o: cannot write" in lines[0], out
    after = artifact_bytes(tiny)
    assert after["devc.o"] == before["devc.o"] and after["tiny.so"] == before["tiny.so"]
    executed = ok(tiny)  # the disk has room again: the build completes
    assert {"devc:tiny@llvm", "export:tiny@llvm"} <= executed


# -- the kernel cache --------------------------------------------------------------

def test_damaged_cache_entries_are_recompiled_and_counted(tiny: Path):
    ok(tiny)
    kernels = tiny / "out" / "kernels"
    a, b, c = sorted(hashes(tiny, "tiny", "llvm"))[:3]
    good = {h: (kernels / f"{h}.o").read_bytes() for h in (a, b, c)}
    flipped = bytearray(good[a])
    flipped[len(flipped) // 2] ^= 0x40
    (kernels / f"{a}.o").write_bytes(bytes(flipped))                 # corrupted
    (kernels / f"{b}.o").write_bytes(good[b][: len(good[b]) // 2])   # truncated
    for suffix in (".o", ".sha256"):                                 # foreign: b's entry
        (kernels / f"{c}{suffix}").write_bytes((kernels / f"{a}{suffix}").read_bytes())
    (kernels / f"{c}.o").write_bytes(good[b])
    (kernels / f"{c}.sha256").write_text(cache.checksum(b, good[b]))
    for h in (a, b, c):
        assert not cache.is_valid(str(kernels), h)
    (tiny / "out" / "tiny" / "llvm" / "lib0.o").unlink()  # force a relink
    shutil.rmtree(kernels / "ac")  # (the action cache would restore lib0.o unlinked)
    code, executed, out = doit(tiny, "build", "config=matrix.yaml")
    assert code == 0, out[-3000:]
    assert executed == {"lib0:tiny@llvm", "export:tiny@llvm"}
    n = len(hashes(tiny, "tiny", "llvm"))
    assert report(tiny)["entries"]["tiny@llvm"]["compiled"] == 3
    assert f"tiny@llvm: {n} kernels (3 compiled, {n - 3} reused)" in out
    for h in (a, b, c):
        assert (kernels / f"{h}.o").read_bytes() == good[h]


def test_missing_kernel_spec_is_one_line(tmp_path: Path):
    with pytest.raises(cache.CacheError, match=r"0123abcd\.json: kernel spec missing"):
        cache.compile_entry(str(tmp_path), "0123abcd")


def test_unexpected_exception_in_a_stage_is_one_line_and_a_log(tiny: Path):
    inject = tiny / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(textwrap.dedent("""
        import pipeline.tasks.stages as stages
        def pack_devc(*args):
            raise RuntimeError("injected fault")
        stages.pack_devc = pack_devc
        """))
    code, _, out = doit(tiny, "build", "config=matrix.yaml",
                        env={"PYTHONPATH": f"{inject}{os.pathsep}{REPO}"})
    assert code != 0 and "Traceback" not in out, out
    log = Path("out") / "logs" / "devc_tiny@llvm.log"
    lines = [ln for ln in out.splitlines() if "injected fault" in ln]
    assert lines == [f"devc:tiny@llvm: internal error RuntimeError: injected fault "
                     f"(full traceback in {log})"], out
    text = (tiny / log).read_text()
    assert "Traceback" in text and "injected fault" in text and "pack_devc" in text


# -- the library's code ----------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_lib(tmp_path_factory) -> tuple[Path, Path]:
    """(tiny.onnx, tiny.so) built through the Python API."""
    d = tmp_path_factory.mktemp("lib")
    tiny_convnet(d / "tiny.onnx")
    graph, params = pipeline.frontend.from_onnx(d / "tiny.onnx")
    factory = pipeline.build(graph, target="llvm -mcpu=native", params=params)
    factory.export_library(d / "tiny.so")
    factory.export_library(d / "tiny.tar")
    return d / "tiny.onnx", d / "tiny.so"


def _text_section(so: bytes) -> tuple[int, int]:
    from pipeline.link.integrity import elf_sections

    return next((off, size) for name, *_, off, size, _ in elf_sections(so, "x") if name == ".text")


def test_damaged_code_is_refused_at_load(tiny_lib, tmp_path: Path):
    so = tiny_lib[1].read_bytes()
    load_module(tiny_lib[1])  # verified by default
    load_module(tiny_lib[1].with_suffix(".tar"))  # linked at load, stamped there too
    offset, size = _text_section(so)
    damaged = bytearray(so)
    damaged[offset + size // 2] ^= 0xFF
    bad = tmp_path / "tiny.so"
    bad.write_bytes(bytes(damaged))
    with pytest.raises(BlobError, match=rf"^{bad}: code digest mismatch: the library's code "
                                        "was changed after the build; rebuild it$"):
        load_module(bad)
    # The C executor's code (pl_run) is the library's code too: covered by the digest.
    from pipeline.link.integrity import elf_sections

    nm = subprocess.run(["nm", "-D", "--defined-only", str(tiny_lib[1])], capture_output=True,
                        text=True, check=True).stdout
    addr = next(int(line.split()[0], 16) for line in nm.splitlines()
                if line.endswith(" pl_run"))
    _, _, _, text_addr, text_off, _, _ = next(s for s in elf_sections(so, "x") if s[0] == ".text")
    damaged = bytearray(so)
    damaged[addr - text_addr + text_off + 4] ^= 0xFF
    bad.write_bytes(bytes(damaged))
    with pytest.raises(BlobError, match="code digest mismatch"):
        load_module(bad)
    unstamped = bytearray(so)
    # The blob (magic and version: the executor's code holds the bare magic too);
    # its last 32 bytes: the digest.
    slot = so.index(pipeline.link.blob.BLOB_MAGIC
                    + pipeline.link.blob.BLOB_VERSION.to_bytes(4, "little"))
    total = pipeline.link.blob.read_blob_header_length(so[slot:slot + 24])
    unstamped[slot + total - 32:slot + total] = bytes(32)
    bad.write_bytes(bytes(unstamped))
    with pytest.raises(BlobError, match="records no code digest"):
        load_module(bad)


def test_validate_checks_the_code(tiny: Path):
    ok(tiny)
    so = tiny / "out" / "tiny" / "llvm" / "tiny.so"
    data = bytearray(so.read_bytes())
    offset, size = _text_section(bytes(data))
    data[offset + size // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    code, _, out = doit(tiny, "validate", "config=matrix.yaml")
    assert code != 0 and "Traceback" not in out, out
    assert len([ln for ln in out.splitlines() if "code digest mismatch" in ln]) == 1, out


# -- ONNX inputs ---------------------------------------------------------------------

def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _f32(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


@pytest.mark.parametrize("location, message", [
    ("../outside/w.bin", "points outside the directory"),
    ("/tmp/w.bin", "should be a relative path"),
])
def test_external_data_outside_the_model_folder_is_refused(tmp_path: Path, location, message):
    (tmp_path / "outside").mkdir()
    np.ones(4, np.float32).tofile(tmp_path / "outside" / "w.bin")
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, "offset": "0", "length": "16"}.items():
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    model = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
                   [_f32("x", [4])], [_f32("y", [4])], [weight])
    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match=rf"^{path}: .*tensor name: w.*{message}"):
        pipeline.frontend.from_onnx(path)


@pytest.mark.parametrize("shape, limit, message", [
    ([10**7, 10**6], None, r"has 10000000000000 elements, more than the limit of 17179869184"),
    ([2**40, 2**40], None, r"has 1208925819614629174706176 elements"),
    ([64, 64], "1000", r"has 4096 elements, more than the limit of 1000"),
])
def test_oversized_input_shape(shape, limit, message, monkeypatch):
    if limit:
        monkeypatch.setenv("PIPELINE_MAX_TENSOR_ELEMENTS", limit)
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                   [_f32("x", shape)], [_f32("y", shape)])
    with pytest.raises(LimitError, match=rf"^m: input 'x': shape .*{message}"):
        pipeline.frontend.from_onnx(model, source="m")


def test_oversized_constant_is_refused_before_allocation():
    shape = numpy_helper.from_array(np.array([10**7, 10**6], np.int64), "s")
    model = _model([helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill"),
                    helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                   [_f32("x", [1])], [_f32("y", [10**7, 10**6])], [shape])
    with pytest.raises(PipelineError, match=r"10000000000000 elements"):
        pipeline.frontend.from_onnx(model, source="m")


def test_oversized_shapes_in_the_runtime_readers(monkeypatch):
    from pipeline.link.plan import encode_plan  # the graph JSON reader (executor plan)
    from pipeline.runtime.params import load_params, save_params

    data = bytearray(save_params({"w": np.zeros(2, np.float32)}))
    shape_at = data.index(np.int64(2).tobytes(), 40)  # the array's one dimension
    data[shape_at:shape_at + 8] = np.int64(2**62).tobytes()
    with pytest.raises(LimitError, match=r"array 'w': shape \[4611686018427387904\]"):
        load_params(bytes(data))
    graph = {"nodes": [{"op": "null", "name": "x", "inputs": []}], "arg_nodes": [0],
             "heads": [[0, 0, 0]], "node_row_ptr": [0, 1],
             "attrs": {"shape": ["list_shape", [[2**33, 2**33]]],
                       "dltype": ["list_str", ["float32"]],
                       "storage_id": ["list_int", [0]]}}
    with pytest.raises(LimitError, match=r"graph JSON: entry 0: shape \[8589934592, 8589934592\]"):
        encode_plan(json.dumps(graph))
    graph["attrs"]["shape"][1] = [[2]]
    for offsets, message in (([-64], r"entry 0: storage_offset -64 is not a byte offset"),
                             ([0, 0], r"must have 1 entries")):
        graph["attrs"]["storage_offset"] = ["list_int", offsets]
        with pytest.raises(FormatError, match=message):
            encode_plan(json.dumps(graph))


@pytest.mark.parametrize("nodes, message", [
    ([helper.make_node("Relu", ["b"], ["a"], name="r1"),
      helper.make_node("Relu", ["a"], ["b"], name="r2")],
     r"^m: node 'r1' \(Relu\): input 'b' is computed by node 'r2' after it: the graph has "
     "a cycle"),
    ([helper.make_node("Relu", ["a"], ["a"], name="self")],
     r"^m: node 'self' \(Relu\): input 'a' is computed by node 'self' itself"),
    ([helper.make_node("Add", ["x", "nope"], ["b"], name="add")],
     r"^m: node 'add' \(Add\): input 'nope' is not a graph input, an initializer or the "
     "output of any node"),
])
def test_cycle_or_dangling_input(nodes, message):
    model = _model(nodes, [_f32("x", [2])], [_f32("b", [2])])
    with pytest.raises(ModelError, match=message):
        pipeline.frontend.from_onnx(model, source="m")


# -- configs ---------------------------------------------------------------------------

BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{p}'] * 9)}]\n"
               for p, a in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize("text, message", [
    ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + BOMB
     + "models: {m: {path: x.onnx, inputs: *i}}\ntargets: {}\n",
     "the YAML expands to more than 100000 values through its aliases"),
    ("models: &m {x: *m}\ntargets: {}\n", "a YAML alias refers to the value that contains it"),
])
def test_yaml_alias_bombs(tmp_path: Path, text: str, message: str):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{cfg}: {message}"):
        load_config(cfg)


def test_yaml_aliases_within_bounds_still_work(tmp_path: Path):
    tiny_convnet(tmp_path / "tiny.onnx")
    cfg = tmp_path / "ok.yaml"
    cfg.write_text('models: {tiny: {path: tiny.onnx}}\n'
                   'targets:\n  a: &t {target: "llvm -mcpu=native", opt_level: 3}\n  b: *t\n')
    assert set(load_config(cfg).targets) == {"a", "b"}


# -- the runtime's inputs -----------------------------------------------------------------

def test_set_input_checks(tiny_lib):
    m = GraphModule(load_module(tiny_lib[1])["default"]())
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16), dtype=np.float32)
    with pytest.raises(ValueError, match=r"^input 'x': the library was built for shape "
                                         r"\[1, 3, 16, 16\] float32, given shape "
                                         r"\[1, 3, 16, 16\] float64$"):
        m.set_input("x", x.astype(np.float64))
    with pytest.raises(ValueError, match=r"given shape \[1, 3, 16, 15\] float32$"):
        m.set_input("x", x[..., :15])
    with pytest.raises(KeyError, match=r"no input named 'y'; inputs: \['x'\]"):
        m.set_input("y", x)
    m.set_input("x", x)
    m.run()
    expected = m.get_output(0)
    strided = np.zeros((1, 3, 16, 32), np.float32)[..., ::2]  # not contiguous
    strided[...] = x
    fortran = np.asfortranarray(x)
    for value in (strided, fortran):
        assert not value.flags.c_contiguous
        m.set_input("x", np.zeros_like(x))
        m.run()
        m.set_input("x", value)
        m.run()
        np.testing.assert_array_equal(m.get_output(0), expected)
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(str(tiny_lib[0])).run(None, {"x": x})[0]
    np.testing.assert_allclose(expected, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "absolute", "dotdot", "folder"])
def test_tar_members_are_refused(tmp_path: Path, tiny_lib, kind: str):
    path = tmp_path / "bad.tar"
    lib0 = tiny_lib[1].with_suffix(".tar")
    with tarfile.open(lib0) as src, tarfile.open(path, "w") as tar:
        for member in src.getmembers():
            tar.addfile(member, src.extractfile(member))
        info = tarfile.TarInfo({"absolute": "/tmp/evil.o", "dotdot": "../evil.o",
                                "folder": "sub/evil.o"}.get(kind, "evil.o"))
        if kind in ("symlink", "hardlink"):
            info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 4
            tar.addfile(info, __import__("io").BytesIO(b"evil"))
    with pytest.raises(FormatError, match=rf"^{path}: refusing tar member '{info.name}'"):
        load_module(path)
    assert not Path("/tmp/evil.o").exists() and not (tmp_path.parent / "evil.o").exists()


def test_not_a_tar(tmp_path: Path):
    path = tmp_path / "bad.tar"
    path.write_bytes(b"\x00" * 10 + b"garbage" * 100)
    with pytest.raises(FormatError, match=rf"^{path}: "):
        load_module(path)

