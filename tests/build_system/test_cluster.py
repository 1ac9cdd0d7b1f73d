"""Kernel compiles on a real Dask cluster (issue 15, point 4): `dask scheduler` and
two `dask worker` processes on 127.0.0.1, started by the test."""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

from tests.support import REPO
from tests.support.build_outputs import artifact_bytes, build_report, how
from tests.support.checkouts import tiny_checkout
from tests.support.doit_runner import doit
from tests.support.servers import dask_cluster


def test_cluster_build_is_byte_identical_to_local(tmp_path: Path):
    local = tiny_checkout(tmp_path / "local")
    code, _, out = doit(local, "build", "config=matrix.yaml")
    assert code == 0, out[-3000:]
    remote, parallel = tiny_checkout(tmp_path / "remote"), tiny_checkout(tmp_path / "n2")
    with dask_cluster(tmp_path, REPO) as (address, _):
        code, executed, out = doit(remote, "build", "config=matrix.yaml", f"dask={address}")
        assert code == 0, out[-3000:]
        # doit -n 2: each forked worker talks to the scheduler through its own client.
        code2, _, out2 = doit(parallel, "-n", "2", "build", "config=matrix.yaml",
                              f"dask={address}")
        assert code2 == 0, out2[-3000:]
    for folder in (remote, parallel):
        kernels = {t: h for t, h in how(build_report(folder)).items()
                   if t.startswith("kernel:")}
        assert kernels and set(kernels.values()) == {"computed on the cluster"}, kernels
        assert artifact_bytes(folder) == artifact_bytes(local)
    assert "computed on the cluster" in out
    code, _, out = doit(remote, "validate", "config=matrix.yaml")
    assert code == 0, out[-3000:]


def test_killing_a_worker_mid_build_ends_correct_or_one_error(tmp_path: Path):
    local = tiny_checkout(tmp_path / "local")
    assert doit(local, "build", "config=matrix.yaml", "actions=0")[0] == 0
    slow = tmp_path / "slow"  # each compile takes a second on the workers
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(textwrap.dedent("""
        import time
        import pipeline.tasks.compile_job as compile_job
        _compile = compile_job.compile_spec
        def compile_spec(spec):
            time.sleep(1.0)
            return _compile(spec)
        compile_job.compile_spec = compile_spec
        """))
    folder = tiny_checkout(tmp_path / "w")
    with dask_cluster(tmp_path, REPO, worker_path=str(slow)) as (address, workers):
        killer = threading.Timer(2.0, workers[0].kill)  # while kernels are compiling
        killer.start()
        start = time.monotonic()
        code, _, out = doit(folder, "build", "config=matrix.yaml", f"dask={address}")
        killer.join()
    assert time.monotonic() - start > 2.0  # the kill happened during the build
    assert not list((folder / "out").rglob("*.tmp")), "a half-written file was left"
    if code == 0:
        assert artifact_bytes(folder) == artifact_bytes(local)
    else:
        lines = [ln for ln in out.splitlines() if "compile on the cluster" in ln]
        assert len(lines) == 1 and "Traceback" not in out, out[-3000:]
