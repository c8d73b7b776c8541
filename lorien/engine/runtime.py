"""The native runtime: a persistent thread pool for parallel loops and a timing loop.

Two builds of the same runtime exist; ``$LORIEN_RUNTIME`` picks one (``auto`` by default):

- ``llvm``: LLVM IR JIT-compiled by llvmlite (:mod:`lorien.engine.runtime_ir`). Needs nothing
  but the installed wheels, so tuning works on a slim image with no C compiler.
- ``c``: a few dozen lines of C compiled once with the system C compiler (``$CC``, default
  gcc) and cached in ``~/.cache/lorien`` (keyed by the source hash).

``auto`` takes ``llvm`` (same speed, nothing to compile outside the process; see
``benchmarks/engine.py``), and ``c`` only when asked. Which one is in use is logged once.
Worker threads spin briefly on a generation counter, then sleep on a futex, so launching a
parallel loop costs a few microseconds; workers are kept off the caller's CPU and ask for a
short scheduler slice, so that they join short loops on a loaded machine. JIT-compiled kernels
call ``lorien_parallel_for``; Python times kernels through ``lorien_time`` so the timing loop runs without the interpreter
(and without the GIL).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from lorien.engine.runtime_ir import MAX_THREADS
from lorien.errors import ConfigError
from lorien.native import NativeBuildError, cache_dir, install, load_shared

__all__ = ["RUNTIMES", "RuntimeBuildError", "backend", "cache_dir", "default_num_threads", "install", "num_threads",
           "set_num_threads", "symbol_addresses", "threads", "time_kernel"]

logger = logging.getLogger(__name__)

RUNTIME_ENV = "LORIEN_RUNTIME"
RUNTIMES = ("auto", "llvm", "c")
THREADS_ENV = "LORIEN_NUM_THREADS"

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
#define SPIN_NS 1000000L   /* spin this long on the ticket before parking (workers) or yielding (the caller) */
#define CLOCK_EVERY 64     /* spins between two readings of the clock */
#define PARTS_PER_THREAD 4
#define WORKER_SLICE_NS 100000L   /* the scheduler slice a worker asks for (EEVDF, Linux 6.12+) */
#define AFFINITY_BYTES 128

static int wanted_threads = 0, started_threads = 0;
/* The job ticket, one cache line: the job word ((threads << 48) | (parts << 32) | job id; its
   low half, the id, is the futex word workers spin on), written in one store, and the job; a
   worker that sees a new id has the whole job in the same line. */
static struct {
    _Atomic uint64_t word;
    int64_t n;
    body_fn fn;
    void *ctx;
} job __attribute__((aligned(64)));
#define FUTEX_WORD ((void *)&job.word)   /* the id: the word's low half (little endian) */
static atomic_int sleepers __attribute__((aligned(64)));
/* Per thread (the caller is thread 0), each on a cache line of its own and tagged
   (job id << 32) | count: how many of its home parts are claimed (written by that thread, and
   by another only when it steals one) and how many parts it has finished (written only by that
   thread; the caller polls it). A launch writes only the ticket (nothing is reset). */
typedef struct { _Atomic uint64_t word; } __attribute__((aligned(64))) line_t;
static line_t claimed_parts[MAX_THREADS], finished_parts[MAX_THREADS];
static unsigned initial_generation[MAX_THREADS];
static atomic_int worker_tid[MAX_THREADS];   /* 0 until the worker has started */
/* The CPUs the process may use (read when the pool starts) and the CPU the workers were last
   kept off (the launching thread's), -1 when they may run anywhere. */
static unsigned char allowed_cpus[AFFINITY_BYTES];
static int allowed_known = 0, excluded_cpu = -1;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

#if defined(__x86_64__) || defined(__i386__)
static inline void cpu_relax(void) { __builtin_ia32_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax(void) { __asm__ __volatile__("yield"); }
#else
static inline void cpu_relax(void) {}
#endif

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Spinning is bounded in time, not in iterations (a pause is 10 cycles on one CPU and 140 on
   another): every CLOCK_EVERY spins the clock is read (vDSO, no system call); true once
   SPIN_NS have passed since the first reading. */
static int spun_out(int spins, int64_t *start) {
    if (spins % CLOCK_EVERY) return 0;
    int64_t t = now_ns();
    if (spins == CLOCK_EVERY) { *start = t; return 0; }
    return t - *start > SPIN_NS;
}

/* The count a counter tagged (job id << 32) | count holds for job id: its count when the tag
   is id; else 0 while job id is still the current job (the counter holds an earlier job's
   count, however many jobs ago: a thread with no home parts leaves its counters alone, so a tag
   may be 2^31 jobs old), and -1 once a later job has been launched (the caller is past job id). */
static long tagged_count(unsigned long tagged, unsigned id) {
    unsigned tag = (unsigned)(tagged >> 32);
    if (tag == id) return (long)(tagged & 0xffffffffu);
    return (unsigned)atomic_load_explicit(&job.word, memory_order_acquire) == id ? 0 : -1;
}

/* Thread `self` runs parts of job id (of `parts` parts over `threads` threads, read with the id
   from the job word): first its home parts, [ceil(t*parts/threads), ceil((t+1)*parts/threads))
   for thread t (the caller, thread 0, has at least one), the same every launch (as OpenMP's
   schedule(static): a row stays in one core's cache), then any part another thread has not
   claimed yet, so a late or descheduled thread holds back at most the part it is running. A
   part is claimed with a CAS on its home thread's (job id, parts claimed), so a thread that
   wakes late never runs a part twice or of a later job: a claim of job id succeeds only while
   one of its parts is unclaimed, so the job, and the ticket's n, fn and ctx, are still its.
   Only the thread itself writes its done count. */
static void run_parts(unsigned id, unsigned parts, unsigned threads, unsigned self) {
    unsigned long tag = (unsigned long)id << 32;
    long finished = 0;
    for (unsigned k = 0; k < threads; k++) {
        unsigned home = (self + k) % threads;
        unsigned first = (home * parts + threads - 1) / threads;
        unsigned size = ((home + 1) * parts + threads - 1) / threads - first;
        for (;;) {
            unsigned long cur = atomic_load_explicit(&claimed_parts[home].word, memory_order_acquire);
            long claimed = tagged_count(cur, id);
            if (claimed < 0 || claimed >= (long)size) break;
            if (!atomic_compare_exchange_weak_explicit(&claimed_parts[home].word, &cur, tag | (unsigned long)(claimed + 1),
                                                       memory_order_acq_rel, memory_order_acquire)) continue;
            /* balanced: part sizes differ by at most one iteration (28 rows in 8 parts: 3 or 4,
               not seven parts of 4 and an empty one, which left one thread 16 rows and the other 12) */
            int64_t part = first + claimed;
            int64_t begin = part * job.n / parts, end = (part + 1) * job.n / parts;
            if (begin < end) job.fn(job.ctx, begin, end);
            atomic_store_explicit(&finished_parts[self].word, tag | (unsigned long)++finished, memory_order_release);
        }
    }
}

/* The parts of job id the first `threads` threads have finished. */
static long parts_finished(unsigned id, unsigned threads) {
    long finished = 0;
    for (unsigned t = 0; t < threads; t++) {
        long count = tagged_count(atomic_load_explicit(&finished_parts[t].word, memory_order_acquire), id);
        if (count > 0) finished += count;
    }
    return finished;
}

/* struct sched_attr's first fields (SCHED_ATTR_SIZE_VER0). */
struct slice_attr { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t priority;
                    uint64_t runtime, deadline, period; };

/* A worker asks for a short scheduler slice: on a loaded CPU, a woken worker with a shorter
   slice than the running task preempts it instead of waiting for that task's slice to end
   (EEVDF; older kernels ignore sched_runtime for SCHED_OTHER). Its policy and nice stay. */
static void ask_short_slice(void) {
    struct slice_attr attr = {0};
    if (syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) != 0 || attr.policy != SCHED_OTHER) return;
    attr.size = sizeof attr;
    attr.flags = 0;
    attr.runtime = WORKER_SLICE_NS;
    syscall(SYS_sched_setattr, 0, &attr, 0);
}

/* At each launch: keep the workers off the launching thread's CPU. Woken from a busy CPU, a
   parked worker is otherwise queued on the waker's own CPU (wake-affine) and runs only once the
   caller stops, after the short parallel loop it was woken for and the ones after it; and a
   caller moved onto a spinning worker's CPU would share it. The affinity is set only when the
   caller's CPU changed since the last time (sched_getcpu itself makes no system call). */
static void keep_workers_off(int cpu, int workers) {
    if (!allowed_known || cpu < 0 || cpu >= AFFINITY_BYTES * 8 || cpu == excluded_cpu) return;
    unsigned char mask[AFFINITY_BYTES];
    int others = 0;
    for (int i = 0; i < AFFINITY_BYTES; i++) mask[i] = allowed_cpus[i];
    mask[cpu / 8] &= (unsigned char)~(1u << (cpu % 8));
    for (int i = 0; i < AFFINITY_BYTES; i++) others |= mask[i];
    if (!others) { excluded_cpu = cpu; return; }
    int missing = 0;   /* a worker that has not started yet: try again at the next launch */
    for (int i = 1; i <= workers; i++) {
        int tid = atomic_load(&worker_tid[i]);
        if (tid > 0) syscall(SYS_sched_setaffinity, tid, AFFINITY_BYTES, mask); else missing = 1;
    }
    if (!missing) excluded_cpu = cpu;
}

static void *worker_main(void *arg) {
    int index = (int)(intptr_t)arg;
    unsigned seen = initial_generation[index];
    ask_short_slice();
    atomic_store(&worker_tid[index], (int)syscall(SYS_gettid));
    for (;;) {
        uint64_t word;
        int spins = 0;
        int64_t start = 0;
        while ((unsigned)(word = atomic_load_explicit(&job.word, memory_order_acquire)) == seen) {
            if (!spun_out(++spins, &start)) {
                cpu_relax();
            } else {
                atomic_fetch_add(&sleepers, 1);
                syscall(SYS_futex, FUTEX_WORD, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
                atomic_fetch_sub(&sleepers, 1);
                spins = 0;
            }
        }
        seen = (unsigned)word;
        unsigned threads = (unsigned)(word >> 48);
        if ((unsigned)index >= threads) continue;   /* beyond this job's thread count: sit it out */
        run_parts(seen, (unsigned)(word >> 32) & 0xffffu, threads, (unsigned)index);
        /* Take the claim line back while idle: the caller read it when it looked for parts to
           steal, and the next launch's claim would otherwise wait for that copy to go. A CAS of
           the value to itself: a stealer's claim of a later job in between is kept. */
        unsigned long mine = atomic_load_explicit(&claimed_parts[index].word, memory_order_relaxed);
        atomic_compare_exchange_strong_explicit(&claimed_parts[index].word, &mine, mine,
                                                memory_order_relaxed, memory_order_relaxed);
    }
    return NULL;
}

static void reset_after_fork(void) {
    started_threads = 0;
    excluded_cpu = -1;
    for (int i = 0; i < MAX_THREADS; i++) atomic_store(&worker_tid[i], 0);   /* the parent's threads */
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
    if (!allowed_known) allowed_known = syscall(SYS_sched_getaffinity, 0, AFFINITY_BYTES, allowed_cpus) > 0;
    while (started_threads < wanted_threads - 1) {
        pthread_t thread;
        initial_generation[started_threads + 1] = (unsigned)atomic_load(&job.word);
        atomic_store(&worker_tid[started_threads + 1], 0);
        pthread_create(&thread, NULL, worker_main, (void *)(intptr_t)(started_threads + 1));
        pthread_detach(thread);
        started_threads++;
        excluded_cpu = -1;   /* the new worker may run anywhere until the next wake-up */
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

/* How many parts a loop of n iterations is cut into: a few per thread, so that a descheduled
   thread holds back only a small part while the others claim the rest; of those counts
   (multiples of threads, 2 to PARTS_PER_THREAD per thread) the largest that divides n, so
   that every thread's share is the same number of iterations (28 rows: 4 parts of 7, not 8
   parts of 3 or 4, which two threads claiming in turn split 12 / 16); else that many parts of
   sizes differing by one; n when it is smaller. */
static int part_count(int64_t n, int threads) {
    int64_t most = (int64_t)threads * PARTS_PER_THREAD;
    if (n < most) return (int)n;
    for (int64_t p = most; p >= 2 * (int64_t)threads; p -= threads)
        if (n % p == 0) return (int)p;
    return (int)most;
}

void lorien_parallel_for(body_fn fn, void *ctx, int64_t n) {
    if (n <= 0) return;
    if (pthread_mutex_trylock(&pool_lock) != 0) { fn(ctx, 0, n); return; }
    start_pool();
    int threads = wanted_threads < started_threads + 1 ? wanted_threads : started_threads + 1;
    if (threads <= 1 || n == 1) { pthread_mutex_unlock(&pool_lock); fn(ctx, 0, n); return; }
    int parts = part_count(n, threads);
    keep_workers_off(sched_getcpu(), started_threads);
    unsigned id = (unsigned)atomic_load_explicit(&job.word, memory_order_relaxed) + 1;
    job.fn = fn; job.ctx = ctx; job.n = n;
    /* one store: a worker reads the id, the part count and the thread count together. Sequentially
       consistent with the load of sleepers after it (as in the IR build): with a release store
       the load could be done before the store is visible, read no sleeper while a worker that
       went to sleep read the old id in futex_wait, and the worker would miss this job's wake. */
    atomic_store_explicit(&job.word, ((uint64_t)(unsigned)threads << 48) | ((uint64_t)(unsigned)parts << 32) | id,
                          memory_order_seq_cst);
    if (atomic_load_explicit(&sleepers, memory_order_seq_cst) > 0) syscall(SYS_futex, FUTEX_WORD, FUTEX_WAKE_PRIVATE, MAX_THREADS, NULL, NULL, 0);
    run_parts(id, (unsigned)parts, (unsigned)threads, 0);
    int spins = 0;
    int64_t start = 0;
    while (parts_finished(id, (unsigned)threads) < parts) {
        if (spun_out(++spins, &start)) sched_yield(); else cpu_relax();
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


class RuntimeBuildError(NativeBuildError):
    """The native runtime could not be built (no C compiler for ``c``, or it failed)."""


TIME_FN = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
NUM_THREADS_FN = ctypes.CFUNCTYPE(ctypes.c_int)
SET_NUM_THREADS_FN = ctypes.CFUNCTYPE(None, ctypes.c_int)


@dataclass
class _Loaded:
    """A built runtime: which one, its exported addresses, and ctypes calls into it (ctypes
    releases the GIL for the call)."""

    name: str
    addresses: dict[str, int]

    def __post_init__(self) -> None:
        self.time = TIME_FN(self.addresses["lorien_time"])
        self.num_threads = NUM_THREADS_FN(self.addresses["lorien_num_threads"])
        self.set_num_threads = SET_NUM_THREADS_FN(self.addresses["lorien_set_num_threads"])


_LOADED: _Loaded | None = None


def chosen_runtime() -> str:
    """``llvm`` or ``c``: what ``$LORIEN_RUNTIME`` asks for (``auto``, the default, is ``llvm``)."""
    wanted = os.environ.get(RUNTIME_ENV, "auto").strip().lower() or "auto"
    if wanted not in RUNTIMES:
        raise ConfigError(f"${RUNTIME_ENV}={wanted!r} is not a runtime (known: {', '.join(RUNTIMES)})")
    return "llvm" if wanted == "auto" else wanted


def _build_c() -> dict[str, int]:
    try:
        lib = load_shared(C_SOURCE, "runtime", ("-O2", "-pthread"), mode=ctypes.RTLD_GLOBAL, error=RuntimeBuildError)
    except RuntimeBuildError as exc:
        raise RuntimeBuildError(f"{exc}\n(${RUNTIME_ENV}=c needs a C compiler; ${RUNTIME_ENV}=llvm needs none)") from exc
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in EXPORTS}


def _loaded() -> _Loaded:
    global _LOADED
    if _LOADED is None:
        name = chosen_runtime()
        if name == "c":
            addresses = _build_c()
        else:
            from lorien.engine import runtime_ir

            addresses = runtime_ir.build()
        _LOADED = _Loaded(name, addresses)
        logger.info("engine runtime: %s", "LLVM IR via llvmlite" if name == "llvm" else "C, built with $CC")
    return _LOADED


def backend() -> str:
    """The runtime in use in this process: ``llvm`` or ``c`` (built on first use)."""
    return _loaded().name


def symbol_addresses() -> dict[str, int]:
    """Addresses of the runtime's exported functions, for the JIT's symbol table."""
    return dict(_loaded().addresses)


def time_kernel(address: int, args: ctypes.Array, number: int) -> float:
    """Seconds taken by ``number`` calls of the kernel at ``address`` with ``args``."""
    return float(_loaded().time(address, args, number))


def set_num_threads(n: int) -> None:
    """Threads used by parallel loops from the next launch on (the caller counts as one)."""
    _loaded().set_num_threads(int(n))


def num_threads() -> int:
    """Threads parallel loops use now."""
    return int(_loaded().num_threads())


def default_num_threads() -> int:
    """Threads parallel loops use unless told otherwise: ``$LORIEN_NUM_THREADS``, else the
    online CPUs (the runtime's own rule, without starting it)."""
    wanted = os.environ.get(THREADS_ENV, "").strip()
    count = int(wanted) if wanted.isdigit() and int(wanted) > 0 else os.sysconf("SC_NPROCESSORS_ONLN")
    return max(1, min(count, MAX_THREADS))


@contextmanager
def threads(n: int | None) -> Iterator[None]:
    """Parallel loops use ``n`` threads inside the block (``None``: unchanged)."""
    if n is None:
        yield
        return
    before = num_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(before)
