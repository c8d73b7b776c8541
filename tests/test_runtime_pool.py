"""The thread pool under repeated launches: hot (workers spinning), after the workers parked on
the futex, with 1 and 2 threads, both runtime builds; every launch's result is checked and a
hang fails the test (each run is a child process with a timeout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

POOL_SCRIPT = """
import json, time
import numpy as np
from lorien.engine import build, runtime, te
from lorien.engine.runtime_ir import SPIN_NS
from lorien.engine.schedule import create_schedule

def kernel(rows, width):
    a = te.placeholder((rows, width), name="a")
    out = te.compute((rows, width), lambda r, i: a[r, i] * 2.0 + 1.0, name="out")
    s = create_schedule(out)
    s[out].parallel(out.op.axis[0])
    return build(s, [a, out])

small, wide = kernel(2, 64), kernel(37, 256)   # 2 parts; 37 rows in 8 uneven parts
checked = 0
def check(k, rows, width, seed):
    global checked
    x = np.random.default_rng(seed).uniform(-1, 1, (rows, width)).astype("float32")
    y = np.zeros_like(x)
    k(x, y)
    assert np.array_equal(y, x * 2 + 1), (rows, width, seed)
    checked += 1

for threads in (2, 1, 2):
    with runtime.threads(threads):
        assert runtime.num_threads() == threads
        for i in range(300):                   # hot: back to back, workers awake
            check(small if i % 2 else wide, *((2, 64) if i % 2 else (37, 256)), i)
        x, y = np.ones((37, 256), "float32"), np.zeros((37, 256), "float32")
        wide.time(x, y, number=2000, repeat=1)  # 2000 launches from the native timing loop
        assert np.array_equal(y, x * 3)
        for i in range(8):                     # cold: the workers have parked on the futex
            time.sleep(3 * SPIN_NS / 1e9)
            check(wide, 37, 256, 1000 + i)
print(json.dumps({"runtime": runtime.backend(), "checked": checked}))
"""


@pytest.mark.parametrize("runtime", ["llvm", "c"])
def test_pool_survives_repeated_hot_and_cold_launches_with_1_and_2_threads(tmp_path, runtime):
    env = {**os.environ, "LORIEN_RUNTIME": runtime, "LORIEN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO_ROOT), "LORIEN_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", POOL_SCRIPT], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"runtime": runtime, "checked": 3 * (300 + 8)}


def test_spinning_is_bounded_in_time_not_in_pause_instructions():
    from lorien.engine import runtime_ir

    text = runtime_ir.ir_text("x86_64")
    assert "@spun_out" in text and "@clock_gettime" in text
    assert str(runtime_ir.SPIN_NS) in text
    # the job ticket (generation and the job) shares one line; the sleeper count has its own,
    # and each thread's claim and done counters a line each (8 + 56 bytes)
    assert "@generation = internal global { i32, i32, i64, ptr, ptr, [32 x i8] }" in text
    for counter in ("@claimed_parts", "@finished_parts", "@sleepers"):
        assert f"{counter} = internal global [" in text and "align 64" in text.split(counter, 1)[1].split("\n")[0]
    for counter in ("@claimed_parts", "@finished_parts"):
        assert f"{counter} = internal global [256 x {{ i64, [56 x i8] }}]" in text


PLACEMENT_SCRIPT = """
import ctypes, json, os, time
import numpy as np
from lorien.engine import build, te
from lorien.engine.runtime_ir import SPIN_NS
from lorien.engine.schedule import create_schedule

