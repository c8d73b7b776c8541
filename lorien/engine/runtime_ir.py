"""The engine runtime written in LLVM IR and JIT-compiled with llvmlite: no C compiler needed.

It is the same runtime as the C one in :mod:`lorien.engine.runtime` (a persistent thread pool
for parallel loops, a timing loop, aligned allocation), function for function: worker threads
spin briefly on a generation counter and then sleep on a futex; a parallel loop is cut into a
few parts per thread (a count that gives each thread the same share where one exists); each
thread first runs its home parts (the same ones every launch, as OpenMP's schedule(static)),
then steals parts another thread has not claimed, each claimed with a compare-and-swap on its
home thread's (job id, parts claimed); the caller runs parts too and waits until every thread's
done count adds up, and a launch writes only the job ticket (the counters are tagged with the
job id, not reset). Workers are kept off the caller's CPU and ask for a
short scheduler slice, so that a woken worker joins short loops on a loaded machine
(docs/engine.md, "The runtime"). Only libc is called (pthread, ``syscall`` for the futex,
thread id, affinity and slice, ``sched_getcpu``, ``clock_gettime``, ``posix_memalign``); their
addresses come from the running process, so nothing is linked or compiled outside llvmlite.
"""

from __future__ import annotations

import ctypes
import platform

#: Exported functions, as in the C runtime.
EXPORTS = ("lorien_parallel_for", "lorien_time", "lorien_alloc", "lorien_free",
           "lorien_num_threads", "lorien_set_num_threads")
LIBC_FUNCTIONS = ("syscall", "sched_yield", "sched_getcpu", "sysconf", "getenv", "atoi", "pthread_create", "pthread_detach",
                  "clock_gettime", "posix_memalign", "free")
#: ``pthread_atfork`` as the C library exports it: glibc links it statically into each program
#: and exports ``__register_atfork(prepare, parent, child, dso_handle)`` instead.
ATFORK_FUNCTIONS = ("pthread_atfork", "__register_atfork")

#: Per machine: the system call numbers the runtime uses and the spin-wait hint.
_SYSCALLS = ("futex", "gettid", "sched_setaffinity", "sched_getaffinity", "sched_setattr", "sched_getattr")
_ARCHES = {
    "x86_64": (dict(zip(_SYSCALLS, (202, 186, 203, 204, 314, 315), strict=True)),
               "declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"),
    "aarch64": (dict(zip(_SYSCALLS, (98, 178, 122, 123, 274, 275), strict=True)), "", 'call void asm sideeffect "yield", ""()'),
}
#: How long a worker spins on the job ticket before it parks on the futex, and how long the
#: launching thread spins for the others to finish before it yields its core between checks.
SPIN_NS = 1_000_000
#: Spins between two readings of the clock (a power of two).
CLOCK_EVERY = 64
PARTS_PER_THREAD = 4
#: The scheduler slice a worker asks for (``sched_attr.sched_runtime``; EEVDF, Linux 6.12+):
#: woken on a busy CPU, a worker with a shorter slice than the running task preempts it.
WORKER_SLICE_NS = 100_000
#: Bytes of the CPU affinity masks (1024 CPUs).
AFFINITY_BYTES = 128
MAX_THREADS = 256
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
SC_NPROCESSORS_ONLN = 84
CLOCK_MONOTONIC = 1

