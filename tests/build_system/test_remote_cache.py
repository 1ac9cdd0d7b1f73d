"""The action cache's remote tier against a real nginx (issue 15, points 1-3, 6).

A "fresh clone" is a new folder with the same model and config and no out/;
the local tier is its own out/kernels. Which tasks ran, and how each got its
outputs, come from the build report; bytes are compared with a build that
used no cache at all.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.build_outputs import artifact_bytes, build_report, how
from tests.support.checkouts import tiny_checkout
from tests.support.doit_runner import doit
from tests.support.onnx_models import tiny_convnet
from tests.support.servers import nginx, silent_server

SO = "out/tiny/llvm/tiny.so"
INTERMEDIATES = ("lib0.o", "devc.o", "tiny.params")


def checkout(folder: Path, cache_url: str | None = None) -> Path:
    # the remote tier from the config rather than the command line
    return tiny_checkout(folder, extra=f"cache: {{url: \"{cache_url}\", timeout: 5}}\n"
                         if cache_url else "")


def run(folder: Path, *args: str, command: str = "build") -> tuple[dict, str]:
    code, _, out = doit(folder, command, "config=matrix.yaml", *args)
    assert code == 0 and "Traceback" not in out, out[-3000:]
    return build_report(folder), out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, bytes]:
    """The artifacts of a build without any action cache."""
    folder = checkout(tmp_path_factory.mktemp("ref"))
    run(folder, "actions=0")
    return artifact_bytes(folder)


def test_fresh_clone_with_remote_cache_runs_no_stage(tmp_path: Path, reference):
    with nginx(tmp_path / "nginx") as (url, served):
        first, _ = run(checkout(tmp_path / "one", url))
        assert set(how(first).values()) == {"computed"}
        assert (served / "ac").is_dir() and (served / "cas").is_dir()  # uploaded
        clone = checkout(tmp_path / "two", url)
        second, out = run(clone, command="validate")
        ran = how(second)
        assert {t for t, h in ran.items() if h != "restored from cache (remote)"} == \
            {"validate:tiny@llvm"}, ran
        assert any(t.startswith("kernel:") for t in ran)
        assert "restored from cache (remote)" in out
        assert json.loads((clone / "out/tiny/llvm/validation.json").read_text())["passed"]
        # Without the bytes: the library came down, the intermediates stayed on the
        # server (downloads=minimal, the default).
        assert (clone / SO).read_bytes() == reference["tiny.so"]
        assert not any((clone / "out/tiny/llvm" / n).exists() for n in INTERMEDIATES)
        assert run(clone)[0]["executed"] == []  # and doit knows they exist
        # A passed validation is cached too: the next clone validates nothing.
        other = checkout(tmp_path / "three", url)
        validated, _ = run(other, command="validate")
        assert set(how(validated).values()) == {"restored from cache (remote)"}
        assert json.loads((other / "out/tiny/llvm/validation.json").read_text())["passed"]
        # downloads=all brings them down: the same bytes as a build without a cache.
        fetched, _ = run(clone, "downloads=all")
        assert "computed" not in how(fetched).values() and how(fetched), how(fetched)
        assert artifact_bytes(clone) == reference
    # The remote hits filled the local tier: a third build in a fresh out/ is local.
    (clone / "out" / "tiny").rename(clone / "old")
    (clone / "out" / ".doit.db").unlink()
    third, _ = run(clone)  # nginx is gone now
    assert set(how(third).values()) == {"restored from cache (local)"}


def test_a_stage_that_must_run_fetches_the_inputs_hits_left_on_the_server(tmp_path: Path):
    with nginx(tmp_path / "nginx") as (url, _):
        run(checkout(tmp_path / "one", url))
        clone = checkout(tmp_path / "two", url)
        run(clone)
        tiny_convnet(clone / "nets" / "tiny.onnx", seed=1)  # new weights, same layers
        report, _ = run(clone, command="validate")
    assert {t for t, h in how(report).items() if h == "computed"} == {
        "import:tiny", "optimize:tiny@llvm", "devc:tiny@llvm", "export:tiny@llvm",
        "validate:tiny@llvm"}, how(report)
    # export linked lib0.o and executor.o, which the first build left on the server
    assert (clone / "out/tiny/llvm/lib0.o").exists()
    assert (clone / "out/runtime/llvm/executor.o").exists()
    assert json.loads((clone / "out/tiny/llvm/validation.json").read_text())["passed"]


def test_intermediates_gone_from_every_tier_are_recomputed(tmp_path: Path, reference):
    """A stage that must run needs inputs a hit left on the server: fetched, or,
    with the server gone and the local tier emptied, recomputed from their
    producers (import, optimize, kernels, lib0, devc), never a failure."""
    with nginx(tmp_path / "nginx") as (url, _):
        run(checkout(tmp_path / "one", url))
        clone = checkout(tmp_path / "two", url)
        run(clone)
    assert not (clone / "out/tiny/llvm/lib0.o").exists()
    shutil.rmtree(clone / "out" / "kernels")
    (clone / SO).unlink()
    report, out = run(clone)
    assert how(report) == {"export:tiny@llvm": "computed"}, how(report)
    assert "warning: remote cache" in out
    assert (clone / SO).read_bytes() == reference["tiny.so"]
    assert artifact_bytes(clone) == reference  # remade on the way


def test_server_down_is_one_warning_and_a_local_build(tmp_path: Path, reference):
    from pipeline.tools.servers import free_port

    folder = checkout(tmp_path / "w")
    report, out = run(folder, f"cache_url=http://127.0.0.1:{free_port()}/c")
    warnings = [ln for ln in out.splitlines() if "warning: remote cache" in ln]
    assert len(warnings) == 1 and "building locally" in warnings[0], out
    assert set(how(report).values()) == {"computed"}
    assert artifact_bytes(folder) == reference


def test_slow_server_is_bounded_by_the_timeout(tmp_path: Path, reference):
    folder = checkout(tmp_path / "w")
    with silent_server() as url:
        start = time.monotonic()
        report, out = run(folder, f"cache_url={url}", "cache_timeout=1")
        took = time.monotonic() - start
    assert len([ln for ln in out.splitlines() if "warning: remote cache" in ln]) == 1, out
    assert "timed out" in out
    assert took < 30  # one timeout, then the tier is off: not one per request
    assert artifact_bytes(folder) == reference


def test_corrupted_remote_blob_is_a_reported_miss(tmp_path: Path, reference):
    with nginx(tmp_path / "nginx") as (url, served):
        run(checkout(tmp_path / "one"), f"cache_url={url}")
        so = (tmp_path / "one" / "out/tiny/llvm/tiny.so").read_bytes()
        import hashlib

        blob = served / "cas" / hashlib.sha256(so).hexdigest()
        blob.write_bytes(so[: len(so) // 2])  # truncated on the server
        clone = checkout(tmp_path / "two")
        report, out = run(clone, f"cache_url={url}", "downloads=all")
    assert "is corrupted" in out, out
    assert how(report)["export:tiny@llvm"] == "computed"  # recomputed, never linked
    assert artifact_bytes(clone) == reference


def test_read_only_and_refusing_servers_upload_nothing(tmp_path: Path, reference):
    with nginx(tmp_path / "ro") as (url, served):
        folder = checkout(tmp_path / "one")
        _, out = run(folder, f"cache_url={url}", "cache_upload=0")
        assert not served.exists() and "warning" not in out
    with nginx(tmp_path / "refusing", writable=False) as (url, served):
        folder = checkout(tmp_path / "two")
        _, out = run(folder, f"cache_url={url}")
        assert not served.exists()
        warnings = [ln for ln in out.splitlines() if "refused an upload" in ln]
        assert len(warnings) == 1 and "HTTP 405" in warnings[0], out
    assert artifact_bytes(folder) == reference


def test_two_runners_write_the_same_keys_at_once(tmp_path: Path, reference):
    with nginx(tmp_path / "nginx") as (url, served):
        folders = [checkout(tmp_path / n) for n in ("one", "two")]
        with ThreadPoolExecutor(2) as pool:  # two doit processes at once
            results = list(pool.map(lambda d: doit(d, "build", "config=matrix.yaml",
                                                   f"cache_url={url}", "downloads=all"),
                                    folders))
        for code, _, out in results:
            assert code == 0 and "warning" not in out, out[-3000:]
        clone = checkout(tmp_path / "three")
        report, _ = run(clone, f"cache_url={url}", "downloads=all")
    for d in (*folders, clone):
        assert artifact_bytes(d) == reference
    assert set(how(report).values()) == {"restored from cache (remote)"}
