"""The record ids a writer has seen, kept compact (16 bytes per id instead of a Python string)
and, beyond :data:`MEMORY_IDS` of them, on disk: a writer's memory does not grow with the store.

Lorien's record ids are 32 hex digits (the first 16 bytes of a SHA-256). They are kept as two
uint64 halves in a few runs sorted by the high half (each run at most half the size of the one
before it, so an id is merged about log2(count) times in all, and a merge needs no memory
beyond the merged run); a membership test is one ``searchsorted`` per run. When more than
:data:`MEMORY_IDS` ids are in memory they are merged, one partition at a time, with the ids
already on disk into one sorted pair of files (high halves, low halves) in the system's
temporary directory (``TMPDIR``); the files are unlinked as they are created, so a killed
process leaves none behind. A membership test then reads the high halves of the partitions it
needs, one partition at a time (the low halves only where a high half matches). An id of any
other spelling (a caller's own ``record_id``) goes to a plain set.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa

_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)


def id_halves(ids: pa.Array | pa.ChunkedArray, low: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """The two uint64 halves of each 32-hex-digit id, read from the Arrow buffers; None when
    some id is not 32 lowercase hex digits. Without ``low`` only the high halves are computed
    (the second array is then empty): enough to tell ids apart quickly (see tables.dedupe)."""
    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    highs, lows = [], []
    for chunk in chunks:
        if len(chunk) == 0:
            continue
        if chunk.type != pa.string() or chunk.null_count:
            return None
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[chunk.offset:chunk.offset + len(chunk) + 1]
        if not np.all(np.diff(offsets) == 32):
            return None
        digits = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0]:offsets[-1]].reshape(-1, 32)
        is_digit = (digits >= 48) & (digits <= 57)
        if not np.all(is_digit | ((digits >= 97) & (digits <= 102))):
            return None
        nibbles = np.where(is_digit, digits - 48, digits - 87).astype(np.uint64)
        highs.append((nibbles[:, :16] << _SHIFTS).sum(axis=1, dtype=np.uint64))
        if low:
            lows.append((nibbles[:, 16:] << _SHIFTS).sum(axis=1, dtype=np.uint64))
    if not highs:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64)
    return np.concatenate(highs), (np.concatenate(lows) if low else np.zeros(0, dtype=np.uint64))


def _merged(older: tuple[np.ndarray, np.ndarray], newer: tuple[np.ndarray, np.ndarray]
            ) -> tuple[np.ndarray, np.ndarray]:
    """Two runs sorted by their high halves as one (a merge, not a sort)."""
    size = len(older[0]) + len(newer[0])
    at = np.searchsorted(older[0], newer[0], side="right") + np.arange(len(newer[0]))
    from_newer = np.zeros(size, dtype=bool)
    from_newer[at] = True
    merged = []
    for old, new in zip(older, newer, strict=True):
        values = np.empty(size, dtype=np.uint64)
        values[at] = new
        values[~from_newer] = old
        merged.append(values)
    return merged[0], merged[1]


#: Ids are kept in 2**PARTITION_BITS partitions by the top bits of their high half, each with its
#: own sorted runs: merging two runs then needs memory for one partition's ids, not for all of
#: them (one merge of every id would briefly hold them twice).
PARTITION_BITS = 8
_PARTITIONS = 1 << PARTITION_BITS
_PARTITION_SHIFT = np.uint64(64 - PARTITION_BITS)
_PARTITION_NUMBERS = np.arange(_PARTITIONS + 1, dtype=np.uint64)


def _partition_bounds(high: np.ndarray) -> np.ndarray:
    """Where each partition's ids start in ``high`` (sorted), and where the last one ends."""
    return np.searchsorted(high >> _PARTITION_SHIFT, _PARTITION_NUMBERS)


#: Ids a :class:`RecordIds` keeps in memory (16 bytes each: 2**20 ids are 16 MiB); more go to disk.
MEMORY_IDS = 1 << 20


