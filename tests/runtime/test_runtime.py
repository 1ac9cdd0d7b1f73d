"""Runtime tests: param dicts, blobs, devc.o, linking, loading and running graphs.

Kernels are written here with llvmlite, following the code generator's
calling convention `int32_t f(void **args)` (inputs, then outputs).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest
from llvmlite import ir

from pipeline.files import atomic_write
from pipeline.ir.target import parse_target
from pipeline.link.blob import (
    BLOB_MAGIC,
    BLOB_SYMBOL,
    emit_blob_object,
    pack_blob,
    read_blob_header_length,
    write_devc,
)
from pipeline.link.cc import LinkError, create_shared, create_tar, link_relocatable
from pipeline.link.export import link_library
from pipeline.runtime import GraphModule, load_module, load_params, save_params
from pipeline.runtime.blob import BlobError, unpack_blob
from tests.support import REPO

N = 8
TARGET = "llvm -mcpu=native"


def _triple() -> str:
    """TARGET's triple: the blob writer takes a triple, not a target string."""
    return parse_target(TARGET).triple


# ---------------------------------------------------------------- params


def _all_dtypes() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((2, 3)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "i32": np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
        "i64": np.array([-(2**62), 0, 2**62], dtype=np.int64),
        "u8": np.arange(256, dtype=np.uint8),
        "i8": np.array([-128, -1, 0, 127], dtype=np.int8),
        "bool": np.array([[True, False], [False, True]]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "strided": np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2],
        "bigendian": np.arange(4, dtype=">f4"),
        "ünïcode": np.ones(2, dtype=np.float32),
    }


def test_params_round_trip_every_dtype():
    params = _all_dtypes()
    loaded = load_params(save_params(params))
    assert list(loaded) == sorted(params)
    for name, arr in params.items():
        got = loaded[name]
        assert got.shape == arr.shape and got.dtype == arr.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, arr)
        assert got.flags.writeable and got.flags.c_contiguous


def test_params_bytes_are_deterministic_and_tvm_layout():
    params = _all_dtypes()
    reordered = dict(reversed(list(params.items())))
    assert save_params(params) == save_params(reordered)
    data = save_params({"w": np.array([1.0, 2.0], dtype=np.float32)})
    expected = b"".join([
        struct.pack("<QQQ", 0xF7E58D4F05049CB7, 0, 1), struct.pack("<Q", 1), b"w",
        struct.pack("<Q", 1),
        struct.pack("<QQiiiBBH", 0xDD5E40F096B4A13F, 0, 1, 0, 1, 2, 32, 1),
        struct.pack("<qq", 2, 8), np.array([1.0, 2.0], dtype="<f4").tobytes(),
    ])
    assert data == expected
    # bool is TVM's UInt(1) stored one byte per element.
    flag = save_params({"b": np.array([True])})
    assert flag[-(1 + 8 + 8 + 4):-(1 + 8 + 8)] == struct.pack("<BBH", 1, 1, 1)


def test_params_errors():
    data = save_params({"w": np.ones(4, dtype=np.float32)})
    with pytest.raises(ValueError, match="expected magic 0xf7e58d4f05049cb7"):
        load_params(b"\0" * 8 + data[8:])
    with pytest.raises(ValueError, match="truncated: expected 16 bytes for data of array 'w'"):
        load_params(data[:-1])
    with pytest.raises(ValueError, match="trailing"):
        load_params(data + b"\0")
    with pytest.raises(ValueError, match="unsupported dtype complex64"):
        save_params({"c": np.zeros(2, dtype=np.complex64)})


# ---------------------------------------------------------------- blob


def _blob() -> bytes:
    return pack_blob(GRAPH, b"\x01\x02params", ["k_a", "k_b"], TARGET)