a = te.placeholder((2, 64), name="a")
out = te.compute((2, 64), lambda r, i: a[r, i] + 1.0, name="out")
s = create_schedule(out)
s[out].parallel(out.op.axis[0])
kernel = build(s, [a, out])
x, y = np.zeros((2, 64), "float32"), np.zeros((2, 64), "float32")
kernel(x, y)                           # starts the pool
workers = [int(tid) for tid in os.listdir("/proc/self/task") if int(tid) != os.getpid()]
for _ in range(100):                   # a loaded machine may start the worker late
    time.sleep(3 * SPIN_NS / 1e9)      # the worker parks on the futex
    kernel(x, y)                       # and is woken: kept off this thread's CPU once it has started
    if all(len(os.sched_getaffinity(tid)) < len(os.sched_getaffinity(0)) for tid in workers):
        break
assert np.array_equal(y, x + 1)
slices = {}
for tid in workers:
    for line in open(f"/proc/self/task/{tid}/sched"):
        if line.startswith("se.slice"):
            slices[tid] = int(line.split(":")[1])
print(json.dumps({"allowed": sorted(os.sched_getaffinity(0)),
                  "workers": {tid: sorted(os.sched_getaffinity(tid)) for tid in workers},
                  "slices": slices}))
"""


@pytest.mark.parametrize("runtime", ["llvm", "c"])
def test_a_woken_worker_is_kept_off_the_callers_cpu_and_asks_for_a_short_slice(tmp_path, runtime):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: there is no other CPU to keep the worker on")
    env = {**os.environ, "LORIEN_RUNTIME": runtime, "LORIEN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO_ROOT), "LORIEN_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PLACEMENT_SCRIPT], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    (worker_cpus,) = found["workers"].values()   # LORIEN_NUM_THREADS=2: the caller and one worker
    assert set(worker_cpus) < set(found["allowed"]) and len(worker_cpus) == len(found["allowed"]) - 1
    from lorien.engine.runtime_ir import WORKER_SLICE_NS

    if found["slices"] and tuple(map(int, os.uname().release.split(".")[:2])) >= (6, 12):
        assert list(found["slices"].values()) == [WORKER_SLICE_NS]


PARTS_SCRIPT = """
import ctypes, json
from lorien.engine import runtime

BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
parallel_for = ctypes.CFUNCTYPE(None, BODY, ctypes.c_void_p, ctypes.c_int64)(
    runtime.symbol_addresses()["lorien_parallel_for"])
ranges = {}
for n in (2, 26, 28, 37, 112):
    seen = []
    body = BODY(lambda ctx, begin, end: seen.append((begin, end)))
    parallel_for(body, None, n)
    ranges[n] = sorted(seen)
print(json.dumps(ranges))
"""


def _cut(n: int, parts: int) -> list[list[int]]:
    return [[p * n // parts, (p + 1) * n // parts] for p in range(parts)]


@pytest.mark.parametrize("runtime", ["llvm", "c"])
def test_a_loop_is_cut_into_parts_that_give_each_thread_the_same_share(tmp_path, runtime):
    """With 2 threads: the most parts (2-4 per thread) whose count divides the loop, so that
    the two threads claiming in turn run as many iterations each; else 8 parts whose sizes
    differ by at most one; each iteration in exactly one part."""
    env = {**os.environ, "LORIEN_RUNTIME": runtime, "LORIEN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO_ROOT), "LORIEN_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", PARTS_SCRIPT], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ranges = {int(n): parts for n, parts in json.loads(done.stdout).items()}
    assert ranges == {2: _cut(2, 2),      # fewer iterations than 8 parts: one each
                      26: _cut(26, 8),    # no count of 4-8 parts divides 26: 8 parts of 3 or 4
                      28: _cut(28, 4),    # 4 parts of 7, not 8 parts of 3 or 4 (12 / 16 rows)
                      37: _cut(37, 8),
                      112: _cut(112, 8)}


HOME_PARTS_SCRIPT = """
import ctypes, json, platform, threading
import llvmlite.binding as llvm
import numpy as np
from lorien.engine import runtime, runtime_ir

