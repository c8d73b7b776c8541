"""Measurement: every candidate becomes a result with TVM's error code, with real JIT-compiled kernels."""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import psutil
import pytest

from lorien.engine import ops, reference, te
from lorien.engine.measure import (
    Builder,
    CpuGate,
    MeasureInput,
    MeasureOption,
    MeasureResult,
    Runner,
    keeping_fastest,
    measure_batch,
)
from lorien.engine.schedule import create_schedule
from lorien.errors import LorienError
from lorien.record import ErrorNo


def dense_candidate(n: int, tile: int):
    data, weight = te.placeholder((n, n), name="data"), te.placeholder((n, n), name="weight")
    out = ops.dense(data, weight)
    s = create_schedule(out)
    i, j = s[out].op.axis
    jo, ji = s[out].split(j, factor=tile)
    s[out].vectorize(ji)
    s[out].parallel(i)
    return s, [data, weight, out]


def invalid_split_candidate():
    s, args = dense_candidate(16, 4)
    s[args[-1]].split("no_such_axis", factor=2)
    return s, args


def out_of_bounds_candidate():
    a = te.placeholder((16,), name="a")
    out = te.compute((16,), lambda i: a[i * (1 << 40)] + 1.0, name="out")
    return create_schedule(out), [a, out]


def endless_candidate():
    a = te.placeholder((4,), name="a")
    k = te.reduce_axis(1 << 40, name="k")
    out = te.compute((4,), lambda i: te.sum(a[i] * 1.0, axis=k), name="out")
    return create_schedule(out), [a, out]


def int_exp_candidate():
    a = te.placeholder((4,), "int64", name="a")
    out = te.compute((4,), lambda i: te.exp(a[i]), name="out")
    return create_schedule(out), [a, out]


def slow_builder():
    time.sleep(30)
    return dense_candidate(8, 4)


def wrong_reference(data, weight):
    return reference.dense(data, weight) + 1.0


def reference_of_aligned_inputs(data, weight):
    """The right answer only when the runner handed 64-byte aligned inputs (the arrays the
    kernel ran on are the ones the reference sees)."""
    misaligned = [a.ctypes.data % 64 for a in (data, weight) if a.ctypes.data % 64]
    return reference.dense(data, weight) + float(len(misaligned))


@pytest.fixture(scope="module")
def measure_parts():
    builder, runner = Builder.create("local", n_parallel=2), Runner.create("local")
    yield builder, runner
    builder.pool.shutdown()
    runner.pool.shutdown()


def _measure(parts, candidates, **option):
    builder, runner = parts
    opts = MeasureOption(build_timeout_s=option.pop("build_timeout_s", 20), run_timeout_s=option.pop("run_timeout_s", 5),
                         **option)
    return measure_batch(candidates, opts, builder, runner)


def test_valid_candidate_is_checked_and_timed(measure_parts):
    inp = MeasureInput(functools.partial(dense_candidate, 32, 8), reference.dense)
    (result,) = _measure(measure_parts, [inp], repeat=3)
    assert result.error_no == ErrorNo.NO_ERROR, result.error_msg
    assert len(result.costs) == 3 and all(0 < c < 1 for c in result.costs)
    assert result.all_cost > 0 and result.timestamp > 0


def test_a_candidate_that_cannot_beat_the_fastest_so_far_stops_its_repeats(measure_parts):
    builder, runner = measure_parts
    inp = MeasureInput(functools.partial(dense_candidate, 32, 8), reference.dense)
    option = MeasureOption(repeat=3, build_timeout_s=20, run_timeout_s=5)
    (slow,) = measure_batch([inp], option, builder, runner, best_cost_s=1e-12)
    (kept,) = measure_batch([inp], replace(option, stop_slower_repeats=False), builder, runner, best_cost_s=1e-12)
    (unknown,) = measure_batch([inp], option, builder, runner)
    assert slow.ok and len(slow.costs) == 1, slow.costs  # 3 x 1e-12 s: one repeat already sums to more
    assert len(kept.costs) == 3 and len(unknown.costs) == 3


def test_the_fastest_so_far_includes_the_candidates_of_the_batch_timed_before(measure_parts):
    builder, runner = measure_parts
    fast = MeasureInput(functools.partial(dense_candidate, 8, 8), reference.dense)
    slow = MeasureInput(functools.partial(dense_candidate, 384, 1), reference.dense)  # ~100,000x the work
    results = measure_batch([fast, slow, slow], MeasureOption(repeat=3, run_timeout_s=20), builder, runner)
    assert [len(result.costs) for result in results] == [3, 1, 1], [result.costs for result in results]