def test_blob_round_trip():
    blob = _blob()
    assert blob.startswith(BLOB_MAGIC)
    assert read_blob_header_length(blob[:24]) == len(blob)
    got = unpack_blob(blob, "test.so")
    assert got.graph_json == GRAPH and got.params == b"\x01\x02params"
    assert got.kernels == ("k_a", "k_b") and got.target == TARGET
    assert got.import_tree["modules"][1] == {"type_key": "GraphExecutorFactory",
                                             "module_name": "default"}
    assert got.import_tree["row_ptr"] == [0, 1, 1]
    assert _blob() == blob  # deterministic


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b[:-10], r"^test\.so: blob truncated: expected \d+ bytes, found \d+$"),
    (lambda b: b[:10], r"^test\.so: blob truncated: expected at least 24 bytes, found 10$"),
    (lambda b: b[:60] + bytes([b[60] ^ 0xFF]) + b[61:],
     r"^test\.so: checksum mismatch: the library is corrupted; rebuild it$"),
    (lambda b: b"XXXXXXX\0" + b[8:], r"^test\.so: not a pipeline blob: expected magic"),
    (lambda b: b[:8] + struct.pack("<I", 3) + b[12:],  # before offsets in the plan
     r"^test\.so: blob from format version 3, this runtime reads version 4; "
     r"rebuild the library$"),
    (lambda b: b[:8] + struct.pack("<I", 5) + b[12:],
     r"^test\.so: blob from format version 5, this runtime reads version 4; "
     r"rebuild the library$"),
])
def test_blob_corruption(mutate, message):
    with pytest.raises(BlobError, match=message):
        unpack_blob(mutate(_blob()), "test.so")


# ---------------------------------------------------------------- kernels & libraries


def _kernel_module(triple: str) -> ir.Module:
    """pl_add: out = a + b; pl_relu: out = max(x, 0); pl_fail: returns 1 (8 floats)."""
    mod = ir.Module(name="kernels")
    mod.triple = triple
    ptr, f32, i32, i64 = ir.PointerType(), ir.FloatType(), ir.IntType(32), ir.IntType(64)

    def kernel(name, n_args, body):
        fn = ir.Function(mod, ir.FunctionType(i32, [ptr]), name=name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        bufs = [b.load(b.gep(fn.args[0], [i64(k)], source_etype=ptr), typ=ptr)
                for k in range(n_args)]
        loop, done = fn.append_basic_block("loop"), fn.append_basic_block("done")
        entry = b.block
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(i64)
        i.add_incoming(i64(0), entry)

        def elem(buf):
            return b.gep(buf, [i], source_etype=f32)

        body(b, [b.load(elem(p), typ=f32) for p in bufs[:-1]], elem(bufs[-1]))
        nxt = b.add(i, i64(1))
        i.add_incoming(nxt, loop)
        b.cbranch(b.icmp_signed("<", nxt, i64(N)), loop, done)
        b.position_at_end(done)
        b.ret(i32(0))

    kernel("pl_add", 3, lambda b, xs, out: b.store(b.fadd(xs[0], xs[1]), out))
    kernel("pl_relu", 2, lambda b, xs, out: b.store(
        b.select(b.fcmp_ordered(">", xs[0], f32(0)), xs[0], f32(0)), out))
    fail = ir.Function(mod, ir.FunctionType(i32, [ptr]), name="pl_fail")
    ir.IRBuilder(fail.append_basic_block("entry")).ret(i32(1))
    return mod


def _graph(ops: list[tuple[str, str, list[int], int]], heads: list[int]) -> str:
    """Graph JSON over 8-float tensors: nodes 0 "data", 1 "w", then ops.

    ops are (name, func_name, input node ids, storage id); inputs get sids 0, 1.
    """
    nodes = [{"op": "null", "name": "data", "inputs": []},
             {"op": "null", "name": "w", "inputs": []}]
    sids = [0, 1]
    for name, func, inputs, sid in ops:
        nodes.append({"op": "tvm_op", "name": name, "inputs": [[i, 0, 0] for i in inputs],
                      "attrs": {"func_name": func, "num_inputs": str(len(inputs)),
                                "num_outputs": "1", "flatten_data": "0"}})
        sids.append(sid)
    return json.dumps({
        "nodes": nodes, "arg_nodes": [0, 1], "heads": [[h, 0, 0] for h in heads],
        "node_row_ptr": list(range(len(nodes) + 1)),
        "attrs": {"shape": ["list_shape", [[N]] * len(nodes)],
                  "dltype": ["list_str", ["float32"] * len(nodes)],
                  "storage_id": ["list_int", sids]},
    })


# t1 = data + w; t2 = relu(t1); t3 = t2 + w. t1 is dead once t2 exists, so t3
# reuses its storage (sid 2).
GRAPH = _graph([("add0", "pl_add", [0, 1], 2), ("relu", "pl_relu", [2], 3),
                ("add1", "pl_add", [3, 1], 2)], heads=[4, 3])
KERNELS = ["pl_add", "pl_relu", "pl_fail"]
DATA = np.linspace(-2, 2, N, dtype=np.float32)
W = np.linspace(0.5, -0.5, N, dtype=np.float32)


def _expected(data=DATA, w=W):
    t2 = np.maximum(data + w, 0)
    return t2 + w, t2


@pytest.fixture(scope="module")
def objs(tmp_path_factory):
    """lib0.o (kernels, via cc -r) and devc.o (blob) in a temporary folder."""
    out = tmp_path_factory.mktemp("objs")
    target = parse_target(TARGET)
    import llvmlite.binding as llvm

    machine = target.target_machine()
    kernel_o = out / "kernels.o"
    kernel_o.write_bytes(machine.emit_object(llvm.parse_assembly(
        str(_kernel_module(target.triple)))))
    link_relocatable(out / "lib0.o", [kernel_o])
    params = save_params({"w": W})
    write_devc(pack_blob(GRAPH, params, KERNELS, TARGET), target.triple, out / "devc.o")
    return out


@pytest.fixture(scope="module")
def so_path(objs):
    path = objs / "model.so"
    link_library(objs / "lib0.o", objs / "devc.o", path)
    return path


def test_shared_library_exports(so_path):
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so_path)], capture_output=True,
                          text=True, check=True).stdout.split()
    assert BLOB_SYMBOL in syms and all(k in syms for k in KERNELS)
    # The executor's C API is exported, its helpers are not (-fvisibility=hidden).
    assert {"pl_create", "pl_run", "pl_destroy"} <= set(syms) and "open_blob" not in syms


