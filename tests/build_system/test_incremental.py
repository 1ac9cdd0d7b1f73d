"""The incrementality properties the README lists (section "Rebuilds you can trust"),
one test each, through real doit.

Every test builds a small conv-net in a temporary folder with `doit -f
<repo>/dodo.py -d <tmp>` in a subprocess and reads which tasks executed from
the record our reporter writes (out/build-report.json), never from timings.
Then: the kernel cache (shared folder, corruption, clean, gc, two processes
at once), byte-identical rebuilds (-n 2, from clean), the explanations and
the progress lines.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest

from tests.support import REPO
from tests.support.build_outputs import artifact_bytes, hashes, kernel_tasks
from tests.support.checkouts import TARGET, matrix, tiny_checkout
from tests.support.doit_runner import doit, doit_process
from tests.support.onnx_models import tiny_convnet


def build(tmp: Path, *args: str, jobs: int = 1, repo: Path = REPO) -> set[str]:
    code, executed, out = doit(tmp, "-n", str(jobs), "build", "config=matrix.yaml", *args,
                               repo=repo)
    assert code == 0, out[-3000:]
    return executed


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return tiny_checkout(tmp_path)


# -- the eight properties -----------------------------------------------------

def test_1_noop_rebuild_runs_nothing(tiny: Path):
    assert "export:tiny@llvm" in build(tiny)
    assert build(tiny) == set()


def test_2_weight_change_rebuilds_params_devc_so_only(tiny: Path):
    build(tiny)
    tiny_convnet(tiny / "nets" / "tiny.onnx", seed=1)  # same layers, new weights
    executed = build(tiny)
    # import and optimize re-read the weights; kernels.json comes out identical,
    # so neither any kernel nor lib0.o is rebuilt.
    assert executed == {"import:tiny", "optimize:tiny@llvm", "devc:tiny@llvm",
                        "export:tiny@llvm"}


def test_3_layer_change_rebuilds_only_kernels_whose_hash_changed(tiny: Path):
    build(tiny)
    before = hashes(tiny, "tiny", "llvm")
    tiny_convnet(tiny / "nets" / "tiny.onnx", classes=5)  # the last layer's shape
    executed = build(tiny)
    after = hashes(tiny, "tiny", "llvm")
    changed = after - before
    assert 0 < len(changed) < len(after)  # the dense kernel only, not the convs
    assert kernel_tasks(executed) == changed


def test_4_pass_option_rebuilds_only_that_entry(tiny: Path):
    targets = f"a: {TARGET}\nb: {TARGET}\n"
    matrix(tiny, "tiny: {path: nets/tiny.onnx}\n", targets)
    build(tiny)
    before = hashes(tiny, "tiny", "a") | hashes(tiny, "tiny", "b")
    matrix(tiny, "tiny: {path: nets/tiny.onnx}\n",
           f"a: {TARGET}\n"
           'b: {target: "llvm -mcpu=native", opt_level: 3, config: {FuseOps.max_depth: 1}}\n')
    executed = build(tiny)
    assert not [name for name in executed if name.endswith("@a")], executed
    assert "optimize:tiny@b" in executed
    new = hashes(tiny, "tiny", "b") - before
    assert new and kernel_tasks(executed) == new  # only the kernels fusion changed
    assert hashes(tiny, "tiny", "b") & before  # the unaffected ones are reused


def test_5_added_target_compiles_only_its_kernels(tiny: Path):
    build(tiny)
    before = artifact_bytes(tiny)
    matrix(tiny, "tiny: {path: nets/tiny.onnx}\n",
           f"llvm: {TARGET}\n" 'hsw: {target: "llvm -mcpu=haswell", opt_level: 3}\n')
    executed = build(tiny)
    assert executed and all(n.endswith("@hsw") or n.startswith("kernel:") or n == "runtime:hsw"
                            for n in executed), executed
    assert kernel_tasks(executed) == hashes(tiny, "tiny", "hsw")
    assert artifact_bytes(tiny) == before


def test_6_models_sharing_kernels_compile_them_once(tmp_path: Path):
    tiny_convnet(tmp_path / "nets" / "a.onnx", seed=0)
    tiny_convnet(tmp_path / "nets" / "b.onnx", seed=1)
    matrix(tmp_path, "a: {path: nets/a.onnx}\nb: {path: nets/b.onnx}\n")
    executed = build(tmp_path)
    shared = hashes(tmp_path, "a", "llvm")
    assert shared == hashes(tmp_path, "b", "llvm")  # same layers, other weights
    assert kernel_tasks(executed) == shared  # each one compiled once


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A copy of the compiler whose sources a test may edit."""
    copy = tmp_path / "repo"
    copy.mkdir()
    for item in ("dodo.py", "pipeline", "models"):
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, copy / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, copy / item)
    return copy


