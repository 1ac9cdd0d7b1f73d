"""Servers on 127.0.0.1 for the cache benchmark and tests: nginx with a WebDAV PUT
location (the Bazel HTTP remote-cache protocol's simplest server), started as a
subprocess (`nginx -p <tmp> -c <tmp>/nginx.conf`, `daemon off;`) and killed on exit."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {seconds} s")


NGINX_CONF = """daemon off;
{user}pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size 0;
    location / {{
      root {tmp}/data;
      {dav}
    }}
  }}
}}
"""


@contextlib.contextmanager
def nginx(tmp: Path, writable: bool = True) -> Iterator[tuple[str, Path]]:
    """(base URL, the folder it serves) of an nginx on a free port; `writable`
    False leaves PUT out (the server refuses uploads with 405)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "data").mkdir(exist_ok=True)
    port = free_port()
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers write as the owner
    dav = "dav_methods PUT; create_full_put_path on; dav_access user:rw all:r;" if writable \
        else ""
    (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, port=port, user=user, dav=dav))
    proc = subprocess.Popen(["nginx", "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/cache", tmp / "data" / "cache"
    finally:
        # SIGTERM: the master stops its workers (SIGKILL would leave them serving).
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def dask_cluster(tmp: Path, repo: Path, workers: int = 2, worker_path: str = ""
                 ) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """(scheduler address, worker processes) of `dask scheduler` + `dask worker`s on
    127.0.0.1, the workers importing this checkout (PYTHONPATH, after worker_path)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(repo)}
    worker_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [worker_path, str(repo)]))}
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
         str(port), "--no-dashboard"], cwd=tmp, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [scheduler]
    try:
        wait_for_port(port, scheduler)
        address = f"tcp://127.0.0.1:{port}"
        for _ in range(workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads",
                 "1", "--no-dashboard", "--host", "127.0.0.1"],
                cwd=tmp, env=worker_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for_workers(address, workers)
        yield address, procs[1:]
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def _wait_for_workers(address: str, n: int, seconds: float = 60.0) -> None:
    from distributed import Client

    with Client(address, timeout=20) as c:
        c.wait_for_workers(n, timeout=seconds)
