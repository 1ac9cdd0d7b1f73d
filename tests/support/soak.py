"""Many threads running one library, each with its own executor, in a process of
their own (so the RSS it reports is theirs, not a long test session's):

    python -m tests.support.soak LIB INPUTS.npz EXPECTED.npz SECONDS

INPUTS.npz holds one input `x` per thread (arr_0, arr_1, ...), EXPECTED.npz its
output. Prints one JSON line: runs per thread, the first errors (a wrong output or
an exception) and the RSS after warm-up and at the end. Also this process's memory
figures the memory tests read (rss_bytes, anon_bytes, mapped_bytes), in their own
processes too (tests/runtime/test_load.py)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from pipeline.runtime import GraphModule, load_module


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def anon_bytes() -> int:
    """This process's resident anonymous memory (/proc/self/status RssAnon)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                if x.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def mapped_bytes(path: Path) -> int:
    """Resident bytes of this process's mappings of the file at `path` (/proc smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef":  # a mapping's header line
            inside = line.split()[-1] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def soak(lib_path: str, inputs: list, expected: list, seconds: float) -> dict:
    """Run the library from len(inputs) threads for `seconds`; see the module docstring."""
    module = load_module(lib_path)
    n = len(inputs)
    stop, warm = threading.Event(), threading.Barrier(n + 1)
    runs, errors = [0] * n, []

    def worker(k: int) -> None:
        try:
            m = GraphModule(module["default"]())  # every thread its own executor
            m.set_input("x", inputs[k])
            m.run()
            warm.wait()
            while not stop.is_set():
                m.run()
                got = m.get_output(0)
                if not np.array_equal(got, expected[k]):
                    errors.append(f"thread {k}, run {runs[k]}: {got} != {expected[k]}")
                    return
                runs[k] += 1
        except Exception as err:  # noqa: BLE001 - reported to the caller
            errors.append(f"thread {k}: {err!r}")
            warm.abort()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    try:
        warm.wait()
    except threading.BrokenBarrierError:
        pass
    time.sleep(min(2.0, seconds / 5))  # warm-up: allocator pools, thread teams
    rss_warm = rss_bytes()
    time.sleep(seconds - min(2.0, seconds / 5))
    rss_end = rss_bytes()
    stop.set()
    for t in threads:
        t.join()
    return {"runs": runs, "errors": errors[:3], "rss_warm": rss_warm, "rss_end": rss_end}


if __name__ == "__main__":
    lib, inputs, expected, seconds = sys.argv[1:5]
    with np.load(inputs) as xs, np.load(expected) as ys:
        xs, ys = [xs[k] for k in sorted(xs, key=lambda k: int(k[4:]))], \
            [ys[k] for k in sorted(ys, key=lambda k: int(k[4:]))]
    print(json.dumps(soak(lib, xs, ys, float(seconds))))
