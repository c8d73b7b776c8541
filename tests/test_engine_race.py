"""lorien.engine.race: the fastest of a few kernels picked on a simulated shared machine (a clock
that the calls advance), and on real kernels whose outputs stay bit-close to NumPy."""

from __future__ import annotations

import functools
import statistics

import numpy as np
import pytest

from lorien.engine import build, race, reference
from lorien.engine.arrays import aligned_zeros
from lorien.engine.x86 import dense_candidate, dense_gemv_candidate, vector_lanes


class SharedMachine:
    """A simulated clock. A call of a kernel costs its intrinsic seconds, or twice that when the
    pool's second thread misses it (another process holds the second core, so the calling
    thread runs every part itself). The other process takes the core for windows of
    ``window_s`` of simulated time, each with probability ``miss_rate`` (seeded; a window of 0:
    call by call), and for good from ``busy_from`` for ``busy_for`` seconds."""

    def __init__(self, miss_rate: float = 0.0, seed: int = 0, busy_from: float = 0.0, busy_for: float = 0.0,
                 window_s: float = 0.0):
        self.now, self.miss_rate, self.busy_from, self.busy_for = 0.0, miss_rate, busy_from, busy_for
        self.rng, self.window_s, self.windows = np.random.default_rng(seed), window_s, {}
        self.log: list[str] = []

    def missed(self) -> bool:
        if self.busy_from <= self.now < self.busy_from + self.busy_for:
            return True
        if not self.window_s:
            return self.rng.random() < self.miss_rate
        window = int(self.now / self.window_s)
        if window not in self.windows:
            self.windows[window] = self.rng.random() < self.miss_rate
        return self.windows[window]

    def kernel(self, name: str, seconds: float):
        def call() -> None:
            self.log.append(name)
            self.now += seconds * (2.0 if self.missed() else 1.0)
        return call

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def old_pick(machine: SharedMachine, kernels: dict[str, float], calls: int = 24, block: int = 6) -> str:
    """The pick the race replaced in benchmarks/engine.py: blocks of 6 calls of each kernel in
    turn (after a pause and an untimed call), the fastest median of 24 calls wins."""
    times: dict[str, list[float]] = {name: [] for name in kernels}
    calls_of = {name: machine.kernel(name, seconds) for name, seconds in kernels.items()}
    while min(len(found) for found in times.values()) < calls:
        for name, call in calls_of.items():
            machine.sleep(0.25)
            call()
            for _ in range(block):
                start = machine.clock()
                call()
                times[name].append(machine.clock() - start)
    return min(times, key=lambda name: statistics.median(times[name]))


# A 14 us kernel (the weight packed beforehand) and a 20 us one (a GEMV), as at 1x768x768.
KERNELS = {"gemv": 20e-6, "packed weight": 14e-6}


def test_the_median_of_few_calls_flips_with_the_second_threads_misses_the_race_does_not():
    # the second thread misses half the calls (a loaded 2-core host): the median of 24 calls is
    # the 14 us or the 28 us mode by a coin toss, and picked the slower kernel for some seeds
    fooled = [seed for seed in range(20) if old_pick(SharedMachine(0.5, seed), KERNELS) == "gemv"]
    assert fooled, "the scenario should fool the old pick for some seed"
    for seed in fooled:
        machine = SharedMachine(0.5, seed)
        calls = {name: machine.kernel(name, seconds) for name, seconds in KERNELS.items()}
        result = race.race(calls, rounds=9, clock=machine.clock, sleep=machine.sleep)
        assert result.winner == "packed weight", seed
        assert result.score["gemv"] == pytest.approx(20 / 14)


def test_turns_that_the_other_process_takes_whole_do_not_decide_the_race():
    # as measured at load average 10: the second core is taken for whole windows of a few ms,
    # so a turn runs at 2x throughout or not at all; 4 near-equal candidates and a faster one
    kernels = {"a": 16e-6, "b": 16.5e-6, "c": 17e-6, "fast": 14e-6}
    for seed in range(20):
        machine = SharedMachine(0.5, seed, window_s=0.004)
        calls = {name: machine.kernel(name, seconds) for name, seconds in kernels.items()}
        result = race.race(calls, rounds=9, clock=machine.clock, sleep=machine.sleep)
        assert result.winner == "fast", seed


def test_a_busy_second_core_for_a_while_does_not_decide_the_race():
    # the other core is taken for the first 30 ms: the first rounds are all slow, for both
    machine = SharedMachine(busy_from=0.0, busy_for=0.03)
    calls = {name: machine.kernel(name, seconds) for name, seconds in KERNELS.items()}
    result = race.race(calls, rounds=9, clock=machine.clock, sleep=machine.sleep)
    assert result.winner == "packed weight"
    assert result.score["packed weight"] == 1.0 and result.score["gemv"] == pytest.approx(20 / 14)


def test_a_round_in_which_the_whole_machine_is_slow_moves_no_score():
    machine = SharedMachine(busy_from=0.0, busy_for=1e9)   # busy all along: everything twice as slow
    calls = {name: machine.kernel(name, seconds) for name, seconds in KERNELS.items()}
    result = race.race(calls, rounds=5, clock=machine.clock, sleep=machine.sleep)
    assert result.winner == "packed weight"
    assert result.score["gemv"] == pytest.approx(20 / 14)
    assert result.seconds["packed weight"] == pytest.approx(28e-6)


def test_turns_rotate_so_no_candidate_always_goes_first():
    machine = SharedMachine()
    calls = {name: machine.kernel(name, 1e-3) for name in ("a", "b", "c")}
    race.race(calls, rounds=3, min_calls=1, turn_budget_s=0.0, pause_s=0.0, clock=machine.clock, sleep=machine.sleep)
    # each turn: one untimed call and one timed call
    firsts = [machine.log[i] for i in range(0, len(machine.log), 6)]
    assert firsts == ["a", "b", "c"]


