"""The in-memory serving index: the best rows of one target key, looked up by workload key."""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa

from lorien.record import TuningRecord
from lorien.target import match_tier
from lorien.warehouse.parquet.tables import SERVING_ORDER, dedupe, group_starts


class ServingIndex:
    """Best rows of one target key; a lookup finds its group in a dict and reads a few scalars.

    Rows stay where the files put them: only the key columns are sorted, into ``order``
    (sorted position -> row), so building the index copies none of the wide columns.
    """

    def __init__(self, table: pa.Table, files: tuple[str, ...] = ()):
        import pyarrow.compute as pc

        self.files = files
        table = dedupe(table)
        self.table = table
        rows = table.num_rows
        keys = table.select([name for name, _ in SERVING_ORDER])
        self.order = pc.sort_indices(keys, sort_keys=SERVING_ORDER).to_numpy() if rows else np.zeros(0, int)
        self.cost_s = table.column("cost_s").to_numpy(zero_copy_only=False)[self.order] if rows else np.zeros(0)
        self._rank: np.ndarray | None = None
        self.by_workload: dict[str, list[tuple[str, str, int, int]]] = {}
        if rows:
            group_columns = ("workload_key", "target", "layout")
            sorted_keys = keys.select(list(group_columns)).take(self.order)
            starts = group_starts(sorted_keys, group_columns)
            stops = [*starts[1:].tolist(), rows]
            heads = sorted_keys.take(starts)
            for workload_key, target, layout, start, stop in zip(
                    heads.column("workload_key").to_pylist(), heads.column("target").to_pylist(),
                    heads.column("layout").to_pylist(), starts.tolist(), stops, strict=True):
                self.by_workload.setdefault(workload_key, []).append((target, layout, start, stop))
        self.sorted_workloads = sorted(self.by_workload)
        # Per column, its chunks and where each starts: a row is read as one scalar per column.
        self.columns = []
        for name in table.column_names:
            chunks = table.column(name).chunks
            starts_of_chunks = np.cumsum([0] + [len(chunk) for chunk in chunks[:-1]]).tolist()
            self.columns.append((name, chunks, starts_of_chunks))

    @property
    def rank(self) -> np.ndarray:
        """Rank of each sorted position's record_id (ties in cost are broken by record_id)."""
        if self._rank is None:
            import pyarrow.compute as pc

            by_row = np.empty(self.table.num_rows, dtype=np.int64)
            by_row[pc.sort_indices(self.table.column("record_id")).to_numpy()] = np.arange(self.table.num_rows)
            self._rank = by_row[self.order]
        return self._rank

    def _row(self, position: int) -> dict[str, object]:
        row = int(self.order[position])
        values = {}
        for name, chunks, starts in self.columns:
            chunk = bisect.bisect_right(starts, row) - 1
            values[name] = chunks[chunk][row - starts[chunk]].as_py()
        return values

    def _workload_keys(self, workload_key: str, prefix: bool) -> list[str]:
        if not prefix:
            return [workload_key] if workload_key in self.by_workload else []
        first = bisect.bisect_left(self.sorted_workloads, workload_key)
        last = first
        while last < len(self.sorted_workloads) and self.sorted_workloads[last].startswith(workload_key):
            last += 1
        return self.sorted_workloads[first:last]

    def _best_positions(self, spans: list[tuple[int, int, int]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions, their match tiers) of the best ``k`` rows of ``(start, stop, tier)`` spans."""
        if len(spans) == 1:
            start, stop, tier = spans[0]
            positions = np.arange(start, min(stop, start + k))
            return positions, np.full(len(positions), tier)
        positions = np.concatenate([np.arange(start, stop) for start, stop, _ in spans])
        tiers = np.concatenate([np.full(stop - start, tier) for start, stop, tier in spans])
        ranked = np.lexsort((self.rank[positions], self.cost_s[positions], tiers))[:k]
        return positions[ranked], tiers[ranked]

    def best(self, workload_key: str, target: str, k: int, layout: str | None,
             mode: str, prefix: bool, per_layout: bool) -> list[TuningRecord]:
        """The best rows of ``workload_key`` on the stored targets that match ``target``
        (canonical) in ``mode`` (see lorien.target.match_tier), most specific match first."""
        spans_by_layout: dict[str, list[tuple[int, int, int]]] = {}
        for key in self._workload_keys(workload_key, prefix):
            for group_target, group_layout, start, stop in self.by_workload[key]:
                if layout is not None and group_layout != layout:
                    continue
                tier = match_tier(target, group_target, mode)
                if tier is not None:
                    spans_by_layout.setdefault(group_layout, []).append((start, stop, tier))
        if not spans_by_layout:
            return []
        if per_layout:
            chosen = [self._best_positions(spans, k) for spans in spans_by_layout.values()]
            chosen.sort(key=lambda best: (best[1][0], self.cost_s[best[0][0]], self.rank[best[0][0]]))
            positions = np.concatenate([positions for positions, _ in chosen])
        else:
            positions, _ = self._best_positions([span for spans in spans_by_layout.values() for span in spans], k)
        return [TuningRecord.from_row(self._row(position)) for position in positions.tolist()]
