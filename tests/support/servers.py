"""Real servers the cache tests start on 127.0.0.1: nginx (a WebDAV PUT location,
the Bazel HTTP cache protocol's simplest server), a server that never answers,
and a Dask scheduler with workers. Each is a subprocess killed at teardown."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from pipeline.tools import servers
from tests.support.toolchains import require_tools


@contextlib.contextmanager
def nginx(tmp: Path, writable: bool = True) -> Iterator[tuple[str, Path]]:
    """pipeline.tools.servers.nginx; skipped (failed under CI=true) without nginx."""
    require_tools("nginx")
    with servers.nginx(tmp, writable) as found:
        yield found


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A base URL whose server accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held, stop = [], threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(sock.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/cache"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


@contextlib.contextmanager
def dask_cluster(tmp: Path, repo: Path, workers: int = 2, worker_path: str = ""
                 ) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """pipeline.tools.servers.dask_cluster; skipped (failed under CI=true) without
    the `distributed` package."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        import pytest

        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but the `distributed` package is missing (.[cluster])")
        pytest.skip("missing: the `distributed` package (pip install -e .[cluster])")
    with servers.dask_cluster(tmp, repo, workers, worker_path) as found:
        yield found
