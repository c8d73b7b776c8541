"""The serving index persisted beside the data, so a new process answers ``best()`` without
rebuilding it, and a one-shot ``lorien query`` answers without importing pyarrow or numpy.

One file per target key and serving-file listing: ``_index/best/target_key=K/<fingerprint>.lsi``,
where the fingerprint is a hash of the names of the serving files it was built from. Serving
files are immutable and uniquely named, so an index file is valid for exactly the listing it
names: a commit that adds (or a merge that removes) a serving file changes the listing, and
every process, this one or another, then looks for another file. A stale index is never read.

The file (little-endian, each section 64-byte aligned) holds the serving rows, deduplicated and in
serving order (workload_key, target, layout, cost, record_id), row by row, so that a lookup touches
a few pages of the file, not one or two per column (on a file of gigabytes most of a lookup's
time went to first touches of mapped pages):

- ``rows.offsets``: int64 (rows + 1), where each row starts in ``rows.data``;
- ``rows.data``: each row as ``<dddd q B I`` (cost_s, all_cost, timestamp, flop, error_no, a
  byte whose bits 1 and 2 say cost_s and flop are not null, the number of costs), a uint32 byte
  length per string column, the costs (float64), then the UTF-8 bytes of each string column. A
  string equal to the one of its group's first row is not kept again: its length is
  0xFFFFFFFF (the columns that name a workload, a target or a source repeat down a group, and
  cost 4 bytes a row instead of 100-200);

then, per (workload_key, target, layout) group, uint64 arrays: the hash of its workload key (sorted),
its (first row, end row) pairs in that order, and the first rows in row order (prefix lookups);
then a JSON header (version, files, listing, depth, rows, sections, CRC-32 of the group arrays)
and a tail: ``[uint64 header length][uint32 CRC-32 of the header][uint32 version][8-byte magic]``.

Reading maps the file and reads values through memoryviews (the standard library only). Opening
checks the magic, the size, both CRCs and the section bounds; a row is checked against its content
hash (``record_id``) and its cost against its costs the first time a lookup returns it (one bit a
row remembers it), so a damaged file is noticed and rebuilt, not believed. A lookup reads the
group keys and the (cost, record_id) of the rows that compete, and decodes whole only the rows
it returns. It is written under ``_staging`` and renamed into place.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import mmap
import os
import struct
import sys
import uuid
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate

from lorien.record import TuningRecord, compute_record_id, mean_cost_s
from lorien.target import match_tier

MAGIC = b"LORIENSI"
VERSION = 4
INDEX_DIR = "_index"
SUFFIX = ".lsi"
TAIL = struct.Struct("<QII8s")
GROUP_COLUMNS = ("workload_key", "target", "layout")
#: The number columns of a serving row, in the order a row keeps them; every other column of
#: SERVING_FILE_SCHEMA is a string, and ``costs`` a list of float64.
NUMBER_COLUMNS = ("cost_s", "all_cost", "timestamp", "flop", "error_no")
ROW_HEAD = "<ddddqBI"
COST_S_VALID, FLOP_VALID = 1, 2
#: A string length that says "as in the group's first row".
SAME_AS_HEAD = 0xFFFFFFFF
#: Rows laid out at a time by the writer (bounds its scratch memory).
WRITE_SLICE_ROWS = 4096


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


def string_names(names: Sequence[str]) -> list[str]:
    """The string columns of ``names``, in the order a row keeps them."""
    return [name for name in names if name not in NUMBER_COLUMNS and name != "costs"]


def _copy_segments(out, dest_starts, source, source_starts, lengths) -> None:
    """``out[dest_starts[i]:+lengths[i]] = source[source_starts[i]:+lengths[i]]`` for every i, at once."""
    import numpy as np

    total = int(lengths.sum())
    if not total:
        return
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(dest_starts, lengths) + within] = source[np.repeat(source_starts, lengths) + within]


def _row_bytes(table, strings: list[str], head_of: object, carried: dict[str, str]):
    """The rows of ``table`` laid out as ``rows.data`` keeps them: (bytes as uint8, each row's end).
    ``head_of`` is each row's group head in ``table`` (-1: a group begun in an earlier table,
    whose head's strings are ``carried``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = table.num_rows
    head_dtype = np.dtype([("cost_s", "<f8"), ("all_cost", "<f8"), ("timestamp", "<f8"), ("flop", "<f8"),
                           ("error_no", "<i8"), ("flags", "u1"), ("costs", "<u4"), ("lengths", "<u4", (len(strings),))])
    heads = np.zeros(rows, dtype=head_dtype)
    flags = np.zeros(rows, dtype=np.uint8)
    for name, bit in (("cost_s", COST_S_VALID), ("flop", FLOP_VALID), ("all_cost", 0), ("timestamp", 0),
                      ("error_no", 0)):
        column = table.column(name).combine_chunks()
        values = column.to_numpy(zero_copy_only=False)
        if column.null_count:
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            values = np.where(valid, values, 0)
        else:
            valid = np.ones(rows, dtype=bool)
        if bit:
            flags |= valid.astype(np.uint8) * bit
        elif not valid.all():
            raise ValueError(f"column {name} holds nulls")
        heads[name] = values
    heads["flags"] = flags
    costs = table.column("costs").combine_chunks()
    cost_offsets = np.frombuffer(costs.buffers()[1], dtype=np.int32)[costs.offset:costs.offset + rows + 1].astype(np.int64)
    cost_counts = np.diff(cost_offsets)
    cost_bytes = np.frombuffer(costs.flatten().to_numpy(zero_copy_only=False).astype("<f8").tobytes(), dtype=np.uint8)
    heads["costs"] = cost_counts
    own = head_of >= 0
    continued = ~own
    is_head = head_of == np.arange(rows)
    parts = []  # per string column: (bytes, starts in them, lengths kept)
    for number, name in enumerate(strings):
        column = table.column(name).combine_chunks().cast(pa.string())
        offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[
            column.offset:column.offset + rows + 1].astype(np.int64)
        lengths = np.diff(offsets)
        heads_values = column.take(pa.array(np.where(own, head_of, 0)))
        same = pc.equal(column, heads_values).to_numpy(zero_copy_only=False) & own & ~is_head
        if continued.any() and name in carried:
            same |= continued & pc.equal(column, pa.scalar(carried[name], pa.string())).to_numpy(zero_copy_only=False)
        kept = np.where(same, 0, lengths)
        heads["lengths"][:, number] = np.where(same, SAME_AS_HEAD, lengths)
        data = column.buffers()[2]
        parts.append((np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8),
                      offsets[:-1], kept))
    fixed = head_dtype.itemsize
    sizes = fixed + 8 * cost_counts + sum(kept for _, _, kept in parts)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    out = np.empty(int(ends[-1]) if rows else 0, dtype=np.uint8)
    _copy_segments(out, starts, heads.view(np.uint8), np.arange(rows, dtype=np.int64) * fixed,
                   np.full(rows, fixed, dtype=np.int64))
    at = starts + fixed
    _copy_segments(out, at, cost_bytes, (cost_offsets[:-1] - cost_offsets[0]) * 8, 8 * cost_counts)
    at = at + 8 * cost_counts
    for data, source_starts, kept in parts:
        _copy_segments(out, at, data, source_starts, kept)
        at = at + kept
    return out, ends


