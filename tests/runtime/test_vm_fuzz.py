"""Fuzzing the readers of .ro files (docs/vm.md): the C reader and interpreter
(tests/runtime/fuzz_ro.c under libFuzzer with AddressSanitizer and
UndefinedBehaviorSanitizer) and the Python reader (pipeline/vm/format.py, Hypothesis).
Any input is accepted or refused with a one-line message, never a crash. Seeds: a
compiled executor plan (kernels, a copy, an alias, a param), a hand-written
executable with If, Goto, Invoke, Move and View, and one with symbolic dimensions
(ShapeOf, AddDim, MulDim, AllocTensorDims, ViewDims, InvokePackedDims)."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import FormatError, PipelineError
from pipeline.link.runtime_c import C_DIR
from pipeline.vm.bytecode import (
    AddDim,
    AddImm,
    AllocShaped,
    AllocStorage,
    AllocTensor,
    AllocTensorDims,
    Copy,
    CopyAt,
    Fail,
    Function,
    Goto,
    HasValue,
    If,
    Invoke,
    InvokePacked,
    InvokePackedDims,
    Less,
    LoadConst,
    Move,
    MulDim,
    NoneValue,
    Ret,
    Scalar,
    SeqAt,
    SeqConstruct,
    SeqErase,
    SeqInsert,
    SeqLength,
    SeqSplit,
    ShapeOf,
    TensorType,
    View,
    ViewAt,
    ViewDims,
    ViewRows,
    ViewShape,
)
from pipeline.vm.compile import Executable, compile_plan
from pipeline.vm.format import read_ro, write_ro
from tests.support.fuzz_seeds import stub_graph_json

FUZZ_RO = Path(__file__).with_name("fuzz_ro.c")
FUZZ_SECONDS = int(os.environ.get("PIPELINE_FUZZ_SECONDS", "20"))
EXAMPLES = int(os.environ.get("PIPELINE_FUZZ_EXAMPLES", "150"))


def _plan_seed() -> bytes:
    """compile_plan over a graph JSON of kernels k_*, a copy, an alias and a param."""
    graph = stub_graph_json()
    return write_ro(compile_plan(graph, {"idx": np.array([1, -2, 3], dtype=np.int64)}))


def _control_seed() -> bytes:
    """main(c: bool) = If c then f_then(w) else f_else(w), through Invoke, with a Goto
    over dead code, a Move, a View and a Copy; then a counted loop (Scalar, Less,
    AddImm) writing rows of a tensor (ViewAt, CopyAt), and a Fail it never reaches;
    then the data-dependent shapes' ViewShape, AllocShaped and ViewRows."""
    f32 = TensorType("t", "float32", (2, 2))
    body = (AllocStorage(1, 16), AllocTensor(2, 1, 0, 0, (2, 2)), InvokePacked(0, (0, 2)),
            View(3, 2, 0, 0, (4,)), AllocStorage(4, 16), AllocTensor(5, 4, 0, 0, (4,)),
            Copy(5, 3), View(6, 5, 0, 0, (2, 2)), Ret((6,)))
    then = Function("then", (f32,), (f32,), 7, body)
    orelse = Function("else", (f32,), (f32,), 7, body)
    main = Function("main", (TensorType("c", "bool", ()),), (f32,), 15, (
        LoadConst(1, 0), If(0, 2, 4),
        Invoke(1, (1,), (2,)), Goto(5),
        Invoke(2, (1,), (2,)),
        Move(3, 2),
        Scalar(4, 3, 0), Scalar(5, 3, 2), AllocStorage(6, 16), AllocTensor(7, 6, 0, 0, (2, 2)),
        Less(8, 4, 5), If(8, 12, 16),
        ViewAt(9, 3, 4, 0, (2,)), CopyAt(7, 9, 4), AddImm(4, 4, 1), Goto(10),
        Less(10, 4, 5), If(10, 18, 19), Fail(0),
        LoadConst(11, 1), ViewShape(12, 7, 11), AllocShaped(13, 11, 0), ViewRows(14, 12, 9, 0),
        Ret((7,))))
    return write_ro(Executable((main, then, orelse), {"w": np.ones((2, 2), np.float32),
                                                      "s": np.array([4], np.int64)},
                               ("k_stub",)))


