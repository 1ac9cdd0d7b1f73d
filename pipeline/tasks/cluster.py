"""Kernel compiles on a Dask `distributed` cluster: `doit build dask=tcp://HOST:8786`.

A kernel compile is a pure function from its spec (JSON text) to (LLVM IR,
object bytes, notes): pipeline.tasks.compile_job.compile_spec. doit still
orchestrates: when the kernel tasks are created, every kernel not yet in the
cache is submitted at once (`prefetch`), so the cluster compiles them in
parallel while doit's serial runner walks the tasks; each kernel task then
waits for its own result (`compile_remotely`) and writes it into the cache
like a local compile. Tasks are keyed by the kernel's hash, so a resubmission
(a `doit -n` worker's own client, a rerun) joins the running compile.

A worker that dies mid-compile is Dask's to handle: the scheduler reruns its
tasks on the other workers; only when no worker is left or a task kills
workers repeatedly does a kernel task fail, with one line naming the kernel
and the scheduler. Results are checked by the cache's checksum like any object.
The workers need this package importable (the same checkout on PYTHONPATH or
the same version installed).
"""

from __future__ import annotations

import hashlib
import json
import os

from pipeline.errors import PipelineError
from pipeline.tasks.compile_job import compile_spec

CONNECT_TIMEOUT = 10.0   # seconds to reach the scheduler
RESULT_TIMEOUT = 600.0   # seconds for one kernel's compile, queueing included

_CLIENTS: dict[tuple[str, int], object] = {}


class ClusterError(PipelineError):
    """The scheduler is unreachable or a compile failed on the cluster."""


def client(address: str):
    """This process's Client for `address` (a forked `doit -n` worker makes its own)."""
    ident = (address, os.getpid())
    if ident not in _CLIENTS:
        try:
            from distributed import Client
        except ImportError:
            raise ClusterError("dask=: the `distributed` package is missing; "
                               "pip install -e .[cluster]") from None
        try:
            _CLIENTS[ident] = Client(address, timeout=CONNECT_TIMEOUT,
                                     set_as_default=False)
        except (OSError, TimeoutError) as err:
            raise ClusterError(f"dask={address}: cannot reach the scheduler "
                               f"({type(err).__name__}: {err})") from None
    return _CLIENTS[ident]


def _key(spec_json: str) -> str:
    """The task's key on the scheduler: the same spec text, the same compile."""
    return f"pipeline-kernel-{hashlib.sha256(spec_json.encode()).hexdigest()[:32]}"


def prefetch(address: str, specs: list[str]) -> None:
    """Submit the compiles of `specs` (JSON texts) so the cluster starts on all of them.
    An unreachable scheduler is left for the kernel tasks to report (one line each
    task that needs it), not raised while doit creates the tasks."""
    try:
        c = client(address)
    except ClusterError:
        return
    futures = [c.submit(compile_spec, s, key=_key(s), pure=False) for s in specs]
    _PENDING.update({f.key: f for f in futures})


_PENDING: dict[str, object] = {}


def compile_remotely(address: str, spec_json: str) -> tuple[str, bytes, list[str]]:
    """compile_spec(spec_json), run on the cluster; ClusterError in one line."""
    key = _key(spec_json)
    future = _PENDING.pop(key, None) if os.getpid() == _OWNER else None
    try:
        if future is None:
            future = client(address).submit(compile_spec, spec_json, key=key, pure=False)
        return future.result(timeout=RESULT_TIMEOUT)
    except PipelineError:
        raise
    except Exception as err:  # noqa: BLE001 - KilledWorker, CommClosedError, a compile error
        first = str(err).splitlines()[0] if str(err) else ""
        raise ClusterError(f"kernel {_symbol(spec_json)}: compile on the cluster "
                           f"{address} failed: {type(err).__name__}: {first}") from None


def _symbol(spec_json: str) -> str:
    try:
        return "_".join(n["op"] for n in json.loads(spec_json)["ops"])
    except (ValueError, KeyError, TypeError):
        return "?"


_OWNER = os.getpid()  # futures in _PENDING belong to the process that imported us
