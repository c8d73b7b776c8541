"""The serving index persisted beside the data, so a new process answers ``best()`` without
rebuilding it.

One file per target key and serving-file listing: ``_index/best/target_key=K/<fingerprint>.lsi``,
where the fingerprint is a hash of the names of the serving files it was built from. Serving
files are immutable and uniquely named, so an index file is valid for exactly the listing it
names: a commit that adds (or a merge that removes) a serving file changes the listing, and
every process, this one or another, then looks for another file. A stale index is never read.

The file (little-endian)::

    [Arrow IPC file: the serving rows, deduplicated, in serving order]  memory-mapped, zero-copy
    [uint64 arrays, 64-byte aligned]  per (workload_key, target, layout) group: hash of its
                                      workload key, first row, end row (sorted by hash); first
                                      rows in row order (for prefix lookups)
    [header: JSON]  version, files, listing, depth, rows, groups, offsets, CRC-32 of the arrays
    [uint64 header length][uint32 CRC-32 of the header][uint32 version][8-byte magic]

Opening one checks the magic, the size, both CRCs and the Arrow footer; every row it returns is
checked against its content hash (``record_id``) and its cost against its costs, so a damaged
file is noticed and rebuilt, not believed. It is written under ``_staging`` and renamed into
place, so a reader sees a whole file or none.

The build reads the serving files one key range at a time (the files are sorted by workload key
and their row-group statistics say which row groups hold a range), so its memory is bounded by
the range size, not by the serving view.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import mmap
import os
import struct
import uuid
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from lorien.record import TuningRecord, compute_record_id, mean_cost_s

MAGIC = b"LORIENSI"
VERSION = 1
INDEX_DIR = "_index"
SUFFIX = ".lsi"
TAIL = struct.Struct("<QII8s")
GROUP_COLUMNS = ("workload_key", "target", "layout")
#: Rows per Arrow record batch of an index file, and about the rows a build reads at a time.
BATCH_ROWS = 65536


class IndexDamaged(Exception):
    """An index file that cannot be trusted (truncated, overwritten, of another version)."""


def fingerprint(listed: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(listed)).encode()).hexdigest()[:32]


def index_rel(serving_dir: str, listed: Sequence[str]) -> str:
    return f"{INDEX_DIR}/{serving_dir}/{fingerprint(listed)}{SUFFIX}"


def key_hash(workload_key: str) -> int:
    return int.from_bytes(hashlib.blake2b(workload_key.encode(), digest_size=8).digest(), "little")


def _align(offset: int) -> int:
    return -(-offset // 64) * 64


def write_index(path: str, batches: Callable[[], object], schema: object, files: Sequence[str],
                listed: Sequence[str], depth: int | None) -> int:
    """Write an index file at ``path`` (its directory must exist) from ``batches()``, an iterator
    of Arrow tables of serving rows in serving order, deduplicated, ``schema``'s columns.
    Returns the rows written."""
    import pyarrow as pa

    from lorien.warehouse.parquet.tables import group_starts

    hashes: list[int] = []
    starts: list[int] = []
    rows = 0
    last_key = None
    with open(path, "wb") as handle:
        with pa.ipc.new_file(pa.PythonFile(handle, mode="w"), schema) as writer:
            for table in batches():
                if not table.num_rows:
                    continue
                table = pa.Table.from_arrays(table.columns, schema=schema)
                heads = group_starts(table, GROUP_COLUMNS).tolist()
                first = tuple(table.column(name)[0].as_py() for name in GROUP_COLUMNS)
                if heads and heads[0] == 0 and first == last_key:
                    heads = heads[1:]  # the group goes on from the previous table
                if heads:
                    hashes.extend(key_hash(key) for key in
                                  table.column("workload_key").take(heads).to_pylist())
                    starts.extend(rows + head for head in heads)
                last_key = tuple(table.column(name)[-1].as_py() for name in GROUP_COLUMNS)
                for batch in table.to_batches(BATCH_ROWS):
                    writer.write_batch(batch)
                rows += table.num_rows
        arrow_size = handle.tell()
        row_starts = np.array(starts, dtype=np.uint64)
        stops = np.append(row_starts[1:], np.uint64(rows)).astype(np.uint64)
        key_hashes = np.array(hashes, dtype=np.uint64)
        order = np.argsort(key_hashes, kind="stable")
        arrays = {"hashes": key_hashes[order], "starts": row_starts[order], "stops": stops[order],
                  "row_starts": row_starts}
        offset = _align(arrow_size)
        sections = {}
        crc = 0
        for name, values in arrays.items():
            handle.write(b"\0" * (offset - handle.tell()))
            data = values.tobytes()
            handle.write(data)
            crc = zlib.crc32(data, crc)
            sections[name] = [offset, len(values)]
            offset = _align(offset + len(data))
        end = handle.tell()
        header = json.dumps({"version": VERSION, "files": list(files), "listed": sorted(listed), "depth": depth,
                             "rows": rows, "groups": len(hashes), "arrow_size": arrow_size,
                             "sections": sections, "arrays_crc": crc, "schema": schema.names}).encode()
        handle.write(header)
        total = end + len(header) + TAIL.size
        handle.write(TAIL.pack(len(header), zlib.crc32(header), VERSION, MAGIC))
        handle.flush()
        if handle.tell() != total:
            raise OSError(f"index file {path} has {handle.tell()} bytes, expected {total}")
    return rows


class PersistedIndex:
    """A memory-mapped index file; answers as :class:`~lorien.warehouse.parquet.serving.ServingIndex`."""

    persisted = True

    def __init__(self, path: str, target_key: str):
        import pyarrow as pa

        self.path = path
        self.target_key = target_key
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < TAIL.size:
                    raise IndexDamaged(f"{size} bytes, shorter than its tail")
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file cannot be mapped
            raise IndexDamaged(str(exc)) from exc
        header_len, header_crc, version, magic = TAIL.unpack_from(self._map, size - TAIL.size)
        if magic != MAGIC:
            raise IndexDamaged("no index tail (truncated or not an index file)")
        if version != VERSION:
            raise IndexDamaged(f"format version {version}, this Lorien reads {VERSION}")
        header_at = size - TAIL.size - header_len
        if header_at < 0:
            raise IndexDamaged("header longer than the file")
        header_bytes = self._map[header_at:header_at + header_len]
        if zlib.crc32(header_bytes) != header_crc:
            raise IndexDamaged("header checksum mismatch")
        header = json.loads(header_bytes)
        self.files: tuple[str, ...] = tuple(header["files"])
        self.listed: tuple[str, ...] = tuple(header["listed"])
        self.depth: int | None = header["depth"]
        self.rows: int = header["rows"]
        buffer = pa.py_buffer(self._map)
        arrays, crc = {}, 0
        for name, (offset, count) in header["sections"].items():
            if offset + 8 * count > header_at:
                raise IndexDamaged(f"section {name} past the header")
            arrays[name] = np.frombuffer(self._map, dtype=np.uint64, count=count, offset=offset)
            crc = zlib.crc32(arrays[name], crc)
        if crc != header["arrays_crc"]:
            raise IndexDamaged("array checksum mismatch")
        self.hashes, self.starts, self.stops = arrays["hashes"], arrays["starts"], arrays["stops"]
        self.row_starts = arrays["row_starts"]
        if not (len(self.hashes) == len(self.starts) == len(self.stops) == len(self.row_starts) == header["groups"]):
            raise IndexDamaged("group arrays of different lengths")
        if header["groups"] and (int(self.stops.max()) > self.rows or np.any(self.starts >= self.stops)):
            raise IndexDamaged("group spans outside the rows")
        try:
            table = pa.ipc.open_file(buffer.slice(0, header["arrow_size"])).read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            raise IndexDamaged(f"rows unreadable: {exc}") from exc
        if table.num_rows != self.rows or table.column_names != header["schema"]:
            raise IndexDamaged(f"{table.num_rows} rows of columns {table.column_names}, header says "
                               f"{self.rows} of {header['schema']}")
        self.table = table
        self.batches = [_BatchReader(batch) for batch in table.to_batches()]
        self.batch_starts = np.cumsum([0] + [batch.rows for batch in self.batches[:-1]]).tolist()
        self.names = table.column_names
        self.verified: set[str] = set()  # record ids checked (or confirmed from the serving files)

    def close(self) -> None:
        self.table = None
        self.batches = []

    def value(self, name: str, row: int) -> object:
        at = bisect.bisect_right(self.batch_starts, row) - 1
        return self.batches[at].value(self.names.index(name), row - self.batch_starts[at])

    def row(self, row: int) -> dict[str, object]:
        at = bisect.bisect_right(self.batch_starts, row) - 1
        reader, offset = self.batches[at], row - self.batch_starts[at]
        values: dict[str, object] = {"target_key": self.target_key}
        for number, name in enumerate(self.names):
            values[name] = reader.value(number, offset)
        return values

    def _groups(self, workload_key: str, prefix: bool) -> list[tuple[int, int]]:
        """(first row, end row) of each group of ``workload_key`` (or of every key it prefixes)."""
        if not prefix:
            wanted = np.uint64(key_hash(workload_key))
            first = int(np.searchsorted(self.hashes, wanted, side="left"))
            last = int(np.searchsorted(self.hashes, wanted, side="right"))
            return [(int(self.starts[g]), int(self.stops[g])) for g in range(first, last)
                    if self.value("workload_key", int(self.starts[g])) == workload_key]
        starts = self.row_starts
        low, high = 0, len(starts)
        while low < high:  # first group whose key is >= the prefix (groups are in key order)
            middle = (low + high) // 2
            if self.value("workload_key", int(starts[middle])) < workload_key:
                low = middle + 1
            else:
                high = middle
        spans = []
        while low < len(starts):
            start = int(starts[low])
            if not self.value("workload_key", start).startswith(workload_key):
                break
            stop = int(starts[low + 1]) if low + 1 < len(starts) else self.rows
            spans.append((start, stop))
            low += 1
        return spans

    def best(self, workload_key: str, target: str, k: int, layout: str | None,
             mode: str, prefix: bool, per_layout: bool) -> list[TuningRecord]:
        from lorien.target import match_tier
        from lorien.warehouse.parquet.tables import rank_rows

        candidates = []
        for start, stop in self._groups(workload_key, prefix):
            group_layout = self.value("layout", start)
            if layout is not None and group_layout != layout:
                continue
            tier = match_tier(target, self.value("target", start), mode)
            if tier is None:
                continue
            for position in range(start, min(stop, start + k)):  # a group is in cost order
                row = self.row(position)
                if row["workload_key"] != self.value("workload_key", start) or row["layout"] != group_layout:
                    raise IndexDamaged(f"row {position} is not of its group")
                row["tier"] = tier
                candidates.append(row)
        chosen = rank_rows(candidates, k, per_layout)
        for row in chosen:
            if row["record_id"] not in self.verified and not content_matches(row):
                raise SuspectRow(row)
        return [TuningRecord.from_row(row) for row in chosen]


class _BatchReader:
    """Scalars of one record batch read straight from its (memory-mapped) buffers: a string is
    a slice of its data buffer, a number an element of a typed memoryview; other types (and
    anything unexpected) go through Arrow's scalars."""

    def __init__(self, batch: object):
        import pyarrow as pa

        self.rows = batch.num_rows
        self.readers = []
        for column in batch.columns:
            kind, parts = "arrow", (column,)
            if column.null_count == 0 and column.offset == 0:
                buffers = column.buffers()
                if pa.types.is_string(column.type):
                    kind, parts = "string", (memoryview(buffers[1]).cast("i"), memoryview(buffers[2]))
                elif pa.types.is_float64(column.type):
                    kind, parts = "number", (memoryview(buffers[1]).cast("d"),)
                elif pa.types.is_int64(column.type):
                    kind, parts = "number", (memoryview(buffers[1]).cast("q"),)
                elif (pa.types.is_list(column.type) and pa.types.is_float64(column.type.value_type)
                      and column.values.null_count == 0 and column.values.offset == 0):
                    kind, parts = "floats", (memoryview(buffers[1]).cast("i"),
                                             memoryview(column.values.buffers()[1]).cast("d"))
            self.readers.append((kind, parts))

    def value(self, number: int, row: int) -> object:
        kind, parts = self.readers[number]
        if kind == "string":
            offsets, data = parts
            return str(data[offsets[row]:offsets[row + 1]], "utf-8")
        if kind == "number":
            return parts[0][row]
        if kind == "floats":
            offsets, values = parts
            return values[offsets[row]:offsets[row + 1]].tolist()
        return parts[0][row].as_py()


class SuspectRow(Exception):
    """A row whose content does not hash to its record_id: a damaged index, or a record whose
    caller chose its own id (the store tells them apart from the serving files)."""

    def __init__(self, row: dict[str, object]):
        super().__init__(f"record {row['record_id']!r}")
        self.row = row


def content_matches(row: dict[str, object]) -> bool:
    """Whether a row's identity fields hash to its record_id and its cost_s is its costs' mean."""
    costs = list(row["costs"] or [])
    try:
        expected = compute_record_id(row["dialect"], row["target"], row["workload_key"], row["layout"],
                                     row["config"], costs, row["error_no"], row["timestamp"])
    except (TypeError, struct.error, AttributeError):
        return False
    if expected != row["record_id"]:
        return False
    mean, cost = mean_cost_s(costs, row["error_no"]), row["cost_s"]
    return mean is not None and cost is not None and abs(mean - cost) <= 1e-12 * abs(mean)


def staged_path(directory: str) -> str:
    return os.path.join(directory, f"{uuid.uuid4().hex}{SUFFIX}.tmp")
