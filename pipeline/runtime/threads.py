"""Thread count of the parallel kernels.

Their outer loop runs on the library's own team (runtime/c/parallel.h), or on
libgomp's in a library of kernels without the executor; either way the count is
libgomp's: the C executor calls `omp_set_num_threads` before every run with the
executor's count, and each kernel caps it by its estimated work (dsl/vector.py).
The default is $PIPELINE_NUM_THREADS, else every core this process may run on.

Between parallel kernels libgomp's idle threads spin before they sleep; by default
for ~300000 pause instructions (tens of milliseconds), which on a machine shared
with other work takes the cores from the very threads the next kernel waits for,
and from anything else this process runs between inferences. The loader sets
$GOMP_SPINCOUNT (unless the user did) to a spin that still spans the gap between
two kernels of a graph but ends soon after a run.
"""

from __future__ import annotations

import os
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


def limit_idle_spin() -> None:
    """Set $GOMP_SPINCOUNT unless set; effective when libgomp is loaded afterwards
    (libgomp reads it once, when the first library linked to it is loaded)."""
    os.environ.setdefault(SPIN_VAR, SPIN_DEFAULT)