IR_TEMPLATE = r"""
@wanted_threads = internal global i32 0
@started_threads = internal global i32 0
; The job ticket, one cache line: generation (the job id, the futex word workers spin on),
; parts and threads, read and written together as one i64 (the job word,
; threads << 48 | parts << 32 | id), then n, fn, ctx. A worker that sees a new generation has
; the whole job in the same line.
@generation = internal global {{ i32, i32, i64, ptr, ptr, [32 x i8] }} zeroinitializer, align 64
@sleepers = internal global [16 x i32] zeroinitializer, align 64
; Per thread (the caller is thread 0), each on a cache line of its own and tagged
; (job id << 32) | count: how many of its home parts are claimed (written by that thread, and
; by another only when it steals one) and how many parts it has finished (written only by that
; thread; the caller polls it). A launch writes only the ticket (nothing is reset).
@claimed_parts = internal global [{max_threads} x {{ i64, [56 x i8] }}] zeroinitializer, align 64
@finished_parts = internal global [{max_threads} x {{ i64, [56 x i8] }}] zeroinitializer, align 64
@initial_generation = internal global [{max_threads} x i32] zeroinitializer
@worker_tid = internal global [{max_threads} x i32] zeroinitializer   ; 0 until the worker has started
; The CPUs the process may use (read when the pool starts), and the CPU the workers were last
; kept off (the launching thread's), -1 when they may run anywhere.
@allowed_cpus = internal global [{affinity_words} x i64] zeroinitializer
@allowed_known = internal global i32 0
@excluded_cpu = internal global i32 -1
@pool_lock = internal global i32 0                ; 0 free, 1 held
@atfork_done = internal global i32 0
@threads_env = private constant [19 x i8] c"LORIEN_NUM_THREADS\00"

declare i64 @syscall(i64, ...)
declare i32 @sched_yield()
declare i32 @sched_getcpu()
declare i64 @sysconf(i32)
declare ptr @getenv(ptr)
declare i32 @atoi(ptr)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(i64)
declare i32 @lorien_libc_atfork(ptr, ptr, ptr, ptr)
declare i32 @clock_gettime(i32, ptr)
declare i32 @posix_memalign(ptr, i64, i64)
declare void @free(ptr)
{pause_declaration}

define internal i64 @now_ns() {{
  %ts = alloca [2 x i64]
  %rc = call i32 @clock_gettime(i32 {clock_monotonic}, ptr %ts)
  %s = load i64, ptr %ts
  %ns_at = getelementptr [2 x i64], ptr %ts, i64 0, i64 1
  %ns = load i64, ptr %ns_at
  %s_ns = mul i64 %s, 1000000000
  %t = add i64 %s_ns, %ns
  ret i64 %t
}}

; Spinning is bounded in time, not in iterations: a pause takes 10 cycles on one CPU and 140
; on another. Every {clock_every} spins, the clock is read (vDSO, no system call); true once
; {spin_ns} ns have passed since %start (which the first check sets).
define internal i1 @spun_out(i32 %spins, ptr %start) {{
entry:
  %low = and i32 %spins, {clock_mask}
  %check = icmp eq i32 %low, 0
  br i1 %check, label %clock, label %no
clock:
  %t = call i64 @now_ns()
  %first = icmp eq i32 %spins, {clock_every}
  br i1 %first, label %mark, label %compare
mark:
  store i64 %t, ptr %start
  br label %no
compare:
  %t0 = load i64, ptr %start
  %elapsed = sub i64 %t, %t0
  %long = icmp sgt i64 %elapsed, {spin_ns}
  ret i1 %long
no:
  ret i1 false
}}

define internal void @cpu_relax() {{
  {pause_call}
  ret void
}}

define internal void @lock() {{
entry:
  br label %try
try:
  %pair = cmpxchg weak ptr @pool_lock, i32 0, i32 1 acquire monotonic
  %won = extractvalue {{ i32, i1 }} %pair, 1
  br i1 %won, label %done, label %wait
wait:
  %yielded = call i32 @sched_yield()
  br label %try
done:
  ret void
}}

define internal void @unlock() {{
  store atomic i32 0, ptr @pool_lock release, align 4
  ret void
}}

; The count a counter tagged (job id << 32) | count holds for job %id: its count when the tag
; is %id; else 0 while job %id is still the current job (the counter holds an earlier job's
; count, however many jobs ago: a thread with no home parts leaves its counters alone, so a tag
; may be 2^31 jobs old), and -1 once a later job has been launched (the caller is past job %id).
define internal i64 @tagged_count(i64 %tagged, i32 %id) {{
entry:
  %high = lshr i64 %tagged, 32
  %tag = trunc i64 %high to i32
  %same = icmp eq i32 %tag, %id
  br i1 %same, label %this_job, label %other_job
this_job:
  %count = and i64 %tagged, 4294967295
  ret i64 %count
other_job:
  %current = load atomic i32, ptr @generation acquire, align 8
  %still = icmp eq i32 %current, %id
  %result = select i1 %still, i64 0, i64 -1
  ret i64 %result
}}

; Thread %self runs parts of job %id (of %parts parts over %threads threads, read with the id
; from the job word): first its home parts, [ceil(t*parts/threads), ceil((t+1)*parts/threads))
; for thread t (the caller, thread 0, has at least one), the same every launch (as OpenMP's
; schedule(static): a row stays in one core's cache), then any part another thread has not
; claimed yet, so a late or descheduled thread holds back at most the part it is running. A
; part is claimed with a CAS on its home thread's (job id, parts claimed), so a thread that
; wakes late never runs a part twice or a part of a later job: a claim of job %id succeeds only
; while one of its parts is unclaimed, so the job, and the ticket's n, fn and ctx, are still
; its. Only the thread itself writes its done count.
; Part p is [p*n/parts, (p+1)*n/parts): sizes differ by at most one iteration.
define internal void @run_parts(i32 %id, i32 %parts, i32 %threads, i32 %self) {{
entry:
  %parts64 = zext i32 %parts to i64
  %threads64 = zext i32 %threads to i64
  %self64 = zext i32 %self to i64
  %id64 = zext i32 %id to i64
  %tag = shl i64 %id64, 32
  %done_at = getelementptr [{max_threads} x {{ i64, [56 x i8] }}], ptr @finished_parts, i64 0, i64 %self64, i32 0
  br label %next_home
next_home:
  %k = phi i64 [ 0, %entry ], [ %k_next, %home_done ]
  %finished = phi i64 [ 0, %entry ], [ %finished_claim, %home_done ]
  %more_homes = icmp ult i64 %k, %threads64
  br i1 %more_homes, label %home, label %done
home:
  %self_plus_k = add i64 %self64, %k
  %home_index = urem i64 %self_plus_k, %threads64
  %threads_less_one = sub i64 %threads64, 1
  %first_scaled = mul i64 %home_index, %parts64
  %first_up = add i64 %first_scaled, %threads_less_one
  %first = udiv i64 %first_up, %threads64
  %after = add i64 %home_index, 1
  %after_scaled = mul i64 %after, %parts64
  %after_up = add i64 %after_scaled, %threads_less_one
  %home_end = udiv i64 %after_up, %threads64
  %size = sub i64 %home_end, %first
  %claimed_at = getelementptr [{max_threads} x {{ i64, [56 x i8] }}], ptr @claimed_parts, i64 0, i64 %home_index, i32 0
  br label %claim
claim:
  %finished_claim = phi i64 [ %finished, %home ], [ %finished_claim, %try ], [ %finished_next, %count ]
  %cur = load atomic i64, ptr %claimed_at acquire, align 8
  %claimed = call i64 @tagged_count(i64 %cur, i32 %id)
  %later = icmp slt i64 %claimed, 0
  %claimed_all = icmp sge i64 %claimed, %size
  %stop = or i1 %later, %claimed_all
  br i1 %stop, label %home_done, label %try
try:
  %claimed_next = add i64 %claimed, 1
  %next = or i64 %tag, %claimed_next
  %pair = cmpxchg weak ptr %claimed_at, i64 %cur, i64 %next acq_rel acquire
  %won = extractvalue {{ i64, i1 }} %pair, 1
  br i1 %won, label %run, label %claim
run:
  %part = add i64 %first, %claimed
  %n = load i64, ptr getelementptr inbounds (i8, ptr @generation, i64 8)
  %begin_scaled = mul i64 %part, %n
  %begin = sdiv i64 %begin_scaled, %parts64
  %part_after = add i64 %part, 1
  %end_scaled = mul i64 %part_after, %n
  %end = sdiv i64 %end_scaled, %parts64
  %nonempty = icmp slt i64 %begin, %end
  br i1 %nonempty, label %call, label %count
call:
  %fn = load ptr, ptr getelementptr inbounds (i8, ptr @generation, i64 16)
  %ctx = load ptr, ptr getelementptr inbounds (i8, ptr @generation, i64 24)
  call void %fn(ptr %ctx, i64 %begin, i64 %end)
  br label %count
count:
  %finished_next = add i64 %finished_claim, 1
  %done_word = or i64 %tag, %finished_next
  store atomic i64 %done_word, ptr %done_at release, align 8
  br label %claim
home_done:
  %k_next = add i64 %k, 1
  br label %next_home
done:
  ret void
}}

; The parts of job %id the first %threads threads have finished.
define internal i64 @parts_finished(i32 %id, i32 %threads) {{
entry:
  %threads64 = zext i32 %threads to i64
  br label %loop
loop:
  %t = phi i64 [ 0, %entry ], [ %t_next, %add ]
  %sum = phi i64 [ 0, %entry ], [ %sum_next, %add ]
  %more = icmp ult i64 %t, %threads64
  br i1 %more, label %add, label %out
add:
  %done_at = getelementptr [{max_threads} x {{ i64, [56 x i8] }}], ptr @finished_parts, i64 0, i64 %t, i32 0
  %word = load atomic i64, ptr %done_at acquire, align 8
  %count = call i64 @tagged_count(i64 %word, i32 %id)
  %positive = icmp sgt i64 %count, 0
  %counted = select i1 %positive, i64 %count, i64 0
  %sum_next = add i64 %sum, %counted
  %t_next = add i64 %t, 1
  br label %loop
out:
  ret i64 %sum
}}

; A worker asks for a short scheduler slice (struct sched_attr's first 48 bytes: size, policy,
; flags, nice, priority, runtime at byte 24): on a loaded CPU, a woken worker with a shorter
; slice than the running task preempts it instead of waiting for that task's slice to end
; (EEVDF; older kernels ignore the runtime of SCHED_OTHER). Its policy and nice stay.
define internal void @ask_short_slice() {{
entry:
  %attr = alloca [6 x i64], align 8
  store [6 x i64] zeroinitializer, ptr %attr
  %got = call i64 (i64, ...) @syscall(i64 {sys_sched_getattr}, i64 0, ptr %attr, i64 48, i64 0)
  %got_ok = icmp eq i64 %got, 0
  br i1 %got_ok, label %check_policy, label %done
check_policy:
  %policy_at = getelementptr inbounds i8, ptr %attr, i64 4
  %policy = load i32, ptr %policy_at
  %normal = icmp eq i32 %policy, 0
  br i1 %normal, label %set, label %done
set:
  store i32 48, ptr %attr
  %flags_at = getelementptr inbounds i8, ptr %attr, i64 8
  store i64 0, ptr %flags_at
  %runtime_at = getelementptr inbounds i8, ptr %attr, i64 24
  store i64 {worker_slice_ns}, ptr %runtime_at
  %set_rc = call i64 (i64, ...) @syscall(i64 {sys_sched_setattr}, i64 0, ptr %attr, i64 0)
  br label %done
done:
  ret void
}}

; At each launch: keep the workers off the launching thread's CPU %cpu. Woken from a busy CPU,
; a parked worker is otherwise queued on the waker's own CPU (wake-affine) and runs only once
; the caller stops, after the short parallel loop it was woken for and the ones after it; and a
; caller moved onto a spinning worker's CPU would share it. The affinity is set only when the
; caller's CPU changed since the last time (sched_getcpu itself makes no system call).
define internal void @keep_workers_off(i32 %cpu, i32 %workers) {{
entry:
  %mask = alloca [{affinity_words} x i64], align 8
  %known = load i32, ptr @allowed_known
  %unknown = icmp eq i32 %known, 0
  %negative = icmp slt i32 %cpu, 0
  %too_high = icmp sge i32 %cpu, {affinity_bits}
  %last = load i32, ptr @excluded_cpu
  %same = icmp eq i32 %cpu, %last
  %skip1 = or i1 %unknown, %negative
  %skip2 = or i1 %too_high, %same
  %skip = or i1 %skip1, %skip2
  br i1 %skip, label %done, label %build
build:
  %allowed = load [{affinity_words} x i64], ptr @allowed_cpus
  store [{affinity_words} x i64] %allowed, ptr %mask
  %cpu64 = zext i32 %cpu to i64
  %word_index = lshr i64 %cpu64, 6
  %bit_index = and i64 %cpu64, 63
  %bit = shl i64 1, %bit_index
  %not_bit = xor i64 %bit, -1
  %word_at = getelementptr [{affinity_words} x i64], ptr %mask, i64 0, i64 %word_index
  %word = load i64, ptr %word_at
  %cleared = and i64 %word, %not_bit
  store i64 %cleared, ptr %word_at
  br label %any
any:
  %w = phi i64 [ 0, %build ], [ %w_next, %any ]
  %others = phi i64 [ 0, %build ], [ %others_next, %any ]
  %at = getelementptr [{affinity_words} x i64], ptr %mask, i64 0, i64 %w
  %value = load i64, ptr %at
  %others_next = or i64 %others, %value
  %w_next = add i64 %w, 1
  %more_words = icmp slt i64 %w_next, {affinity_words}
  br i1 %more_words, label %any, label %checked
checked:
  %none = icmp eq i64 %others_next, 0
  br i1 %none, label %remember, label %each
each:
  %i = phi i32 [ 1, %checked ], [ %i_next, %next ]
  %missing = phi i1 [ false, %checked ], [ %missing_next, %next ]
  %beyond = icmp sgt i32 %i, %workers
  br i1 %beyond, label %all_seen, label %one
one:
  %i64 = sext i32 %i to i64
  %tid_at = getelementptr [{max_threads} x i32], ptr @worker_tid, i64 0, i64 %i64
  %tid = load atomic i32, ptr %tid_at acquire, align 4
  %started = icmp sgt i32 %tid, 0
  br i1 %started, label %pin, label %next
pin:
  %tid_64 = sext i32 %tid to i64
  %pin_rc = call i64 (i64, ...) @syscall(i64 {sys_sched_setaffinity}, i64 %tid_64, i64 {affinity_bytes}, ptr %mask)
  br label %next
next:
  %not_started = xor i1 %started, true
  %missing_next = or i1 %missing, %not_started
  %i_next = add i32 %i, 1
  br label %each
all_seen:
  ; a worker that has not started yet: try again at the next launch
  br i1 %missing, label %done, label %remember
remember:
  store i32 %cpu, ptr @excluded_cpu
  br label %done
done:
  ret void
}}

define internal ptr @worker_main(ptr %arg) {{
entry:
  %spin_start = alloca i64
  %index = ptrtoint ptr %arg to i64
  %slot = getelementptr [{max_threads} x i32], ptr @initial_generation, i64 0, i64 %index
  %first_seen = load i32, ptr %slot
  call void @ask_short_slice()
  %tid = call i64 (i64, ...) @syscall(i64 {sys_gettid})
  %tid32 = trunc i64 %tid to i32
  %tid_slot = getelementptr [{max_threads} x i32], ptr @worker_tid, i64 0, i64 %index
  store atomic i32 %tid32, ptr %tid_slot release, align 4
  br label %wait
wait:
  %seen = phi i32 [ %first_seen, %entry ], [ %now, %work ], [ %now, %take_parts ]
  br label %spin
spin:
  %spins = phi i32 [ 0, %wait ], [ %spins_next, %relax ], [ 0, %sleep ]
  %word = load atomic i64, ptr @generation acquire, align 8
  %now = trunc i64 %word to i32
  %idle = icmp eq i32 %now, %seen
  br i1 %idle, label %count, label %work
count:
  %spins_next = add i32 %spins, 1
  %long = call i1 @spun_out(i32 %spins_next, ptr %spin_start)
  br i1 %long, label %sleep, label %relax
relax:
  call void @cpu_relax()
  br label %spin
sleep:
  %sleepers_before = atomicrmw add ptr @sleepers, i32 1 seq_cst
  %seen64 = zext i32 %seen to i64
  %waited = call i64 (i64, ...) @syscall(i64 {sys_futex}, ptr @generation, i64 {futex_wait}, i64 %seen64, ptr null, ptr null, i64 0)
  %sleepers_after = atomicrmw sub ptr @sleepers, i32 1 seq_cst
  br label %spin
work:
  ; a worker beyond this job's thread count sits it out
  %word_high = lshr i64 %word, 32
  %parts_field = trunc i64 %word_high to i32
  %now_parts = and i32 %parts_field, 65535
  %word_top = lshr i64 %word, 48
  %now_threads = trunc i64 %word_top to i32
  %index32 = trunc i64 %index to i32
  %member = icmp ult i32 %index32, %now_threads
  br i1 %member, label %take_parts, label %wait
take_parts:
  call void @run_parts(i32 %now, i32 %now_parts, i32 %now_threads, i32 %index32)
  ; take the claim line back while idle: the caller read it when it looked for parts to steal,
  ; and the next launch's claim would otherwise wait for that copy to go. A CAS of the value to
  ; itself: a stealer's claim of a later job in between is kept.
  %claim_at = getelementptr [{max_threads} x {{ i64, [56 x i8] }}], ptr @claimed_parts, i64 0, i64 %index, i32 0
  %mine = load atomic i64, ptr %claim_at monotonic, align 8
  %kept = cmpxchg ptr %claim_at, i64 %mine, i64 %mine monotonic monotonic
  br label %wait
}}

; In a forked child no worker thread exists: start them again on the next launch.
define internal void @reset_after_fork() {{
  store i32 0, ptr @started_threads
  store i32 0, ptr @pool_lock
  store i32 -1, ptr @excluded_cpu
  store [{max_threads} x i32] zeroinitializer, ptr @worker_tid   ; the parent's threads
  ret void
}}

; Called with the lock held: decide the thread count once, then start the missing workers.
define internal void @start_pool() {{
entry:
  %tid = alloca i64
  %wanted_now = load i32, ptr @wanted_threads
  %unset = icmp sle i32 %wanted_now, 0
  br i1 %unset, label %count_cpus, label %atfork
count_cpus:
  %cpus = call i64 @sysconf(i32 {sc_nprocessors_onln})
  %env = call ptr @getenv(ptr @threads_env)
  %has_env = icmp ne ptr %env, null
  br i1 %has_env, label %parse_env, label %clamp
parse_env:
  %from_env = call i32 @atoi(ptr %env)
  %env_positive = icmp sgt i32 %from_env, 0
  %from_env64 = sext i32 %from_env to i64
  %chosen = select i1 %env_positive, i64 %from_env64, i64 %cpus
  br label %clamp
clamp:
  %n = phi i64 [ %cpus, %count_cpus ], [ %chosen, %parse_env ]
  %too_many = icmp sgt i64 %n, {max_threads}
  %n_capped = select i1 %too_many, i64 {max_threads}, i64 %n
  %too_few = icmp slt i64 %n_capped, 1
  %n_clamped = select i1 %too_few, i64 1, i64 %n_capped
  %n32 = trunc i64 %n_clamped to i32
  store i32 %n32, ptr @wanted_threads
  br label %atfork
atfork:
  %registered = load i32, ptr @atfork_done
  %register_now = icmp eq i32 %registered, 0
  br i1 %register_now, label %register, label %affinity
register:
  %atfork_rc = call i32 @lorien_libc_atfork(ptr null, ptr null, ptr @reset_after_fork, ptr null)
  store i32 1, ptr @atfork_done
  br label %affinity
affinity:
  %allowed_before = load i32, ptr @allowed_known
  %read_allowed = icmp eq i32 %allowed_before, 0
  br i1 %read_allowed, label %read_affinity, label %spawn_check
read_affinity:
  %mask_bytes = call i64 (i64, ...) @syscall(i64 {sys_sched_getaffinity}, i64 0, i64 {affinity_bytes}, ptr @allowed_cpus)
  %mask_read = icmp sgt i64 %mask_bytes, 0
  %mask_known = zext i1 %mask_read to i32
  store i32 %mask_known, ptr @allowed_known
  br label %spawn_check
spawn_check:
  %started = load i32, ptr @started_threads
  %wanted = load i32, ptr @wanted_threads
  %workers = sub i32 %wanted, 1
  %missing = icmp slt i32 %started, %workers
  br i1 %missing, label %spawn, label %out
spawn:
  %index = add i32 %started, 1
  %generation_now = load atomic i32, ptr @generation monotonic, align 4
  %index64 = sext i32 %index to i64
  %slot = getelementptr [{max_threads} x i32], ptr @initial_generation, i64 0, i64 %index64
  store i32 %generation_now, ptr %slot
  %tid_slot = getelementptr [{max_threads} x i32], ptr @worker_tid, i64 0, i64 %index64
  store atomic i32 0, ptr %tid_slot release, align 4
  %arg = inttoptr i64 %index64 to ptr
  %create_rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @worker_main, ptr %arg)
  %created = icmp eq i32 %create_rc, 0
  br i1 %created, label %detach, label %give_up
detach:
  %thread = load i64, ptr %tid
  %detach_rc = call i32 @pthread_detach(i64 %thread)
  store i32 %index, ptr @started_threads
  store i32 -1, ptr @excluded_cpu     ; the new worker may run anywhere until the next wake-up
  br label %spawn_check
give_up:
  ; no more threads can be made: run with those there are
  store i32 %index, ptr @wanted_threads
  br label %out
out:
  ret void
}}

define i32 @lorien_num_threads() {{
entry:
  %wanted = load i32, ptr @wanted_threads
  %unset = icmp sle i32 %wanted, 0
  br i1 %unset, label %init, label %done
init:
  call void @lock()
  call void @start_pool()
  call void @unlock()
  br label %done
done:
  %threads = load i32, ptr @wanted_threads
  ret i32 %threads
}}

define void @lorien_set_num_threads(i32 %n) {{
  call void @lock()
  %too_few = icmp slt i32 %n, 1
  %at_least_one = select i1 %too_few, i32 1, i32 %n
  %too_many = icmp sgt i32 %at_least_one, {max_threads}
  %clamped = select i1 %too_many, i32 {max_threads}, i32 %at_least_one
  store i32 %clamped, ptr @wanted_threads
  call void @unlock()
  ret void
}}

; How many parts a loop of %n iterations is cut into: a few per thread, so that a descheduled
; thread holds back at most a small part; of those counts (multiples of %threads, 2 to
; {parts_per_thread} per thread) the largest that divides %n, so that every thread's share is the same
; number of iterations (28 rows: 4 parts of 7, not 8 parts of 3 or 4, which two threads
; claiming in turn split 12 / 16); else that many parts of sizes differing by one; %n itself
; when it is smaller.
define internal i32 @part_count(i64 %n, i32 %threads) {{
entry:
  %threads64 = sext i32 %threads to i64
  %most = mul i64 %threads64, {parts_per_thread}
  %few = icmp slt i64 %n, %most
  br i1 %few, label %all, label %search
all:
  %n32 = trunc i64 %n to i32
  ret i32 %n32
search:
  %p = phi i64 [ %most, %entry ], [ %p_next, %next ]
  %rest = urem i64 %n, %p
  %divides = icmp eq i64 %rest, 0
  br i1 %divides, label %found, label %next
next:
  %p_next = sub i64 %p, %threads64
  %fewest = mul i64 %threads64, 2
  %more = icmp sge i64 %p_next, %fewest
  br i1 %more, label %search, label %fallback
found:
  %p32 = trunc i64 %p to i32
  ret i32 %p32
fallback:
  %most32 = trunc i64 %most to i32
  ret i32 %most32
}}

; fn(ctx, begin, end) over [0, n): on the pool, or serially inside another parallel loop.
define void @lorien_parallel_for(ptr %fn, ptr %ctx, i64 %n) {{
entry:
  %spin_start = alloca i64
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %return, label %try_lock
try_lock:
  %pair = cmpxchg ptr @pool_lock, i32 0, i32 1 acquire monotonic
  %locked = extractvalue {{ i32, i1 }} %pair, 1
  br i1 %locked, label %pool, label %serial
serial:
  call void %fn(ptr %ctx, i64 0, i64 %n)
  br label %return
pool:
  call void @start_pool()
  %wanted = load i32, ptr @wanted_threads
  %started = load i32, ptr @started_threads
  %available = add i32 %started, 1
  %fewer = icmp slt i32 %wanted, %available
  %threads = select i1 %fewer, i32 %wanted, i32 %available
  %one_thread = icmp sle i32 %threads, 1
  %one_iteration = icmp eq i64 %n, 1
  %alone = or i1 %one_thread, %one_iteration
  br i1 %alone, label %run_alone, label %launch
run_alone:
  call void @unlock()
  call void %fn(ptr %ctx, i64 0, i64 %n)
  br label %return
launch:
  %parts = call i32 @part_count(i64 %n, i32 %threads)
  %caller_cpu = call i32 @sched_getcpu()
  call void @keep_workers_off(i32 %caller_cpu, i32 %started)
  %last_id = load atomic i32, ptr @generation monotonic, align 4
  %id = add i32 %last_id, 1
  store ptr %fn, ptr getelementptr inbounds (i8, ptr @generation, i64 16)
  store ptr %ctx, ptr getelementptr inbounds (i8, ptr @generation, i64 24)
  store i64 %n, ptr getelementptr inbounds (i8, ptr @generation, i64 8)
  ; one store of the job word: a worker reads the id, the part count and the thread count together
  %id64 = zext i32 %id to i64
  %parts_word = zext i32 %parts to i64
  %parts_high = shl i64 %parts_word, 32
  %threads_word = zext i32 %threads to i64
  %threads_high = shl i64 %threads_word, 48
  %parts_id = or i64 %parts_high, %id64
  %word = or i64 %threads_high, %parts_id
  ; sequentially consistent with the load of sleepers after it: a release store could become
  ; visible after that load, which then sees no sleeper while a worker going to sleep reads
  ; the old id in futex_wait, and the worker misses this job's wake
  store atomic i64 %word, ptr @generation seq_cst, align 8
  %sleeping = load atomic i32, ptr @sleepers seq_cst, align 4
  %wake = icmp sgt i32 %sleeping, 0
  br i1 %wake, label %wake_up, label %own_share
wake_up:
  %woken = call i64 (i64, ...) @syscall(i64 {sys_futex}, ptr @generation, i64 {futex_wake}, i64 {max_threads}, ptr null, ptr null, i64 0)
  br label %own_share
own_share:
  call void @run_parts(i32 %id, i32 %parts, i32 %threads, i32 0)
  %all_parts = zext i32 %parts to i64
  br label %join
join:
  %spins = phi i32 [ 0, %own_share ], [ %spins_next, %relax ], [ %spins_next, %yield ]
  %finished = call i64 @parts_finished(i32 %id, i32 %threads)
  %all_done = icmp sge i64 %finished, %all_parts
  br i1 %all_done, label %release, label %count
count:
  %spins_next = add i32 %spins, 1
  %long = call i1 @spun_out(i32 %spins_next, ptr %spin_start)
  br i1 %long, label %yield, label %relax
relax:
  call void @cpu_relax()
  br label %join
yield:
  %yielded = call i32 @sched_yield()
  br label %join
release:
  call void @unlock()
  br label %return
return:
  ret void
}}

; Seconds taken by %number calls of fn(args), timed without the interpreter.
define double @lorien_time(ptr %fn, ptr %args, i64 %number) {{
entry:
  %start = alloca [2 x i64]
  %stop = alloca [2 x i64]
  %rc_start = call i32 @clock_gettime(i32 {clock_monotonic}, ptr %start)
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i_next, %body ]
  %more = icmp slt i64 %i, %number
  br i1 %more, label %body, label %end
body:
  call void %fn(ptr %args)
  %i_next = add i64 %i, 1
  br label %loop
end:
  %rc_stop = call i32 @clock_gettime(i32 {clock_monotonic}, ptr %stop)
  %start_s = load i64, ptr %start
  %stop_s = load i64, ptr %stop
  %start_ns_at = getelementptr [2 x i64], ptr %start, i64 0, i64 1
  %stop_ns_at = getelementptr [2 x i64], ptr %stop, i64 0, i64 1
  %start_ns = load i64, ptr %start_ns_at
  %stop_ns = load i64, ptr %stop_ns_at
  %seconds = sub i64 %stop_s, %start_s
  %nanoseconds = sub i64 %stop_ns, %start_ns
  %seconds_f = sitofp i64 %seconds to double
  %nanoseconds_f = sitofp i64 %nanoseconds to double
  %fraction = fmul double %nanoseconds_f, 1.0e-9
  %elapsed = fadd double %seconds_f, %fraction
  ret double %elapsed
}}

define ptr @lorien_alloc(i64 %nbytes) {{
entry:
  %out = alloca ptr
  store ptr null, ptr %out
  %tiny = icmp slt i64 %nbytes, 64
  %size = select i1 %tiny, i64 64, i64 %nbytes
  %rc = call i32 @posix_memalign(ptr %out, i64 64, i64 %size)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %done, label %failed
done:
  %memory = load ptr, ptr %out
  ret ptr %memory
failed:
  ret ptr null
}}

define void @lorien_free(ptr %memory) {{
  call void @free(ptr %memory)
  ret void
}}
"""


