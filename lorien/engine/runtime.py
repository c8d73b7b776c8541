"""The native runtime: a persistent thread pool for parallel loops and a timing loop.

A few dozen lines of C compiled once with the system C compiler and cached in
``~/.cache/lorien`` (keyed by the source hash). Worker threads spin briefly on a generation
counter, then sleep on a futex, so launching a parallel loop costs a few microseconds.
JIT-compiled kernels call ``lorien_parallel_for``; Python times kernels through
``lorien_time`` so the timing loop runs without the interpreter (and without the GIL).
"""

from __future__ import annotations

import ctypes

from lorien.native import NativeBuildError, cache_dir, install, load_shared

__all__ = ["RuntimeBuildError", "cache_dir", "install", "library", "num_threads", "set_num_threads",
           "symbol_addresses"]

C_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/syscall.h>

typedef void (*body_fn)(void *, int64_t, int64_t);
typedef void (*kernel_fn)(void **);

#define MAX_THREADS 256
#define SPIN_LIMIT 100000
#define PARTS_PER_THREAD 4

static int wanted_threads = 0, started_threads = 0;
static atomic_uint generation;
static atomic_int sleepers;
static atomic_ulong next_part;   /* (job id << 32) | next unclaimed part */
static atomic_int done_parts;
static body_fn job_fn;
static void *job_ctx;
static int64_t job_n;
static int job_parts;
static unsigned job_id;
static unsigned initial_generation[MAX_THREADS];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static inline void cpu_relax(void) { __builtin_ia32_pause(); }

/* Claim and run parts of the current job until none is left. Parts are claimed with a CAS on
   (job id, index), so a thread that wakes late never runs a part twice or of a later job. */
static void run_parts(unsigned id) {
    for (;;) {
        unsigned long cur = atomic_load_explicit(&next_part, memory_order_acquire);
        unsigned part = (unsigned)(cur & 0xffffffffu);
        if ((unsigned)(cur >> 32) != id || part >= (unsigned)job_parts) return;
        if (!atomic_compare_exchange_weak_explicit(&next_part, &cur, cur + 1,
                                                   memory_order_acq_rel, memory_order_acquire)) continue;
        int64_t chunk = (job_n + job_parts - 1) / job_parts;
        int64_t begin = (int64_t)part * chunk, end = begin + chunk;
        if (end > job_n) end = job_n;
        if (begin < end) job_fn(job_ctx, begin, end);
        atomic_fetch_add_explicit(&done_parts, 1, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    int index = (int)(intptr_t)arg;
    unsigned seen = initial_generation[index];
    for (;;) {
        unsigned now;
        int spins = 0;
        while ((now = atomic_load_explicit(&generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_LIMIT) {
                cpu_relax();
            } else {
                atomic_fetch_add(&sleepers, 1);
                syscall(SYS_futex, &generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
                atomic_fetch_sub(&sleepers, 1);
                spins = 0;
            }
        }
        seen = now;
        run_parts(now);
    }
    return NULL;
}

static void reset_after_fork(void) {
    started_threads = 0;
    pthread_mutex_init(&pool_lock, NULL);
}

static void start_pool(void) {
    if (wanted_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        const char *env = getenv("LORIEN_NUM_THREADS");
        if (env && atoi(env) > 0) n = atoi(env);
        wanted_threads = n > MAX_THREADS ? MAX_THREADS : (int)n;
    }
    static int atfork_done = 0;
    if (!atfork_done) { pthread_atfork(NULL, NULL, reset_after_fork); atfork_done = 1; }
    while (started_threads < wanted_threads - 1) {
        pthread_t thread;
        initial_generation[started_threads + 1] = atomic_load(&generation);
        pthread_create(&thread, NULL, worker_main, (void *)(intptr_t)(started_threads + 1));
        pthread_detach(thread);
        started_threads++;
    }
}

int lorien_num_threads(void) {
    if (wanted_threads <= 0) { pthread_mutex_lock(&pool_lock); start_pool(); pthread_mutex_unlock(&pool_lock); }
    return wanted_threads;
}

void lorien_set_num_threads(int n) {
    pthread_mutex_lock(&pool_lock);
    wanted_threads = n < 1 ? 1 : (n > MAX_THREADS ? MAX_THREADS : n);
    pthread_mutex_unlock(&pool_lock);
}

void lorien_parallel_for(body_fn fn, void *ctx, int64_t n) {
    if (n <= 0) return;
    if (pthread_mutex_trylock(&pool_lock) != 0) { fn(ctx, 0, n); return; }
    start_pool();
    int threads = wanted_threads < started_threads + 1 ? wanted_threads : started_threads + 1;
    if (threads <= 1 || n == 1) { pthread_mutex_unlock(&pool_lock); fn(ctx, 0, n); return; }
    /* A few parts per thread: a thread that is descheduled (a shared machine) holds back at
       most a small part while the others claim the rest. */
    int parts = n < (int64_t)threads * PARTS_PER_THREAD ? (int)n : threads * PARTS_PER_THREAD;
    unsigned id = atomic_load(&generation) + 1;
    job_fn = fn; job_ctx = ctx; job_n = n; job_parts = parts; job_id = id;
    atomic_store_explicit(&done_parts, 0, memory_order_relaxed);
    atomic_store_explicit(&next_part, (unsigned long)id << 32, memory_order_release);
    atomic_store_explicit(&generation, id, memory_order_release);
    if (atomic_load(&sleepers) > 0) syscall(SYS_futex, &generation, FUTEX_WAKE_PRIVATE, MAX_THREADS, NULL, NULL, 0);
    run_parts(id);
    int spins = 0;
    while (atomic_load_explicit(&done_parts, memory_order_acquire) < parts) {
        if (++spins < SPIN_LIMIT) cpu_relax(); else sched_yield();
    }
    pthread_mutex_unlock(&pool_lock);
}

double lorien_time(kernel_fn fn, void **args, int64_t number) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = 0; i < number; i++) fn(args);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

void *lorien_alloc(int64_t nbytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, nbytes < 64 ? 64 : (size_t)nbytes) != 0) return NULL;
    return p;
}

void lorien_free(void *p) { free(p); }
"""

EXPORTS = ("lorien_parallel_for", "lorien_time", "lorien_alloc", "lorien_free",
           "lorien_num_threads", "lorien_set_num_threads")

_LIB: ctypes.CDLL | None = None


class RuntimeBuildError(NativeBuildError):
    """The native runtime could not be compiled (no C compiler, or it failed)."""


def library() -> ctypes.CDLL:
    """The loaded runtime library, compiling it on first use."""
    global _LIB
    if _LIB is not None:
        return _LIB
    lib = load_shared(C_SOURCE, "runtime", ("-O2", "-pthread"), mode=ctypes.RTLD_GLOBAL, error=RuntimeBuildError)
    lib.lorien_time.restype = ctypes.c_double
    lib.lorien_time.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.lorien_set_num_threads.argtypes = [ctypes.c_int]
    lib.lorien_num_threads.restype = ctypes.c_int
    _LIB = lib
    return lib


def symbol_addresses() -> dict[str, int]:
    """Addresses of the runtime's exported functions, for the JIT's symbol table."""
    lib = library()
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in EXPORTS}


def set_num_threads(n: int) -> None:
    """Threads used by parallel loops (the caller counts as one); call before the first launch."""
    library().lorien_set_num_threads(int(n))


def num_threads() -> int:
    return int(library().lorien_num_threads())