def write_index(path: str, tables: Callable[[], Iterable[tuple[object, Sequence[int]]]], names: Sequence[str],
                files: Sequence[str], listed: Sequence[str], depth: int | None) -> int:
    """Write an index file at ``path`` from ``tables()``: pairs of an Arrow table of serving rows
    (columns ``names``, plain types) in serving order, deduplicated, each range of workload keys
    after the last, and the rows of that table where a (workload_key, target, layout) group
    starts. Returns the rows written. The rows are gathered in a scratch file beside ``path``
    first."""
    import shutil
    import tempfile

    import numpy as np

    missing = {*NUMBER_COLUMNS, "costs", *GROUP_COLUMNS} - set(names)
    if missing:
        raise ValueError(f"serving rows without columns {sorted(missing)}")
    strings = string_names(names)
    scratch = tempfile.mkdtemp(prefix=".index-", dir=os.path.dirname(path))
    try:
        offsets_part = open(os.path.join(scratch, "rows.offsets"), "wb")  # noqa: SIM115
        data_part = open(os.path.join(scratch, "rows.data"), "wb")  # noqa: SIM115
        offsets_part.write(np.zeros(1, dtype=np.int64).tobytes())
        end = 0  # of the rows written so far, in rows.data
        carried: dict[str, str] = {}  # the strings of the head of the group the last table ended in
        # 8 bytes a group each (two lists of Python ints take about 88 bytes a group: 34 MiB at 400,000)
        hashes = array("Q")
        starts = array("Q")
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
            head_array = np.asarray(heads, dtype=np.int64)
            before = np.searchsorted(head_array, np.arange(table.num_rows), side="right") - 1
            head_of_row = np.where(before >= 0, head_array[np.maximum(before, 0)] if len(head_array) else -1, -1)
            for first in range(0, table.num_rows, WRITE_SLICE_ROWS):
                part = table.slice(first, WRITE_SLICE_ROWS)
                head_of = head_of_row[first:first + part.num_rows] - first  # negative: a head before the slice
                head_of = np.where(head_of >= 0, head_of, -1)
                data, ends = _row_bytes(part, strings, head_of, carried)
                data_part.write(data.tobytes())
                offsets_part.write((ends + end).astype(np.int64).tobytes())
                end += int(ends[-1])
                last_head = int(head_of[-1])
                if last_head >= 0:
                    carried = {name: part.column(name)[last_head].as_py() for name in strings}
            rows += table.num_rows
        offsets_part.close()
        data_part.close()
        row_starts = np.frombuffer(starts, dtype=np.uint64)
        stops = np.append(row_starts[1:], np.uint64(rows)).astype(np.uint64)
        key_hashes = np.frombuffer(hashes, dtype=np.uint64)
        order = np.argsort(key_hashes, kind="stable")
        spans = np.stack([row_starts[order], stops[order]], axis=1).reshape(-1)
        groups = {"hashes": key_hashes[order], "spans": spans, "row_starts": row_starts}
        sections: dict[str, list[int]] = {}
        crc = 0
        with open(path, "wb") as out:
            out.write(MAGIC)
            for name in ("rows.offsets", "rows.data"):
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


