"""benchmarks/engine.py's timing: warm-up of each block, re-timing, and the pick of a layer's
kernel, on a simulated clock; the launch loops' shared arrays on real kernels (no wall-clock
assertions)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    yield load_benchmark("engine.py", "bench_engine")
    sys.modules.pop("bench_engine", None)


class FakeTime:
    """``time`` for the benchmark module: a clock that sleeps and calls advance."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_blocks_untimed_calls_last_the_warm_up_time(bench, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(bench, "time", clock)
    calls = {"a": 0, "b": 0}

    def kernel(name: str, seconds: float):
        def call() -> None:
            calls[name] += 1
            clock.now += seconds
        return call

    times = bench.paired_samples({"a": kernel("a", 10e-6), "b": kernel("b", 5e-3)}, samples=6, block=6)
    assert [len(found) for found in times.values()] == [6, 6]
    # 10 us calls: 1 ms of untimed calls (about 100) before the 6 timed; a 5 ms call: one untimed
    assert 100 + 6 <= calls["a"] <= 101 + 6
    assert calls["b"] == 1 + 6


class FakeKernel:
    """A kernel whose native fastest run and bound calls cost ``seconds`` on the fake clock; its
    native runs while the second core is taken (``busy_screens``, counted down) cost twice."""

    def __init__(self, clock: FakeTime, seconds: float, busy_screens: int = 0):
        self.clock, self.seconds, self.busy_screens = clock, seconds, busy_screens

    def time(self, *arrays, number: int = 1, repeat: int = 1, warmup: bool = True) -> list[float]:
        factor = 2.0 if self.busy_screens > 0 else 1.0
        self.busy_screens -= 1
        self.clock.now += self.seconds * factor * repeat
        return [self.seconds * factor] * repeat

    def bind(self, *arrays):
        def call() -> None:
            self.clock.now += self.seconds
        return call


def test_a_kernel_screened_while_the_second_core_was_taken_still_wins(bench, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(bench.race, "race", _race_on(bench, clock))
    # the fastest kernel's first screening ran at the one-thread speed (a second job held the
    # other core): screened one after the other, five slower kernels would have been finalists
    candidates = [(f"tile{i}", FakeKernel(clock, (16 + i) * 1e-6), f"config{i}", []) for i in range(5)]
    candidates.append(("packed weight", FakeKernel(clock, 13.5e-6, busy_screens=2), "packed", []))
    label, _, config, _ = bench.pick_fastest(candidates, finalists=4)
    assert (label, config) == ("packed weight", "packed")


def _race_on(bench, clock: FakeTime):
    race = bench.race.race

    def on_fake_clock(calls, **options):
        return race(calls, clock=clock.perf_counter, sleep=clock.sleep, **options)
    return on_fake_clock


def test_the_launch_loops_of_both_sides_share_page_aligned_arrays_and_compute_the_loop(bench, monkeypatch):
    monkeypatch.setattr(bench, "WARM_RUNS", 20)
    monkeypatch.setattr(bench, "SIDE_PAUSE_S", 0.0)
    a, out = bench.launch_arrays(256)
    assert a.ctypes.data % 4096 == 0 and out.ctypes.data % 4096 == 0
    lorien_par, lorien_one = bench._lorien_launch_side(a, out)
    lorien_par(3)
    np.testing.assert_array_equal(out, np.full_like(out, 3.0))        # both rows: 1 * 2 + 1
    out.fill(0.0)
    lorien_one(3)
    np.testing.assert_array_equal(out[0], np.full(256, 3.0, "float32"))  # the serial loop: the first row only
    np.testing.assert_array_equal(out[1], np.zeros(256, "float32"))
    found = bench.bench_launch(rounds=1, with_omp=True)   # checks the shared output of every loop run
    assert set(found) == {"small", "large"} and all(set(size) == {"lorien", "omp"} for size in found.values())


def _count_sets(bench, monkeypatch) -> list[int]:
    sets = []
    once = bench._paired_once

    def counted(calls, samples, block):
        sets.append(samples)
        return once(calls, samples, block)
    monkeypatch.setattr(bench, "_paired_once", counted)
    return sets


def test_a_side_at_its_one_thread_speed_in_most_blocks_has_every_side_timed_again(bench, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(bench, "time", clock)
    sets = _count_sets(bench, monkeypatch)
    first_set_until = 2.0      # the first set (5 blocks a side after a 0.25 s pause each) ends at 2.5 s

    def lorien() -> None:       # 20 us with the pool's worker, 40 us in the first set's first 4 blocks
        clock.now += 40e-6 if clock.now < first_set_until else 20e-6

    def torch() -> None:        # 30 us throughout
        clock.now += 30e-6

    times = bench.paired_samples({"lorien": lorien, "torch": torch}, samples=30, block=6)
    assert sets == [30, 30]
    assert bench.statistics.median(times["lorien"]) == pytest.approx(20e-6)
    assert bench.statistics.median(times["torch"]) == pytest.approx(30e-6)
    assert all(len(found) == 30 for found in times.values())


def test_sides_near_their_minimum_are_timed_once(bench, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(bench, "time", clock)
    sets = _count_sets(bench, monkeypatch)
    counted = {"a": 0, "b": 0}

    def kernel(name: str, seconds: float):
        def call() -> None:
            counted[name] += 1
            clock.now += seconds * (1.5 if counted[name] % 2 else 1.0)   # median at most 1.5x the minimum
        return call

    bench.paired_samples({"a": kernel("a", 20e-6), "b": kernel("b", 30e-6)}, samples=12, block=6)
    assert sets == [12]