def test_candidates_built_ahead_are_handed_to_a_later_call_without_building_again():
    builder = Builder.create("local", n_parallel=2)
    built = []
    pool_map = builder.pool.map
    builder.pool.map = lambda kind, payloads, timeout_s: built.append(len(payloads)) or pool_map(kind, payloads, timeout_s)
    now, first, second, other = (MeasureInput(functools.partial(dense_candidate, 16, tile), reference.dense)
                                 for tile in (1, 2, 4, 8))
    option = MeasureOption(build_timeout_s=20)
    try:
        results = builder.build([now], option, ahead=[first, second])
        results += builder.build([first], option, ahead=[second])
        results += builder.build([second, other], option)
        results += builder.build([second], option)  # asked for already: built again
    finally:
        builder.pool.shutdown()
    assert built == [3, 1, 1]
    assert all(result.error_no == ErrorNo.NO_ERROR for result in results)
    assert results[2].artifact["fn_name"] == results[4].artifact["fn_name"] != results[3].artifact["fn_name"]


def test_keeping_fastest_hands_each_batch_the_fastest_mean_measured_before():
    seen = []

    def measure(candidates, best_cost_s):
        seen.append(best_cost_s)
        return [MeasureResult([cost, cost], ErrorNo.NO_ERROR, 0.0, 0.0) if cost else
                MeasureResult([1e10], ErrorNo.WRONG_ANSWER, 0.0, 0.0) for cost in candidates]

    measure_job = keeping_fastest(measure)
    measure_job([3.0, 0.0, 2.0])
    measure_job([5.0])
    measure_job([1.0])
    assert seen == [math.inf, 2.0, 2.0]


def test_kernels_are_measured_on_64_byte_aligned_arrays(measure_parts):
    inp = MeasureInput(functools.partial(dense_candidate, 20, 4), reference_of_aligned_inputs)
    (result,) = _measure(measure_parts, [inp])
    assert result.error_no == ErrorNo.NO_ERROR, result.error_msg


def test_invalid_schedule_is_an_instantiation_error(measure_parts):
    (result,) = _measure(measure_parts, [MeasureInput(invalid_split_candidate)])
    assert result.error_no == ErrorNo.INSTANTIATION_ERROR
    assert "no_such_axis" in result.error_msg


def test_codegen_failure_is_a_compile_host_error(measure_parts):
    (result,) = _measure(measure_parts, [MeasureInput(int_exp_candidate)])
    assert result.error_no == ErrorNo.COMPILE_HOST
    assert "exp" in result.error_msg


def test_build_that_hangs_is_a_build_timeout(measure_parts):
    (result,) = _measure(measure_parts, [MeasureInput(slow_builder)], build_timeout_s=1)
    assert result.error_no == ErrorNo.BUILD_TIMEOUT


def test_kernel_that_segfaults_is_a_runtime_device_error_and_the_runner_recovers(measure_parts):
    good = MeasureInput(functools.partial(dense_candidate, 16, 8), reference.dense)
    results = _measure(measure_parts, [MeasureInput(out_of_bounds_candidate), good])
    assert results[0].error_no == ErrorNo.RUNTIME_DEVICE
    assert "SIGSEGV" in results[0].error_msg
    assert results[1].ok


def test_kernel_that_hangs_is_a_run_timeout(measure_parts):
    (result,) = _measure(measure_parts, [MeasureInput(endless_candidate)], run_timeout_s=1)
    assert result.error_no == ErrorNo.RUN_TIMEOUT


def test_output_that_differs_from_numpy_is_a_wrong_answer(measure_parts):
    (result,) = _measure(measure_parts, [MeasureInput(functools.partial(dense_candidate, 16, 8), wrong_reference)])
    assert result.error_no == ErrorNo.WRONG_ANSWER
    assert "'dense'" in result.error_msg


def test_unknown_builder_kind_is_rejected():
    with pytest.raises(LorienError, match="unknown builder kind 'rpc'"):
        Builder.create("rpc")


def test_results_come_back_in_input_order(measure_parts):
    inputs = [MeasureInput(invalid_split_candidate),
              MeasureInput(functools.partial(dense_candidate, 16, 4), reference.dense),
              MeasureInput(functools.partial(dense_candidate, 16, 8), wrong_reference)]
    codes = [r.error_no for r in _measure(measure_parts, inputs)]
    assert codes == [ErrorNo.INSTANTIATION_ERROR, ErrorNo.NO_ERROR, ErrorNo.WRONG_ANSWER]
    assert np.isfinite([r.all_cost for r in _measure(measure_parts, inputs[1:2])]).all()