def _run(lib) -> list[np.ndarray]:
    gmod = GraphModule(lib["default"](None))
    gmod.set_input("data", DATA)
    gmod.run()
    return [gmod.get_output(i) for i in range(gmod.get_num_outputs())]


def test_load_and_run_so(so_path):
    lib = load_module(so_path)
    assert lib.kernels == tuple(KERNELS) and lib.target == TARGET
    np.testing.assert_array_equal(lib.params["w"], W)
    gmod = GraphModule(lib["default"]("cpu"))
    assert gmod.get_input_names() == ["data"] and gmod.get_num_inputs() == 1
    assert gmod.get_input_info() == ({"data": (N,)}, {"data": "float32"})
    # 4 storage ids of 32 bytes, each padded to 64: add1 reuses add0's storage.
    assert gmod.module.storage_bytes() == 4 * 64
    gmod.run(data=DATA)
    for got, want in zip(_run(lib), _expected(), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=0)
    np.testing.assert_array_equal(gmod.get_input(0), DATA)
    # load_params overrides w; by-index set_input works too.
    gmod.load_params(save_params({"w": np.ones(N, dtype=np.float32)}))
    gmod.set_input(0, DATA)
    gmod.run()
    np.testing.assert_array_equal(gmod.get_output(0), _expected(w=np.ones(N, np.float32))[0])
    with pytest.raises(KeyError, match="nope"):
        gmod.load_params(save_params({"nope": W}))
    with pytest.raises(KeyError, match=r"available: \['default'\]"):
        lib["other"]
    with pytest.raises(AttributeError, match="kernel symbol 'missing' not found"):
        lib.get_function("missing")


def test_set_input_checks_shape_and_dtype(so_path):
    gmod = GraphModule(load_module(so_path)["default"]())
    with pytest.raises(ValueError, match=r"input 'data': the library was built for shape "
                                         r"\[8\] float32, given shape \[4\] float32"):
        gmod.set_input("data", np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"input 'data'.*given shape \[8\] float64"):
        gmod.set_input(data=np.zeros(N))
    with pytest.raises(KeyError, match="no input named 'x'"):
        gmod.set_input("x", DATA)


