"""Grid search: every config index in order."""

from __future__ import annotations

from lorien.search.base import IndexedSpace, Tuner


class GridSearchTuner(Tuner):
    """Proposes indices 0, 1, 2, ... of the space, skipping those already visited (replayed)."""

    def __init__(self, space: IndexedSpace, seed: int | None = None):
        super().__init__(space, seed)
        self._cursor = 0

    def next_batch(self, n: int) -> list[int]:
        batch: list[int] = []
        while len(batch) < n and self._cursor < len(self.space):
            if self._cursor not in self.visited:
                batch.append(self._mark(self._cursor))
            self._cursor += 1
        return batch
