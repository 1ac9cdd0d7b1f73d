"""Thread count of the parallel kernels (they run their outer loop with libgomp).

A library whose kernels call GOMP_parallel is linked against libgomp, so its
handle also resolves `omp_set_num_threads`; the executor calls it before every
run with its own count. The default is $PIPELINE_NUM_THREADS, else every core
this process may run on.

Between parallel kernels libgomp's idle threads spin before they sleep; by default
for ~300000 pause instructions (tens of milliseconds), which on a machine shared
with other work takes the cores from the very threads the next kernel waits for,
and from anything else this process runs between inferences. The loader sets
$GOMP_SPINCOUNT (unless the user did) to a spin that still spans the gap between
two kernels of a graph but ends soon after a run.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

ENV_VAR = "PIPELINE_NUM_THREADS"
SPIN_VAR, SPIN_DEFAULT = "GOMP_SPINCOUNT", "10000"


def check_num_threads(n: Any, where: str) -> int:
    """`n` as a thread count >= 1; ValueError naming `where` otherwise."""
    try:
        value = int(n)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or isinstance(n, bool) or (isinstance(n, float) and n != value):
        raise ValueError(f"{where}: the thread count must be an integer >= 1, got {n!r}")
    return value


def default_num_threads() -> int:
    """$PIPELINE_NUM_THREADS if set, else the number of cores available to us."""
    text = os.environ.get(ENV_VAR, "").strip()
    if text:
        return check_num_threads(text if not text.isdigit() else int(text), ENV_VAR)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def thread_setter(lookup: Callable[[str], Any]) -> Callable[[int], None] | None:
    """The library's `omp_set_num_threads`, or None when it has no parallel kernels."""
    try:
        fn = lookup("omp_set_num_threads")
    except (AttributeError, KeyError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = None
    return fn


def limit_idle_spin() -> None:
    """Set $GOMP_SPINCOUNT unless set; effective when libgomp is loaded afterwards
    (libgomp reads it once, when the first library linked to it is loaded)."""
    os.environ.setdefault(SPIN_VAR, SPIN_DEFAULT)
