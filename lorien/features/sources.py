"""Where records come from for featurization: a store or log files, as Arrow batches.

Both sources stream Arrow tables in :data:`lorien.record.ARROW_SCHEMA` (only the columns
featurization needs are used) and describe themselves for the manifest (store URI and
stats, or each file's size and modification time).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lorien.errors import LorienError
from lorien.record import ARROW_SCHEMA

#: Record columns phase 1 reads.
NEEDED_COLUMNS = ["dialect", "target", "target_key", "workload_key", "task_name", "args", "layout",
                  "config", "costs", "error_no", "flop", "build"]
#: Filters featurization understands (column -> value or list of values).
FILTER_COLUMNS = ("dialect", "target", "target_key", "task_name", "workload_key", "layout")
LOG_SUFFIXES = {".log", ".json", ".jsonl", ".txt"}


@dataclass
class SourceInfo:
    """What produced a featurization: store snapshot or files, filters, parse errors."""

    kind: str
    description: dict[str, Any] = field(default_factory=dict)
    parse_errors: int = 0
    parse_error_examples: list[str] = field(default_factory=list)


def apply_filters(table: pa.Table, filters: dict[str, Any] | None) -> pa.Table:
    """Rows of ``table`` whose columns equal the filter values (a list means any of them)."""
    if not filters:
        return table
    mask = None
    for column, wanted in filters.items():
        if column not in table.column_names:
            raise LorienError(f"cannot filter on {column!r}: records have no such column")
        values = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
        condition = pc.is_in(table[column], value_set=pa.array([str(v) for v in values]))
        mask = condition if mask is None else pc.and_(mask, condition)
    return table.filter(mask)


def _expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*")
                           if p.is_file() and p.suffix in LOG_SUFFIXES and not p.name.startswith("."))
            if not found:
                raise LorienError(f"no log files (*.log, *.json, *.jsonl, *.txt) under {path}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise LorienError(f"log path not found: {path}")
    return files


def iter_log_batches(paths: Sequence[str | Path], filters: dict[str, Any] | None, batch_size: int,
                     info: SourceInfo) -> Iterator[pa.Table]:
    """Arrow batches of every record in the log files, read with the format codecs."""
    from lorien.formats import iter_log_tables

    files = _expand_paths(paths)
    info.kind = "logs"
    info.description = {"files": [{"path": str(p.resolve()), "bytes": p.stat().st_size,
                                   "mtime": p.stat().st_mtime} for p in files]}
    for path in files:
        for table, errors in iter_log_tables(path, batch_size=batch_size):
            info.parse_errors += len(errors)
            for error in errors[: max(0, 5 - len(info.parse_error_examples))]:
                info.parse_error_examples.append(str(error))
            table = apply_filters(table, filters)
            if table.num_rows:
                yield table


def iter_store_batches(store_uri: str, filters: dict[str, Any] | None, batch_size: int,
                       info: SourceInfo, columns: Sequence[str] = tuple(NEEDED_COLUMNS),
                       batch_bytes: int | None = None) -> Iterator[pa.Table]:
    """Arrow batches of a store's records matching ``filters``, with a snapshot description.

    A local parquet store is streamed file by file from its Hive layout (memory follows the
    batch size; duplicates left by racing writers are dropped by ``record_id``). Other stores
    are scanned one target-key partition at a time. ``columns``: the record columns read
    (program features also need ``extra``, where a MetaSchedule record carries its workload).
    From a local store a batch also ends once it holds ``batch_bytes`` of Arrow data.
    """
    columns = list(columns)
    from lorien.warehouse import open_store

    store = open_store(store_uri)
    try:
        location = getattr(store, "location", None)
        if store.uri.startswith("parquet:") and isinstance(location, str) and "://" not in location:
            visible = [rel for rel in sorted(store.visible_record_files()) if rel.startswith("records/")]
            yield from _iter_parquet_files(Path(location.removeprefix("file:")), visible, filters, batch_size,
                                           info, store.uri, columns, batch_bytes)
            return
        stats = store.stats()
        info.kind = "store"
        info.description = {"uri": store.uri, "stats": _jsonable(stats)}
        filters = dict(filters or {})
        partitions: list[str | None] = [None]
        if "target_key" not in filters and stats.get("target_keys"):
            partitions = list(stats["target_keys"])
        for target_key in partitions:
            scoped = filters if target_key is None else {**filters, "target_key": target_key}
            table = store.scan(scoped or None, columns=columns)
            for batch in table.to_batches(max_chunksize=batch_size):
                yield pa.Table.from_batches([batch])
            del table
    finally:
        store.close()


def _iter_parquet_files(root: Path, visible: list[str], filters: dict[str, Any] | None, batch_size: int,
                        info: SourceInfo, uri: str, columns: list[str] = NEEDED_COLUMNS,
                        batch_bytes: int | None = None) -> Iterator[pa.Table]:
    """Stream the store's visible record files (``visible``: paths relative to ``root``, of
    complete commits only, so a killed writer's half-published commit is never featurized)."""
    records_dir = root / "records"
    files = [str(root / rel) for rel in visible]
    info.kind = "store"
    info.description = {"uri": uri, "files": len(files), "bytes": sum(os.path.getsize(f) for f in files),
                        "file_list": [{"path": os.path.relpath(f, root), "bytes": os.path.getsize(f),
                                       "mtime": os.path.getmtime(f)} for f in files]}
    if not files:
        return
    filters = dict(filters or {})
    unknown = sorted(set(filters) - set(FILTER_COLUMNS))
    if unknown:
        raise LorienError(f"cannot filter on {unknown} (known: {', '.join(FILTER_COLUMNS)})")
    file_columns = ["record_id", *(c for c in columns if c not in PARTITION_COLUMNS)]
    file_columns += [c for c in filters if c not in file_columns and c not in PARTITION_COLUMNS]

    schema = pa.schema([ARROW_SCHEMA.field(name) for name in [*file_columns, *PARTITION_COLUMNS]])

    def batches() -> Iterator[pa.RecordBatch]:
        for path in files:
            partition = _hive_partition(Path(path).relative_to(records_dir))
            if any(name in filters and partition.get(name, "") not in _as_list(filters[name])
                   for name in PARTITION_COLUMNS):
                continue
            parquet = pq.ParquetFile(path, memory_map=False, pre_buffer=False)
            for batch in parquet.iter_batches(batch_size=min(batch_size, 8192), columns=file_columns,
                                              use_threads=False):
                arrays = [column.cast(schema.field(name).type) for name, column in
                          zip(batch.schema.names, batch.columns, strict=True)]
                arrays += [pa.array([partition.get(n, "")] * batch.num_rows, pa.string()) for n in PARTITION_COLUMNS]
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    row_filters = {k: v for k, v in filters.items() if k not in PARTITION_COLUMNS}
    seen = SeenPrefixes()
    duplicates = 0
    for table in _rebatch(batches(), batch_size, batch_bytes):
        table = apply_filters(table, row_filters)
        if table.num_rows == 0:
            continue
        ids = np.fromiter((int(rid[:16], 16) for rid in table["record_id"].to_pylist()), dtype=np.uint64,
                          count=table.num_rows)
        fresh = seen.add(ids)
        if not fresh.all():
            duplicates += int((~fresh).sum())
            table = table.filter(pa.array(fresh))
        yield table.select(columns)
    info.description["duplicates_dropped"] = duplicates


