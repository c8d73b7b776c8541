"""The tuner interface (AutoTVM style) and the ``create(kind)`` factory.

A tuner walks an *indexed space*: anything with ``len(space)``, ``space.dims`` (entities per
knob), ``space.knob_indices(index)``, ``space.index_of_knobs(positions)`` and
``space.get(index)``. The autotvm ``ConfigSpace`` is one; a tuner never knows which template,
builder, runner or store is behind it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from lorien.errors import ConfigError


class IndexedSpace(Protocol):
    """A search space of ``len(space)`` points addressed by index, one position per knob.
    Optional: ``mutate(index, rng)`` (the evolution's move) and ``sample(rng)`` (a random
    point from the space's prior; random search and evolution draw from it, else uniformly) and
    ``path_knobs`` (the knobs that choose the schedule's path -- a template's ``path``, a sketch,
    a rule: the first batch of the random and xgb tuners holds each of their values)."""

    dims: list[int]

    def __len__(self) -> int: ...

    def knob_indices(self, index: int) -> list[int]: ...

    def index_of_knobs(self, positions: Sequence[int]) -> int: ...

    def get(self, index: int) -> Any: ...


class MeasuredLike(Protocol):
    costs: Sequence[float]
    error_no: int


def knob_positions(index: int, dims: Sequence[int]) -> list[int]:
    """Per-knob positions of a point of a mixed-radix space (first knob least significant)."""
    index = int(index)
    positions = []
    for dim in dims:
        positions.append(index % dim)
        index //= dim
    return positions


def index_of_positions(positions: Sequence[int], dims: Sequence[int]) -> int:
    """Inverse of :func:`knob_positions`."""
    index = 0
    for position, dim in zip(reversed(positions), reversed(dims), strict=True):
        index = index * dim + int(position)
    return index


class MixedRadixSpace:
    """An indexed space whose points are the positions of its knobs (``dims`` values each),
    first knob least significant: what a dialect's space subclasses to be searched."""

    dims: list[int]

    def __len__(self) -> int:
        return math.prod(self.dims)

    def knob_indices(self, index: int) -> list[int]:
        return knob_positions(index, self.dims)

    def index_of_knobs(self, positions: Sequence[int]) -> int:
        return index_of_positions(positions, self.dims)


#: How a record's repeats reduce to the cost a program-feature model learns from: ``"min"``,
#: the fastest repeat (a wake-up or preemption spike in one repeat does not move it). Offline
#: training (:func:`lorien.features.pipeline.throughput_gflops` for program features) and a
#: pre-trained model's online updates in tuning (:func:`label_cost`) both use it.
LABEL_STATISTIC = "min"


def label_cost(result: MeasuredLike) -> float:
    """The cost in seconds a cost model learns from a result (its fastest repeat,
    :data:`LABEL_STATISTIC`), ``inf`` for a failed one or one with a NaN, infinite or
    non-positive repeat (the records program featurization gives throughput 0)."""
    costs = np.asarray(list(result.costs), dtype=float)
    if int(result.error_no) != 0 or costs.size == 0 or not np.all(np.isfinite(costs)):
        return math.inf
    value = float(costs.min() if LABEL_STATISTIC == "min" else costs.mean())
    return value if value > 0 else math.inf


def result_cost(result: MeasuredLike) -> float:
    """Mean cost in seconds of a valid result, ``inf`` for a failed one."""
    costs = list(result.costs)
    if int(result.error_no) != 0 or not costs:
        return math.inf
    value = float(np.mean(costs))
    return value if math.isfinite(value) and value > 0 else math.inf


class Tuner(ABC):
    """Proposes config indices in batches and learns from their measurements."""

    def __init__(self, space: IndexedSpace, seed: int | None = None):
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.visited: set[int] = set()
        self.best_index: int | None = None
        self.best_cost_s: float = math.inf
        self.trials = 0

    def has_next(self) -> bool:
        """True while the space still has unproposed points."""
        return len(self.visited) < len(self.space)

    @abstractmethod
    def next_batch(self, n: int) -> list[int]:
        """Up to ``n`` config indices not proposed before."""

    def upcoming(self, n: int) -> list[int]:
        """Up to ``n`` indices the next ``next_batch`` calls will propose first, in that order,
        whatever the results of the points proposed so far turn out to be (so they can be built
        before those results are in); empty where the next proposals depend on them (the default)."""
        return []

    def update(self, indices: Sequence[int], results: Sequence[MeasuredLike]) -> None:
        """Record the measurements of proposed indices (keeps the best)."""
        for index, result in zip(indices, results, strict=True):
            self.trials += 1
            cost = result_cost(result)
            if cost < self.best_cost_s:
                self.best_cost_s, self.best_index = cost, int(index)

    def replay(self, indices: Sequence[int], results: Sequence[MeasuredLike]) -> None:
        """Learn measurements made before this tuner existed (a resumed job's earlier attempts):
        they count as proposed, so they are never proposed again, and update the tuner as if
        just measured. Replay them in measurement order, in batches as they were measured."""
        for index in indices:
            self._mark(index)
        self.update(indices, results)

    def _mark(self, index: int) -> int:
        self.visited.add(int(index))
        return int(index)


_KINDS: dict[str, str] = {
    "grid": "lorien.search.grid:GridSearchTuner",
    "random": "lorien.search.random_search:RandomTuner",
    "ga": "lorien.search.ga:GATuner",
    "xgb": "lorien.search.xgb:XGBTuner",
}


def available_tuners() -> list[str]:
    return sorted(_KINDS)


def create(kind: str, space: IndexedSpace, seed: int | None = None, **options: Any) -> Tuner:
    """A tuner of kind ``grid``, ``random``, ``ga`` or ``xgb`` over ``space``."""
    import importlib

    if kind not in _KINDS:
        raise ConfigError(f"unknown tuner {kind!r} (known: {', '.join(available_tuners())})")
    module_name, class_name = _KINDS[kind].split(":")
    tuner_class = getattr(importlib.import_module(module_name), class_name)
    try:
        return tuner_class(space, seed=seed, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad options {options} for tuner {kind!r}: {exc}") from exc