#: Linux's ``MADV_POPULATE_READ`` (5.14 and later; Python's mmap module names it from 3.13 on).
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22 if sys.platform.startswith("linux") else None)


def preload_map(mapped: mmap.mmap) -> str | None:
    """Bring a whole mapped index into memory now: its pages read from disk (or the page cache)
    and mapped into this process, so that no later lookup faults on the disk, whatever the page
    cache held before (``MADV_POPULATE_READ``: about 0.9 s for a 3 GB index here). Where the
    kernel does not have that, the kernel is asked to read it in the background
    (``MADV_WILLNEED``); the first lookups may then still wait for it."""
    if MADV_POPULATE_READ is not None:
        try:
            mapped.madvise(MADV_POPULATE_READ)
            return "populated"
        except OSError:  # EINVAL from a kernel older than 5.14
            pass
    if hasattr(mmap, "MADV_WILLNEED"):
        mapped.madvise(mmap.MADV_WILLNEED)
        return "advised"
    return None


class PersistedIndex:
    """A memory-mapped index file; answers as :class:`~lorien.warehouse.parquet.serving.ServingIndex`
    (with the standard library only). The group arrays are read into memory at open, the rows are
    read from the map as lookups touch them; with ``preload`` the whole file is read and mapped
    before the constructor returns (:func:`preload_map`)."""

    persisted = True

    def __init__(self, path: str, target_key: str, preload: bool = False):
        self.path = path
        self.target_key = target_key
        self.verified: set[str] = set()  # record ids checked (or confirmed from the serving files)
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < len(MAGIC) + TAIL.size:
                raise IndexDamaged(f"{size} bytes, shorter than an empty index")
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        #: how the whole file was brought into memory as it was opened, so that no lookup of a
        #: serving process waits for the disk: "populated" (read and mapped before this returns),
        #: "advised" (the kernel asked to read it in the background), or None (not asked, or
        #: the platform has neither)
        self.preloaded = preload_map(self._map) if preload else None
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
        # The group arrays (24 bytes a group) are copied into this process's memory, not left
        # mapped: every lookup searches them, and a page of them evicted from the page cache
        # (by a large write beside the server, say) would cost a lookup a read from disk.
        crc = 0
        group_arrays = []
        for name in ("hashes", "spans", "row_starts"):
            if len(sections[f"group.{name}"]) % 8:
                raise IndexDamaged(f"section group.{name} is not of 8-byte values")
            values = array("Q")
            values.frombytes(sections[f"group.{name}"])
            crc = zlib.crc32(values, crc)
            group_arrays.append(values)
        if crc != header["groups_crc"]:
            raise IndexDamaged("group arrays checksum mismatch")
        self.hashes, self.spans, self.row_starts = group_arrays
        if not len(self.hashes) == len(self.spans) // 2 == len(self.row_starts) == groups:
            raise IndexDamaged("group arrays of different lengths")
        self.offsets = sections["rows.offsets"].cast("q")
        self.data = sections["rows.data"]
        if len(self.offsets) != self.rows + 1:
            raise IndexDamaged(f"{len(self.offsets) - 1} row offsets, header says {self.rows} rows")
        self.strings = string_names(self.names)
        self._head = struct.Struct(f"{ROW_HEAD}{len(self.strings)}I")
        self._workload_key = self.strings.index("workload_key")
        self._record_id = self.strings.index("record_id")
        self._head_columns = (*(self.strings.index(name) for name in GROUP_COLUMNS), self._record_id)
        #: one bit per row: its content was checked against its record_id by this process (a
        #: row is hashed the first time a lookup returns it, not on every lookup)
        self.checked_rows = bytearray((self.rows + 7) // 8)

    def close(self) -> None:
        self.offsets = self.data = None

    def _fields(self, row: int) -> tuple[int, int, tuple]:
        """(where its costs start, where the row ends, its fixed fields) of a row."""
        start, stop = self.offsets[row], self.offsets[row + 1]
        if not 0 <= start <= stop - self._head.size or stop > len(self.data):
            raise IndexDamaged(f"row {row}: bytes {start}..{stop} outside {len(self.data)}")
        return start + self._head.size, stop, self._head.unpack_from(self.data, start)

    def _strings(self, at: int, lengths: Sequence[int]) -> list[str]:
        """The strings of these byte lengths laid end to end from ``at``: decoded at once, and
        cut as characters where all are ASCII (the usual case), else decoded one by one."""
        ends = list(accumulate(lengths))
        stop = at + (ends[-1] if ends else 0)
        text = str(self.data[at:stop], "utf-8")
        if len(text) == stop - at:
            return [text[begin:end] for begin, end in zip([0, *ends], ends, strict=False)]
        return [str(self.data[at + begin:at + end], "utf-8") for begin, end in zip([0, *ends], ends, strict=False)]

    def row(self, row: int, head: int | None = None) -> dict[str, object]:
        """Every column of a row; ``head`` is the first row of its group (strings it shares)."""
        try:
            at, stop, fields = self._fields(row)
            cost_s, all_cost, timestamp, flop, error_no, flags, count = fields[:7]
            values: dict[str, object] = {"target_key": self.target_key}
            values["costs"] = list(struct.unpack_from(f"<{count}d", self.data, at))
            at += 8 * count
            lengths = fields[7:]
            shared = SAME_AS_HEAD in lengths
            if shared:
                if head is None or head == row:
                    raise IndexDamaged(f"row {row}: a column refers to its group's first row")
                lengths = [0 if length == SAME_AS_HEAD else length for length in lengths]
            strings = self._strings(at, lengths)
            if at + sum(lengths) != stop:
                raise IndexDamaged(f"row {row}: {stop - at - sum(lengths)} bytes left over")
            values.update(zip(self.strings, strings, strict=True))
            if shared:
                head_values = self.row(head)
                for name, length in zip(self.strings, fields[7:], strict=True):
                    if length == SAME_AS_HEAD:
                        values[name] = head_values[name]
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise IndexDamaged(f"row {row}: {exc}") from exc
        values["cost_s"] = cost_s if flags & COST_S_VALID else None
        values["flop"] = flop if flags & FLOP_VALID else None
        values["all_cost"], values["timestamp"], values["error_no"] = all_cost, timestamp, error_no
        return values

    def _head_strings(self, head: int, columns: int) -> tuple[tuple, list[str]]:
        """(fixed fields, the first ``columns`` string columns) of a group's first row, with no
        other string decoded."""
        try:
            at, stop, fields = self._fields(head)
            lengths = fields[7:7 + columns]
            if SAME_AS_HEAD in lengths:
                raise IndexDamaged(f"row {head}, a group's first row, refers to another")
            at += 8 * fields[6]
            if at + sum(lengths) > stop:
                raise IndexDamaged(f"row {head}: strings past its end")
            return fields, self._strings(at, lengths)
        except (struct.error, UnicodeDecodeError) as exc:
            raise IndexDamaged(f"row {head}: {exc}") from exc

    def workload_key(self, head: int) -> str:
        """The workload key of a group's first row (no other string read)."""
        return self._head_strings(head, self._workload_key + 1)[1][self._workload_key]

    def group_head(self, head: int) -> tuple[str, str, str, str, float | None]:
        """(workload_key, target, layout, record_id, cost_s) of a group's first row: its group's
        key and what ranking needs of it, no other string read."""
        workload, target, layout, record_id = self._head_columns
        fields, values = self._head_strings(head, max(self._head_columns) + 1)
        cost_s = fields[0] if fields[5] & COST_S_VALID else None
        return values[workload], values[target], values[layout], values[record_id], cost_s

    def _rank_fields(self, row: int) -> tuple[float, str]:
        """(cost_s, record_id) of a row, what ranking needs of it (no other string read)."""
        at, stop, fields = self._fields(row)
        lengths = fields[7:]
        if not fields[5] & COST_S_VALID:
            raise IndexDamaged(f"row {row}: a serving row without a cost")
        length = lengths[self._record_id]
        if length == SAME_AS_HEAD:
            raise IndexDamaged(f"row {row}: its record_id refers to its group's first row")
        at += 8 * fields[6] + sum(other for other in lengths[:self._record_id] if other != SAME_AS_HEAD)
        if at + length > stop:
            raise IndexDamaged(f"row {row}: its record_id past its end")
        try:
            return fields[0], str(self.data[at:at + length], "utf-8")
        except UnicodeDecodeError as exc:
            raise IndexDamaged(f"row {row}: {exc}") from exc

    def _groups(self, workload_key: str, prefix: bool) -> list[tuple[int, int, tuple]]:
        """(first row, end row, :meth:`group_head`) of each group of ``workload_key`` (or of every
        key it prefixes)."""
        try:
            if not prefix:
                wanted = key_hash(workload_key)
                hashes = self.hashes
                # hashes are uniform: start looking where this one would be, a page or two wide
                guess = wanted * len(hashes) >> 64
                low, high = max(guess - 256, 0), min(guess + 256, len(hashes))
                if low > 0 and hashes[low] >= wanted:
                    low = 0
                if high < len(hashes) and hashes[high - 1] <= wanted:
                    high = len(hashes)
                first = bisect.bisect_left(hashes, wanted, low, high)
                groups = []
                while first < len(hashes) and hashes[first] == wanted:
                    start, stop = self.spans[2 * first], self.spans[2 * first + 1]
                    key = self.group_head(start)
                    if key[0] == workload_key:
                        groups.append((start, stop, key))
                    first += 1
                return groups
            starts = self.row_starts
            low, high = 0, len(starts)
            while low < high:  # the first group whose key is >= the prefix (groups are in key order)
                middle = (low + high) // 2
                if self.workload_key(starts[middle]) < workload_key:
                    low = middle + 1
                else:
                    high = middle
            groups = []
            while low < len(starts):
                start = starts[low]
                key = self.group_head(start)
                if not key[0].startswith(workload_key):
                    break
                groups.append((start, starts[low + 1] if low + 1 < len(starts) else self.rows, key))
                low += 1
            return groups
        except IndexError as exc:
            raise IndexDamaged(f"a group outside the rows ({exc})") from exc

    def best(self, workload_key: str, target: str, k: int, layout: str | None,
             mode: str, prefix: bool, per_layout: bool, verify: bool = True) -> list[TuningRecord]:
        """As ServingIndex.best. Only the group keys and the (cost_s, record_id) of the rows that
        compete are read; the rows returned are decoded whole, and each is checked against its
        record_id the first time this index returns it."""
        candidates = []  # (tier, cost_s, record_id, layout, row, group's first row, workload_key)
        for start, stop, (group_workload, group_target, group_layout, record_id, cost_s) in self._groups(
                workload_key, prefix):
            if not start < stop <= self.rows:
                raise IndexDamaged(f"group rows {start}..{stop} outside {self.rows} rows")
            if layout is not None and group_layout != layout:
                continue
            tier = match_tier(target, group_target, mode)
            if tier is None:
                continue
            if cost_s is None:
                raise IndexDamaged(f"row {start}: a serving row without a cost")
            candidates.append((tier, cost_s, record_id, group_layout, start, start, group_workload))
            for position in range(start + 1, min(stop, start + k)):  # a group is in cost order
                candidates.append((tier, *self._rank_fields(position), group_layout, position, start, group_workload))
        candidates.sort()
        if per_layout:
            by_layout: dict[str, list[tuple]] = {}
            for candidate in candidates:
                by_layout.setdefault(candidate[3], []).append(candidate)
            candidates = [candidate for group in by_layout.values() for candidate in group[:k]]
        else:
            del candidates[k:]
        records = []
        for _tier, _cost_s, record_id, group_layout, position, start, group_workload in candidates:
            row = self.row(position, None if position == start else start)
            if (row["record_id"], row["layout"], row["workload_key"]) != (record_id, group_layout, group_workload):
                raise IndexDamaged(f"row {position} is not of its group")
            bit = 1 << (position & 7)
            if verify and not self.checked_rows[position >> 3] & bit:
                if record_id not in self.verified and not content_matches(row):
                    raise SuspectRow(row)
                self.checked_rows[position >> 3] |= bit
            records.append(TuningRecord.from_row(row))
        return records


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