def test_tar_export_loads(objs, tmp_path):
    tar = tmp_path / "model.tar"
    create_tar(tar, [objs / "lib0.o", objs / "devc.o"])
    first = tar.read_bytes()
    create_tar(tar, [objs / "devc.o", objs / "lib0.o"])
    assert tar.read_bytes() == first  # deterministic
    with tarfile.open(tar) as t:
        assert [(m.name, m.mtime, m.uid) for m in t] == [("devc.o", 0, 0), ("lib0.o", 0, 0)]
    link_library(objs / "lib0.o", objs / "devc.o", tar)  # the export: with the executor
    with tarfile.open(tar) as t:
        assert t.getnames() == ["devc.o", "executor.o", "lib0.o"]
    for got, want in zip(_run(load_module(tar)), _expected(), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="duplicate file name lib0.o"):
        create_tar(tmp_path / "dup.tar", [objs / "lib0.o", tmp_path / "x" / "lib0.o"])


def test_tar_with_unsafe_member_is_refused(objs, tmp_path):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as t:
        t.add(objs / "lib0.o", arcname="../lib0.o")
    with pytest.raises(ValueError, match="refusing tar member '../lib0.o'"):
        load_module(bad)


def test_fresh_process_imports_only_runtime(so_path):
    code = (
        "import json, sys, numpy as np\n"
        "from pipeline.runtime import GraphModule, load_module\n"
        f"g = GraphModule(load_module({str(so_path)!r})['default']())\n"
        f"g.run(data=np.array({DATA.tolist()!r}, dtype=np.float32))\n"
        "assert 'llvmlite' not in sys.modules\n"
        "print(json.dumps([g.get_output(i).tolist() for i in range(2)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    for got, want in zip(json.loads(out), _expected(), strict=True):
        np.testing.assert_array_equal(np.array(got, np.float32), want)


def test_rebuilt_library_at_same_path_is_reloaded(objs, tmp_path):
    path = tmp_path / "m.so"
    link_library(objs / "lib0.o", objs / "devc.o", path)
    np.testing.assert_array_equal(_run(load_module(path))[0], _expected()[0])
    w2 = np.full(N, 3.0, np.float32)
    devc2 = tmp_path / "devc.o"
    write_devc(pack_blob(GRAPH, save_params({"w": w2}), KERNELS, TARGET), _triple(), devc2)
    link_library(objs / "lib0.o", devc2, path)
    np.testing.assert_array_equal(_run(load_module(path))[0], _expected(w=w2)[0])


def test_kernel_failure_names_node_and_function(objs, tmp_path):
    graph = _graph([("boom", "pl_fail", [0, 1], 2)], heads=[2])
    devc = tmp_path / "devc.o"
    write_devc(pack_blob(graph, save_params({"w": W}), KERNELS, TARGET), _triple(), devc)
    link_library(objs / "lib0.o", devc, tmp_path / "f.so")
    gmod = GraphModule(load_module(tmp_path / "f.so")["default"]())
    with pytest.raises(RuntimeError, match="node 'boom' \\(function 'pl_fail'\\)"):
        gmod.run()


def test_storage_shared_with_input_is_rejected(objs, tmp_path):
    graph = _graph([("add0", "pl_add", [0, 1], 0)], heads=[2])  # writes data's storage
    devc = tmp_path / "devc.o"
    write_devc(pack_blob(graph, save_params({"w": W}), KERNELS, TARGET), _triple(), devc)
    link_library(objs / "lib0.o", devc, tmp_path / "s.so")
    with pytest.raises(ValueError, match="node 'add0' writes storage 0, which holds 'data'"):
        load_module(tmp_path / "s.so")["default"]()


def test_library_without_blob_or_kernels(objs, tmp_path):
    create_shared(tmp_path / "noblob.so", [objs / "lib0.o"])
    with pytest.raises(BlobError, match=f"noblob.so: no {BLOB_SYMBOL} symbol"):
        load_module(tmp_path / "noblob.so")
    devc = tmp_path / "devc.o"
    write_devc(pack_blob(GRAPH, b"", [*KERNELS, "pl_gone"], TARGET), _triple(), devc)
    create_shared(tmp_path / "nok.so", [objs / "lib0.o", devc])
    with pytest.raises(BlobError, match=r"missing from the library: \['pl_gone'\]"):
        load_module(tmp_path / "nok.so")


def test_truncated_library_is_an_error_not_a_crash(so_path, tmp_path):
    cut = tmp_path / "cut.so"
    cut.write_bytes(so_path.read_bytes()[:5000])  # headers intact, segments missing
    with pytest.raises(OSError, match=r"cut\.so: truncated \(5000 bytes, a segment ends at"):
        load_module(cut)


def test_load_module_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="gone.so"):
        load_module(tmp_path / "gone.so")
    (tmp_path / "m.dll").write_bytes(b"")
    with pytest.raises(ValueError, match=r"m\.dll: supported library suffixes are \.so, \.tar, "
                                         r"\.o"):
        load_module(tmp_path / "m.dll")