class _SpilledIds:
    """Ids on disk, sorted by their high halves: two unlinked temporary files (high halves,
    low halves) and, in memory, where each partition starts in them."""

    def __init__(self) -> None:
        self.bounds = np.zeros(_PARTITIONS + 1, dtype=np.int64)
        self.files = (tempfile.TemporaryFile(prefix="lorien-record-ids-"),
                      tempfile.TemporaryFile(prefix="lorien-record-ids-"))

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def read(self, number: int, half: int) -> np.ndarray:
        """Partition ``number``'s high (``half`` 0) or low (1) halves, read from disk."""
        start, stop = int(self.bounds[number]), int(self.bounds[number + 1])
        values = np.empty(stop - start, dtype=np.uint64)
        view, done = memoryview(values).cast("B"), 0
        while done < len(view):
            got = os.preadv(self.files[half].fileno(), [view[done:]], start * 8 + done)
            if got <= 0:
                raise OSError(f"record ids on disk end early ({done} of {len(view)} bytes)")
            done += got
        return values

    @staticmethod
    def merged(spilled: _SpilledIds | None, parts: list[list[tuple[np.ndarray, np.ndarray]]]) -> _SpilledIds:
        """The ids of ``spilled`` (if any) and of ``parts`` (runs per partition) in new files,
        merged one partition at a time."""
        merged = _SpilledIds()
        position = 0
        for number in range(_PARTITIONS):
            merged.bounds[number] = position
            runs = list(parts[number])
            if spilled is not None and spilled.bounds[number + 1] > spilled.bounds[number]:
                runs.append((spilled.read(number, 0), spilled.read(number, 1)))
            if not runs:
                continue
            high = np.concatenate([run[0] for run in runs])
            order = np.argsort(high, kind="stable")
            merged.files[0].write(memoryview(high[order]))
            merged.files[1].write(memoryview(np.concatenate([run[1] for run in runs])[order]))
            position += len(high)
        merged.bounds[-1] = position
        for handle in merged.files:
            handle.flush()
        return merged

    def close(self) -> None:
        for handle in self.files:
            handle.close()


