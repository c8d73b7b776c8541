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
  With ``close``, the candidates within that fraction of the leader race again among
  themselves (the best turn of both races counts): on a quiet 2-core znver4 one run's race put
  two dense 1024³ kernels 0.2 % apart (10.48 and 10.51 ms) where another run's put them 5 %
  apart the other way (10.28 and 9.76 ms); the first run kept the slower one.

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
    median of its turn figures: how the load treated it), ``calls`` (timed calls, all turns) and
    ``reraced`` (the candidates that raced again, within ``close`` of the leader; empty when
    none did)."""

    winner: str
    score: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    typical: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    reraced: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line: each candidate's best-turn and median-turn seconds, best first, and which
        raced again."""
        order = sorted(self.score, key=self.score.__getitem__)
        line = ", ".join(f"{name} {self.seconds[name] * 1e6:.1f} us x{self.score[name]:.2f} (median turn "
                         f"{self.typical[name] * 1e6:.1f} us, {self.calls[name]} calls)" for name in order)
        return line + (f"; raced again: {', '.join(self.reraced)}" if self.reraced else "")


def low_quantile(seconds: list[float], quantile: float) -> float:
    """The ``quantile`` (0 = the fastest) of ``seconds``, by the nearest rank below."""
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(quantile * (len(ordered) - 1)))]


def race(calls: Mapping[str, Callable[[], object]], rounds: int = 9, turn_budget_s: float = 0.003,
         min_calls: int = 6, max_calls: int = 400, quantile: float = 0.25, pause_s: float = PAUSE_S,
         close: float = 0.0, clock: Callable[[], float] = time.perf_counter,
         sleep: Callable[[float], None] = time.sleep) -> RaceResult:
    """The fastest of ``calls`` (name -> a callable with no arguments), timed in ``rounds``
    interleaved, rotated rounds of time-budgeted turns (see the module's docstring). With
    ``close`` > 0, the candidates whose best turn is within ``close`` (a fraction) of the
    leader's race again among themselves for ``rounds`` more rounds, and each one's best turn of
    all counts: a load that held for the whole first race can have slowed one of them more than
    the others, and two within noise of each other may differ by more on a quieter core."""
    if not calls:
        raise ValueError("race: no candidates")
    if rounds < 1 or min_calls < 1 or max_calls < min_calls or not 0.0 <= quantile <= 1.0 or close < 0.0:
        raise ValueError(f"race: rounds ({rounds}) and min_calls ({min_calls}) must be at least 1, "
                         f"max_calls ({max_calls}) at least min_calls, quantile ({quantile}) within [0, 1], "
                         f"close ({close}) not negative")
    names = list(calls)
    if len(names) == 1:
        return RaceResult(names[0], {names[0]: 1.0}, {names[0]: math.nan}, {names[0]: math.nan}, {names[0]: 0})
    figures: dict[str, list[float]] = {name: [] for name in names}
    counts = dict.fromkeys(names, 0)

    def run_rounds(entrants: list[str]) -> None:
        for round_index in range(rounds):
            for name in rotated(entrants, round_index):
                seconds = _turn(calls[name], turn_budget_s, min_calls, max_calls, pause_s, clock, sleep)
                counts[name] += len(seconds)
                figures[name].append(low_quantile(seconds, quantile))

    run_rounds(names)
    leader = min(min(values) for values in figures.values())
    contenders = [name for name in names if min(figures[name]) <= leader * (1.0 + close)] if close > 0 else []
    if len(contenders) > 1:
        run_rounds(contenders)
    best = {name: min(values) for name, values in figures.items()}
    winner = min(names, key=best.__getitem__)
    score = {name: best[name] / best[winner] if best[winner] > 0 else 1.0 for name in names}
    typical = {name: statistics.median(values) for name, values in figures.items()}
    return RaceResult(winner, score, best, typical, counts, contenders if len(contenders) > 1 else [])


def _turn(call: Callable[[], object], turn_budget_s: float, min_calls: int, max_calls: int, pause_s: float,
          clock: Callable[[], float], sleep: Callable[[float], None]) -> list[float]:
    """One turn of :func:`race`: a pause, one untimed call, then timed calls until the budget is
    spent (at least ``min_calls``, at most ``max_calls``); their seconds."""
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
    return seconds