def test_a_turn_is_time_budgeted_short_kernels_get_more_calls():
    machine = SharedMachine()
    calls = {"short": machine.kernel("short", 10e-6), "long": machine.kernel("long", 1e-3)}
    result = race.race(calls, rounds=2, turn_budget_s=0.002, min_calls=6, max_calls=400,
                       clock=machine.clock, sleep=machine.sleep)
    assert 2 * 200 <= result.calls["short"] <= 2 * 201     # 2 ms of 10 us calls each round (float sums)
    assert result.calls["long"] == 2 * 6        # at least min_calls


def test_one_candidate_is_the_winner_without_timing_and_none_is_an_error():
    assert race.race({"only": lambda: None}).winner == "only"
    with pytest.raises(ValueError, match="no candidates"):
        race.race({})


def test_screen_measures_again_a_candidate_that_was_disturbed_in_its_first_round():
    measured: dict[str, int] = {}

    def measure(name: str, seconds: list[float]):
        def once() -> float:
            measured[name] = measured.get(name, 0) + 1
            return seconds[min(measured[name], len(seconds)) - 1]
        return once

    # "fast" was screened while the second core was busy (2x) in its first round only
    candidates = {f"slow{i}": measure(f"slow{i}", [20e-6 + i * 1e-6]) for i in range(8)}
    candidates["fast"] = measure("fast", [28e-6, 14e-6])
    kept = race.screen(candidates, keep=2, full_rounds=2)
    assert [name for name, _ in kept] == ["fast", "slow0"]
    assert kept[0][1] == 14e-6
    # successive halving: 9 candidates in both full rounds, then 5, then 3, then 2
    assert sum(measured.values()) == 9 + 9 + 5 + 3
    with pytest.raises(ValueError, match="keep"):
        race.screen(candidates, keep=0)


def test_screen_measures_a_hopeless_candidate_once():
    measured: dict[str, int] = {}

    def measure(name: str, seconds: float):
        def once() -> float:
            measured[name] = measured.get(name, 0) + 1
            return seconds
        return once

    # twice the fastest (a kernel that lost its second thread) is kept for the second round;
    # more than three times is not measured again
    candidates = {"fast": measure("fast", 10e-6), "twice": measure("twice", 20e-6),
                  "slow": measure("slow", 31e-6), "slower": measure("slower", 100e-6)}
    kept = race.screen(candidates, keep=1, full_rounds=2)
    assert kept == [("fast", 10e-6)]
    assert measured == {"fast": 2, "twice": 2, "slow": 1, "slower": 1}


def test_low_quantile_is_by_rank():
    assert race.low_quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.25) == 2.0
    assert race.low_quantile([5.0, 1.0], 0.0) == 1.0


def test_race_of_real_batch1_dense_kernels_picks_one_that_stays_bit_close_to_numpy():
    """The benchmark's use: a GEMV and the tile on a weight packed beforehand for 1x256x256, both
    checked against NumPy, raced through their bound calls."""
    m, n, k, lanes = 1, 256, 256, vector_lanes()
    rng = np.random.default_rng(0)
    data, weight = rng.uniform(-1, 1, (m, k)).astype("float32"), rng.uniform(-1, 1, (n, k)).astype("float32")
    expected = reference.dense(data, weight)
    makes = {"gemv": functools.partial(dense_gemv_candidate, m, n, k, 2, 1, True, None),
             "packed weight": functools.partial(dense_candidate, m, n, k, m, 4 * lanes, "nm", False, False, True)}
    calls, outs = {}, {}
    for name, make in makes.items():
        s, args = make()
        kernel = build(s, args)
        outs[name] = aligned_zeros((m, n), "float32")
        arrays = kernel.pack_arguments(data, weight, outs[name])
        calls[name] = kernel.bind(*arrays)
    result = race.race(calls, rounds=3, turn_budget_s=0.0005)
    assert result.winner in makes and set(result.score) == set(makes)
    assert min(result.score.values()) == 1.0
    for name in makes:
        np.testing.assert_allclose(outs[name], expected, rtol=1e-4, atol=1e-4)


def test_finalists_within_close_of_the_leader_race_again_and_the_best_turn_of_both_races_counts():
    # "b" (10 us) ran 3 % slow through the whole first race (a load that held all along) and
    # trailed "a" (10.2 us) by 1 %; "c" (12 us) is far behind and does not race again
    machine = SharedMachine()
    first_race_end = {}

    def b_call() -> None:
        machine.log.append("b")
        machine.now += 10.3e-6 if machine.now < first_race_end["s"] else 10e-6

    calls = {"a": machine.kernel("a", 10.2e-6), "b": b_call, "c": machine.kernel("c", 12e-6)}
    # one race without `close` on a copy of the machine measures where the first race ends
    first_race_end["s"] = float("inf")
    fooled = race.race(calls, rounds=3, clock=machine.clock, sleep=machine.sleep)
    assert fooled.winner == "a" and not fooled.reraced
    first_race_end["s"], machine.now = machine.now, 0.0
    result = race.race(calls, rounds=3, close=0.02, clock=machine.clock, sleep=machine.sleep)
    assert result.winner == "b"
    assert sorted(result.reraced) == ["a", "b"]
    assert result.seconds["b"] == pytest.approx(10e-6)
    assert result.calls["c"] < result.calls["a"]      # c ran in the first race only
    assert "raced again: " in result.describe()


def test_close_must_not_be_negative():
    with pytest.raises(ValueError, match="close"):
        race.race({"a": lambda: None, "b": lambda: None}, close=-0.1)
