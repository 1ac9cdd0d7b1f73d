"""The host's measured fp32 multiply-add peak, the 100% of `doit bench`'s "% of peak",
its streaming read bandwidth, the 100% of a memory-bound kernel's "% of bandwidth",
and its core-to-core latency, which says how much two threads can gain.

A tiny C loop (compiled by the host cc with -march=native) keeps twelve independent
vector accumulators busy with a*x+b: enough chains to cover the FMA latency of
two FMA ports, all in registers, no memory traffic. `threads` Python threads run it
at once (ctypes releases the GIL during the call); the best of a few repetitions
counts, since a shared machine only ever makes the loop slower. For the same
reason best_peak_gflops keeps the best ever seen on this CPU in a small JSON file:
a peak measured while other work held a core would inflate every "% of peak".

The streaming read bandwidth (measure_read_gbps) is `threads` threads summing their
own part of a 256 MiB buffer (8x this class of machine's L3, so it comes from DRAM;
on transparent huge pages, as the executor's weights are) with eight vector
accumulators, touched before the clock starts; GB/s is the buffer's
bytes over the wall time of the slowest thread, best of a few passes, and
best_read_gbps keeps the best seen in the same file as the FMA peak. It is the roof of
a kernel that streams its weights once per call, as batch-1 fully connected layers do.

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


# The streaming read of measure_read_gbps (after _PING_PONG, whose _GNU_SOURCE must
# come before any #include).
_STREAM = """#include <stdlib.h>
#include <sys/mman.h>
/* `n` floats (a multiple of 8 * W) on transparent huge pages where the kernel offers
   them, as the executor's arena is (runtime/c/executor.c arena_alloc: on 4 KiB pages
   a VM's page walks cut a streaming read by a third or more), written once, so that
   every page is mapped before stream_read times it; NULL if out of memory. */
float *stream_buffer(long n) {
    size_t huge = (size_t)2 << 20, bytes = ((size_t)n * sizeof(float) + huge - 1) / huge * huge;
    float *p = aligned_alloc(huge, bytes);
    if (!p) return p;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    for (long i = 0; i < n; i++) p[i] = 1.0f;
    return p;
}
void stream_free(float *p) { free(p); }
/* The sum of `n` floats from `p` (64-byte aligned, n a multiple of 8 * W): eight
   independent accumulators, so the adds wait on memory, not on each other. */
float stream_read(const float *p, long n) {
    const vf *v = (const vf *)p;
    vf acc[8] = {0};
    for (long i = 0; i < n / W; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += v[i + j];
    float s = 0;
    for (int j = 0; j < 8; j++) for (int i = 0; i < W; i++) s += acc[j][i];
    return s;
}
"""


@functools.cache  # compiled once per process: bench measures per model and thread count
def _load_loop() -> ctypes.CDLL:
    tmp = tempfile.TemporaryDirectory(prefix="pipeline-peak-")  # removed at exit
    folder = Path(tmp.name)
    src, lib = folder / "fma.c", folder / "fma.so"
    src.write_text(_SOURCE + _PING_PONG + _STREAM)
    subprocess.run([*shlex.split(host_cc()), "-O3", "-march=native", "-ffp-contract=fast",
                    "-pthread", "-shared", "-fPIC", "-o", str(lib), str(src)],
                   check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))
    dll.fma_loop.argtypes = [ctypes.c_long, ctypes.c_float, ctypes.c_float]
    dll.fma_loop.restype = ctypes.c_float
    dll.ping_pong.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
    dll.ping_pong.restype = ctypes.c_double
    dll.stream_buffer.argtypes = [ctypes.c_long]
    dll.stream_buffer.restype = ctypes.c_void_p
    dll.stream_free.argtypes = [ctypes.c_void_p]
    dll.stream_read.argtypes = [ctypes.c_void_p, ctypes.c_long]
    dll.stream_read.restype = ctypes.c_float
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


STREAM_BYTES = 256 * 2**20


def measure_read_gbps(threads: int, total_bytes: int = STREAM_BYTES, repeats: int = 5) -> float:
    """GB/s (1e9 bytes) of `threads` threads reading `total_bytes` together, each its
    own contiguous part (best of `repeats`). Raises MemoryError if the buffer cannot be
    allocated, subprocess.CalledProcessError if cc fails."""
    dll = _load_loop()
    # Each thread's part a whole number of the loop's 8 vectors of up to 16 floats.
    part = total_bytes // 4 // threads // 128 * 128
    buffer = dll.stream_buffer(part * threads)
    if not buffer:
        raise MemoryError(f"measure_read_gbps: cannot allocate {total_bytes} bytes")
    try:
        best = 0.0
        for _ in range(repeats):
            workers = [threading.Thread(target=dll.stream_read, args=(buffer + 4 * part * i, part))
                       for i in range(threads)]
            start = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best = max(best, 4 * part * threads / (time.perf_counter() - start))
    finally:
        dll.stream_free(buffer)
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


def _keep_best(record: str, key: str, threads: int, now: float) -> float:
    """The best of `now` and the figure kept in `record` under key and threads (JSON:
    {"cpu": name, "gflops": {threads: best}, "read_gbps": {threads: best}}), rewritten
    when beaten; a record of another CPU counts as empty."""
    cpu = _cpu_name()
    try:
        doc = json.loads(Path(record).read_text())
        doc = doc if isinstance(doc, dict) and doc.get("cpu") == cpu else {}
    except (OSError, ValueError):
        doc = {}
    kept = doc.get(key) if isinstance(doc.get(key), dict) else {}
    if now > kept.get(str(threads), 0.0):
        kept[str(threads)] = round(now, 1)
        doc.update({"cpu": cpu, key: kept})
        atomic_write(record, json.dumps(doc, indent=1).encode())
    return kept[str(threads)]


def best_peak_gflops(threads: int, record: str) -> float:
    """The best FMA peak (GFLOP/s) of a measurement now and that kept in `record`
    (rewritten when beaten; ignored if of another CPU)."""
    return _keep_best(record, "gflops", threads, measure_peak_gflops(threads))


def best_read_gbps(threads: int, record: str) -> float:
    """The best streaming read bandwidth (GB/s) of a measurement now and that kept in
    `record` (the FMA peak's file, key "read_gbps"; rewritten when beaten)."""
    return _keep_best(record, "read_gbps", threads, measure_read_gbps(threads))