def raising_builder():
    raise ZeroDivisionError("template bug")


def test_builder_that_raises_is_an_instantiation_error_with_its_cause(measure_parts):
    (result,) = _measure(measure_parts, [MeasureInput(raising_builder)])
    assert result.error_no == ErrorNo.INSTANTIATION_ERROR
    assert "ZeroDivisionError: template bug" in result.error_msg


def test_runner_worker_is_recycled_after_max_tasks():
    runner = Runner.create("local")
    runner.pool.max_tasks = 2
    builder = Builder.create("local", n_parallel=1)
    inputs = [MeasureInput(functools.partial(dense_candidate, 8, 4), reference.dense) for _ in range(3)]
    try:
        pids = []
        for inp in inputs:
            results = measure_batch([inp], MeasureOption(), builder, runner)
            assert results[0].ok
            pids.append(runner.pool._idle[0].proc.pid if runner.pool._idle else None)
        assert pids[0] is not None and pids[1] is None and pids[2] is not None and pids[2] != pids[0]
    finally:
        builder.pool.shutdown()
        runner.pool.shutdown()


# A parent process that hands its worker a one-second task, reports the worker's pid and
# waits to be killed; the worker inherits the parent's stderr.
_ORPHANING_PARENT = """
import functools, pickle, sys, time
from lorien.engine.measure import MeasureInput, _Worker
worker = _Worker()
worker.send_conn.send(("build", pickle.dumps(MeasureInput(functools.partial(time.sleep, 1.0)))))
print(worker.proc.pid, flush=True)
time.sleep(60)
"""


