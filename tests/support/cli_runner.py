"""`pipeline ARGS` in a subprocess, as a user runs the command (the CLI tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO


def pipeline(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`pipeline ARGS` as a subprocess (python -m of the console script's module), with
    PYTHONPATH=REPO and no PIPELINE_KERNEL_CACHE, then `env` on top."""
    full_env = {k: v for k, v in os.environ.items() if k != "PIPELINE_KERNEL_CACHE"}
    full_env.update({"PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.run([sys.executable, "-m", "pipeline.tools.cli", *args], cwd=cwd,
                          capture_output=True, text=True, env=full_env, timeout=600)