class SeenPrefixes:
    """The 64-bit record-id prefixes read so far: 8 bytes each, in 256 partitions (by their top
    byte) of sorted runs, each run at most half the one before it. Adding a batch copies at most
    a partition's runs, never every prefix (a sorted array grown by ``np.insert`` held all of
    them twice on every batch)."""

    def __init__(self) -> None:
        self._parts: list[list[np.ndarray]] = [[] for _ in range(256)]

    def __len__(self) -> int:
        return sum(len(run) for runs in self._parts for run in runs)

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Add ``ids``; True for each that is the first of its value here and was not seen before."""
        order = np.argsort(ids, kind="stable")
        ordered = ids[order]
        first_of_value = np.ones(ids.size, dtype=bool)
        first_of_value[1:] = ordered[1:] != ordered[:-1]
        fresh = np.zeros(ids.size, dtype=bool)
        fresh[order[first_of_value]] = True
        bounds = np.searchsorted(ordered >> np.uint64(56), np.arange(257, dtype=np.uint64))
        for number in np.flatnonzero(np.diff(bounds)).tolist():
            rows = order[bounds[number]:bounds[number + 1]]
            values = ids[rows]
            for run in self._parts[number]:
                fresh[rows] &= run[np.minimum(np.searchsorted(run, values), run.size - 1)] != values
            new = np.sort(values[fresh[rows]])
            if new.size:
                self._add_run(number, new)
        return fresh

    def _add_run(self, number: int, run: np.ndarray) -> None:
        runs = self._parts[number]
        runs.append(run)
        while len(runs) > 1 and runs[-2].size <= 2 * runs[-1].size:
            newer, older = runs.pop(), runs.pop()
            runs.append(np.sort(np.concatenate([older, newer]), kind="mergesort"))


PARTITION_COLUMNS = ("target_key", "layout")
#: Hive's directory name for an empty partition value (as the parquet store writes it).
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def _as_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple, set)) else [str(value)]


def _hive_partition(relative: Path) -> dict[str, str]:
    """Partition values of a Hive path ``key=value/.../file``."""
    values = {}
    for part in relative.parts[:-1]:
        key, sep, value = part.partition("=")
        if sep:
            values[key] = "" if value == NULL_PARTITION else unquote(value)
    return values


def _rebatch(batches: Iterator[pa.RecordBatch], batch_size: int, batch_bytes: int | None = None
             ) -> Iterator[pa.Table]:
    """Tables of about ``batch_size`` rows (or fewer, once they hold ``batch_bytes``) from a
    stream of (often small) record batches."""
    pending: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
        if rows >= batch_size or (batch_bytes is not None and size >= batch_bytes):
            yield pa.Table.from_batches(pending).combine_chunks()
            pending, rows, size = [], 0, 0
    if pending:
        yield pa.Table.from_batches(pending).combine_chunks()


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)
