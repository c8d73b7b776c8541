"""ParquetStore: commits, reads, best(), workload entries and compaction over the files."""

from __future__ import annotations

import math
import os
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lorien.errors import StoreError
from lorien.record import ARROW_SCHEMA, TuningRecord
from lorien.serving_index import (
    GROUP_COLUMNS,
    IndexDamaged,
    IndexOfOtherVersion,
    PersistedIndex,
    SuspectRow,
    index_rel,
    rank_rows,
    staged_path,
    write_index,
)
from lorien.target import match_mode, match_tier, parse_target
from lorien.warehouse.base import CommitResult, Store, register_store
from lorien.warehouse.parquet.commit import ParquetCommit, PendingFile
from lorien.warehouse.parquet.files import open_files
from lorien.warehouse.parquet.ids import RecordIds
from lorien.warehouse.parquet.layout import (
    ABANDONED_COMMIT_S,
    COMPACT_ROW_GROUP,
    DEFAULT_NBEST,
    HASH_TEXT,
    PARTITION_COLUMNS,
    READ_RETRIES,
    RECORD_FILE_SCHEMA,
    RECORDS_DIR,
    S3_REFRESH_INTERVAL_S,
    SERVING_DIR,
    SERVING_FILE_SCHEMA,
    SERVING_MERGE_FILES,
    SERVING_MERGE_ROWS,
    SERVING_ROW_GROUP,
    STAGING_DIR,
    STALE_STAGING_S,
    WORKLOAD_FILE_SCHEMA,
    WORKLOADS_DIR,
    commit_of,
    complete_commits,
    partition_of,
    pause_point,
    published,
    records_dir,
    serving_depth,
    serving_dir,
)
from lorien.warehouse.parquet.serving import ServingIndex
from lorien.warehouse.parquet.tables import (
    constant,
    dedupe,
    group_starts,
    may_hold,
    serving_dictionary_columns,
    sort_for_serving,
    top_per_group,
)

#: Rows of the serving files a persisted index build reads at a time (about; see _serving_ranges).
INDEX_BUILD_ROWS = 16384


class ServingIndexWarning(UserWarning):
    """A persisted serving index could not be trusted and is rebuilt."""


#: A local directory's listing is kept while its mtime stays the same, once that mtime is this
#: much older than the listing (file systems stamp with a coarse clock: a change in the same
#: tick as an earlier one can leave the mtime as it was).
LISTING_SETTLE_NS = 1_000_000_000


@dataclass
class Listing:
    """A target key's serving files as last listed, and which of them are visible."""

    at: float
    listed: tuple[str, ...]
    files: tuple[str, ...]
    depth: int | None
    pending: bool  # some file belongs to a commit not (yet) complete: decide again next time
    #: A local directory's modification time (ns) taken before it was listed, when the listing
    #: may be kept while it stays the same (see ParquetStore._serving_files); else None.
    stamp: int | None = None


