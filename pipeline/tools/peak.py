"""The host's measured fp32 multiply-add peak, the 100% of `doit bench`'s "% of peak",
and its core-to-core latency, which says how much two threads can gain.

A tiny C loop (compiled by the host cc with -march=native) keeps twelve independent
vector accumulators busy with a*x+b: enough chains to cover the FMA latency of
two FMA ports, all in registers, no memory traffic. `threads` Python threads run it
at once (ctypes releases the GIL during the call); the best of a few repetitions
counts, since a shared machine only ever makes the loop slower. For the same
reason best_peak_gflops keeps the best ever seen on this CPU in a small JSON file:
a peak measured while other work held a core would inflate every "% of peak".

The core-to-core round trip (core_to_core_ns) is two threads, pinned to two CPUs,
passing a counter on one cache line back and forth. On the 2-vCPU VMs we bench on it
changes from minute to minute, about 90-130 ns in one state and about 400 ns in the
other (the vCPUs on two chiplets); in the slow state a small kernel reading what the
other core wrote gets several times slower, for onnxruntime as for us, so `doit
bench` records it beside every multi-thread figure.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import platform
import shlex
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from pipeline.files import atomic_write
from pipeline.link.cc import host_cc

CHAINS = 12
_SOURCE = f"""
#ifdef __AVX512F__
#define W 16
#else
#define W 8
#endif
typedef float vf __attribute__((vector_size(W * 4)));
int fma_width(void) {{ return W; }}
/* {CHAINS} chains of acc = acc * a + b, `iters` times; a and b arrive as arguments so
   the compiler cannot fold the loop. Returns a sum so the work is not dead. */
float fma_loop(long iters, float a, float b) {{
    vf acc[{CHAINS}], va, vb;
    for (int i = 0; i < W; i++) {{ va[i] = a; vb[i] = b; }}
    for (int j = 0; j < {CHAINS}; j++) for (int i = 0; i < W; i++) acc[j][i] = j + i;
    for (long n = 0; n < iters; n++)
        for (int j = 0; j < {CHAINS}; j++) acc[j] = acc[j] * va + vb;
    float s = 0;
    for (int j = 0; j < {CHAINS}; j++) for (int i = 0; i < W; i++) s += acc[j][i];
    return s;
}}
"""

# The ping-pong of core_to_core_ns: the ball is odd when thread A served it, even when
# B returned it; each thread waits for its turn spinning on the one cache line.
_PING_PONG = """
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

static _Atomic long ball __attribute__((aligned(64)));
struct player { int cpu; long rounds, first; double seconds; };

static void *play(void *arg) {
    struct player *p = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(p->cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < p->rounds; i++) {
        long mine = 2 * i + p->first, seen;
        while ((seen = atomic_load_explicit(&ball, memory_order_acquire)) != mine - 1)
            if (seen < 0) return 0; /* the other player never started */
        atomic_store_explicit(&ball, mine, memory_order_release);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    p->seconds = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    return 0;
}

/* Seconds per round trip between CPUs a and b; negative if a thread failed to start. */
double ping_pong(int a, int b, long rounds) {
    struct player pa = {a, rounds, 1, 0}, pb = {b, rounds, 2, 0};
    pthread_t ta, tb;
    atomic_store(&ball, 0);
    if (pthread_create(&tb, 0, play, &pb)) return -1;
    if (pthread_create(&ta, 0, play, &pa)) {
        atomic_store(&ball, -1);
        pthread_join(tb, 0);
        return -1;
    }
    pthread_join(ta, 0);
    pthread_join(tb, 0);
    return pa.seconds / (double)rounds;
}
"""


@functools.cache  # compiled once per process: bench measures per model and thread count
def _load_loop() -> ctypes.CDLL:
    tmp = tempfile.TemporaryDirectory(prefix="pipeline-peak-")  # removed at exit
    folder = Path(tmp.name)
    src, lib = folder / "fma.c", folder / "fma.so"
    src.write_text(_SOURCE + _PING_PONG)
    subprocess.run([*shlex.split(host_cc()), "-O3", "-march=native", "-ffp-contract=fast",
                    "-pthread", "-shared", "-fPIC", "-o", str(lib), str(src)],
                   check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))
    dll.fma_loop.argtypes = [ctypes.c_long, ctypes.c_float, ctypes.c_float]
    dll.fma_loop.restype = ctypes.c_float
    dll.ping_pong.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
    dll.ping_pong.restype = ctypes.c_double
    dll.folder = tmp  # the folder lives as long as the loaded library
    return dll


def measure_peak_gflops(threads: int, seconds: float = 0.1, repeats: int = 5) -> float:
    """GFLOP/s of `threads` threads running the FMA loop together (best of `repeats`,
    each about `seconds` long). Raises subprocess.CalledProcessError if cc fails."""
    dll = _load_loop()
    flops_per_iter = 2 * CHAINS * dll.fma_width()
    iters = 1 << 16
    while True:  # calibrate on one thread to about `seconds`
        start = time.perf_counter()
        dll.fma_loop(iters, 0.999, 0.001)
        if time.perf_counter() - start >= seconds / 4:
            break
        iters *= 2
    iters = int(iters * seconds / max(time.perf_counter() - start, 1e-6))
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=dll.fma_loop, args=(iters, 0.999, 0.001))
                   for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, threads * iters * flops_per_iter / (time.perf_counter() - start))
    return best / 1e9


def core_to_core_ns(rounds: int = 4000, repeats: int = 5) -> float | None:
    """The median over `repeats` of the mean round trip (ns) of a cache line between
    the first two CPUs this process may run on; None with fewer than two."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    dll = _load_loop()
    trips = [dll.ping_pong(cpus[0], cpus[1], rounds) for _ in range(repeats)]
    if min(trips) < 0:
        raise OSError("core_to_core_ns: could not start the ping-pong threads")
    return round(statistics.median(trips) * 1e9, 1)


def _cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def best_peak_gflops(threads: int, record: str) -> float:
    """The best of a measurement now and those kept in `record` (JSON: {"cpu": name,
    "gflops": {threads: best}}, rewritten when beaten; ignored if of another CPU)."""
    cpu, now = _cpu_name(), measure_peak_gflops(threads)
    try:
        doc = json.loads(Path(record).read_text())
        kept = doc["gflops"] if doc.get("cpu") == cpu else {}
    except (OSError, ValueError, KeyError, AttributeError):
        kept = {}
    if now > kept.get(str(threads), 0.0):
        kept[str(threads)] = round(now, 1)
        atomic_write(record, json.dumps({"cpu": cpu, "gflops": kept}, indent=1).encode())
    return kept[str(threads)]