def test_7_codegen_edit_rebuilds_kernels_validation_edit_does_not(tiny: Path,
                                                                   repo_copy: Path):
    code, _, out = doit(tiny, "validate", "config=matrix.yaml", repo=repo_copy)
    assert code == 0, out[-3000:]
    kernels = hashes(tiny, "tiny", "llvm")

    with open(repo_copy / "pipeline" / "tools" / "validate.py", "a") as f:
        f.write("\n_EDITED = True  # an edit to the validation code\n")
    code, executed, out = doit(tiny, "validate", "config=matrix.yaml", repo=repo_copy)
    assert code == 0, out[-3000:]
    assert executed == {"validate:tiny@llvm"}

    render = repo_copy / "pipeline" / "codegen" / "render.py"
    with open(render, "a") as f:
        f.write("\n# a comment in the code generator\n")
    code, executed, out = doit(tiny, "build", "config=matrix.yaml", repo=repo_copy)
    assert code == 0, out[-3000:]
    assert "optimize:tiny@llvm" in executed and not kernel_tasks(executed)  # same code

    with open(render, "a") as f:
        f.write("\n_EDITED = True  # an edit to the code generator\n")
    code, executed, out = doit(tiny, "build", "config=matrix.yaml", repo=repo_copy)
    assert code == 0, out[-3000:]
    # The generator's version is part of every kernel's hash: all are new.
    assert kernel_tasks(executed) == hashes(tiny, "tiny", "llvm")
    assert not kernels & hashes(tiny, "tiny", "llvm")


def test_8_parallel_build_same_bytes_and_reproducible(tmp_path: Path):
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    for d in (serial, parallel):
        tiny_convnet(d / "nets" / "tiny.onnx")
        matrix(d, "tiny: {path: nets/tiny.onnx}\n")
    build(serial)
    executed = build(parallel, jobs=2)
    assert len(kernel_tasks(executed)) >= 3
    first = artifact_bytes(serial)
    assert artifact_bytes(parallel) == first  # other folder, other process count

    shutil.rmtree(serial / "out")  # from clean, again: the same bytes
    build(serial)
    assert artifact_bytes(serial) == first


def test_model_file_rewritten_same_graph_and_weights_stops_at_import(tiny: Path):
    """Only the ONNX metadata changes: import runs, writes the same IR and weights,
    leaves them untouched (mtime too), and nothing after it runs."""
    build(tiny)
    path = tiny / "nets" / "tiny.onnx"
    model = onnx.load(str(path))
    model.producer_name = "another exporter"
    onnx.save(model, str(path))
    ir = tiny / "out" / "tiny" / "tiny.ir.json"
    mtime = ir.stat().st_mtime_ns
    assert build(tiny) == {"import:tiny"}
    assert ir.stat().st_mtime_ns == mtime


# -- source edits: what a change to the compiler rebuilds (see also test 7) ---------

def edit_function(path: Path, name: str, statement: str) -> None:
    """Insert `statement` before the last statement of the function `name` in `path`."""
    source = path.read_text()
    (fn,) = [n for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.FunctionDef) and n.name == name]
    last = fn.body[-1]
    lines = source.splitlines(keepends=True)
    lines.insert(last.lineno - 1, " " * last.col_offset + statement + "\n")
    path.write_text("".join(lines))


def kernel_ops(tmp: Path, model: str, target: str) -> dict[str, list[str]]:
    """Each kernel of the entry: hash -> its operators, read from its spec."""
    return {h: [o["op"] for o in json.loads(
        (tmp / "out" / "kernels" / f"{h}.json").read_text())["ops"]]
            for h in hashes(tmp, model, target)}


