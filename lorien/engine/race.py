"""Picking the fastest of several kernels on a shared machine, by interleaved rounds.

Timing candidates one after the other compares them under whatever load each one met: on a
2-core host, a job that takes the other core for a second doubles every 2-thread kernel timed
in that second, and a 14 us kernel judged by the median of a few calls is judged by how many
of them the pool's second thread missed. Here the candidates take turns in rounds, the order
rotated every round, so each meets the machine's moods as often as the others:

- :func:`screen`: successive halving on a cheap measurement (e.g. the native loop's fastest
  run). Every candidate is measured in each of the first ``full_rounds`` rounds; after that,
  every round measures the survivors again and keeps the better half (by each one's fastest
  measurement so far), until ``keep`` are left.
- :func:`race`: the finalists' own calls, as a benchmark or an application makes them. A turn
  starts after a pause (``pause_s``, longer than the pool's spin, so its workers are parked as
  before a layer's first call), makes one untimed call, then times calls until ``turn_budget_s``
  is spent (at least ``min_calls``, at most ``max_calls``: a 14 us kernel is called about a
  hundred times in 3 ms, a 1 ms kernel a few times). A turn's figure is a low quantile of its
  calls (``quantile``); a candidate's figure is its best turn's, and the lowest figure wins.
  On a loaded 2-core host a whole turn of a 2-thread kernel runs at one speed or the other:
  another process holds the second core for milliseconds at a time, so in some turns the
  pool's worker joins every call and in others none (1x768x768, load average 10: 13.4 us or
  24-28 us, turn by turn, for each of four kernels). The best turn is what the kernel does when
  it gets the cores it asks for; a median of a few calls, or of turns, is a count of the turns
  the other process left alone, which is a coin toss.

``clock`` and ``sleep`` are parameters so that tests can drive a simulated machine.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

#: Pause before each turn of :func:`race`: longer than the pool's spin (1 ms), so that each
#: turn starts with parked workers, as a layer's first call after idle time does.
PAUSE_S = 0.005


def rotated(names: list[str], round_index: int) -> list[str]:
    """``names`` starting at position ``round_index`` (mod their count): who goes first changes
    every round, so no candidate always follows the same one."""
    if not names:
        return []
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def screen(measure: Mapping[str, Callable[[], float]], keep: int, full_rounds: int = 2,
           max_rounds: int = 8, hopeless: float = 3.0) -> list[tuple[str, float]]:
    """The ``keep`` candidates with the fastest measurements, fastest first, as
    ``(name, fastest seconds)``. ``measure[name]()`` returns one measurement in seconds (lower is
    better); the candidates are measured in rotated rounds: all of them in each of the first
    ``full_rounds``, then the better half of the survivors each round (never fewer than
    ``keep``) until ``keep`` are left or ``max_rounds`` have run. After every round, one more
    than ``hopeless`` times slower than the fastest is dropped (while more than ``keep`` are
    left): a 2-thread kernel that lost its second thread is twice as slow, not three times, and
    a slow candidate measured again costs the most."""
    if keep < 1:
        raise ValueError(f"screen: keep must be at least 1, got {keep}")
    if full_rounds < 1:
        raise ValueError(f"screen: full_rounds must be at least 1, got {full_rounds}")
    best = {name: math.inf for name in measure}
    alive = list(measure)
    for round_index in range(max(max_rounds, full_rounds)):
        for name in rotated(alive, round_index):
            best[name] = min(best[name], measure[name]())
        alive = sorted(alive, key=best.__getitem__)
        if alive:
            limit = hopeless * best[alive[0]]
            alive = alive[:keep] + [name for name in alive[keep:] if best[name] <= limit]
        if round_index + 1 >= full_rounds:
            alive = sorted(alive, key=best.__getitem__)[:max(keep, (len(alive) + 1) // 2)]
            if len(alive) <= keep:
                break
    return [(name, best[name]) for name in sorted(alive, key=best.__getitem__)[:keep]]


@dataclass
class RaceResult:
    """What :func:`race` found: the ``winner``; per candidate ``seconds`` (its best turn's
    figure), ``score`` (``seconds`` over the winner's: 1.0 for the winner), ``typical`` (the
    median of its turn figures: how the load treated it) and ``calls`` (timed calls, all turns)."""

    winner: str
    score: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    typical: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: each candidate's best-turn and median-turn seconds, best first."""
        order = sorted(self.score, key=self.score.__getitem__)
        return ", ".join(f"{name} {self.seconds[name] * 1e6:.1f} us x{self.score[name]:.2f} (median turn "
                         f"{self.typical[name] * 1e6:.1f} us, {self.calls[name]} calls)" for name in order)


def low_quantile(seconds: list[float], quantile: float) -> float:
    """The ``quantile`` (0 = the fastest) of ``seconds``, by the nearest rank below."""
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(quantile * (len(ordered) - 1)))]


def race(calls: Mapping[str, Callable[[], object]], rounds: int = 9, turn_budget_s: float = 0.003,
         min_calls: int = 6, max_calls: int = 400, quantile: float = 0.25, pause_s: float = PAUSE_S,
         clock: Callable[[], float] = time.perf_counter,
         sleep: Callable[[float], None] = time.sleep) -> RaceResult:
    """The fastest of ``calls`` (name -> a callable with no arguments), timed in ``rounds``
    interleaved, rotated rounds of time-budgeted turns (see the module's docstring)."""
    if not calls:
        raise ValueError("race: no candidates")
    if rounds < 1 or min_calls < 1 or max_calls < min_calls or not 0.0 <= quantile <= 1.0:
        raise ValueError(f"race: rounds ({rounds}) and min_calls ({min_calls}) must be at least 1, "
                         f"max_calls ({max_calls}) at least min_calls, quantile ({quantile}) within [0, 1]")
    names = list(calls)
    if len(names) == 1:
        return RaceResult(names[0], {names[0]: 1.0}, {names[0]: math.nan}, {names[0]: math.nan}, {names[0]: 0})
    figures: dict[str, list[float]] = {name: [] for name in names}
    counts = dict.fromkeys(names, 0)
    for round_index in range(rounds):
        for name in rotated(names, round_index):
            call = calls[name]
            if pause_s > 0:
                sleep(pause_s)
            call()
            seconds: list[float] = []
            turn_start = clock()
            while len(seconds) < max_calls:
                start = clock()
                call()
                end = clock()
                seconds.append(end - start)
                if len(seconds) >= min_calls and end - turn_start >= turn_budget_s:
                    break
            counts[name] += len(seconds)
            figures[name].append(low_quantile(seconds, quantile))
    best = {name: min(values) for name, values in figures.items()}
    winner = min(names, key=best.__getitem__)
    score = {name: best[name] / best[winner] if best[winner] > 0 else 1.0 for name in names}
    typical = {name: statistics.median(values) for name, values in figures.items()}
    return RaceResult(winner, score, best, typical, counts)
