"""The serving index persisted beside the data, so a new process answers ``best()`` without
rebuilding it, and a one-shot ``lorien query`` answers without importing pyarrow or numpy.

One file per target key and serving-file listing: ``_index/best/target_key=K/<fingerprint>.lsi``,
where the fingerprint is a hash of the names of the serving files it was built from. Serving
files are immutable and uniquely named, so an index file is valid for exactly the listing it
names: a commit that adds (or a merge that removes) a serving file changes the listing, and
every process, this one or another, then looks for another file. A stale index is never read.

The file (little-endian, each section 64-byte aligned) holds the serving rows, deduplicated and in
serving order (workload_key, target, layout, cost, record_id), column by column:

- a string column: a uint32 value number per row, and int64 offsets (values + 1) and the UTF-8
  bytes of its values, where a row equal to the row before shares its value (the columns that
  name a workload, a target or a source repeat down a group: kept once per run, they cost 4 bytes
  a row instead of 100-200);
- a number column: float64 (int64 for error_no) values, and a byte per row (1: not null) where
  the column may hold nulls;
- costs: int64 offsets (rows + 1) and float64 values;

then, per (workload_key, target, layout) group, uint64 arrays: the hash of its workload key, its
first row and its end row (sorted by hash), and the first rows in row order (prefix lookups);
then a JSON header (version, files, listing, depth, rows, sections, CRC-32 of the group arrays)
and a tail: ``[uint64 header length][uint32 CRC-32 of the header][uint32 version][8-byte magic]``.

Reading maps the file and reads values through memoryviews (the standard library only). Opening
checks the magic, the size, both CRCs and the section bounds; every row returned is checked
against its content hash (``record_id``) and its cost against its costs, so a damaged file is
noticed and rebuilt, not believed. It is written under ``_staging`` and renamed into place.
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
from collections.abc import Callable, Iterable, Sequence

from lorien.record import TuningRecord, compute_record_id, mean_cost_s

MAGIC = b"LORIENSI"
VERSION = 3
INDEX_DIR = "_index"
SUFFIX = ".lsi"
TAIL = struct.Struct("<QII8s")
GROUP_COLUMNS = ("workload_key", "target", "layout")
#: How each column of a serving row is kept (the columns of SERVING_FILE_SCHEMA).
COLUMN_KINDS = {"error_no": "int", "costs": "floats", "cost_s": "float", "all_cost": "float",
                "timestamp": "float", "flop": "float"}
NULLABLE = ("cost_s", "flop")


class IndexDamaged(Exception):
    """An index file that cannot be trusted (truncated, overwritten, of another version)."""


class IndexOfOtherVersion(IndexDamaged):
    """An index file written by a Lorien of another format version: rebuilt, not damaged."""


def fingerprint(listed: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(listed)).encode()).hexdigest()[:32]


def index_rel(serving_dir: str, listed: Iterable[str]) -> str:
    return f"{INDEX_DIR}/{serving_dir}/{fingerprint(listed)}{SUFFIX}"


def key_hash(workload_key: str) -> int:
    return int.from_bytes(hashlib.blake2b(workload_key.encode(), digest_size=8).digest(), "little")


def _align(offset: int) -> int:
    return -(-offset // 64) * 64


def write_index(path: str, tables: Callable[[], Iterable[tuple[object, Sequence[int]]]], names: Sequence[str],
                files: Sequence[str], listed: Sequence[str], depth: int | None) -> int:
    """Write an index file at ``path`` from ``tables()``: pairs of an Arrow table of serving rows
    (columns ``names``, plain types) in serving order, deduplicated, each range of workload keys
    after the last, and the rows of that table where a (workload_key, target, layout) group
    starts. Returns the rows written. Each column is gathered in a scratch file beside ``path``
    first."""
    import shutil
    import tempfile

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    scratch = tempfile.mkdtemp(prefix=".index-", dir=os.path.dirname(path))
    try:
        parts: dict[str, object] = {}

        def part(name: str):
            handle = parts.get(name)
            if handle is None:
                handle = parts[name] = open(os.path.join(scratch, name), "wb")  # noqa: SIM115
            return handle

        ends = {name: 0 for name in names}  # running end of each variable-length column's data
        values_seen = {name: 0 for name in names}  # values (runs) of each string column so far
        last_values: dict[str, object] = {}  # each string column's value in the previous table's last row
        for name in names:
            if COLUMN_KINDS.get(name, "string") in ("string", "floats"):
                part(f"{name}.offsets").write(np.zeros(1, dtype=np.int64).tobytes())
        hashes: list[int] = []
        starts: list[int] = []
        rows = 0
        last_key = None
        for table, group_heads in tables():
            if not table.num_rows:
                continue
            table = table.select(list(names)).combine_chunks()
            heads = list(group_heads)
            if heads and heads[0] == 0 and tuple(table.column(n)[0].as_py() for n in GROUP_COLUMNS) == last_key:
                heads = heads[1:]  # the group goes on from the previous table
            if heads:
                hashes.extend(key_hash(key) for key in table.column("workload_key").take(heads).to_pylist())
                starts.extend(rows + head for head in heads)
            last_key = tuple(table.column(n)[-1].as_py() for n in GROUP_COLUMNS)
            for name in names:
                column = table.column(name).chunk(0) if table.column(name).num_chunks else None
                kind = COLUMN_KINDS.get(name, "string")
                if kind in ("string", "floats"):
                    if kind == "string":
                        column = column.cast(pa.string())
                        first_new = np.ones(1, dtype=bool) if last_values.get(name) != column[0].as_py() \
                            else np.zeros(1, dtype=bool)
                        last_values[name] = column[-1].as_py()
                        changed = pc.not_equal(column[1:], column[:-1]).to_numpy(zero_copy_only=False)
                        starts_run = np.concatenate([first_new, changed])
                        # a first row equal to the previous table's last one is of its value
                        numbers = np.cumsum(starts_run, dtype=np.int64) - 1 + values_seen[name]
                        if numbers[-1] >= 1 << 32:
                            raise ValueError(f"column {name}: over 2**32 distinct runs")
                        part(f"{name}.numbers").write(numbers.astype(np.uint32).tobytes())
                        column = column.filter(pa.array(starts_run))
                        values_seen[name] += int(starts_run.sum())
                        if not len(column):
                            continue
                        offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[
                            column.offset:column.offset + len(column) + 1].astype(np.int64)
                        data = column.buffers()[2]
                        payload = memoryview(data)[offsets[0]:offsets[-1]] if data is not None else b""
                    else:
                        flat = column.flatten()
                        offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[
                            column.offset:column.offset + len(column) + 1].astype(np.int64)
                        values = flat.to_numpy(zero_copy_only=False).astype(np.float64)
                        payload = values.tobytes()
                        offsets = offsets - offsets[0]
                        offsets = offsets * 8 + offsets[0]
                    offsets = offsets - offsets[0] + ends[name]
                    part(f"{name}.offsets").write(offsets[1:].tobytes())
                    part(f"{name}.data").write(payload)
                    ends[name] = int(offsets[-1])
                else:
                    values = column.to_numpy(zero_copy_only=False)
                    valid = np.ones(len(values), dtype=np.uint8)
                    if column.null_count:
                        valid = column.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
                        values = np.where(valid.astype(bool), values, 0)
                    dtype = np.int64 if kind == "int" else np.float64
                    part(f"{name}.values").write(np.asarray(values, dtype=dtype).tobytes())
                    if name in NULLABLE:
                        part(f"{name}.valid").write(valid.tobytes())
            rows += table.num_rows
        for handle in parts.values():
            handle.close()
        row_starts = np.array(starts, dtype=np.uint64)
        stops = np.append(row_starts[1:], np.uint64(rows)).astype(np.uint64)
        key_hashes = np.array(hashes, dtype=np.uint64)
        order = np.argsort(key_hashes, kind="stable")
        groups = {"hashes": key_hashes[order], "starts": row_starts[order], "stops": stops[order],
                  "row_starts": row_starts}
        sections: dict[str, list[int]] = {}
        crc = 0
        with open(path, "wb") as out:
            out.write(MAGIC)
            for name in sorted(parts):
                out.write(b"\0" * (_align(out.tell()) - out.tell()))
                at = out.tell()
                with open(os.path.join(scratch, name), "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 22)
                sections[name] = [at, out.tell() - at]
            for name, values in groups.items():
                out.write(b"\0" * (_align(out.tell()) - out.tell()))
                data = values.tobytes()
                sections[f"group.{name}"] = [out.tell(), len(data)]
                out.write(data)
                crc = zlib.crc32(data, crc)
            header = json.dumps({"version": VERSION, "files": list(files), "listed": sorted(listed),
                                 "depth": depth, "rows": rows, "groups": len(hashes), "names": list(names),
                                 "sections": sections, "groups_crc": crc}).encode()
            out.write(header)
            out.write(TAIL.pack(len(header), zlib.crc32(header), VERSION, MAGIC))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


class PersistedIndex:
    """A memory-mapped index file; answers as :class:`~lorien.warehouse.parquet.serving.ServingIndex`
    (with the standard library only)."""

    persisted = True

    def __init__(self, path: str, target_key: str):
        self.path = path
        self.target_key = target_key
        self.verified: set[str] = set()  # record ids checked (or confirmed from the serving files)
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < len(MAGIC) + TAIL.size:
                raise IndexDamaged(f"{size} bytes, shorter than an empty index")
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(self._map)
        header_len, header_crc, version, magic = TAIL.unpack_from(view, size - TAIL.size)
        if magic != MAGIC or view[:len(MAGIC)] != MAGIC:
            raise IndexDamaged("no index magic (truncated or not an index file)")
        if version != VERSION:
            raise IndexOfOtherVersion(f"format version {version}, this Lorien reads {VERSION}")
        header_at = size - TAIL.size - header_len
        if header_at < len(MAGIC):
            raise IndexDamaged("header longer than the file")
        header_bytes = bytes(view[header_at:header_at + header_len])
        if zlib.crc32(header_bytes) != header_crc:
            raise IndexDamaged("header checksum mismatch")
        header = json.loads(header_bytes)
        self.files: tuple[str, ...] = tuple(header["files"])
        self.listed: tuple[str, ...] = tuple(header["listed"])
        self.depth: int | None = header["depth"]
        self.rows: int = header["rows"]
        self.names: list[str] = header["names"]
        groups: int = header["groups"]
        sections = {}
        for name, (at, length) in header["sections"].items():
            if at < len(MAGIC) or at + length > header_at:
                raise IndexDamaged(f"section {name} outside the file")
            sections[name] = view[at:at + length]
        crc = 0
        for name in ("hashes", "starts", "stops", "row_starts"):
            crc = zlib.crc32(sections[f"group.{name}"], crc)
        if crc != header["groups_crc"]:
            raise IndexDamaged("group arrays checksum mismatch")
        self.hashes, self.starts, self.stops, self.row_starts = (
            sections[f"group.{name}"].cast("Q") for name in ("hashes", "starts", "stops", "row_starts"))
        if not len(self.hashes) == len(self.starts) == len(self.stops) == len(self.row_starts) == groups:
            raise IndexDamaged("group arrays of different lengths")
        self.readers: list[tuple[str, str, tuple]] = []
        for name in self.names:
            kind = COLUMN_KINDS.get(name, "string")
            if kind == "string":
                numbers = sections[f"{name}.numbers"].cast("I")
                offsets = sections[f"{name}.offsets"].cast("q")
                data = sections[f"{name}.data"]
                if len(numbers) != self.rows:
                    raise IndexDamaged(f"column {name}: {len(numbers)} rows, header says {self.rows}")
                self.readers.append((name, kind, (numbers, offsets, data, len(data))))
            elif kind == "floats":
                offsets = sections[f"{name}.offsets"].cast("q")
                data = sections[f"{name}.data"]
                if len(offsets) != self.rows + 1:
                    raise IndexDamaged(f"column {name}: {len(offsets) - 1} rows, header says {self.rows}")
                self.readers.append((name, kind, (offsets, data.cast("d"), len(data))))
            else:
                values = sections[f"{name}.values"].cast("q" if kind == "int" else "d")
                valid = sections.get(f"{name}.valid")
                if len(values) != self.rows or (valid is not None and len(valid) != self.rows):
                    raise IndexDamaged(f"column {name}: {len(values)} rows, header says {self.rows}")
                self.readers.append((name, kind, (values, valid)))
        self._reader = {name: (kind, parts) for name, kind, parts in self.readers}

    def close(self) -> None:
        self.readers = []
        self._reader = {}

    @staticmethod
    def _read(kind: str, parts: tuple, row: int) -> object:
        if kind == "string":
            numbers, offsets, data, size = parts
            number = numbers[row]
            if number + 1 >= len(offsets):
                raise IndexDamaged(f"row {row}: value {number} of {len(offsets) - 1}")
            start, stop = offsets[number], offsets[number + 1]
            if not 0 <= start <= stop <= size:
                raise IndexDamaged(f"row {row}: offsets {start}..{stop} outside {size} bytes")
            return str(data[start:stop], "utf-8")
        if kind == "floats":
            offsets, values, size = parts
            start, stop = offsets[row], offsets[row + 1]
            if not 0 <= start <= stop <= size or start % 8 or stop % 8:
                raise IndexDamaged(f"row {row}: offsets {start}..{stop} outside {size} bytes")
            return values[start // 8:stop // 8].tolist()
        values, valid = parts
        if valid is not None and not valid[row]:
            return None
        return values[row]

    def value(self, name: str, row: int) -> object:
        kind, parts = self._reader[name]
        return self._read(kind, parts, row)

    def row(self, row: int) -> dict[str, object]:
        values: dict[str, object] = {"target_key": self.target_key}
        read = self._read
        for name, kind, parts in self.readers:
            values[name] = read(kind, parts, row)
        return values

    def _groups(self, workload_key: str, prefix: bool) -> list[tuple[int, int]]:
        """(first row, end row) of each group of ``workload_key`` (or of every key it prefixes)."""
        try:
            if not prefix:
                wanted = key_hash(workload_key)
                first = bisect.bisect_left(self.hashes, wanted)
                last = bisect.bisect_right(self.hashes, wanted, first)
                spans = [(self.starts[g], self.stops[g]) for g in range(first, last)]
                return [(start, stop) for start, stop in spans if self.value("workload_key", start) == workload_key]
            starts = self.row_starts
            low, high = 0, len(starts)
            while low < high:  # the first group whose key is >= the prefix (groups are in key order)
                middle = (low + high) // 2
                if self.value("workload_key", starts[middle]) < workload_key:
                    low = middle + 1
                else:
                    high = middle
            spans = []
            while low < len(starts):
                start = starts[low]
                if not self.value("workload_key", start).startswith(workload_key):
                    break
                spans.append((start, starts[low + 1] if low + 1 < len(starts) else self.rows))
                low += 1
            return spans
        except IndexError as exc:
            raise IndexDamaged(f"a group outside the rows ({exc})") from exc

    def best(self, workload_key: str, target: str, k: int, layout: str | None,
             mode: str, prefix: bool, per_layout: bool, verify: bool = True) -> list[TuningRecord]:
        from lorien.target import match_tier

        # Candidates are ranked on the columns ranking needs; only the rows chosen are read whole.
        candidates = []
        value = self.value
        for start, stop in self._groups(workload_key, prefix):
            if not start < stop <= self.rows:
                raise IndexDamaged(f"group rows {start}..{stop} outside {self.rows} rows")
            group_key, group_layout = value("workload_key", start), value("layout", start)
            if layout is not None and group_layout != layout:
                continue
            tier = match_tier(target, value("target", start), mode)
            if tier is None:
                continue
            for position in range(start, min(stop, start + k)):  # a group is in cost order
                candidates.append({"tier": tier, "cost_s": value("cost_s", position),
                                   "record_id": value("record_id", position), "layout": group_layout,
                                   "workload_key": group_key, "position": position})
        chosen = []
        for candidate in rank_rows(candidates, k, per_layout):
            row = self.row(candidate["position"])
            if row["workload_key"] != candidate["workload_key"] or row["layout"] != candidate["layout"]:
                raise IndexDamaged(f"row {candidate['position']} is not of its group")
            row["tier"] = candidate["tier"]
            chosen.append(row)
        if verify:
            for row in chosen:
                if row["record_id"] not in self.verified and not content_matches(row):
                    raise SuspectRow(row)
        return [TuningRecord.from_row(row) for row in chosen]


def rank_rows(rows: list[dict], k: int, per_layout: bool) -> list[dict]:
    """Most specific target match first (``row["tier"]``, see lorien.target.match_tier), then
    fastest (ties by record_id); with ``per_layout`` the best k of each layout, layouts ordered
    by their first row."""
    ordered = sorted(rows, key=lambda row: (row["tier"], row["cost_s"], row["record_id"]))
    if not per_layout:
        return ordered[:k]
    by_layout: dict[str, list[dict]] = {}
    for row in ordered:
        by_layout.setdefault(row["layout"], []).append(row)
    return [row for group in by_layout.values() for row in group[:k]]


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
