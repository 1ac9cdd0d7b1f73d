"""The C side of the runtime: `pipeline-run` (a subprocess over a real exported
library, compared with onnx's reference), its error lines, and a bounded
libFuzzer run over the executor's blob/plan/params reader (tests/runtime/fuzz_blob.c).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import pipeline
from pipeline.link.blob import BLOB_MAGIC, BLOB_VERSION, pack_blob
from pipeline.link.runtime_c import C_DIR, build_pipeline_run
from pipeline.runtime.params import save_params
from tests.support.fuzz_seeds import stub_graph_json

TARGET = "llvm -mcpu=native"
FUZZ_BLOB = Path(__file__).with_name("fuzz_blob.c")  # the reader's libFuzzer target
FUZZ_SECONDS = int(os.environ.get("PIPELINE_FUZZ_SECONDS", "20"))


def _mixed_model():
    """Inputs of every dtype pipeline-run reads, outputs of several: bool, float64,
    int64, int32, float16, uint8 in; float64, int64, bool, float32, float16, int8,
    uint8 out; plus a float32 weight."""
    t = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Neg", ["x"], ["nx"]),
        helper.make_node("Where", ["c", "x", "nx"], ["sel"]),
        helper.make_node("Cast", ["j"], ["j64"], to=TensorProto.INT64),
        helper.make_node("Add", ["i", "j64"], ["sum"]),
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x32", "w"], ["scaled"]),
        helper.make_node("Mul", ["h", "h"], ["hh"]),
        helper.make_node("Cast", ["j"], ["j8"], to=TensorProto.INT8),
        helper.make_node("Add", ["b", "b"], ["bb"]),
    ]
    inits = [helper.make_tensor("zero", TensorProto.DOUBLE, [], [0.0]),
             helper.make_tensor("w", TensorProto.FLOAT, [3], [0.5, -2.0, 3.0])]
    graph = helper.make_graph(
        nodes, "mixed",
        [t("c", TensorProto.BOOL, [2, 3]), t("x", TensorProto.DOUBLE, [2, 3]),
         t("i", TensorProto.INT64, [3]), t("j", TensorProto.INT32, [3]),
         t("h", TensorProto.FLOAT16, [3]), t("b", TensorProto.UINT8, [3])],
        [t("sel", TensorProto.DOUBLE, [2, 3]), t("sum", TensorProto.INT64, [3]),
         t("pos", TensorProto.BOOL, [2, 3]), t("scaled", TensorProto.FLOAT, [2, 3]),
         t("hh", TensorProto.FLOAT16, [3]), t("j8", TensorProto.INT8, [3]),
         t("bb", TensorProto.UINT8, [3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


INPUTS = {
    "c": np.array([[True, False, True], [False, False, True]]),
    "x": np.linspace(-1.5, 2.5, 6).reshape(2, 3),
    "i": np.array([2**40, -3, 7], dtype=np.int64),
    "j": np.array([5, -6, 2**30], dtype=np.int32),
    "h": np.array([0.1, -2.5, 300.0], dtype=np.float16),
    "b": np.array([1, 200, 255], dtype=np.uint8),
}


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    """(pipeline-run, the mixed model's .so, the ONNX model)."""
    out = tmp_path_factory.mktemp("prun")
    run = out / "pipeline-run"
    build_pipeline_run(run)
    model = _mixed_model()
    graph, params = pipeline.frontend.from_onnx(model)
    with pipeline.transform.PassContext(opt_level=3):
        factory = pipeline.build(graph, target=TARGET, params=params)
    return run, factory.export_library(out / "mixed.so"), model


def _inputs(folder: Path, values: dict = INPUTS) -> list[str]:
    args = []
    for name, value in values.items():
        np.save(folder / f"{name}.npy", value)
        args += ["--input", f"{name}={folder / f'{name}.npy'}"]
    return args


def _run(cmd: list) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)