class RecordIds:
    """A set of record ids: :meth:`update` adds an Arrow column of ids, :meth:`fresh` tells
    which ids of a column are not in the set. At most ``memory_ids`` ids (default
    :data:`MEMORY_IDS`) are held in memory; the others are on disk (see the module's docstring)."""

    def __init__(self, memory_ids: int | None = None) -> None:
        # per partition, runs of (high, low) sorted by high
        self._parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(_PARTITIONS)]
        self._other: set[str] = set()
        self.memory_ids = MEMORY_IDS if memory_ids is None else memory_ids
        self._in_memory = 0
        self._spilled: _SpilledIds | None = None

    @property
    def _runs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The runs held in memory."""
        return [run for runs in self._parts for run in runs]

    def __len__(self) -> int:
        return self._in_memory + (len(self._spilled) if self._spilled is not None else 0) + len(self._other)

    @property
    def spilled(self) -> int:
        """How many ids are on disk."""
        return len(self._spilled) if self._spilled is not None else 0

    @property
    def nbytes(self) -> int:
        """Bytes held in memory by the compact runs (the ids of other spellings are not counted)."""
        return sum(high.nbytes + low.nbytes for high, low in self._runs)

    def update(self, ids: pa.Array | pa.ChunkedArray | RecordIds) -> None:
        if isinstance(ids, RecordIds):
            for number, runs in enumerate(ids._parts):
                for high, low in runs:
                    self._add_run(number, high, low)
            if ids._spilled is not None:
                for number in np.flatnonzero(np.diff(ids._spilled.bounds)).tolist():
                    self._add_run(number, ids._spilled.read(number, 0), ids._spilled.read(number, 1))
            self._other |= ids._other
            self._spill_if_full()
            return
        halves = id_halves(ids)
        if halves is None:
            self._other.update(ids.to_pylist())
        elif len(halves[0]):
            order = np.argsort(halves[0], kind="stable")
            high, low = halves[0][order], halves[1][order]
            bounds = _partition_bounds(high)
            for number in np.flatnonzero(np.diff(bounds)).tolist():
                start, stop = bounds[number], bounds[number + 1]
                self._add_run(number, high[start:stop].copy(), low[start:stop].copy())
            self._spill_if_full()

    def _add_run(self, number: int, high: np.ndarray, low: np.ndarray) -> None:
        runs = self._parts[number]
        runs.append((high, low))
        self._in_memory += len(high)
        while len(runs) > 1 and len(runs[-2][0]) <= 2 * len(runs[-1][0]):
            newer, older = runs.pop(), runs.pop()
            runs.append(_merged(older, newer))

    def _spill_if_full(self) -> None:
        """Past ``memory_ids`` in memory: merge them into the ids on disk, memory freed."""
        if self._in_memory <= self.memory_ids:
            return
        spilled = self._spilled
        self._spilled = _SpilledIds.merged(spilled, self._parts)
        if spilled is not None:
            spilled.close()
        for runs in self._parts:
            runs.clear()
        self._in_memory = 0

    def fresh(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """A boolean per id: True where the id is not in the set."""
        halves = id_halves(ids)
        if halves is None:
            return np.fromiter((rid not in self._other and not self._has_text(rid) for rid in ids.to_pylist()),
                               dtype=bool, count=len(ids))
        high, low = halves
        fresh = np.ones(len(high), dtype=bool)
        order = np.argsort(high, kind="stable")
        bounds = _partition_bounds(high[order])
        for number in np.flatnonzero(np.diff(bounds)).tolist():
            if not self._parts[number]:
                continue
            rows = order[bounds[number]:bounds[number + 1]]
            fresh[rows] = ~self._found(self._parts[number], high[rows], low[rows])
        if self._spilled is not None:
            self._fresh_on_disk(fresh, high, low, order, bounds)
        if self._other:
            fresh &= np.fromiter((rid not in self._other for rid in ids.to_pylist()), dtype=bool, count=len(ids))
        return fresh

    def _fresh_on_disk(self, fresh: np.ndarray, high: np.ndarray, low: np.ndarray, order: np.ndarray,
                       bounds: np.ndarray) -> None:
        """Clear ``fresh`` where an id is on disk: each partition's high halves are read once, its
        low halves only where some high half matches."""
        spilled = self._spilled
        assert spilled is not None
        for number in np.flatnonzero(np.diff(bounds)).tolist():
            if spilled.bounds[number + 1] == spilled.bounds[number]:
                continue
            rows = order[bounds[number]:bounds[number + 1]]
            rows = rows[fresh[rows]]
            if not len(rows):
                continue
            run_high = spilled.read(number, 0)
            at = np.minimum(np.searchsorted(run_high, high[rows]), len(run_high) - 1)
            rows = rows[run_high[at] == high[rows]]
            if len(rows):
                fresh[rows] = ~self._found([(run_high, spilled.read(number, 1))], high[rows], low[rows])

    @staticmethod
    def _found(runs: list[tuple[np.ndarray, np.ndarray]], high: np.ndarray, low: np.ndarray) -> np.ndarray:
        found_any = np.zeros(len(high), dtype=bool)
        for run_high, run_low in runs:
            at = np.searchsorted(run_high, high)
            inside = at < len(run_high)
            clipped = np.minimum(at, len(run_high) - 1)
            same_high = inside & (run_high[clipped] == high)
            found = same_high & (run_low[clipped] == low)
            found_any |= found
            # ids sharing their high half with another (rare): look at the rest of that run
            for row in np.flatnonzero(same_high & ~found & ~found_any).tolist():
                stop = np.searchsorted(run_high, high[row], side="right")
                if np.any(run_low[at[row]:stop] == low[row]):
                    found_any[row] = True
        return found_any

    def _has_text(self, rid: str) -> bool:
        halves = id_halves(pa.array([rid], pa.string()))
        return halves is not None and not self.fresh(pa.array([rid], pa.string()))[0]

    def clear(self) -> None:
        for runs in self._parts:
            runs.clear()
        self._other.clear()
        self._in_memory = 0
        if self._spilled is not None:
            self._spilled.close()
            self._spilled = None