class ParquetStore(Store):
    """A warehouse of Parquet files; see the package docstring (lorien.warehouse.parquet) for the layout and guarantees."""

    #: Commits take dictionary-encoded string columns (decoded as files are written).
    accepts_dictionary_columns = True

    def __init__(self, location: str):
        self.location = location
        self.uri = f"parquet:{location}"
        self._files = open_files(location)
        self._known_ids = RecordIds()
        self._id_files: set[str] = set()
        self._serving_rows: dict[str, int] = {}
        self._indexes: dict[str, ServingIndex] = {}
        self._serving_tables: dict[str, pa.Table] = {}
        self._listed: dict[str, Listing] = {}
        self._serving_dirs: dict[str, str] = {}  # target key -> its serving directory
        self._complete: set[str] = set()
        self._lookups: dict[str, int] = {}
        self._targets: dict[str, tuple[str, str]] = {}

    def __repr__(self) -> str:
        return f"ParquetStore({self.location!r})"

    @property
    def local_root(self) -> str | None:
        """The local directory this store lives in (its URI's path, options such as
        ``?preload=true`` left off); None for a store on S3."""
        return self._files.root if self._files.is_local else None

    # -- writing ------------------------------------------------------------------------------

    def transaction(self, nbest: int | None = None, publish_each_batch: bool = False,
                    merge_rows: int | None = None) -> ParquetCommit:
        """A multi-batch commit; nothing becomes visible before ``finish()`` unless
        ``publish_each_batch``. Use as a context manager: an exception discards staged files.
        A serving merge after a batch reads at most ``merge_rows`` rows (the batch size, say)."""
        return ParquetCommit(self, nbest, publish_each_batch, merge_rows)

    def commit(self, records: Iterable[TuningRecord] | pa.Table, nbest: int | None = None) -> CommitResult:
        with self.transaction(nbest, publish_each_batch=True) as commit:
            commit.add(records)
        return commit.result

    def _publish_commit(self, serving: list[PendingFile], records: list[PendingFile]) -> list[str]:
        """Publish one commit: serving files first, record files last, named so that readers
        see none of it until its last record file is in place. Returns the record files."""
        commit, count = uuid.uuid4().hex, len(records)
        for number, pending in enumerate(serving, 1):
            self._place(pending, f"{pending.directory}/part-n{pending.depth}-{commit}-of{count}.parquet")
            pause_point(f"serving:{number}")
        published = []
        for number, pending in enumerate(records, 1):
            final = f"{pending.directory}/part-{commit}-{number}of{count}.parquet"
            self._place(pending, final)
            published.append(final)
            if number < count:
                pause_point(f"record:{number}")
        self._complete.add(commit)
        return published

    def _place(self, pending: PendingFile, final: str) -> None:
        if pending.staged is not None:
            self._files.publish(pending.staged, final)
        else:
            self._files.write(pending.table, final, pending.row_group_size)

    def _remove_abandoned(self, record_files: dict[str, int], serving_files: dict[str, int],
                          complete: set[str]) -> int:
        """Delete the files of incomplete commits whose newest file is older than
        :data:`ABANDONED_COMMIT_S`; returns how many files were deleted."""
        incomplete: dict[str, list[str]] = {}
        for rel in [*record_files, *serving_files]:
            commit = commit_of(rel)
            if commit is not None and commit[0] not in complete:
                incomplete.setdefault(commit[0], []).append(rel)
        if not incomplete:
            return 0
        ages = self._files.ages(rel for rels in incomplete.values() for rel in rels)
        removed = 0
        for rels in incomplete.values():
            if min((ages[rel] for rel in rels if rel in ages), default=math.inf) > ABANDONED_COMMIT_S:
                for rel in rels:
                    self._files.delete(rel)
                removed += len(rels)
        return removed

    def _known_record_ids(self, remove_abandoned: bool = False) -> RecordIds:
        """Record ids of every published record file (read once per file per process); with
        ``remove_abandoned``, also delete the leftovers of killed writers."""
        listed = self._files.list(RECORDS_DIR, sizes=False)
        complete = complete_commits(listed)
        self._complete |= complete
        if remove_abandoned:
            self._remove_abandoned(listed, self._files.list(SERVING_DIR, sizes=False), complete)
        listed = published(listed, complete)
        for rel in listed.keys() - self._id_files:
            try:
                ids = self._files.open(rel).read(columns=["record_id"]).column("record_id")
            except FileNotFoundError:
                continue
            self._known_ids.update(ids)
            self._id_files.add(rel)
        return self._known_ids

    def _invalidate(self) -> None:
        self._listed.clear()

    def close(self) -> None:
        """Free the record ids and serving tables read so far (16 bytes a record for the ids);
        a later commit or lookup reads what it needs again."""
        self._known_ids.clear()
        self._id_files.clear()
        self._serving_tables.clear()

    # -- workload entries ---------------------------------------------------------------------

    def put_workloads(self, entries: Mapping[str, str]) -> int:
        """Keep entries as ``workloads/<hash>.parquet``, one file each, published atomically;
        an entry already kept is not written again (same hash, same content)."""
        for digest in entries:
            if not HASH_TEXT.fullmatch(digest):
                raise StoreError(f"workload hash {digest!r} is not 32 lowercase hex digits")
        kept = set(self._files.names(WORKLOADS_DIR))
        new = 0
        for digest, text in sorted(entries.items()):
            rel = f"{WORKLOADS_DIR}/{digest}.parquet"
            if rel in kept:
                continue
            self._files.write(pa.table({"workload_hash": [digest], "entry": [text]}, schema=WORKLOAD_FILE_SCHEMA), rel)
            new += 1
        return new

    def get_workloads(self, hashes: Iterable[str]) -> dict[str, str]:
        found = {}
        for digest in set(hashes):
            if not HASH_TEXT.fullmatch(digest):
                continue
            try:
                table = self._files.open(f"{WORKLOADS_DIR}/{digest}.parquet").read()
            except FileNotFoundError:
                continue
            found[digest] = table.column("entry")[0].as_py()
        return found

    # -- reading ------------------------------------------------------------------------------

    def _record_files(self, target_keys: set[str] | None, layouts: set[str] | None,
                      sizes: bool = False) -> dict[str, int]:
        """The visible record files (of complete commits), optionally of some partitions only."""
        listed = self._files.list(RECORDS_DIR, sizes)
        listed = published(listed, complete_commits(listed))
        if target_keys is None and layouts is None:
            return listed
        chosen = {}
        for rel, size in listed.items():
            partition = partition_of(rel)
            if target_keys is not None and partition.get("target_key") not in target_keys:
                continue
            if layouts is not None and partition.get("layout") not in layouts:
                continue
            chosen[rel] = size
        return chosen

    def visible_record_files(self) -> dict[str, int]:
        """Record files of complete commits (relative path -> bytes): what readers that stream
        the store file by file (featurization) must restrict themselves to."""
        return self._record_files(None, None, sizes=True)

    def _read_record_file(self, rel: str, columns: list[str]) -> pa.Table:
        file_columns = [name for name in columns if name not in PARTITION_COLUMNS]
        table = self._files.open(rel).read(columns=file_columns)
        partition = partition_of(rel)
        arrays, names = [], []
        for name in columns:
            names.append(name)
            if name in PARTITION_COLUMNS:
                arrays.append(constant(partition.get(name, ""), table.num_rows))
            else:
                arrays.append(table.column(name))
        return pa.Table.from_arrays(arrays, schema=pa.schema([ARROW_SCHEMA.field(n) for n in names]))

    def scan(self, filters: dict[str, Any] | None = None, columns: list[str] | None = None) -> pa.Table:
        import pyarrow.compute as pc

        filters = normalize_filters(filters or {})
        wanted = list(columns) if columns is not None else list(ARROW_SCHEMA.names)
        unknown = [name for name in [*wanted, *filters] if name not in ARROW_SCHEMA.names]
        if unknown:
            raise StoreError(f"unknown column(s) {unknown}; columns are {ARROW_SCHEMA.names}")
        needed = [name for name in ARROW_SCHEMA.names
                  if name in wanted or name in filters or name == "record_id"]
        for _attempt in range(READ_RETRIES):
            files = self._record_files(filters.get("target_key"), filters.get("layout"))
            parts = []
            try:
                for rel in sorted(files):
                    part = self._read_record_file(rel, needed)
                    for name, values in filters.items():
                        if name not in PARTITION_COLUMNS:
                            part = part.filter(pc.is_in(part.column(name), value_set=pa.array(
                                sorted(values), ARROW_SCHEMA.field(name).type)))
                    parts.append(part)
            except FileNotFoundError:
                continue  # a compaction replaced files while we read: list again
            break
        else:
            raise StoreError(f"files of {self.uri} kept changing while reading; try again")
        schema = pa.schema([ARROW_SCHEMA.field(name) for name in needed])
        table = pa.concat_tables(parts) if parts else schema.empty_table()
        return dedupe(table).select(wanted)

    def workloads(self, target: str | None = None) -> list[str]:
        import pyarrow.compute as pc

        filters = {"target": target} if target is not None else None
        table = self.scan(filters, columns=["workload_key"])
        return sorted(pc.unique(table.column("workload_key")).to_pylist())

    def stats(self) -> dict[str, Any]:
        import pyarrow.compute as pc

        serving_listed = self._files.list(SERVING_DIR)
        listed = self._files.list(RECORDS_DIR)
        complete = complete_commits(listed)
        record_files = published(listed, complete)
        serving_files = published(serving_listed, complete)
        incomplete = len(listed) + len(serving_listed) - len(record_files) - len(serving_files)
        table = self.scan(columns=["record_id", "target", "target_key", "workload_key", "layout", "cost_s"])
        valid = table.filter(pc.is_valid(table.column("cost_s")))

        def distinct(name: str) -> int:
            return pc.count_distinct(table.column(name)).as_py() if table.num_rows else 0

        return {
            "uri": self.uri,
            "records": table.num_rows,
            "valid_records": valid.num_rows,
            "workloads": distinct("workload_key"),
            "targets": distinct("target"),
            "target_keys": sorted(set(table.column("target_key").to_pylist())),
            "layouts": distinct("layout"),
            "files": len(record_files),
            "bytes": sum(record_files.values()),
            "serving_files": len(serving_files),
            "serving_bytes": sum(serving_files.values()),
            "incomplete_commit_files": incomplete,  # being published, or left by killed writers
            "workload_entries": len(self._files.names(WORKLOADS_DIR)),  # kept once each (MetaSchedule modules)
        }

    # -- best ---------------------------------------------------------------------------------

    def _target_names(self, target: str) -> tuple[str, str]:
        """(alternate key, canonical string) of a target, parsed once per spelling."""
        names = self._targets.get(target)
        if names is None:
            parsed = parse_target(target)
            names = self._targets[target] = (parsed.alternate_key, parsed.canonical)
        return names

    def _serving_files(self, target_key: str) -> tuple[tuple[str, ...], int | None]:
        """A target key's visible serving files and the serving depth they guarantee (None: no
        files). The decision is kept while the listing stays the same and no file waits on
        an incomplete commit."""
        now = time.monotonic()
        cached = self._listed.get(target_key)
        if cached is not None and not self._files.is_local and now - cached.at < S3_REFRESH_INTERVAL_S:
            return cached.files, cached.depth
        directory = self._serving_dirs.get(target_key)
        if directory is None:
            directory = self._serving_dirs[target_key] = serving_dir(target_key)
        stamp = self._files.stamp(directory)
        if cached is not None and stamp is not None and cached.stamp == stamp and not cached.pending:
            return cached.files, cached.depth
        listed = tuple(sorted(self._files.names(directory)))
        if cached is not None and cached.listed == listed and not cached.pending:
            files, depth, pending = cached.files, cached.depth, False
        else:
            # A persisted index of exactly this listing was built when all of it was visible
            # (it is never persisted otherwise), so it says which files are visible.
            index = self._indexes.get(target_key)
            if listed and not (isinstance(index, PersistedIndex) and index.listed == listed):
                index = self._open_persisted(target_key, listed)
                if index is not None:
                    self._indexes[target_key] = index
            if isinstance(index, PersistedIndex) and index.listed == listed:
                files, depth, pending = index.files, index.depth, False
                self._complete.update(commit[0] for commit in map(commit_of, files) if commit is not None)
            else:
                files, pending = self._visible_serving(listed)
                depth = min((serving_depth(rel) for rel in files), default=None)
        # A directory changed within the file system's timestamp resolution of this listing
        # may change again without a new mtime: such a listing is not kept.
        settled = stamp is not None and stamp < time.time_ns() - LISTING_SETTLE_NS
        self._listed[target_key] = Listing(now, listed, files, depth, pending, stamp if settled else None)
        return files, depth

    def _visible_serving(self, listed: Iterable[str]) -> tuple[tuple[str, ...], bool]:
        """The serving files that stand alone or belong to a complete commit, and whether any
        other was left out. Commits seen complete once are remembered, so the record files are
        listed only when a serving file of a commit not seen complete yet appears."""
        visible, waiting = [], []
        for rel in listed:
            commit = commit_of(rel)
            if commit is None or commit[0] in self._complete:
                visible.append(rel)
            else:
                waiting.append((rel, commit[0]))
        if waiting:
            self._complete |= complete_commits(self._files.list(RECORDS_DIR, sizes=False))
            visible.extend(rel for rel, commit in waiting if commit in self._complete)
        return tuple(sorted(visible)), len(visible) < len(listed)

    def _relist_serving(self, target_key: str) -> tuple[str, ...]:
        self._listed.pop(target_key, None)
        return self._serving_files(target_key)[0]

    def _read_serving(self, rel: str, target_key: str) -> pa.Table:
        cached = self._serving_tables.get(rel)
        if cached is None:
            table = self._files.open(rel).read()
            table = table.append_column(ARROW_SCHEMA.field("target_key"), constant(target_key, table.num_rows))
            cached = self._serving_tables[rel] = table.select(ARROW_SCHEMA.names)
        return cached

    def _best_cold(self, files: tuple[str, ...], target_key: str, workload_key: str, target: str,
                   k: int, layout: str | None, mode: str, prefix: bool,
                   per_layout: bool) -> list[TuningRecord]:
        """A first lookup reads only the row groups whose workload_key range can hold the key
        and selects in plain Python, so a process that asks once (a cold ``lorien query``)
        neither builds the index nor pays for Arrow compute."""
        high = workload_key + "\U0010ffff" if prefix else workload_key
        rows: dict[str, dict] = {}
        for rel in files:
            handle = self._files.open(rel)
            metadata = handle.metadata
            column = metadata.schema.names.index("workload_key")
            groups = [number for number in range(metadata.num_row_groups)
                      if may_hold(metadata.row_group(number).column(column).statistics, workload_key, high)]
            if not groups:
                continue
            part = handle.read_row_groups(groups)
            keys = part.column("workload_key").to_pylist()
            hits = [row for row, key in enumerate(keys)
                    if (key.startswith(workload_key) if prefix else key == workload_key)]
            if not hits:
                continue
            # Serving files are sorted by workload_key: the hits are one contiguous run.
            for row in part.slice(hits[0], hits[-1] + 1 - hits[0]).to_pylist():
                key = row["workload_key"]
                if not (key.startswith(workload_key) if prefix else key == workload_key):
                    continue
                tier = match_tier(target, row["target"], mode)
                if tier is not None and (layout is None or row["layout"] == layout):
                    row["target_key"], row["tier"] = target_key, tier
                    rows[row["record_id"]] = row
        return [TuningRecord.from_row(row) for row in rank_rows(list(rows.values()), k, per_layout)]

    # -- the persisted serving index (local stores; see lorien.serving_index) -----------------

    def _open_persisted(self, target_key: str, listed: tuple[str, ...]) -> PersistedIndex | None:
        """The persisted index of this listing, or None when there is none (or it was damaged:
        then it is deleted, with a warning, and rebuilt by the next warm lookup)."""
        if not self._files.is_local:
            return None
        path = self._files._path(index_rel(serving_dir(target_key), listed))
        try:
            return PersistedIndex(path, target_key, preload=self._files.preload)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return None  # none built for this listing (or none can be read here)
        except IndexOfOtherVersion:
            try:
                os.remove(path)  # written by another Lorien: the next warm lookup builds this one's
            except OSError:
                pass
            return None
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, it is not trusted
            self._drop_persisted(path, exc)
            return None

    def _drop_persisted(self, path: str, why: object) -> None:
        warnings.warn(f"serving index {path} is damaged ({why}); rebuilding it from the serving files",
                      ServingIndexWarning, stacklevel=4)
        try:
            os.remove(path)
        except OSError:
            pass

    def _open_serving(self, rel: str):
        """A serving file opened for the index build; read, not memory-mapped: mapped pages of
        every serving file would stay in this process's resident set for the whole build."""
        import pyarrow.parquet as pq

        return pq.ParquetFile(self._files._path(rel), memory_map=False)

    def _serving_ranges(self, files: tuple[str, ...]):
        """The rows of ``files``, deduplicated and in serving order, one workload-key range at a
        time (about :data:`INDEX_BUILD_ROWS` rows): serving files are sorted by workload key, and
        their row-group statistics say which row groups can hold a range."""
        import pyarrow.compute as pc

        groups = []  # (min key, max key, rows, file, row group)
        # Only each row group's workload-key range is kept, not the files' footers: a footer holds
        # statistics of every column of every row group (about 0.5 MiB a file of 27 row groups),
        # and 101 footers held open for the whole build were 55 MiB that grew with the store.
        # A range reopens the files it reads, one at a time (about 1 ms a file).
        for rel in files:
            with self._open_serving(rel) as handle:
                metadata = handle.metadata
                column = metadata.schema.names.index("workload_key")
                for number in range(metadata.num_row_groups):
                    row_group = metadata.row_group(number)
                    statistics = row_group.column(column).statistics
                    if statistics is None or not statistics.has_min_max:
                        groups = []
                        break
                    groups.append((statistics.min, statistics.max, row_group.num_rows, rel, number))
                else:
                    continue
            break
        else:
            groups.sort()
        if not groups and files:  # no statistics to range by: one range of everything
            tables = []
            for rel in files:
                with self._open_serving(rel) as handle:
                    tables.append(handle.read())
            yield sort_for_serving(dedupe(pa.concat_tables(tables))).select(SERVING_FILE_SCHEMA.names)
            return
        bounds: list[str] = []  # a range runs from one bound (included) to the next (excluded)
        rows = 0
        for low, _high, count, _rel, _number in groups:
            if rows >= INDEX_BUILD_ROWS and (not bounds or low > bounds[-1]):
                bounds.append(low)
                rows = 0
            rows += count
        edges: list[str | None] = [None, *bounds, None]
        for low, high in zip(edges[:-1], edges[1:], strict=True):
            by_file: dict[str, list[int]] = {}
            for key_min, key_max, _count, rel, number in groups:
                if (high is None or key_min < high) and (low is None or key_max >= low):
                    by_file.setdefault(rel, []).append(number)
            parts = []
            for rel, numbers in by_file.items():
                with self._open_serving(rel) as handle:
                    part = handle.read_row_groups(numbers, columns=SERVING_FILE_SCHEMA.names)
                keys = part.column("workload_key")
                mask = None
                if low is not None:
                    mask = pc.greater_equal(keys, low)
                if high is not None:
                    below = pc.less(keys, high)
                    mask = below if mask is None else pc.and_(mask, below)
                parts.append(part if mask is None else part.filter(mask))
            if parts:
                table = sort_for_serving(dedupe(pa.concat_tables(parts))).select(SERVING_FILE_SCHEMA.names)
                del parts
                yield table
                del table
                pa.default_memory_pool().release_unused()  # give freed ranges back to the system

    def _build_persisted(self, target_key: str, files: tuple[str, ...]) -> PersistedIndex | None:
        """Build and publish the persisted index of ``files`` (the whole listing, all visible);
        older index files of the target key are deleted. None when a file vanished meanwhile."""
        final = self._files._path(index_rel(serving_dir(target_key), files))
        staging = self._files._path(STAGING_DIR)
        try:
            os.makedirs(staging, exist_ok=True)
            os.makedirs(os.path.dirname(final), exist_ok=True)
        except OSError:
            return None  # a store this process may only read: the index stays in memory
        staged = staged_path(staging)
        depth = min((serving_depth(rel) for rel in files), default=None)
        try:
            ranges = ((table, group_starts(table, GROUP_COLUMNS).tolist()) for table in self._serving_ranges(files))
            write_index(staged, lambda: ranges, SERVING_FILE_SCHEMA.names, files, files, depth)
            os.rename(staged, final)
        except FileNotFoundError:
            return None  # a merge or compaction replaced a serving file: the listing is stale
        except PermissionError:
            return None
        finally:
            if os.path.exists(staged):
                os.remove(staged)
        directory = os.path.dirname(final)
        for name in os.listdir(directory):
            if name != os.path.basename(final):
                try:
                    os.remove(os.path.join(directory, name))
                except FileNotFoundError:
                    pass
        return PersistedIndex(final, target_key, preload=self._files.preload)

    def build_serving_indexes(self) -> dict[str, int]:
        """Build (or find) the persisted serving index of every target key, so that a new
        process answers its first warm ``best()`` without building one; returns the rows of
        each index. Local stores only (an S3 store returns {})."""
        if not self._files.is_local:
            return {}
        built = {}
        for name in sorted(os.listdir(self._files._path(SERVING_DIR)) if os.path.isdir(
                self._files._path(SERVING_DIR)) else []):
            if not name.startswith("target_key="):
                continue
            target_key = partition_of(f"{SERVING_DIR}/{name}/x.parquet")["target_key"]
            files, _depth = self._relist(target_key)
            if files:
                index = self._index(target_key, files)
                built[target_key] = index.rows if isinstance(index, PersistedIndex) else index.table.num_rows
        return built

    def _relist(self, target_key: str) -> tuple[tuple[str, ...], int | None]:
        self._listed.pop(target_key, None)
        return self._serving_files(target_key)

    def _index(self, target_key: str, files: tuple[str, ...]) -> ServingIndex | PersistedIndex:
        index = self._indexes.get(target_key)
        if index is not None and index.files == files:
            return index
        listing = self._listed.get(target_key)
        if (self._files.is_local and files and listing is not None and not listing.pending
                and listing.listed == files):
            persisted = self._open_persisted(target_key, files) or self._build_persisted(target_key, files)
            if persisted is not None:
                self._indexes[target_key] = persisted
                return persisted
        for _attempt in range(READ_RETRIES):
            try:
                tables = [self._read_serving(rel, target_key) for rel in files]
            except FileNotFoundError:
                files = self._relist_serving(target_key)
                continue
            break
        else:
            raise StoreError(f"serving files of {self.uri} kept changing while reading; try again")
        live = set(files)
        for rel in [rel for rel in self._serving_tables if rel not in live and rel.startswith(
                serving_dir(target_key) + "/")]:
            del self._serving_tables[rel]
        table = pa.concat_tables(tables) if tables else ARROW_SCHEMA.empty_table()
        index = ServingIndex(table, files)
        self._indexes[target_key] = index
        return index

    def best(self, workload_key: str, target: str, k: int = 1, layout: str | None = None,
             by_alternate_key: bool = False, prefix: bool = False,
             per_layout: bool = False, exact: bool = False) -> list[TuningRecord]:
        if k < 1:
            raise StoreError(f"k must be a positive number of records, got {k!r}")
        mode = match_mode(exact, by_alternate_key)
        target_key, canonical = self._target_names(target)
        files, depth = self._serving_files(target_key)
        if depth is not None and k > depth:
            return self._best_from_records(workload_key, canonical, target_key, k, layout,
                                           mode, prefix, per_layout)
        lookups = self._lookups.get(target_key, 0)
        self._lookups[target_key] = lookups + 1
        if lookups == 0 and target_key not in self._indexes:
            try:
                return self._best_cold(files, target_key, workload_key, canonical, k, layout,
                                       mode, prefix, per_layout)
            except FileNotFoundError:
                files = self._relist_serving(target_key)
        index = self._index(target_key, files)
        try:
            return index.best(workload_key, canonical, k, layout, mode, prefix, per_layout)
        except SuspectRow as suspect:
            # A row that does not hash to its id: a record whose caller chose its id, or damage.
            # The serving files decide.
            exact = self._best_cold(files, target_key, workload_key, canonical, k, layout, mode,
                                    prefix, per_layout)
            if any(record.record_id == suspect.row["record_id"] and TuningRecord.from_row(suspect.row) == record
                   for record in exact):
                index.verified.add(str(suspect.row["record_id"]))
                return exact
            damage: object = f"record {suspect.row['record_id']} differs from the serving files"
        except IndexDamaged as exc:
            damage = exc
        self._drop_persisted(index.path, damage)
        index.close()
        self._indexes.pop(target_key, None)
        files = self._relist(target_key)[0]
        return self._index(target_key, files).best(workload_key, canonical, k, layout, mode, prefix, per_layout)

    def _best_from_records(self, workload_key: str, target: str, target_key: str, k: int,
                           layout: str | None, mode: str, prefix: bool,
                           per_layout: bool) -> list[TuningRecord]:
        """Exact answer from the full records, for k deeper than the serving view."""
        import pyarrow.compute as pc

        filters: dict[str, Any] = {"target_key": target_key}
        if mode == "exact":
            filters["target"] = target
        if layout is not None:
            filters["layout"] = layout
        if not prefix:
            filters["workload_key"] = workload_key
        table = self.scan(filters)
        if prefix:
            table = table.filter(pc.starts_with(table.column("workload_key"), workload_key))
        index = ServingIndex(top_per_group(table, k))
        return index.best(workload_key, target, k, layout, mode, prefix, per_layout)

    # -- compaction ---------------------------------------------------------------------------

    def _merge_serving(self, target_key: str, merge_rows: int | None = None) -> None:
        """Once commits have piled up more than :data:`SERVING_MERGE_FILES` serving files for a
        target key, fold the smallest together, in groups of at most ``merge_rows`` rows
        (:data:`SERVING_MERGE_ROWS` by default), so the memory a merge takes is bounded however
        large the serving view grows; files larger than that are left to :meth:`compact`. A
        merged file keeps the shallowest depth it covers."""
        listed = self._files.names(serving_dir(target_key))
        if len(listed) <= SERVING_MERGE_FILES:
            return
        files, _ = self._visible_serving(listed)  # files of incomplete commits stay as they are
        limit = SERVING_MERGE_ROWS if merge_rows is None else merge_rows
        try:
            sized = sorted((self._rows_of(rel), rel) for rel in files)
        except FileNotFoundError:
            return  # another process is merging the same files
        groups: list[list[str]] = [[]]
        rows = 0
        for count, rel in sized:
            if rows + count > limit:
                if count > limit:
                    break
                groups.append([])
                rows = 0
            groups[-1].append(rel)
            rows += count
        for group in groups:
            if len(group) > 1:
                self._merge_serving_files(target_key, group)
        self._invalidate()

    def _rows_of(self, rel: str) -> int:
        rows = self._serving_rows.get(rel)
        if rows is None:
            rows = self._serving_rows[rel] = self._files.open(rel).metadata.num_rows
        return rows

    def _merge_serving_files(self, target_key: str, files: list[str]) -> None:
        try:
            # one thread: Arrow's pool threads keep what they allocate, and merges run every commit
            tables = [self._files.open(rel, serving_dictionary_columns()).read(use_threads=False) for rel in files]
        except FileNotFoundError:
            return  # another process is merging the same files
        depth = min(serving_depth(rel) for rel in files)
        merged = top_per_group(dedupe(pa.concat_tables(tables)), depth)
        del tables
        final = f"{serving_dir(target_key)}/part-n{depth}-{uuid.uuid4().hex}-of0.parquet"
        self._files.write(merged.select(SERVING_FILE_SCHEMA.names), final, SERVING_ROW_GROUP)
        self._serving_rows[final] = merged.num_rows
        for rel in files:
            self._files.delete(rel)
            self._serving_rows.pop(rel, None)

    def compact(self) -> dict[str, Any]:
        """Merge each partition's files into one sorted file; rebuild the serving view from
        the records (deduplicated, deepest nbest seen); delete the leftovers of killed writers.
        Query answers do not change."""
        # Serving files first: a serving file listed here whose commit is complete in the
        # record listing that follows has its records in that listing, so the rebuilt view
        # covers it; one whose commit is not complete yet is left alone.
        serving_listed = self._files.list(SERVING_DIR)
        record_listed = self._files.list(RECORDS_DIR)
        complete = complete_commits(record_listed)
        abandoned = self._remove_abandoned(record_listed, serving_listed, complete)
        serving_files = published(serving_listed, complete)
        record_files = published(record_listed, complete)
        depths = [serving_depth(rel) for rel in serving_files]
        depth = max(depths) if depths else DEFAULT_NBEST
        by_partition: dict[tuple[str, str], list[str]] = {}
        for rel in record_files:
            partition = partition_of(rel)
            by_partition.setdefault((partition["target_key"], partition["layout"]), []).append(rel)
        serving_parts: dict[str, list[pa.Table]] = {}
        replaced: list[str] = []
        for (target_key, layout), rels in sorted(by_partition.items()):
            try:
                tables = [self._read_record_file(rel, list(ARROW_SCHEMA.names)) for rel in sorted(rels)]
            except FileNotFoundError:
                continue  # another compaction got here first
            table = dedupe(pa.concat_tables(tables))
            commit = commit_of(rels[0])
            # A file of a many-file commit is rewritten even alone: deleting its siblings in
            # other partitions would leave it in an incomplete commit, which no reader sees.
            if len(rels) > 1 or (commit is not None and commit[1] > 1):
                ordered = table.sort_by([("workload_key", "ascending"), ("cost_s", "ascending"),
                                         ("record_id", "ascending")])
                final = f"{records_dir(target_key, layout)}/part-{uuid.uuid4().hex}-1of1.parquet"
                self._files.write(ordered.select(RECORD_FILE_SCHEMA.names), final, COMPACT_ROW_GROUP)
                replaced.extend(rels)
            serving_parts.setdefault(target_key, []).append(top_per_group(table, depth))
        # Every merged file is published before any file it replaces is deleted.
        for target_key, parts in serving_parts.items():
            serving = sort_for_serving(pa.concat_tables(parts)).select(SERVING_FILE_SCHEMA.names)
            if serving.num_rows:
                final = f"{serving_dir(target_key)}/part-n{depth}-{uuid.uuid4().hex}-of0.parquet"
                self._files.write(serving, final, SERVING_ROW_GROUP)
        for target_key in serving_parts:
            for rel in serving_files:
                if rel.startswith(serving_dir(target_key) + "/"):
                    self._files.delete(rel)
        for rel in replaced:
            self._files.delete(rel)
        for rel in self._files.stale_staged(STALE_STAGING_S):
            self._files.delete(rel)
        self._invalidate()
        self._indexes.clear()
        self._serving_tables.clear()
        indexed = self.build_serving_indexes()
        after = self._files.list(RECORDS_DIR)
        return {
            "record_files_before": len(record_files),
            "record_files_after": len(published(after, complete_commits(after))),
            "record_files_merged": len(replaced),
            "serving_files_before": len(serving_files),
            "serving_files_after": len(self._files.list(SERVING_DIR)),
            "serving_depth": depth,
            "abandoned_files_removed": abandoned,
            "serving_index_rows": sum(indexed.values()),
        }


def normalize_filters(filters: dict[str, Any]) -> dict[str, set]:
    """Filter values as sets; targets canonicalized (their target_key prunes partitions)."""
    normalized: dict[str, set] = {}
    for name, value in filters.items():
        values = set(value) if isinstance(value, (list, tuple, set, frozenset)) else {value}
        if name == "target":
            parsed = [parse_target(text) for text in values]
            values = {target.canonical for target in parsed}
            keys = {target.alternate_key for target in parsed}
            normalized["target_key"] = normalized.get("target_key", keys) & keys
        if name in normalized:
            values = normalized[name] & values
        normalized[name] = values
    return normalized


register_store("parquet", ParquetStore)