def test_converter_edit_reimports_and_recompiles_no_kernel(tiny: Path, repo_copy: Path):
    """The Conv converter of the conv2d ops two of tiny's kernels use."""
    build(tiny, repo=repo_copy)
    kernels = hashes(tiny, "tiny", "llvm")
    frontend = repo_copy / "pipeline" / "frontend" / "onnx"
    edit_function(frontend / "conv.py", "_conv", "assert ctx is not None  # a converter edit")
    edit_function(frontend / "elementwise.py", "_cast", "assert ctx is not None")
    executed = build(tiny, repo=repo_copy)
    # import runs the converters' modules; what it writes is unchanged.
    assert executed == {"import:tiny"}
    assert hashes(tiny, "tiny", "llvm") == kernels


def test_lowering_edit_recompiles_only_that_familys_kernels(tiny: Path, repo_copy: Path):
    from pipeline.kernels import lowering_of

    build(tiny, repo=repo_copy)
    before = kernel_ops(tiny, "tiny", "llvm")
    pooling = {h for h, ops in before.items() if any("pool" in op for op in ops)}
    assert pooling and len(pooling) < len(before)
    (op,) = {op for h in pooling for op in before[h] if "pool" in op}
    lower = lowering_of(op).lower  # where tiny's pooling lowering lives (kernels/pool*.py)
    edit_function(repo_copy / Path(*lower.__module__.split(".")).with_suffix(".py"),
                  lower.__name__, "assert kb is not None  # a lowering edit")
    executed = build(tiny, repo=repo_copy)
    after = kernel_ops(tiny, "tiny", "llvm")
    new = set(after) - set(before)
    assert sorted(after[h] for h in new) == sorted(before[h] for h in pooling)
    assert kernel_tasks(executed) == new
    assert set(after) - new == set(before) - pooling  # dense, conv, reshape: the same
    assert {"lib0:tiny@llvm", "devc:tiny@llvm", "export:tiny@llvm"} <= executed


def test_link_code_edit_relinks_without_compiling(tiny: Path, repo_copy: Path):
    build(tiny, repo=repo_copy)
    with open(repo_copy / "pipeline" / "link" / "cc.py", "a") as f:
        f.write("\n_EDITED = True  # an edit to the linker driver\n")
    executed = build(tiny, repo=repo_copy)
    # devc runs link/export.py, which imports cc.py: it may rerun too; runtime
    # compiles the C executor through cc.py: it reruns.
    assert {"lib0:tiny@llvm", "runtime:llvm", "export:tiny@llvm"} <= executed
    assert executed <= {"lib0:tiny@llvm", "devc:tiny@llvm", "runtime:llvm", "export:tiny@llvm"}

    # The stages module holds every stage (export's build id among them): all rerun,
    # but the kernels, whose code is elsewhere, stay.
    with open(repo_copy / "pipeline" / "tasks" / "stages.py", "a") as f:
        f.write("\n_EDITED = True  # an edit to the stages\n")
    executed = build(tiny, repo=repo_copy)
    assert {"lib0:tiny@llvm", "devc:tiny@llvm", "export:tiny@llvm"} <= executed
    assert not kernel_tasks(executed)

    # The C executor's source (no Python: listed by hand) recompiles the runtime;
    # a comment leaves executor.o's bytes (and so the library) as they were, code
    # relinks the library; nothing else runs.
    with open(repo_copy / "pipeline" / "runtime" / "c" / "executor.c", "a") as f:
        f.write("\n/* a comment */\n")
    assert build(tiny, repo=repo_copy) == {"runtime:llvm"}
    with open(repo_copy / "pipeline" / "runtime" / "c" / "executor.c", "a") as f:
        f.write("\nAPI int pl_edited(void) { return 1; }\n")
    assert build(tiny, repo=repo_copy) == {"runtime:llvm", "export:tiny@llvm"}


# -- the file checker ------------------------------------------------------------

def test_checker_hashes_an_input_once_and_trusts_artifact_mtimes(tmp_path, monkeypatch):
    from pipeline.tasks import checker

    hashed = []
    md5 = checker.get_file_md5
    monkeypatch.setattr(checker, "get_file_md5", lambda p: hashed.append(p) or md5(p))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    for name in ("model.onnx", os.path.join("out", "w.params")):
        Path(name).write_bytes(b"weights")
    c = checker.BuildChecker()
    model, params = (c.get_state(n, None) for n in ("model.onnx", os.path.join("out", "w.params")))
    assert params[2] is None and hashed == ["model.onnx"]  # artifacts are not hashed

    def touch(name: str):
        os.utime(name, (os.stat(name).st_mtime + 5,) * 2)
        return os.stat(name)

    # An input touched but unchanged: md5 decides, once for checking and saving.
    assert not c.check_modified("model.onnx", touch("model.onnx"), model)
    assert c.get_state("model.onnx", model)[2] == model[2]
    assert hashed == ["model.onnx"] * 2
    # An artifact with a new mtime was rewritten, so it changed: no hashing.
    assert c.check_modified("out/w.params", touch("out/w.params"), params)
    assert hashed == ["model.onnx"] * 2


