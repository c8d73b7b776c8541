"""The task scheduler: which task of a network to tune next, so that one trial budget lowers
the network's estimated latency (sum over tasks of weight x best latency) fastest.

Tasks are tuned in rounds (a batch of trials each). ``round-robin`` takes them in turn.
``gradient`` is Ansor's strategy: after one warm-up round per task, it picks the task whose
next round is expected to lower the objective most,

    weight_i * (alpha * backward_i + (1 - alpha) * forward_i)

where ``backward_i`` is how fast the task's best latency fell over its last
``backward_window_size`` rounds, and ``forward_i`` how much its next round may gain: the
smaller of ``best_i / rounds_i`` (latency falling like 1/rounds) and the gap to
``beta`` times the latency the task would have at the best throughput (FLOP/s) of a similar
task (same ``group``, e.g. the same operator). A task whose rounds all fail for
``max_failed_rounds`` rounds, or whose space is exhausted, is left alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lorien.errors import ConfigError

STRATEGIES = ("gradient", "round-robin")


@dataclass
class SchedulerTask:
    """One task of a network: its weight (occurrences), FLOPs and similarity group."""

    name: str
    weight: float = 1.0
    flop: float | None = None
    group: str = ""


class TaskScheduler:
    """Picks tasks round by round; ``update`` it with each round's outcome."""

    def __init__(self, tasks: Sequence[SchedulerTask], strategy: str = "gradient", alpha: float = 0.2,
                 beta: float = 2.0, backward_window_size: int = 3, max_failed_rounds: int = 3,
                 seed: int | None = 0):
        if strategy not in STRATEGIES:
            raise ConfigError(f"unknown task scheduler strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
        if not tasks:
            raise ConfigError("a task scheduler needs at least one task")
        for task in tasks:
            if not task.weight > 0:
                raise ConfigError(f"task {task.name!r}: weight must be positive, got {task.weight!r}")
        self.tasks = list(tasks)
        self.strategy, self.alpha, self.beta = strategy, float(alpha), float(beta)
        self.backward_window_size = int(backward_window_size)
        self.max_failed_rounds = int(max_failed_rounds)
        self.rng = np.random.default_rng(seed)
        n = len(self.tasks)
        self.best_costs = [math.inf] * n
        self.rounds = [0] * n
        self.trials = [0] * n
        self.history: list[list[float]] = [[] for _ in range(n)]
        self.dead: set[int] = set()
        self._next_robin = 0

    # ------------------------------------------------------------ state
    def update(self, task_id: int, trials: int, best_cost_s: float, exhausted: bool = False) -> None:
        """Record one finished round of ``task_id``: trials measured and the task's best latency."""
        self.rounds[task_id] += 1
        self.trials[task_id] += int(trials)
        if math.isfinite(best_cost_s) and best_cost_s > 0:
            self.best_costs[task_id] = min(self.best_costs[task_id], float(best_cost_s))
        self.history[task_id].append(self.best_costs[task_id])
        failed_for_long = (not math.isfinite(self.best_costs[task_id])
                           and self.rounds[task_id] >= self.max_failed_rounds)
        if exhausted or trials == 0 or failed_for_long:
            self.dead.add(task_id)

    def resume(self, task_id: int, trials: int, best_cost_s: float, round_trials: int) -> None:
        """Start from what an earlier run measured (as many rounds as its trials make)."""
        if trials <= 0:
            return
        rounds = max(1, math.ceil(trials / max(1, round_trials)))
        self.rounds[task_id] += rounds
        self.trials[task_id] += int(trials)
        if math.isfinite(best_cost_s) and best_cost_s > 0:
            self.best_costs[task_id] = min(self.best_costs[task_id], float(best_cost_s))
        self.history[task_id].extend([self.best_costs[task_id]] * rounds)

    @property
    def total_trials(self) -> int:
        return sum(self.trials)

    def estimated_latency_s(self) -> float:
        """Sum of weight x best latency; infinite while a task has no valid measurement."""
        return sum(task.weight * cost for task, cost in zip(self.tasks, self.best_costs, strict=True))

    # ------------------------------------------------------------ choice
    def next_task(self, busy: Iterable[int] = ()) -> int | None:
        """The task to tune next (None when every task is dead or busy)."""
        busy = set(busy)
        free = [i for i in range(len(self.tasks)) if i not in self.dead and i not in busy]
        if not free:
            return None
        fresh = [i for i in free if self.rounds[i] == 0]
        if fresh:
            return fresh[0]
        if self.strategy == "round-robin":
            order = sorted(free, key=lambda i: (i - self._next_robin) % len(self.tasks))
            self._next_robin = (order[0] + 1) % len(self.tasks)
            return order[0]
        gradients = [self.gradient(i) for i in free]
        if max(gradients) == min(gradients):
            return free[int(self.rng.integers(len(free)))]
        return free[int(np.argmin(gradients))]

    def gradient(self, task_id: int) -> float:
        """Expected change of the objective per round spent on ``task_id`` (negative is good)."""
        best = self.best_costs[task_id]
        if not math.isfinite(best):
            return -math.inf  # nothing valid yet: any valid result is a gain
        rounds, history, window = self.rounds[task_id], self.history[task_id], self.backward_window_size
        backward = (history[-1] - history[-1 - window]) / window if len(history) > window else 0.0
        forward_next = best - best / rounds
        similar = self._best_similar_throughput(task_id)
        if similar is not None:
            forward_next = min(forward_next, self.beta * self.tasks[task_id].flop / similar)
        forward = forward_next - best
        return self.tasks[task_id].weight * (self.alpha * backward + (1 - self.alpha) * forward)

    def _best_similar_throughput(self, task_id: int) -> float | None:
        task = self.tasks[task_id]
        if not task.group or not task.flop:
            return None
        group = [i for i, other in enumerate(self.tasks) if other.group == task.group and other.flop]
        rates = [self.tasks[i].flop / self.best_costs[i] for i in group if math.isfinite(self.best_costs[i])]
        return max(rates) if len(group) > 1 and rates else None