# A probe body in LLVM IR: each iteration of [begin, end) records the thread that ran it, and
# each part lasts 50 us, so an awake worker has claimed its own parts before the caller has
# finished its own and would look for parts to steal.
PROBE = '''
declare i64 @syscall(i64, ...)
declare i32 @clock_gettime(i32, ptr)
define internal i64 @now_ns() {
  %ts = alloca [2 x i64]
  %rc = call i32 @clock_gettime(i32 1, ptr %ts)
  %s = load i64, ptr %ts
  %ns_at = getelementptr [2 x i64], ptr %ts, i64 0, i64 1
  %ns = load i64, ptr %ns_at
  %s_ns = mul i64 %s, 1000000000
  %t = add i64 %s_ns, %ns
  ret i64 %t
}
define void @probe(ptr %ctx, i64 %begin, i64 %end) {
entry:
  %tid = call i64 (i64, ...) @syscall(i64 GETTID)
  %tid32 = trunc i64 %tid to i32
  %start = call i64 @now_ns()
  br label %spin
spin:
  %t = call i64 @now_ns()
  %elapsed = sub i64 %t, %start
  %more = icmp slt i64 %elapsed, 50000
  br i1 %more, label %spin, label %record
record:
  %i = phi i64 [ %begin, %spin ], [ %i_next, %record ]
  %at = getelementptr i32, ptr %ctx, i64 %i
  store i32 %tid32, ptr %at
  %i_next = add i64 %i, 1
  %again = icmp slt i64 %i_next, %end
  br i1 %again, label %record, label %done
done:
  ret void
}
'''.replace("GETTID", str(runtime_ir._ARCHES[platform.machine()][0]["gettid"]))
addresses = runtime.symbol_addresses()
llvm.initialize_native_target(); llvm.initialize_native_asmprinter()
libc = ctypes.CDLL(None)
for name in ("syscall", "clock_gettime"):
    llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
module = llvm.parse_assembly(PROBE)
module.triple = llvm.get_process_triple()
engine = llvm.create_mcjit_compiler(module, llvm.Target.from_triple(module.triple).create_target_machine())
engine.finalize_object()
parallel_for = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(addresses["lorien_parallel_for"])
probe = engine.get_function_address("probe")
ran_by = np.zeros(4, "int32")
launches = []
for i in range(300):                    # back to back: the worker spins between launches
    ran_by[:] = 0
    parallel_for(probe, ran_by.ctypes.data, 4)
    if i >= 20:
        launches.append(ran_by.tolist())
print(json.dumps({"caller": threading.get_native_id(), "launches": launches}))
"""


@pytest.mark.parametrize("runtime", ["llvm", "c"])
def test_with_the_workers_awake_each_thread_runs_its_own_parts(tmp_path, runtime):
    """4 parts over 2 threads: the caller's home parts are 0 and 1, the worker's 2 and 3, the
    same every launch (as OpenMP's schedule(static)), so a part's data stays in one core's
    cache. Claiming from one shared counter gave part 1 to whichever thread came first (the
    worker, when awake). A thread steals only what the other has not claimed, so on a loaded
    machine a descheduled worker's parts run on the caller: only launches in which the worker
    ran a part are counted, and most (not all) of them must be the static split."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the worker and the caller cannot run at once")
    env = {**os.environ, "LORIEN_RUNTIME": runtime, "LORIEN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO_ROOT), "LORIEN_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", HOME_PARTS_SCRIPT], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    caller, launches = found["caller"], found["launches"]
    assert all(0 not in ran_by for ran_by in launches)          # every part ran, in every launch
    with_worker = [ran_by for ran_by in launches if any(tid != caller for tid in ran_by)]
    assert len(with_worker) >= 20, f"the worker ran a part in only {len(with_worker)} of {len(launches)} launches"
    static = [ran_by for ran_by in with_worker
              if ran_by[:2] == [caller, caller] and ran_by[2] == ran_by[3] != caller]
    assert len(static) >= 0.75 * len(with_worker), with_worker[:10]
