"""`python -m doit -f <repo>/dodo.py -d <folder> ...` in a subprocess, exactly as a
user runs it. Which tasks executed is read from the build report our doit
reporter records (out/build-report.json), never from timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO


def doit_process(folder: Path, *args: str, repo: Path = REPO, env: dict | None = None,
                 dodo: Path | None = None, **popen_kwargs) -> subprocess.Popen:
    """Start doit of `repo` on `folder` with `args`; returns the running process.
    `dodo`: another dodo file than the repo's (a test's wrapper of it).

    The child sees this environment with PYTHONPATH=repo and no
    PIPELINE_KERNEL_CACHE (each test decides where its cache is), then `env`
    applied on top (a None value removes that variable). `popen_kwargs` go to
    subprocess.Popen (stdout, stderr, text, ...)."""
    child_env = {**os.environ, "PYTHONPATH": str(repo)}
    child_env.pop("PIPELINE_KERNEL_CACHE", None)
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    return subprocess.Popen([sys.executable, "-m", "doit", "-f", str(dodo or repo / "dodo.py"),
                             "-d", str(folder), *args], env=child_env, **popen_kwargs)


def doit(folder: Path, *args: str, repo: Path = REPO, env: dict | None = None,
         dodo: Path | None = None, timeout: float = 1800) -> tuple[int, set[str], str]:
    """Run doit on `folder` to the end (doit_process); returns (exit code, executed
    task names, stdout followed by stderr)."""
    report = folder / "out" / "build-report.json"
    stamp = report.stat().st_mtime_ns if report.exists() else None
    with doit_process(folder, *args, repo=repo, env=env, dodo=dodo, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # as subprocess.run does: no process outlives its test
            raise
    executed = set()  # runs that write no report (errors, explain) executed nothing
    if report.exists() and report.stat().st_mtime_ns != stamp:
        executed = {i["task"] for i in json.loads(report.read_text())["executed"]}
    return proc.returncode, executed, stdout + stderr