# -- the kernel cache ----------------------------------------------------------

def test_shared_cache_two_processes_at_once(tmp_path: Path):
    shared = tmp_path / "cache"
    dirs = [tmp_path / "one", tmp_path / "two"]
    procs = []
    for d in dirs:
        tiny_convnet(d / "nets" / "tiny.onnx")
        matrix(d, "tiny: {path: nets/tiny.onnx}\n")
        procs.append(doit_process(d, "validate", "config=matrix.yaml",
                                  env={"PIPELINE_KERNEL_CACHE": str(shared)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out = p.communicate(timeout=600)[0]
        assert p.returncode == 0, out[-3000:]
    for d in dirs:
        assert json.loads((d / "out/tiny/llvm/validation.json").read_text())["passed"]
        assert not (d / "out" / "kernels").exists()  # nothing in the default place
    assert artifact_bytes(dirs[0]) == artifact_bytes(dirs[1])
    entries = {p.name for p in shared.iterdir() if p.is_file()}
    assert {p.name for p in shared.iterdir() if p.is_dir()} == {"ac", "cas"}  # action cache
    for h in hashes(dirs[0], "tiny", "llvm"):
        assert {f"{h}.json", f"{h}.o", f"{h}.ll", f"{h}.sha256"} <= entries
    assert all(name.endswith((".json", ".o", ".ll", ".sha256")) for name in entries), entries

    # A third checkout with the cache on the command line reuses every kernel.
    third = tmp_path / "three"
    tiny_convnet(third / "nets" / "tiny.onnx")
    matrix(third, "tiny: {path: nets/tiny.onnx}\n")
    before = {p.name: p.stat().st_mtime_ns for p in shared.iterdir() if p.suffix == ".ll"}
    code, executed, out = doit(third, "build", "config=matrix.yaml", f"cache={shared}")
    assert code == 0, out
    # Its own doit state is empty, so the kernel tasks run, but find valid entries.
    assert kernel_tasks(executed) == hashes(third, "tiny", "llvm")
    after = {p.name: p.stat().st_mtime_ns for p in shared.iterdir() if p.suffix == ".ll"}
    assert after == before  # nothing recompiled
    n = len(after)
    assert report(third)["entries"]["tiny@llvm"]["reused"] == n
    assert f"tiny@llvm: {n} kernels (0 compiled, {n} reused)" in out


def test_corrupted_cache_entry_is_rebuilt_not_linked(tiny: Path):
    build(tiny)
    victim = sorted(hashes(tiny, "tiny", "llvm"))[0]
    obj = tiny / "out" / "kernels" / f"{victim}.o"
    good = obj.read_bytes()
    obj.write_bytes(good[: len(good) // 2])  # truncated behind doit's back
    (tiny / "out" / "tiny" / "llvm" / "lib0.o").unlink()  # force a relink
    # The action cache would restore lib0.o without linking (a verified copy of
    # the good one); without it, lib0 must relink and must not take the bad object.
    shutil.rmtree(tiny / "out" / "kernels" / "ac")
    executed = build(tiny)
    assert "lib0:tiny@llvm" in executed
    assert obj.read_bytes() == good  # recompiled from its spec, not linked as found
    code, _, out = doit(tiny, "validate", "config=matrix.yaml")
    assert code == 0, out[-3000:]


def test_clean_of_one_entry_keeps_what_another_needs(tmp_path: Path):
    tiny_convnet(tmp_path / "nets" / "a.onnx", seed=0)
    tiny_convnet(tmp_path / "nets" / "b.onnx", seed=1)
    matrix(tmp_path, "a: {path: nets/a.onnx}\nb: {path: nets/b.onnx}\n")
    build(tmp_path)
    code, _, out = doit(tmp_path, "clean", "config=matrix.yaml", "optimize:a@llvm",
                        "lib0:a@llvm", "devc:a@llvm", "export:a@llvm")
    assert code == 0, out
    assert not (tmp_path / "out" / "a" / "llvm" / "a.so").exists()
    for h in hashes(tmp_path, "b", "llvm"):
        assert (tmp_path / "out" / "kernels" / f"{h}.o").exists()
    assert build(tmp_path, "model=b") == set()
    code, executed, out = doit(tmp_path, "validate", "config=matrix.yaml", "model=b")
    assert code == 0 and executed == {"validate:b@llvm"}, out[-3000:]
    assert kernel_tasks(build(tmp_path, "model=a")) == set()  # a's kernels are cached


def test_gc_removes_only_unused_entries(tiny: Path):
    build(tiny)
    old = hashes(tiny, "tiny", "llvm")
    tiny_convnet(tiny / "nets" / "tiny.onnx", classes=5)
    build(tiny)
    stale = old - hashes(tiny, "tiny", "llvm")
    assert stale
    code, _, out = doit(tiny, "gc", "config=matrix.yaml")
    assert code == 0 and f"removed {len(stale)} unused kernels" in out, out
    left = {p.stem for p in (tiny / "out" / "kernels").iterdir() if p.is_file()}
    assert left == hashes(tiny, "tiny", "llvm")
    assert {p.stem for p in (tiny / "out" / "specs").iterdir()} == left
    # The action cache keeps one entry per task of the current build, and only the
    # blobs they name: the first build's library is gone, the second's is there.
    cache = tiny / "out" / "kernels"
    manifests = [json.loads(p.read_text()) for p in (cache / "ac").iterdir()]
    # import, optimize, lib0, devc, runtime, export and one per kernel
    assert len(manifests) == 6 + len(left)
    named = {o["sha256"] for m in manifests for o in m["outputs"].values()}
    assert {p.name for p in (cache / "cas").iterdir()} == named
    assert build(tiny) == set()
    # What gc kept is complete: a fresh out/ restores everything from it.
    shutil.rmtree(tiny / "out" / "tiny")
    (tiny / "out" / ".doit.db").unlink()
    code, _, out = doit(tiny, "build", "config=matrix.yaml")
    assert code == 0 and "computed" not in report(tiny)["how"], out[-3000:]


# -- explanations and progress -------------------------------------------------

def report(tmp: Path) -> dict:
    return json.loads((tmp / "out" / "build-report.json").read_text())


def why(tmp: Path, task: str) -> str:
    return " | ".join(next(i["why"] for i in report(tmp)["executed"] if i["task"] == task))


def test_explain_names_the_cause_and_counts_kernels(tiny: Path):
    build(tiny)
    tiny_convnet(tiny / "nets" / "tiny.onnx", seed=1)
    build(tiny)
    assert "model file changed: nets/tiny.onnx" in why(tiny, "import:tiny")
    assert "weights changed" in why(tiny, "optimize:tiny@llvm")
    n = len(hashes(tiny, "tiny", "llvm"))
    assert report(tiny)["entries"]["tiny@llvm"] == {
        "kernels": n, "compiled": 0, "reused": n,
        "seconds": report(tiny)["entries"]["tiny@llvm"]["seconds"]}

    matrix(tiny, "tiny: {path: nets/tiny.onnx}\n",
           'llvm: {target: "llvm -mcpu=native", opt_level: 3, '
           "config: {FuseOps.max_depth: 1}}\n")
    code, _, out = doit(tiny, "build", "config=matrix.yaml")
    assert code == 0
    assert "pass option config" in why(tiny, "optimize:tiny@llvm")
    assert "FuseOps.max_depth" in why(tiny, "optimize:tiny@llvm")
    summary = [ln for ln in out.splitlines() if ln.startswith("tiny@llvm: ")]
    assert len(summary) == 1 and "compiled" in summary[0] and "reused" in summary[0]

    code, _, out = doit(tiny, "explain", "config=matrix.yaml")
    assert code == 0 and "because pass option config" in out, out


def test_progress_quiet_lines_and_growing_total(tiny: Path):
    code, executed, out = doit(tiny, "build", "config=matrix.yaml")
    lines = [ln for ln in out.splitlines() if ln.startswith("[")]
    assert len(lines) == len(executed)  # one quiet line per task run, no live line
    totals = [int(ln[1:ln.index("]")].split("/")[1]) for ln in lines]
    assert totals == sorted(totals) and totals[-1] > totals[0]  # kernels appeared
    assert totals[-1] == len(executed)
    assert "\r" not in out