def _dims_seed() -> bytes:
    """main(x: float32 [n, 4], n in 1..8): ShapeOf binds n, AddDim n + 0, MulDim 4n, a tensor of
    runtime shape in a storage planned at the bound, a kernel called with its dims, a
    ViewDims of its result."""
    main = Function("main", (TensorType("x", "float32", ("n", 4)),),
                    (TensorType("y", "float32", ("n", 4)),), 8, (
        ShapeOf(1, 0, 0), AddDim(7, -2, 0), MulDim(2, -8, 4), AllocStorage(3, 128),
        AllocTensorDims(4, 3, 0, 0, (-2, 4)), InvokePackedDims(0, (0, 4), (-2,)),
        ViewDims(5, 4, 0, 0, (-3,)), ViewDims(6, 5, 0, 0, (-2, 4)), Ret((6,))))
    return write_ro(Executable((main,), {}, ("k_stub",), {"n": (1, 8)}))


def _sequence_seed() -> bytes:
    """main(x: float32 [2, 2], p: int64): sequences built, grown, read and cut
    (SeqConstruct, SeqInsert at p and at the end, SeqAt, SeqLength, SeqErase, SeqSplit),
    an empty optional and HasValue; returns a tensor, a sequence and none."""
    f32 = TensorType("x", "float32", (2, 2))
    main = Function("main", (f32, TensorType("p", "int64", ())),
                    (f32, TensorType("s", "float32", (), 1), TensorType("o", "float32", (2, 2), 2)),
                    14, (SeqConstruct(2, (0,)), SeqInsert(3, 2, 0, 1), SeqInsert(4, 3, 0, -1),
                         SeqAt(5, 4, 1), SeqLength(6, 4), SeqErase(7, 4, -1), SeqErase(8, 7, 1),
                         SeqSplit(9, 0, 1, 0, (1, 1)), NoneValue(10), HasValue(11, 10),
                         HasValue(12, 9), SeqInsert(13, 9, 5, -1), Ret((5, 13, 10))))
    return write_ro(Executable((main,), {}, ()))


def _aliasing_seed() -> bytes:
    """main(x: float32 [2, 2], p: int64): sequence instructions whose result register is
    also their source (r = SeqInsert(r, ...), r = SeqErase(r), r = SeqAt(r, p)): the old
    sequence goes only after what is read from it is copied (a use-after-free libFuzzer
    once found)."""
    f32 = TensorType("x", "float32", (2, 2))
    main = Function("main", (f32, TensorType("p", "int64", ())),
                    (f32, TensorType("s", "float32", (), 1)), 5, (
        SeqConstruct(2, (0, 0)), SeqInsert(2, 2, 0, -1), SeqErase(2, 2, -1),
        SeqConstruct(3, (0,)), SeqInsert(3, 3, 0, 1), SeqAt(3, 3, 1),
        SeqSplit(4, 3, 0, 1, (1, 1)), SeqAt(4, 4, 1), Ret((4, 2))))
    return write_ro(Executable((main,), {}, ()))


def _seeds() -> tuple[bytes, ...]:
    return _plan_seed(), _control_seed(), _dims_seed(), _sequence_seed(), _aliasing_seed()


def _restamp(ro: bytes) -> bytes:
    """The sha256 trailer made right again (what a mutation would break first)."""
    return ro[:-32] + hashlib.sha256(ro[:-32]).digest()


def _clang() -> str | None:
    clang = shutil.which("clang")
    if clang is None and os.environ.get("CI") == "true":
        pytest.fail("clang is required under CI=true (Debian package clang)")
    return clang