def test_worker_whose_parent_is_killed_exits_without_printing():
    parent = subprocess.Popen([sys.executable, "-c", _ORPHANING_PARENT], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    worker_pid = int(parent.stdout.readline())
    parent.kill()  # SIGKILL: no cleanup runs in the parent; the worker is mid-task
    try:
        # The pipes reach end of file once the worker, which holds them too, has exited.
        _, stderr = parent.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        psutil.Process(worker_pid).kill()
        raise
    assert stderr == ""


@pytest.mark.parametrize("name", ["flush_cache", "check_correctness", "stop_slower_repeats", "overlap_runs"])
def test_a_yes_no_measure_option_given_anything_else_is_a_clear_error(name):
    """``maybe`` or a quoted "false" in a config would read as true; it is refused by name."""
    with pytest.raises(TypeError, match=f"{name} must be true or false, got 'maybe'"):
        MeasureOption(**{name: "maybe"})
    assert getattr(MeasureOption(**{name: False}), name) is False


def test_a_runner_draws_a_workloads_inputs_once_and_hands_each_candidate_fresh_copies():
    from types import SimpleNamespace

    from lorien.engine.arrays import ALIGNMENT, logical_arrays
    from lorien.engine.measure import _fresh_logical_arrays

    specs = [SimpleNamespace(name="a", shape=(33, 7), dtype="float32", is_output=False),
             SimpleNamespace(name="b", shape=(5,), dtype="int32", is_output=False),
             SimpleNamespace(name="out", shape=(33,), dtype="float32", is_output=True)]
    first = _fresh_logical_arrays(specs, 3)
    expected = logical_arrays(specs, 3)
    assert all(np.array_equal(got, want) and got.dtype == want.dtype for got, want in zip(first, expected, strict=True))
    assert all(array.ctypes.data % ALIGNMENT == 0 and array.flags.c_contiguous for array in first)
    for array in first:  # a kernel scribbling over its arguments
        array.fill(7)
    second = _fresh_logical_arrays(specs, 3)
    assert all(np.array_equal(got, want) for got, want in zip(second, expected, strict=True))
    assert not any(np.shares_memory(a, b) for a, b in zip(first, second, strict=True))
    assert not np.array_equal(_fresh_logical_arrays(specs, 4)[0], expected[0])  # another seed, other inputs


def test_a_timing_waiting_for_a_core_goes_before_the_next_build():
    """Two cores, both building: a timing of one thread waits for a build to end, and then it,
    not the third build waiting too, takes the freed core; the build starts when the timing ends."""
    gate, events = CpuGate(2), []
    first_done, second_done, timing_done = threading.Event(), threading.Event(), threading.Event()

    def build(name, done):
        with gate.building():
            events.append(f"{name} starts")
            done.wait(5)
        events.append(f"{name} ends")

    def timing():
        with gate.timing(1):
            events.append("timing starts")
            timing_done.wait(5)
        events.append("timing ends")

    builds = [threading.Thread(target=build, args=(name, done))
              for name, done in (("build 1", first_done), ("build 2", second_done))]
    for thread in builds:
        thread.start()
    _wait_for(lambda: len(events) == 2)
    timer = threading.Thread(target=timing)
    timer.start()
    _wait_for(lambda: gate._timings_waiting == 1)
    third = threading.Thread(target=build, args=("build 3", threading.Event()))
    third.start()
    time.sleep(0.05)
    assert "build 3 starts" not in events  # both cores busy
    first_done.set()
    _wait_for(lambda: "timing starts" in events)
    time.sleep(0.05)
    assert "build 3 starts" not in events  # the freed core went to the timing
    timing_done.set()
    _wait_for(lambda: "build 3 starts" in events)
    second_done.set()
    for thread in (*builds, timer, third):
        thread.join(5)
    assert events.index("timing starts") < events.index("build 3 starts")


def test_a_timing_of_more_threads_than_cores_takes_them_all():
    gate = CpuGate(2)
    with gate.timing(8):
        assert gate._busy == 2
    assert gate._busy == 0


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def _logged(pool, log):
    """``pool.call`` that logs (kind, start, end) of every task."""
    call = pool.call

    def logged_call(kind, payload, timeout_s):
        started = time.monotonic()
        try:
            return call(kind, payload, timeout_s)
        finally:
            log.append((kind, started, time.monotonic()))
    return logged_call


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="overlapping needs a core free of the kernel's threads")
def test_one_thread_candidates_are_timed_while_the_others_build_never_more_tasks_than_cores():
    """Candidates built for one thread (``-num-cores=1``) on a host with more cores: the first
    is timed before the last is built, results come back in input order, each candidate's own
    kernel, and builds plus timings never take more cores than there are; ``overlap_runs: false``
    builds the whole batch first."""
    builder, runner = Builder.create("local", n_parallel=2), Runner.create("local")
    log = []
    builder.pool.call, runner.pool.call = _logged(builder.pool, log), _logged(runner.pool, log)
    inputs = [MeasureInput(functools.partial(dense_candidate, 48, tile), reference.dense, target="llvm -num-cores=1")
              for tile in (1, 2, 4, 8, 16, 1)]
    try:
        overlapped = measure_batch(inputs, MeasureOption(build_timeout_s=20, run_timeout_s=5), builder, runner)
        overlapped_log, log[:] = list(log), []
        serial = measure_batch(inputs, MeasureOption(build_timeout_s=20, run_timeout_s=5, overlap_runs=False),
                               builder, runner)
    finally:
        builder.pool.shutdown()
        runner.pool.shutdown()
    assert all(result.ok for result in overlapped + serial), [r.error_msg for r in overlapped + serial]
    first_run = min(start for kind, start, _ in overlapped_log if kind == "run")
    last_build = max(end for kind, _, end in overlapped_log if kind == "build")
    assert first_run < last_build  # timed while others built
    edges = sorted([(start, 1) for _, start, _ in overlapped_log] + [(end, -1) for _, _, end in overlapped_log])
    busy = peak = 0
    for _, change in edges:
        busy += change
        peak = max(peak, busy)
    assert peak <= 2
    assert max(start for kind, start, _ in log if kind == "build") < min(start for kind, start, _ in log if kind == "run")
    assert len(overlapped) == len(serial) == len(inputs)


def test_candidates_of_all_the_cores_are_built_first_then_timed():
    """A target that runs on every core leaves none to build on: the batch is built, then timed."""
    builder, runner = Builder.create("local", n_parallel=2), Runner.create("local")
    log = []
    builder.pool.call, runner.pool.call = _logged(builder.pool, log), _logged(runner.pool, log)
    inputs = [MeasureInput(functools.partial(dense_candidate, 32, tile), reference.dense) for tile in (1, 2, 4)]
    try:
        results = measure_batch(inputs, MeasureOption(build_timeout_s=20, run_timeout_s=5), builder, runner)
    finally:
        builder.pool.shutdown()
        runner.pool.shutdown()
    assert all(result.ok for result in results)
    assert [kind for kind, _, _ in sorted(log, key=lambda item: item[1])] == ["build"] * 3 + ["run"] * 3