def test_pipeline_run_matches_reference(tools, tmp_path):
    run, so, model = tools
    proc = _run([run, so, *_inputs(tmp_path), "--output-dir", tmp_path, "--threads", "2",
                 "--repeat", "5"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("median ") and proc.stdout.rstrip().endswith("over 5 runs")
    want = ReferenceEvaluator(model).run(None, INPUTS)
    for k, ref in enumerate(want):
        got = np.load(tmp_path / f"output_{k}.npy")
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_pipeline_run_print_time(tools, tmp_path):
    """--repeat N --print-time: one line `time: median X ms, min Y ms over N runs`,
    min <= median; --print-time alone times one run."""
    run, so, _ = tools
    line = re.compile(r"^time: median (\d+\.\d+) ms, min (\d+\.\d+) ms over (\d+) runs$")
    for extra, count in ((["--repeat", "4", "--print-time"], 4), (["--print-time"], 1)):
        proc = _run([run, so, *_inputs(tmp_path), "--output-dir", tmp_path, *extra])
        assert proc.returncode == 0, proc.stderr
        found = line.match(proc.stdout.strip())
        assert found and proc.stdout.count("\n") == 1, proc.stdout
        assert float(found.group(2)) <= float(found.group(1)) and int(found.group(3)) == count


def test_pipeline_run_makes_its_output_dir(tools, tmp_path):
    """--output-dir creates the folder and its missing parents, as mkdir -p does."""
    run, so, model = tools
    out = tmp_path / "not" / "yet" / "there"
    proc = _run([run, so, *_inputs(tmp_path), "--output-dir", out])
    assert proc.returncode == 0, proc.stderr
    for k, ref in enumerate(ReferenceEvaluator(model).run(None, INPUTS)):
        got = np.load(out / f"output_{k}.npy")
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_pipeline_run_output_matches_python_api(tools, tmp_path):
    run, so, _ = tools
    assert _run([run, so, *_inputs(tmp_path), "--output-dir", tmp_path]).returncode == 0
    gmod = pipeline.runtime.GraphModule(pipeline.runtime.load_module(so)["default"]())
    gmod.run(**INPUTS)
    for k in range(gmod.get_num_outputs()):
        np.testing.assert_array_equal(np.load(tmp_path / f"output_{k}.npy"), gmod.get_output(k))


def _corrupt(so: Path, tmp_path: Path, offset: int, data: bytes) -> Path:
    """A copy of `so` with `data` written at `offset` from the blob's start."""
    raw = bytearray(so.read_bytes())
    # Magic and version: the bare magic is also a string constant of the executor.
    at = raw.index(BLOB_MAGIC + BLOB_VERSION.to_bytes(4, "little")) + offset
    raw[at:at + len(data)] = data
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(raw))
    return bad


@pytest.mark.parametrize("case, message", [
    ("no-args", r"usage: pipeline-run LIB\.so --input NAME=FILE\.npy"),
    ("bad-flag", r"bad argument '--fast'"),
    ("bad-threads", r"--threads needs an integer >= 1, got 'two'"),
    ("missing-npy", r"input 'x': cannot open .*nothere\.npy"),
    ("missing-input", r"input 'j' not given \(--input j=FILE\.npy\)"),
    ("unknown-input", r"the library has no input named 'q'"),
    ("wrong-dtype", r"input 'x': .*x\.npy has dtype '<f4', expected float64 '<f8'"),
    ("wrong-shape", r"input 'x': .*x\.npy has shape \(3,2\), expected \(2, 3\)"),
    ("fortran", r"input 'x': .*x\.npy is in Fortran order"),
    ("not-npy", r"input 'x': .*x\.npy is not a \.npy file"),
    ("no-library", r"cannot load .*gone\.so"),
    ("version", rf"bad\.so: blob from format version 9, this runtime reads version "
                rf"{BLOB_VERSION}"),
    ("plan", r"bad\.so: blob corrupted: section plan out of bounds"),
    ("truncated-file", r"cannot load .*bad\.so"),
    ("output-dir-is-a-file", r"cannot create output directory .*x\.npy/y: Not a directory"),
])
def test_pipeline_run_errors_are_one_line(tools, tmp_path, case, message):
    run, so, _ = tools
    args = _inputs(tmp_path)
    x = tmp_path / "x.npy"
    out = ["--output-dir", tmp_path]
    cmd = {
        "no-args": [run],
        "bad-flag": [run, so, *args, *out, "--fast"],
        "bad-threads": [run, so, *args, *out, "--threads", "two"],
        "missing-npy": [run, so, *args, "--input", "x=nothere.npy", *out],
        "missing-input": [run, so, *args[:6], *out],
        "unknown-input": [run, so, *args, "--input", f"q={x}", *out],
        "no-library": [run, tmp_path / "gone.so", *args, *out],
        "output-dir-is-a-file": [run, so, *args, "--output-dir", x / "y"],
    }.get(case)
    if case == "wrong-dtype":
        np.save(x, INPUTS["x"].astype(np.float32))
    elif case == "wrong-shape":
        np.save(x, INPUTS["x"].reshape(3, 2))
    elif case == "fortran":
        np.save(x, np.asfortranarray(INPUTS["x"]))
    elif case == "not-npy":
        x.write_bytes(b"hello")
    elif case == "version":
        so = _corrupt(so, tmp_path, 8, b"\x09")
    elif case == "plan":  # the plan's offset (section table entry 3) far past the end
        so = _corrupt(so, tmp_path, 64, (1 << 40).to_bytes(8, "little"))
        cmd = [run, so, *args, *out, "--no-check"]  # past the sha256: the reader's own check
    elif case == "truncated-file":
        so = tmp_path / "bad.so"
        so.write_bytes(tools[1].read_bytes()[:5000])
    proc = _run(cmd or [run, so, *args, *out])
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("pipeline-run: ")
    assert re.search(message, proc.stderr), proc.stderr


def test_pipeline_run_refuses_a_flipped_weight_byte(tools, tmp_path):
    """The blob's sha256 is checked in C (pl_create), as the Python loader does: one
    weight byte changed is refused; --no-check (pl_create_unchecked) runs it anyway."""
    run, so, _ = tools
    raw = so.read_bytes()
    start = raw.index(BLOB_MAGIC + BLOB_VERSION.to_bytes(4, "little"))
    offset, size = struct.unpack_from("<QQ", raw, start + 48)  # section table: params
    assert size > 0
    bad = _corrupt(so, tmp_path, offset + size - 1, bytes([raw[start + offset + size - 1] ^ 1]))
    args, out = _inputs(tmp_path), ["--output-dir", tmp_path]
    proc = _run([run, bad, *args, *out])
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"pipeline-run: {bad}: checksum mismatch: the blob's "
                                  "sha256 differs"), proc.stderr
    assert _run([run, bad, *args, *out, "--no-check"]).returncode == 0
    with pytest.raises(pipeline.errors.PipelineError, match="checksum mismatch"):
        pipeline.runtime.load_module(bad)