def test_python_reader_round_trips_the_seeds():
    for seed in _seeds():
        assert write_ro(read_ro(seed)) == seed


def test_c_reader_accepts_seeds_and_explains_bad_files(tmp_path):
    reader = tmp_path / "reader"
    subprocess.run(["cc", "-DFUZZ_MAIN", "-I", str(C_DIR), str(FUZZ_RO), "-o", str(reader),
                    "-ldl", "-lpthread"], check=True, capture_output=True)
    seed = _control_seed()
    opcode_at = seed.index(struct.pack("<HHI", 8, 0, 3))  # the If
    cases = {
        "plan": (_plan_seed(), "ok"), "control": (seed, "ok"), "dims": (_dims_seed(), "ok"),
        "sequence": (_sequence_seed(), "ok"), "aliasing": (_aliasing_seed(), "ok"),
        "truncated": (seed[:-1], "VM executable truncated or corrupted"),
        "foreign": (b"\x7fELF" + seed[4:], "not a pipeline VM executable"),
        "version": (seed[:8] + b"\x09" + seed[9:], "VM executable format version 9"),
        "opcode": (seed[:opcode_at] + b"\x63" + seed[opcode_at + 1:],
                   ".ro bytecode corrupted: function 'main', instruction 1 (opcode 99)"),
        "empty": (b"", "not a pipeline VM executable"),
    }
    for name, (data, _) in cases.items():
        (tmp_path / name).write_bytes(data)
    out = subprocess.run([str(reader), *(str(tmp_path / n) for n in cases)], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    for (name, (_, want)), got in zip(cases.items(), out, strict=True):
        assert got.startswith(want), (name, got)


def test_fuzz_ro_reader(tmp_path):
    """libFuzzer + ASan/UBSan over the C reader and interpreter for FUZZ_SECONDS."""
    clang = _clang()
    if clang is None:
        pytest.skip("clang not installed (Debian package clang)")
    fuzzer = tmp_path / "fuzz_ro"
    subprocess.run([clang, "-g", "-O1", "-fsanitize=fuzzer,address,undefined",
                    "-fno-sanitize-recover=undefined", "-I", str(C_DIR), str(FUZZ_RO),
                    "-o", str(fuzzer)], check=True, capture_output=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for k, seed in enumerate(_seeds()):
        (corpus / f"seed{k}").write_bytes(seed)
    proc = subprocess.run([str(fuzzer), f"-max_total_time={FUZZ_SECONDS}", "-timeout=10",
                           "-rss_limit_mb=2048", "-print_final_stats=1",
                           f"-artifact_prefix={tmp_path}/", str(corpus)],
                          capture_output=True, text=True, timeout=FUZZ_SECONDS + 120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = next(line for line in proc.stderr.splitlines()
                if "stat::number_of_executed_units" in line)
    assert int(runs.split(":")[-1]) > 1000


@st.composite
def _mutated(draw) -> bytes:
    """A seed with a few bytes changed or cut, its checksum made right again."""
    data = bytearray(draw(st.sampled_from(_seeds())))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(24, len(data) - 33))
        if draw(st.booleans()):
            data[at] = draw(st.integers(0, 255))
        elif len(data) >= at + 8:
            data[at:at + 8] = struct.pack("<q", draw(st.sampled_from(
                [-1, 0, 1, 2**31, 2**32 + 1, 2**62, -(2**63), 2**63 - 1])))
    return _restamp(bytes(data))


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(_mutated(), st.binary(max_size=100)))
def test_fuzz_python_ro_reader(data: bytes):
    try:
        read_ro(data, "fuzz.ro")
    except PipelineError as err:
        assert str(err).strip() and "\n" not in str(err)


def test_verify_names_the_bad_instruction():
    bad = Function("main", (), (), 1, (Goto(3),))
    with pytest.raises(FormatError, match=r"'main', instruction 0 \(Goto\): jump out"):
        Executable((bad,), {}, ()).verify()
