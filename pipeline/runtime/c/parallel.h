/* The library's own thread team for the parallel kernels (included once, by executor.c).
 *
 * A parallel kernel (pipeline/dsl/vector.py, parallel_for) calls
 * pl_parallel(fn, data, n) when the library defines it, libgomp's GOMP_parallel
 * otherwise (a kernel linked without the executor, as in the kernel tests). fn(data)
 * takes chunks of its thread's range of the loop (pl_thread_index), then of the other
 * ranges, until none is left, so any number of threads may run it, and one alone
 * does the whole loop.
 *
 * Why not GOMP_parallel: its join waits for every thread of the team, also for one the
 * OS has not run yet because the other core is busy; on a loaded machine that wait is
 * a timeslice (milliseconds) per kernel, and two threads ran small models several
 * times slower than one. Here the caller runs fn itself and then waits only for the
 * workers that have already joined the job; a worker that wakes late finds the job
 * closed and goes back to sleep.
 *
 * A worker the OS preempts in the middle of its chunk still holds the caller up;
 * whether the team pays for a whole run is measured by the executor (pl_run).
 *
 * One word holds the job's state: generation (bits 63..32), closed (bit 31) and the
 * number of workers inside fn (bits 15..0). A worker reads fn/data/want, then enters
 * with a compare-and-swap on the word it read: that succeeds only if the job is still
 * the same generation and open, so what it read belongs to this job (the caller writes
 * the next job's fn/data only after closing this one and seeing no worker inside).
 */

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TEAM_MAX 64
#define TEAM_CLOSED ((uint64_t)1 << 31)
#define TEAM_ACTIVE 0xffffu
/* How long an idle worker polls before it sleeps: spans the gap between two parallel
 * kernels of a run (serial kernels between them included) and ends soon after it (as
 * GOMP_SPINCOUNT does for libgomp, runtime/threads.py). 100 us was too short: a worker
 * asleep across a run of serial kernels costs a futex wake-up (tens of us) at the next
 * parallel one, and on an idle 2-core Zen 5 two threads ran shufflenet in 3.72 ms
 * (median; 2.28 min) against 2.24 ms with 1 ms, mobilenet_v2 2.97 -> 1.90 ms. On a
 * shared machine the spinning worker takes that long a core's share from others. */
#define TEAM_SPIN_SECONDS 1e-3

/* Two cache lines: the job (written by the caller, then read once by each worker)
 * and the one the idle workers poll, so that writing a job does not move the line
 * between the cores once per field while a worker spins on it. */
static struct {
    _Alignas(64) pthread_mutex_t lock; /* one caller at a time; another runs its loop alone */
    _Atomic uint64_t word;
    _Atomic(void (*)(void *)) fn;
    _Atomic(void *) data;
    _Atomic int want; /* workers the job may take */
    int workers;      /* started so far; guarded by lock */
    _Alignas(64) _Atomic uint32_t seq; /* the generation, as the futex workers sleep on */
    _Atomic int sleepers;              /* workers in (or entering) FUTEX_WAIT */
} team = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void team_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static double team_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The thread's index in the team: 0 on any thread that is not a worker (the one
 * calling the kernel), 1.. on the workers. A kernel's loop function starts with
 * the range of its index (dsl/vector.py, parallel_for), so from one kernel to the
 * next each thread works on the same rows, and grabs from a counter no other
 * thread writes until it steals. */
static _Thread_local int team_index;

API int pl_thread_index(void) { return team_index; }

static void *team_worker(void *index) {
    team_index = (int)(intptr_t)index;
    uint32_t seen = atomic_load(&team.seq);
    for (;;) {
        double until = team_now() + TEAM_SPIN_SECONDS;
        for (unsigned spins = 1; atomic_load_explicit(&team.seq, memory_order_acquire) == seen;
             spins++) {
            if (spins % 64 || team_now() < until) {
                team_pause();
                continue;
            }
            /* sleepers before the futex re-reads seq; the caller stores seq before it
             * reads sleepers (both seq_cst): one of the two sees the other. */
            atomic_fetch_add(&team.sleepers, 1);
            syscall(SYS_futex, &team.seq, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            atomic_fetch_sub(&team.sleepers, 1);
            until = team_now() + TEAM_SPIN_SECONDS;
        }
        uint64_t w = atomic_load_explicit(&team.word, memory_order_acquire);
        seen = (uint32_t)(w >> 32);
        void (*fn)(void *) = atomic_load_explicit(&team.fn, memory_order_relaxed);
        void *data = atomic_load_explicit(&team.data, memory_order_relaxed);
        int want = atomic_load_explicit(&team.want, memory_order_relaxed);
        while (!(w & TEAM_CLOSED) && (uint32_t)(w >> 32) == seen &&
               (int)(w & TEAM_ACTIVE) < want) {
            if (atomic_compare_exchange_weak(&team.word, &w, w + 1)) {
                fn(data);
                atomic_fetch_sub_explicit(&team.word, 1, memory_order_release);
                break;
            }
        }
    }
    return NULL;
}

/* Run fn(data) on the calling thread and on up to n - 1 workers (started on first
 * use, then kept); returns when every thread that ran fn has returned from it. */
API void pl_parallel(void (*fn)(void *), void *data, int n) {
    if (n > TEAM_MAX) n = TEAM_MAX;
    if (n <= 1 || pthread_mutex_trylock(&team.lock) != 0) {
        fn(data);
        return;
    }
    while (team.workers < n - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, team_worker,
                                    (void *)(intptr_t)(team.workers + 1));
        pthread_attr_destroy(&attr);
        if (failed) break; /* fewer helpers; fn still covers the whole loop */
        team.workers++;
    }
    atomic_store_explicit(&team.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&team.data, data, memory_order_relaxed);
    atomic_store_explicit(&team.want, n - 1, memory_order_relaxed);
    uint32_t gen = (uint32_t)(atomic_load(&team.word) >> 32) + 1;
    atomic_store_explicit(&team.word, (uint64_t)gen << 32, memory_order_release);
    atomic_store(&team.seq, gen);
    /* A worker still spinning sees seq by itself: no system call (a microsecond). */
    if (atomic_load(&team.sleepers) > 0)
        syscall(SYS_futex, &team.seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    fn(data);
    if (atomic_fetch_or(&team.word, TEAM_CLOSED) & TEAM_ACTIVE) {
        while (atomic_load_explicit(&team.word, memory_order_acquire) & TEAM_ACTIVE)
            team_pause();
    }
    pthread_mutex_unlock(&team.lock);
}