def test_link_failure_reports_command_and_stderr(tmp_path):
    junk = tmp_path / "junk.o"
    junk.write_text("not an object file")
    with pytest.raises(LinkError) as err:
        create_shared(tmp_path / "x.so", [junk])
    msg = str(err.value)
    assert msg.startswith("link failed") and "-shared -fPIC -o" in msg and str(junk) in msg
    assert len(msg.splitlines()) > 1  # the tool's stderr follows the command line
    assert not (tmp_path / "x.so").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["junk.o"]  # no temp files left
    with pytest.raises(LinkError, match=r"relocatable link failed.*cc -r -nostdlib -o"):
        link_relocatable(tmp_path / "y.o", [junk])
    with pytest.raises(ValueError, match="must end with '.so'"):
        create_shared(tmp_path / "x.dylib", [junk])


@pytest.mark.slow
def test_atomic_write_keeps_identical_files_and_frees_replaced_ones(tmp_path):
    path = tmp_path / "w.params"
    big = os.urandom(3 << 20)
    atomic_write(path, [big[:10], memoryview(big)[10:]])  # chunks, written in order
    os.utime(path, ns=(1, 1))
    atomic_write(path, big)
    assert path.stat().st_mtime_ns == 1  # same bytes: not rewritten
    atomic_write(path, big[::-1])
    for thread in threading.enumerate():  # the old file is freed in the background
        if thread.name.startswith("free "):
            thread.join()
    assert path.read_bytes() == big[::-1] and os.listdir(tmp_path) == ["w.params"]


def test_large_blob_packs_links_and_loads(objs, tmp_path):
    params = save_params({"w": W, "big": np.ones(25_000_000, np.float32)})  # 100 MB
    graph = _graph([("add0", "pl_add", [0, 1], 2)], heads=[2])
    nodes = json.loads(graph)
    start = time.perf_counter()
    devc = tmp_path / "devc.o"
    write_devc(pack_blob(graph, params, KERNELS, TARGET), _triple(), devc)
    pack_s = time.perf_counter() - start
    link_library(objs / "lib0.o", devc, tmp_path / "big.so")
    link_s = time.perf_counter() - pack_s - start
    print(f"100 MB blob: pack+devc.o {pack_s:.2f}s, link {link_s:.2f}s")
    lib = load_module(tmp_path / "big.so")
    assert lib.params["big"].shape == (25_000_000,) and lib.graph_json == graph
    assert nodes["heads"] == [[2, 0, 0]]
    assert os.path.getsize(tmp_path / "big.so") > 100_000_000


def test_devc_in_folder_with_awkward_name(objs, tmp_path):
    folder = tmp_path / 'we"ird\\ dir'
    folder.mkdir()
    write_devc(pack_blob(GRAPH, save_params({"w": W}), KERNELS, TARGET), _triple(),
               folder / "devc.o")
    assert sorted(p.name for p in folder.iterdir()) == ["devc.o"]  # staging file removed
    link_library(objs / "lib0.o", folder / "devc.o", folder / "m.so")
    np.testing.assert_array_equal(_run(load_module(folder / "m.so"))[0], _expected()[0])


def test_devc_object_is_deterministic_and_elf_only(tmp_path):
    blob = _blob()
    assert emit_blob_object(blob, _triple()) == emit_blob_object(blob, _triple())
    # Written without LLVM, so a cross target's devc.o needs no foreign assembler.
    cross = tmp_path / "devc.o"
    cross.write_bytes(emit_blob_object(blob, "aarch64-unknown-linux-gnu"))
    elf = subprocess.run(["readelf", "-h", "-s", "-W", str(cross)], capture_output=True,
                         text=True, check=True).stdout
    assert "AArch64" in elf and f"{len(blob)} OBJECT  GLOBAL DEFAULT    1 {BLOB_SYMBOL}" in elf
    with pytest.raises(ValueError, match="only little-endian ELF targets"):
        emit_blob_object(blob, "x86_64-apple-darwin")
