"""Random search that never proposes the same point twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

import numpy as np

from lorien.search.base import IndexedSpace, Tuner


class RandomTuner(Tuner):
    """Uniform sampling without replacement over the whole space."""

    def __init__(self, space: IndexedSpace, seed: int | None = None):
        super().__init__(space, seed)
        self._drawn: list[int] = []  # drawn by upcoming(), proposed next
        self._batch = 1  # the size of the batches asked for, by which upcoming() draws

    def next_batch(self, n: int) -> list[int]:
        self._batch = max(1, n)
        batch, self._drawn = self._drawn[:n], self._drawn[n:]
        return [self._mark(i) for i in batch + self._draw(n - len(batch))]

    def upcoming(self, n: int) -> list[int]:
        """Random points do not depend on any result: the next ones are drawn now, batch by batch
        of the size last asked for (as the next ``next_batch`` calls would draw them), and
        proposed by those calls."""
        while len(self._drawn) < n:
            drawn = self._draw(min(self._batch, n - len(self._drawn)))
            if not drawn:
                break
            self._drawn += drawn
        return self._drawn[:n]

    def _draw(self, n: int) -> list[int]:
        if n <= 0:
            return []
        first = not self.visited and not self._drawn
        drawn = set(self._drawn)
        self.visited |= drawn  # never drawn twice
        try:
            batch = sample_unvisited(self, n)
            return cover_paths(self.space, batch, self.visited) if first else batch
        finally:
            self.visited -= drawn


def sample_unvisited(tuner: Tuner, n: int) -> list[int]:
    """Up to ``n`` distinct random indices the tuner has not visited."""
    size = len(tuner.space)
    remaining = size - len(tuner.visited)
    n = min(n, remaining)
    if n <= 0:
        return []
    if remaining <= 4 * n or size <= 1 << 16:
        # Small or nearly exhausted space: draw from the explicit list of what is left.
        pool = [i for i in range(size) if i not in tuner.visited] if size <= 1 << 20 else None
        if pool is not None:
            return [int(i) for i in tuner.rng.choice(pool, size=n, replace=False)]
    chosen: list[int] = []
    seen = set(tuner.visited)
    tries = 0
    while len(chosen) < n:
        tries += 1
        # the space's prior first; uniform once the prior keeps landing on visited points
        index = draw(tuner.space, tuner.rng) if tries <= 32 * n else int(tuner.rng.integers(size))
        if index not in seen:
            seen.add(index)
            chosen.append(index)
    return chosen


def cover_paths(space: IndexedSpace, plan: list[int], exclude: Collection[int], start: int = 0) -> list[int]:
    """``plan`` with every value of the space's path knobs (``space.path_knobs``: a template's
    ``path``, a sketch, a rule) in it where the plan is long enough: a missing value takes the
    place of a value held by more than one point, from position ``start`` on (the points
    before it, e.g. seeds, are kept). A tuner's first, unguided batch thus measures every path,
    and the model learns each one from the start."""
    plan = list(plan)
    for knob in getattr(space, "path_knobs", ()):
        for value in range(space.dims[knob]):
            counts = Counter(space.knob_indices(index)[knob] for index in plan)
            if value in counts:
                continue
            for slot in range(start, len(plan)):
                positions = space.knob_indices(plan[slot])
                if counts[positions[knob]] < 2:
                    continue
                positions[knob] = value
                index = space.index_of_knobs(positions)
                if index not in exclude and index not in plan:
                    plan[slot] = index
                    break
    return plan


def draw(space: IndexedSpace, rng: np.random.Generator) -> int:
    """One random index: from the space's own prior (``space.sample(rng)``) where it has one,
    else uniform."""
    sample = getattr(space, "sample", None)
    return int(sample(rng)) if sample is not None else int(rng.integers(len(space)))
