"""Grid search: every config index in order."""

from __future__ import annotations

from lorien.search.base import IndexedSpace, Tuner


class GridSearchTuner(Tuner):
    """Proposes indices 0, 1, 2, ... of the space."""

    def __init__(self, space: IndexedSpace, seed: int | None = None):
        super().__init__(space, seed)
        self._cursor = 0

    def next_batch(self, n: int) -> list[int]:
        stop = min(len(self.space), self._cursor + n)
        batch = [self._mark(i) for i in range(self._cursor, stop)]
        self._cursor = stop
        return batch