# ---------------------------------------------------------------- fuzzing


def _seed_blobs(offsets: list[int] | None = None) -> list[bytes]:
    """Valid blobs of tests.support.fuzz_seeds' graph for the fuzzer to mutate.
    `offsets`: the entries' storage_offset, if any."""
    graph = stub_graph_json(offsets)
    params = save_params({"idx": np.array([1, -2, 3], dtype=np.int64)})
    return [pack_blob(graph, params, ["k_add", "k_relu", "k_any"], TARGET),
            pack_blob(graph, b"", ["k_add"], TARGET)]


def test_reader_accepts_seeds_and_explains_bad_blobs(tmp_path):
    """The C reader (fuzz_blob.c's plain main, no libFuzzer needed) opens the seeds,
    so the fuzzer starts from valid blobs, and names what is wrong with bad ones."""
    reader = tmp_path / "reader"
    subprocess.run(["cc", "-DFUZZ_MAIN", "-I", str(C_DIR), str(FUZZ_BLOB),
                    "-o", str(reader)], check=True, capture_output=True)
    seed = _seed_blobs()[0]
    at = seed.rindex(b"idx")  # the param dict is the last section: rename its param
    bad_param = seed[:at] + b"idy" + seed[at + 3:]
    cases = {
        "seed0": (seed, "ok"),
        "seed1": (_seed_blobs()[1], "ok"),
        "truncated": (seed[:-1], "blob truncated or corrupted: length"),
        "foreign": (b"\x7fELF" + seed[4:], "not a pipeline blob"),
        "version": (seed[:8] + b"\x01" + seed[9:], "blob from format version 1"),
        "param": (bad_param, "param 'idy' is not used by the graph"),
        "offset": (_seed_blobs([0, 0, 0, 0, 0, 0, 64])[0], "ok"),  # in a storage of its own
        "input_offset": (_seed_blobs([64, 0, 0, 0, 0, 0, 0])[0],
                         "plan corrupted: input 'x' lies at an offset in its storage"),
        "empty": (b"", "not a pipeline blob"),
    }
    for name, (data, _) in cases.items():
        (tmp_path / name).write_bytes(data)
    out = subprocess.run([str(reader), *(str(tmp_path / n) for n in cases)], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    for (name, (_, want)), got in zip(cases.items(), out, strict=True):
        assert got.startswith(want) or want in got, (name, got)


def _clang() -> str | None:
    clang = shutil.which("clang")
    if clang is None and os.environ.get("CI") == "true":
        pytest.fail("clang is required under CI=true (Debian package clang)")
    return clang


def test_fuzz_blob_reader(tmp_path):
    """libFuzzer + ASan/UBSan over the reader for FUZZ_SECONDS: no crash, no leak."""
    clang = _clang()
    if clang is None:
        pytest.skip("clang not installed (Debian package clang)")
    fuzzer = tmp_path / "fuzz_blob"
    subprocess.run([clang, "-g", "-O1", "-fsanitize=fuzzer,address,undefined",
                    "-fno-sanitize-recover=undefined", "-I", str(C_DIR),
                    str(FUZZ_BLOB), "-o", str(fuzzer)],
                   check=True, capture_output=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for k, blob in enumerate(_seed_blobs()):
        (corpus / f"seed{k}").write_bytes(blob)
    proc = subprocess.run([str(fuzzer), f"-max_total_time={FUZZ_SECONDS}", "-timeout=10",
                           "-rss_limit_mb=2048", "-print_final_stats=1", str(corpus)],
                          capture_output=True, text=True, timeout=FUZZ_SECONDS + 120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = next(line for line in proc.stderr.splitlines() if "stat::number_of_executed_units"
                in line)
    print(runs)
    assert int(runs.split(":")[-1]) > 1000