class RuntimeIRError(RuntimeError):
    """This machine's architecture has no IR runtime (the C runtime may still build)."""


def ir_text(machine: str | None = None) -> str:
    """The runtime module's LLVM IR for ``machine`` (``platform.machine()`` by default)."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise RuntimeIRError(f"no IR runtime for machine {machine!r} (known: {', '.join(_ARCHES)})")
    syscalls, pause_declaration, pause_call = _ARCHES[machine]
    return IR_TEMPLATE.format(
        max_threads=MAX_THREADS, spin_ns=SPIN_NS, worker_slice_ns=WORKER_SLICE_NS,
        affinity_bytes=AFFINITY_BYTES, affinity_words=AFFINITY_BYTES // 8, affinity_bits=AFFINITY_BYTES * 8,
        **{f"sys_{name}": number for name, number in syscalls.items()}, clock_every=CLOCK_EVERY, clock_mask=CLOCK_EVERY - 1, parts_per_thread=PARTS_PER_THREAD,
        futex_wait=FUTEX_WAIT_PRIVATE, futex_wake=FUTEX_WAKE_PRIVATE,
        sc_nprocessors_onln=SC_NPROCESSORS_ONLN, clock_monotonic=CLOCK_MONOTONIC,
        pause_declaration=pause_declaration, pause_call=pause_call)


_KEEP: list = []  # the execution engine owns the runtime's code: it lives as long as the process


def build() -> dict[str, int]:
    """JIT the runtime; returns the address of each exported function."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    libc = ctypes.CDLL(None)
    for name in LIBC_FUNCTIONS:
        llvm.add_symbol(name, _address(libc, name))
    atfork = next((name for name in ATFORK_FUNCTIONS if hasattr(libc, name)), None)
    if atfork is None:
        raise RuntimeIRError(f"the C library exports none of {ATFORK_FUNCTIONS}")
    llvm.add_symbol("lorien_libc_atfork", _address(libc, atfork))
    module = llvm.parse_assembly(ir_text())
    module.triple = llvm.get_process_triple()
    module.verify()
    machine = llvm.Target.from_triple(module.triple).create_target_machine(opt=2, codemodel="jitdefault")
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    _KEEP.append(engine)
    return {name: engine.get_function_address(name) for name in EXPORTS}


def _address(library: ctypes.CDLL, name: str) -> int:
    try:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    except AttributeError as exc:
        raise RuntimeIRError(f"the C library does not export {name!r}, which the runtime calls") from exc
