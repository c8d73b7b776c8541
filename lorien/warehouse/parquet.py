"""The embedded warehouse: Parquet files in a local directory or under an S3 prefix.

Layout under the root (Hive partitioning, readable by pandas, DuckDB or Spark)::

    records/target_key=<k>/layout=<l>/part-<commit>-<i>of<n>.parquet   every record (append-only)
    best/target_key=<k>/part-n<nbest>-<commit>-of<n>.parquet            serving view: best nbest valid
                                                             records per (target, workload, layout)
    workloads/<hash>.parquet                                 a workload entry records refer to by
                                                             content hash (a MetaSchedule IRModule)
    _staging/                                                files being written (never read)

Publication. Every file is published atomically: written under ``_staging/`` and renamed into
place on a local disk (fsync'd first with ``?fsync=true``); on S3 one PUT of the whole file (or
a copy of a staged object) is the publication. A commit publishes several files, one at a
time, so a commit is made all-or-nothing by the names: each of its ``n`` record files is named
``part-<commit>-<i>of<n>`` and each of its serving files ``part-n<depth>-<commit>-of<n>``. A
commit is *complete* when all ``n`` of its record files are listed, and readers (``scan``,
``best``, ``stats``, ``workloads``, compaction, a commit's duplicate check) see only the files
of complete commits. A commit publishes its serving files first and its record files last,
so its serving rows appear exactly when its records do; a writer killed anywhere in between
leaves an incomplete commit that no reader sees. A serving file named ``-of0`` (written by a
serving merge or compaction) stands alone, as does a file without a commit in its name.

An incomplete commit whose newest file is older than :data:`ABANDONED_COMMIT_S` is the
leftover of a killed writer: the next commit or compaction deletes its files. Deleting any
file of a commit makes it incomplete for good, so a stalled writer that wakes up after that
can never make it visible. Compaction publishes its merged files before it deletes the ones
they replace; each merged record file is its own one-file commit.

Commits never rewrite a file, so concurrent writers cannot lose each other's records. A
commit skips records whose ``record_id`` it already sees in the store; two writers racing on
the same record may both store it, and every read removes such duplicates by ``record_id``
(compaction removes them for good). The serving view is the union of each commit's own best
``nbest`` per group, which always contains the true best ``nbest`` of every group; a commit
that finds more than :data:`SERVING_MERGE_FILES` serving files for a target key folds them
into one.

``best()`` answers from an in-memory index of the serving view, built once per process
and target key and rebuilt when the list of serving files changes.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lorien.errors import StoreError, StoreUnreachableError
from lorien.record import ARROW_SCHEMA, TuningRecord, mean_cost_s, records_to_table
from lorien.target import match_mode, match_tier, parse_target
from lorien.warehouse.base import CommitResult, Store, register_store

RECORDS_DIR = "records"
SERVING_DIR = "best"
#: Workload entries records refer to by content hash (MetaSchedule IRModules): one file each.
WORKLOADS_DIR = "workloads"
WORKLOAD_FILE_SCHEMA = pa.schema([("workload_hash", pa.string()), ("entry", pa.string())])
_HASH_TEXT = re.compile(r"[0-9a-f]{32}")
STAGING_DIR = "_staging"
#: Serving depth when a commit names none: best records kept per (target, workload, layout).
DEFAULT_NBEST = 20
#: Hive's name for a null/empty partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
PARTITION_COLUMNS = ("target_key", "layout")
#: Columns stored in record files: the partition columns live in the path only.
RECORD_FILE_SCHEMA = pa.schema([f for f in ARROW_SCHEMA if f.name not in PARTITION_COLUMNS])
SERVING_FILE_SCHEMA = pa.schema([f for f in ARROW_SCHEMA if f.name != "target_key"])
#: Rows per row group of serving files; small so a single lookup reads little.
SERVING_ROW_GROUP = 2048
COMPACT_ROW_GROUP = 65536
#: How often an S3 store re-lists its serving files (a local store re-lists on every query).
S3_REFRESH_INTERVAL_S = 1.0
#: A target key's serving files are merged into one when a commit leaves more than this many.
SERVING_MERGE_FILES = 32
#: Staged files older than this are leftovers of killed writers; compaction deletes them.
STALE_STAGING_S = 3600.0
#: An incomplete commit whose newest file is older than this was abandoned by a killed writer;
#: the next commit or compaction deletes it. Publishing a commit takes far less than this.
ABANDONED_COMMIT_S = 3600.0
#: Test hook: a point of the publication (``serving:<i>`` after the i-th serving file,
#: ``record:<i>`` after the i-th record file) where a writer stops until SIGUSR1, so a test can
#: kill it there. Unset in normal use.
PAUSE_ENV = "LORIEN_PARQUET_PAUSE_AT"
_READ_RETRIES = 3


# ---- partition paths ------------------------------------------------------------------------

def _encode_partition(value: str) -> str:
    return quote(value, safe="") if value else NULL_PARTITION


def _decode_partition(text: str) -> str:
    return "" if text == NULL_PARTITION else unquote(text)


def _records_dir(target_key: str, layout: str) -> str:
    return f"{RECORDS_DIR}/target_key={_encode_partition(target_key)}/layout={_encode_partition(layout)}"


def _serving_dir(target_key: str) -> str:
    return f"{SERVING_DIR}/target_key={_encode_partition(target_key)}"


def _partition_of(rel_path: str) -> dict[str, str]:
    """``{"target_key": .., "layout": ..}`` from a record or serving file's relative path."""
    values = {}
    for segment in rel_path.split("/")[1:-1]:
        name, sep, value = segment.partition("=")
        if sep:
            values[name] = _decode_partition(value)
    return values


def _serving_depth(rel_path: str) -> int:
    """The nbest a serving file was written with, from its name ``part-n<depth>-<uuid>``."""
    name = rel_path.rsplit("/", 1)[-1]
    try:
        return int(name.split("-")[1][1:])
    except (IndexError, ValueError) as exc:
        raise StoreError(f"serving file with a malformed name: {rel_path!r}") from exc


def _commit_of(rel_path: str) -> tuple[str, int] | None:
    """(commit id, number of record files of that commit) from a file name; None for a file
    that stands alone (a serving file named ``-of0``, or a file without a commit in its name)."""
    pieces = rel_path.rsplit("/", 1)[-1].removesuffix(".parquet").split("-")
    if len(pieces) < 3 or "of" not in pieces[-1]:
        return None
    try:
        count = int(pieces[-1].rpartition("of")[2])
    except ValueError as exc:
        raise StoreError(f"store file with a malformed name: {rel_path!r}") from exc
    return (pieces[-2], count) if count else None


def _complete_commits(record_files: Iterable[str]) -> set[str]:
    """Ids of the commits all of whose record files are in ``record_files``."""
    seen: dict[str, int] = {}
    wanted: dict[str, int] = {}
    for rel in record_files:
        commit = _commit_of(rel)
        if commit is not None:
            seen[commit[0]] = seen.get(commit[0], 0) + 1
            wanted[commit[0]] = commit[1]
    return {commit for commit, count in seen.items() if count >= wanted[commit]}


def _published(files: dict[str, int], complete: set[str]) -> dict[str, int]:
    """The files that stand alone or belong to a complete commit."""
    visible = {}
    for rel, size in files.items():
        commit = _commit_of(rel)
        if commit is None or commit[0] in complete:
            visible[rel] = size
    return visible


class _Resume(Exception):
    """Raised by the SIGUSR1 handler of :func:`_pause_point` to end the pause."""


def _pause_point(name: str) -> None:
    """Test hook: when :data:`PAUSE_ENV` names this point, say so on stderr and sleep until
    SIGUSR1 (then go on) or a kill."""
    if os.environ.get(PAUSE_ENV) != name:
        return
    import signal

    def resume(signum: int, frame: object) -> None:
        raise _Resume

    previous = signal.signal(signal.SIGUSR1, resume)
    try:
        sys.stderr.write(f"lorien: paused at {name}\n")
        sys.stderr.flush()
        time.sleep(3600)
    except _Resume:
        pass
    finally:
        signal.signal(signal.SIGUSR1, previous)


# ---- file systems ---------------------------------------------------------------------------

class _LocalFiles:
    """A directory on a local disk; publication is an atomic rename."""

    is_local = True

    def __init__(self, root: str, fsync: bool = False):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.fsync = fsync

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def check_readable(self) -> None:
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise StoreUnreachableError(f"store path {self.root!r} exists but is not a directory")

    def list(self, sub: str, sizes: bool = True) -> dict[str, int]:
        """Published parquet files under ``sub``: relative path -> size in bytes (0 for every
        file without ``sizes``, which saves a stat per file)."""
        self.check_readable()
        found: dict[str, int] = {}
        base = self._path(sub)
        stack = [(base, sub)]
        while stack:
            directory, rel = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except FileNotFoundError:
                continue
            except PermissionError as exc:
                raise StoreUnreachableError(f"cannot read store directory {directory!r}: {exc}") from exc
            for entry in entries:
                if entry.name.startswith((".", "_")):
                    continue
                if entry.is_dir():
                    stack.append((entry.path, f"{rel}/{entry.name}"))
                elif entry.name.endswith(".parquet"):
                    found[f"{rel}/{entry.name}"] = entry.stat().st_size if sizes else 0
        return found

    def names(self, sub: str) -> list[str]:
        """Published parquet files directly in ``sub`` (one listing, no stat per file)."""
        try:
            entries = os.listdir(self._path(sub))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            self.check_readable()
            raise
        return [f"{sub}/{name}" for name in entries
                if name.endswith(".parquet") and not name.startswith((".", "_"))]

    def open(self, rel: str) -> pq.ParquetFile:
        return pq.ParquetFile(self._path(rel), memory_map=True)

    def stage(self, table: pa.Table, row_group_size: int | None) -> str:
        staging = self._path(STAGING_DIR)
        os.makedirs(staging, exist_ok=True)
        rel = f"{STAGING_DIR}/{uuid.uuid4().hex}.parquet.tmp"
        path = self._path(rel)
        try:
            _write_parquet(table, path, row_group_size)
            if self.fsync:
                with open(path, "rb+") as handle:
                    os.fsync(handle.fileno())
        except OSError as exc:
            raise StoreError(f"cannot write {path!r}: {exc}") from exc
        return rel

    def publish(self, staged: str, rel: str) -> None:
        target = self._path(rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.utime(self._path(staged))  # a file's age counts from its publication
        os.rename(self._path(staged), target)

    def write(self, table: pa.Table, rel: str, row_group_size: int | None = None) -> None:
        self.publish(self.stage(table, row_group_size), rel)

    def delete(self, rel: str) -> None:
        try:
            os.remove(self._path(rel))
        except FileNotFoundError:
            pass

    def ages(self, rels: Iterable[str]) -> dict[str, float]:
        """Seconds since each file was last written (files that are gone are left out)."""
        now = time.time()
        found = {}
        for rel in rels:
            try:
                found[rel] = now - os.stat(self._path(rel)).st_mtime
            except FileNotFoundError:
                continue
        return found

    def stale_staged(self, older_than_s: float) -> list[str]:
        staging = self._path(STAGING_DIR)
        if not os.path.isdir(staging):
            return []
        cutoff = time.time() - older_than_s
        return [f"{STAGING_DIR}/{entry.name}" for entry in os.scandir(staging)
                if entry.stat().st_mtime < cutoff]


class _S3Files:
    """A prefix in an S3 bucket; an object becomes visible only when its upload completes."""

    is_local = False

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None, region: str | None):
        from pyarrow import fs as pafs

        options: dict[str, Any] = {
            "region": region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            "connect_timeout": 5.0,
            "request_timeout": 30.0,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3),
        }
        if endpoint_url:
            parts = urlsplit(endpoint_url)
            if not parts.netloc:
                raise StoreError(f"bad endpoint_url {endpoint_url!r}: expected http(s)://host:port")
            options["endpoint_override"] = parts.netloc
            options["scheme"] = parts.scheme or "https"
        self._fs_module = pafs
        self.fs = pafs.S3FileSystem(**options)
        self.bucket = bucket
        self.root = f"{bucket}/{prefix.strip('/')}".rstrip("/")
        self.endpoint_url = endpoint_url
        self.region = options["region"]
        self._s3_client = None
        self._client_lock = threading.Lock()  # staging threads share one client
        self._bucket_checked = False

    def _unreachable(self, action: str, exc: OSError) -> StoreUnreachableError:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return StoreUnreachableError(f"cannot {action} s3://{self.root}{where}: {exc}")

    def check_readable(self) -> None:
        """Raise StoreUnreachableError unless the endpoint answers and the bucket exists (asked
        once per process)."""
        if self._bucket_checked:
            return
        try:
            info = self.fs.get_file_info(self.bucket)
        except OSError as exc:
            raise self._unreachable("reach", exc) from exc
        if info.type == self._fs_module.FileType.NotFound:
            raise StoreUnreachableError(f"bucket {self.bucket!r} of s3://{self.root} does not exist")
        self._bucket_checked = True

    def list(self, sub: str, sizes: bool = True) -> dict[str, int]:
        self.check_readable()
        selector = self._fs_module.FileSelector(f"{self.root}/{sub}", recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except OSError as exc:
            raise self._unreachable("list", exc) from exc
        found = {}
        for info in infos:
            if info.type != self._fs_module.FileType.File or not info.base_name.endswith(".parquet"):
                continue
            rel = info.path[len(self.root) + 1:]
            if any(part.startswith((".", "_")) for part in rel.split("/")):
                continue
            found[rel] = info.size
        return found

    def names(self, sub: str) -> list[str]:
        return list(self.list(sub))

    def open(self, rel: str) -> pq.ParquetFile:
        try:
            return pq.ParquetFile(self.fs.open_input_file(f"{self.root}/{rel}"))
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "not exist" in str(exc) or "NoSuchKey" in str(exc):
                raise FileNotFoundError(rel) from exc
            raise self._unreachable(f"read {rel}", exc) from exc

    def _client(self):
        with self._client_lock:
            return self._make_client()

    def _make_client(self):
        if self._s3_client is None:
            import boto3

            self._s3_client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region)
        return self._s3_client

    def write(self, table: pa.Table, rel: str, row_group_size: int | None = None) -> None:
        """One PUT of the whole file: the object appears complete or not at all."""
        import botocore.exceptions

        buffer = pa.BufferOutputStream()
        _write_parquet(table, buffer, row_group_size)
        key = f"{self.root}/{rel}".split("/", 1)[1]
        try:
            self._client().put_object(Bucket=self.bucket, Key=key, Body=buffer.getvalue().to_pybytes())
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreUnreachableError(f"cannot write s3://{self.root}/{rel}: {exc}") from exc

    def stage(self, table: pa.Table, row_group_size: int | None) -> str:
        rel = f"{STAGING_DIR}/{uuid.uuid4().hex}.parquet.tmp"
        self.write(table, rel, row_group_size)
        return rel

    def publish(self, staged: str, rel: str) -> None:
        try:
            self.fs.move(f"{self.root}/{staged}", f"{self.root}/{rel}")
        except OSError as exc:
            raise self._unreachable(f"publish {rel}", exc) from exc

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(f"{self.root}/{rel}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._unreachable(f"delete {rel}", exc) from exc

    def ages(self, rels: Iterable[str]) -> dict[str, float]:
        """Seconds since each object was last written (objects that are gone are left out)."""
        rels = list(rels)
        try:
            infos = self.fs.get_file_info([f"{self.root}/{rel}" for rel in rels])
        except OSError as exc:
            raise self._unreachable("list", exc) from exc
        now = time.time()
        return {rel: now - info.mtime.timestamp() for rel, info in zip(rels, infos, strict=True)
                if info.type == self._fs_module.FileType.File and info.mtime is not None}

    def stale_staged(self, older_than_s: float) -> list[str]:
        selector = self._fs_module.FileSelector(f"{self.root}/{STAGING_DIR}", allow_not_found=True)
        cutoff = time.time() - older_than_s
        return [info.path[len(self.root) + 1:] for info in self.fs.get_file_info(selector)
                if info.mtime is not None and info.mtime.timestamp() < cutoff]


def _open_files(location: str) -> _LocalFiles | _S3Files:
    if location.startswith("file:"):
        location = location[len("file:"):]
        if location.startswith("//"):
            location = location[2:]
    if location.startswith("s3://"):
        parts = urlsplit(location)
        if not parts.netloc:
            raise StoreError(f"bad S3 store URI {location!r}: expected s3://bucket/prefix")
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint_url", "region"}
        if unknown:
            raise StoreError(f"unknown option(s) {sorted(unknown)} in store URI {location!r} "
                             "(known: endpoint_url, region)")
        return _S3Files(parts.netloc, parts.path, query.get("endpoint_url"), query.get("region"))
    path, _, query_text = location.partition("?")
    if not path:
        raise StoreError("empty parquet store path")
    query = {name: values[-1] for name, values in parse_qs(query_text).items()}
    unknown = set(query) - {"fsync"}
    if unknown:
        raise StoreError(f"unknown option(s) {sorted(unknown)} in store URI {location!r} (known: fsync)")
    return _LocalFiles(path, fsync=query.get("fsync", "false").lower() in ("1", "true", "yes"))


# ---- table helpers --------------------------------------------------------------------------

#: Columns with few distinct values, dictionary-encoded in files; the rest (configs, ids,
#: costs) are nearly unique, and trying to dictionary-encode them only costs time.
DICTIONARY_COLUMNS = ["dialect", "target", "target_key", "target_raw", "workload_key", "task_name", "args",
                      "layout", "build", "extra", "source"]


def _write_parquet(table: pa.Table, where: Any, row_group_size: int | None) -> None:
    table = _decoded(table)
    dictionary = [name for name in DICTIONARY_COLUMNS if name in table.column_names]
    pq.write_table(table, where, row_group_size=row_group_size, use_dictionary=dictionary)


def _plain_type(type_: pa.DataType) -> pa.DataType:
    return type_.value_type if pa.types.is_dictionary(type_) else type_


def _decoded(table: pa.Table) -> pa.Table:
    """The table with its dictionary-encoded columns decoded (files and sorts take plain columns)."""
    if not any(pa.types.is_dictionary(field.type) for field in table.schema):
        return table
    return table.cast(pa.schema([field.with_type(_plain_type(field.type)) for field in table.schema]))


def _constant(value: str, length: int) -> pa.Array:
    return pa.array([value], pa.string()).take(np.zeros(length, dtype=np.int32))


def _conform(records: Iterable[TuningRecord] | pa.Table) -> pa.Table:
    """Records as a table of :data:`ARROW_SCHEMA`'s columns and types (cost_s filled in when
    missing), dictionary-encoded string columns left encoded."""
    if not isinstance(records, pa.Table):
        return records_to_table(list(records))
    table = records
    if "cost_s" not in table.column_names:
        costs = table.column("costs").to_pylist()
        errors = table.column("error_no").to_pylist()
        table = table.append_column("cost_s", pa.array(
            [mean_cost_s(c, e) for c, e in zip(costs, errors, strict=True)], pa.float64()))
    missing = [name for name in ARROW_SCHEMA.names if name not in table.column_names]
    if missing:
        raise StoreError(f"cannot commit a table without column(s) {missing}")
    table = table.select(ARROW_SCHEMA.names)

    def stays_encoded(field: pa.Field) -> bool:
        given = table.schema.field(field.name).type
        return pa.types.is_dictionary(given) and given.value_type == field.type

    # a dictionary-encoded column of the schema's type stays encoded until its file is written:
    # splitting and ranking then move indices, not strings (the files hold plain columns)
    return table.cast(pa.schema([table.schema.field(field.name) if stays_encoded(field) else field
                                 for field in ARROW_SCHEMA]))


def _id_prefixes(ids: pa.ChunkedArray) -> np.ndarray | None:
    """The first 16 hex digits of each record_id as a uint64, read straight from the Arrow
    buffers; None when the ids are not all 32 characters (then callers hash the strings)."""
    parts = []
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    for chunk in ids.chunks:
        if len(chunk) == 0:
            continue
        if chunk.type != pa.string() or chunk.null_count:
            return None
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[chunk.offset:chunk.offset + len(chunk) + 1]
        if not np.all(np.diff(offsets) == 32):
            return None
        digits = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0]:offsets[-1]].reshape(-1, 32)[:, :16]
        nibbles = digits.astype(np.int64) - 48
        nibbles -= 39 * (nibbles > 9)
        parts.append((nibbles.astype(np.uint64) << shifts).sum(axis=1, dtype=np.uint64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def _dedupe(table: pa.Table) -> pa.Table:
    """The table with only the first row of each record_id, order kept."""
    import pyarrow.compute as pc

    rows = table.num_rows
    if rows <= 1:
        return table
    ids = table.column("record_id")
    prefixes = _id_prefixes(ids)
    if prefixes is not None:
        ordered = np.sort(prefixes)
        if not np.any(ordered[1:] == ordered[:-1]):
            return table  # distinct prefixes: distinct ids (equal prefixes go the exact way below)
    elif pc.count_distinct(ids).as_py() == rows:
        return table
    firsts = (pa.table({"id": ids, "row": pa.array(np.arange(rows, dtype=np.int64))})
              .group_by("id", use_threads=False).aggregate([("row", "min")]).column("row_min"))
    return table.take(np.sort(firsts.to_numpy()))


def _split_by(table: pa.Table, columns: tuple[str, ...]) -> Iterator[tuple[tuple, pa.Table]]:
    """(key values, rows) for each distinct combination of ``columns``."""
    import pyarrow.compute as pc

    key_columns = _decoded(table.select(list(columns)))
    keys = key_columns.group_by(list(columns), use_threads=False).aggregate([])
    combinations = list(zip(*(keys.column(name).to_pylist() for name in columns), strict=True))
    if len(combinations) == 1:
        yield combinations[0], table
        return
    for combination in combinations:
        mask = None
        for name, value in zip(columns, combination, strict=True):
            equal = pc.equal(key_columns.column(name), value)
            mask = equal if mask is None else pc.and_(mask, equal)
        yield combination, table.filter(mask)


SERVING_ORDER = [("workload_key", "ascending"), ("target", "ascending"), ("layout", "ascending"),
                 ("cost_s", "ascending"), ("record_id", "ascending")]


def _sort_for_serving(table: pa.Table) -> pa.Table:
    return table.sort_by(SERVING_ORDER)


def top_per_group(table: pa.Table, nbest: int | None) -> pa.Table:
    """Valid rows only, the best ``nbest`` per (target, workload_key, layout), in serving order.

    Only the key columns are sorted; the wide columns are gathered once, for the kept rows."""
    import pyarrow.compute as pc

    valid_rows = np.flatnonzero(pc.is_valid(table.column("cost_s")).to_numpy(zero_copy_only=False))
    keys = _decoded(table.select([name for name, _ in SERVING_ORDER]).take(valid_rows))
    order = pc.sort_indices(keys, sort_keys=SERVING_ORDER).to_numpy()
    rows = len(order)
    if nbest is not None and rows:
        positions = np.arange(rows)
        is_start = np.zeros(rows, dtype=bool)
        is_start[group_starts(keys.take(order), ("workload_key", "target", "layout"))] = True
        group_start = np.maximum.accumulate(np.where(is_start, positions, 0))
        order = order[positions - group_start < nbest]
    return table.take(valid_rows[order])


def group_starts(table: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """Row numbers where a new run of equal ``columns`` values begins, in a sorted table."""
    import pyarrow.compute as pc

    rows = table.num_rows
    changed = np.zeros(rows, dtype=bool)
    changed[:1] = True
    for name in columns:
        column = table.column(name)
        changed[1:] |= ~pc.equal(column.slice(1), column.slice(0, rows - 1)).to_numpy(zero_copy_only=False)
    return np.flatnonzero(changed)


def _may_hold(statistics: Any, low: str, high: str) -> bool:
    """Whether a row group with these workload_key statistics can hold keys in [low, high]."""
    if statistics is None or not statistics.has_min_max:
        return True
    return statistics.min <= high and statistics.max >= low


def _rank_rows(rows: list[dict], k: int, per_layout: bool) -> list[dict]:
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


# ---- the serving index ----------------------------------------------------------------------

class _ServingIndex:
    """Best rows of one target key; a lookup finds its group in a dict and reads a few scalars.

    Rows stay where the files put them: only the key columns are sorted, into ``order``
    (sorted position -> row), so building the index copies none of the wide columns.
    """

    def __init__(self, table: pa.Table, files: tuple[str, ...] = ()):
        import pyarrow.compute as pc

        self.files = files
        table = _dedupe(table)
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


# ---- the store ------------------------------------------------------------------------------

@dataclass
class _PendingFile:
    """A file of a commit not yet published: its directory, its serving depth (None for a record
    file), and either its staged copy (being written while ``writing`` is set) or, where one
    PUT publishes it (S3), the table itself."""

    directory: str
    depth: int | None
    staged: str | None = None
    table: pa.Table | None = None
    row_group_size: int | None = None
    writing: Future | None = None


#: Threads that write a batch's staged files while the committing thread prepares its other
#: files (Arrow encodes and compresses without the GIL); they end with the batch.
STAGING_THREADS = 2


class ParquetCommit:
    """One commit, possibly of many batches: files are staged and published at :meth:`finish`.

    With ``publish_each_batch`` (the default for :meth:`ParquetStore.commit`) each batch is
    published as soon as it is written, as a commit of its own, which keeps memory bounded for
    long ingests. Either way, what is published together becomes visible together.
    """

    def __init__(self, store: ParquetStore, nbest: int | None, publish_each_batch: bool):
        if nbest is not None and nbest < 1:
            raise StoreError(f"nbest must be a positive number of records, got {nbest!r}")
        self.store = store
        self.nbest = DEFAULT_NBEST if nbest is None else nbest
        self.publish_each_batch = publish_each_batch
        self.result = CommitResult()
        self._pending_records: list[_PendingFile] = []
        self._pending_serving: list[_PendingFile] = []
        self._unpublished_ids: set[str] = set()
        self._known = store._known_record_ids(remove_abandoned=True)
        # On S3 a single PUT already publishes atomically: no staging copy when publishing at once.
        self._direct = publish_each_batch and not store._files.is_local
        self._writers: ThreadPoolExecutor | None = None

    def add(self, records: Iterable[TuningRecord] | pa.Table) -> CommitResult:
        """Write one batch; returns the counts of this batch."""
        table = _conform(records)
        batch = CommitResult(received=table.num_rows)
        table = _dedupe(table)
        ids = table.column("record_id").to_pylist()
        known, unpublished = self._known, self._unpublished_ids
        if known.isdisjoint(ids) and unpublished.isdisjoint(ids):  # the usual case, checked in C
            fresh = None
        else:
            fresh = np.fromiter((rid not in known and rid not in unpublished for rid in ids), dtype=bool,
                                count=len(ids))
        if fresh is not None and not fresh.all():
            table = table.filter(pa.array(fresh))
            ids = [rid for rid, keep in zip(ids, fresh, strict=True) if keep]
        unpublished.update(ids)
        batch.stored = table.num_rows
        batch.duplicates = batch.received - batch.stored
        if table.num_rows:
            self._write(table)
        try:
            if self.publish_each_batch:
                batch.files = self._publish()
            else:
                self._wait_for_staging()
        finally:
            # no thread outlives a batch: the caller may fork (a log's decoding workers) between batches
            self._stop_writers()
        self.result.received += batch.received
        self.result.stored += batch.stored
        self.result.duplicates += batch.duplicates
        self.result.files.extend(batch.files)
        return batch

    def _write(self, table: pa.Table) -> None:
        for (target_key, layout), part in _split_by(table, PARTITION_COLUMNS):
            self._put(part.select(RECORD_FILE_SCHEMA.names), _records_dir(target_key, layout), None, None,
                      self._pending_records)
        serving = top_per_group(table, self.nbest)
        if serving.num_rows:
            for (target_key,), part in _split_by(serving, ("target_key",)):
                self._put(part.select(SERVING_FILE_SCHEMA.names), _serving_dir(target_key), self.nbest,
                          SERVING_ROW_GROUP, self._pending_serving)

    def _put(self, table: pa.Table, directory: str, depth: int | None, row_group_size: int | None,
             pending: list[_PendingFile]) -> None:
        if self._direct:
            pending.append(_PendingFile(directory, depth, table=table, row_group_size=row_group_size))
            return
        if self._writers is None:
            self._writers = ThreadPoolExecutor(STAGING_THREADS, thread_name_prefix="lorien-staging")
        pending.append(_PendingFile(directory, depth, writing=self._writers.submit(
            self.store._files.stage, table, row_group_size)))

    def _wait_for_staging(self) -> None:
        """Wait until every pending file is staged; raises the first staging error (after all
        the writes have ended, so that :meth:`abort` can delete what was staged)."""
        error: BaseException | None = None
        for pending in self._pending_records + self._pending_serving:
            if pending.writing is not None:
                try:
                    pending.staged = pending.writing.result()
                except BaseException as exc:  # noqa: BLE001 - re-raised below, once all writes ended
                    error = error or exc
                pending.writing = None
        if error is not None:
            raise error

    def _stop_writers(self) -> None:
        if self._writers is not None:
            self._writers.shutdown(wait=True)
            self._writers = None

    def _publish(self) -> list[str]:
        """Publish what is pending as one commit; returns its record files."""
        if not self._pending_records:
            return []
        self._wait_for_staging()
        published = self.store._publish_commit(self._pending_serving, self._pending_records)
        touched = {_partition_of(pending.directory + "/")["target_key"] for pending in self._pending_serving}
        self._pending_records.clear()
        self._pending_serving.clear()
        self.store._known_ids.update(self._unpublished_ids)
        self._unpublished_ids.clear()
        self.store._invalidate()
        for target_key in sorted(touched):
            self.store._merge_serving(target_key)
        return published

    def finish(self) -> CommitResult:
        try:
            self.result.files.extend(self._publish())
        finally:
            self._stop_writers()
        return self.result

    def abort(self) -> None:
        try:
            self._wait_for_staging()
        except BaseException:  # noqa: BLE001 - aborting anyway: delete whatever was staged
            pass
        self._stop_writers()
        for pending in self._pending_records + self._pending_serving:
            if pending.staged is not None:
                self.store._files.delete(pending.staged)
        self._pending_records.clear()
        self._pending_serving.clear()

    def __enter__(self) -> ParquetCommit:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()


@dataclass
class _Listing:
    """A target key's serving files as last listed, and which of them are visible."""

    at: float
    listed: tuple[str, ...]
    files: tuple[str, ...]
    depth: int | None
    pending: bool  # some file belongs to a commit not (yet) complete: decide again next time


class ParquetStore(Store):
    """A warehouse of Parquet files; see the module docstring for the layout and guarantees."""

    #: Commits take dictionary-encoded string columns (decoded as files are written).
    accepts_dictionary_columns = True

    def __init__(self, location: str):
        self.location = location
        self.uri = f"parquet:{location}"
        self._files = _open_files(location)
        self._known_ids: set[str] = set()
        self._id_files: set[str] = set()
        self._indexes: dict[str, _ServingIndex] = {}
        self._serving_tables: dict[str, pa.Table] = {}
        self._listed: dict[str, _Listing] = {}
        self._complete: set[str] = set()
        self._lookups: dict[str, int] = {}
        self._targets: dict[str, tuple[str, str]] = {}

    def __repr__(self) -> str:
        return f"ParquetStore({self.location!r})"

    # -- writing ------------------------------------------------------------------------------

    def transaction(self, nbest: int | None = None, publish_each_batch: bool = False) -> ParquetCommit:
        """A multi-batch commit; nothing becomes visible before ``finish()`` unless
        ``publish_each_batch``. Use as a context manager: an exception discards staged files."""
        return ParquetCommit(self, nbest, publish_each_batch)

    def commit(self, records: Iterable[TuningRecord] | pa.Table, nbest: int | None = None) -> CommitResult:
        with self.transaction(nbest, publish_each_batch=True) as commit:
            commit.add(records)
        return commit.result

    def _publish_commit(self, serving: list[_PendingFile], records: list[_PendingFile]) -> list[str]:
        """Publish one commit: serving files first, record files last, named so that readers
        see none of it until its last record file is in place. Returns the record files."""
        commit, count = uuid.uuid4().hex, len(records)
        for number, pending in enumerate(serving, 1):
            self._place(pending, f"{pending.directory}/part-n{pending.depth}-{commit}-of{count}.parquet")
            _pause_point(f"serving:{number}")
        published = []
        for number, pending in enumerate(records, 1):
            final = f"{pending.directory}/part-{commit}-{number}of{count}.parquet"
            self._place(pending, final)
            published.append(final)
            if number < count:
                _pause_point(f"record:{number}")
        self._complete.add(commit)
        return published

    def _place(self, pending: _PendingFile, final: str) -> None:
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
            commit = _commit_of(rel)
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

    def _known_record_ids(self, remove_abandoned: bool = False) -> set[str]:
        """Record ids of every published record file (read once per file per process); with
        ``remove_abandoned``, also delete the leftovers of killed writers."""
        listed = self._files.list(RECORDS_DIR, sizes=False)
        complete = _complete_commits(listed)
        self._complete |= complete
        if remove_abandoned:
            self._remove_abandoned(listed, self._files.list(SERVING_DIR, sizes=False), complete)
        listed = _published(listed, complete)
        for rel in listed.keys() - self._id_files:
            try:
                ids = self._files.open(rel).read(columns=["record_id"]).column("record_id")
            except FileNotFoundError:
                continue
            self._known_ids.update(ids.to_pylist())
            self._id_files.add(rel)
        return self._known_ids

    def _invalidate(self) -> None:
        self._listed.clear()

    # -- workload entries ---------------------------------------------------------------------

    def put_workloads(self, entries: Mapping[str, str]) -> int:
        """Keep entries as ``workloads/<hash>.parquet``, one file each, published atomically;
        an entry already kept is not written again (same hash, same content)."""
        for digest in entries:
            if not _HASH_TEXT.fullmatch(digest):
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
            if not _HASH_TEXT.fullmatch(digest):
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
        listed = _published(listed, _complete_commits(listed))
        if target_keys is None and layouts is None:
            return listed
        chosen = {}
        for rel, size in listed.items():
            partition = _partition_of(rel)
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
        partition = _partition_of(rel)
        arrays, names = [], []
        for name in columns:
            names.append(name)
            if name in PARTITION_COLUMNS:
                arrays.append(_constant(partition.get(name, ""), table.num_rows))
            else:
                arrays.append(table.column(name))
        return pa.Table.from_arrays(arrays, schema=pa.schema([ARROW_SCHEMA.field(n) for n in names]))

    def scan(self, filters: dict[str, Any] | None = None, columns: list[str] | None = None) -> pa.Table:
        import pyarrow.compute as pc

        filters = _normalize_filters(filters or {})
        wanted = list(columns) if columns is not None else list(ARROW_SCHEMA.names)
        unknown = [name for name in [*wanted, *filters] if name not in ARROW_SCHEMA.names]
        if unknown:
            raise StoreError(f"unknown column(s) {unknown}; columns are {ARROW_SCHEMA.names}")
        needed = [name for name in ARROW_SCHEMA.names
                  if name in wanted or name in filters or name == "record_id"]
        for _attempt in range(_READ_RETRIES):
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
        return _dedupe(table).select(wanted)

    def workloads(self, target: str | None = None) -> list[str]:
        import pyarrow.compute as pc

        filters = {"target": target} if target is not None else None
        table = self.scan(filters, columns=["workload_key"])
        return sorted(pc.unique(table.column("workload_key")).to_pylist())

    def stats(self) -> dict[str, Any]:
        import pyarrow.compute as pc

        serving_listed = self._files.list(SERVING_DIR)
        listed = self._files.list(RECORDS_DIR)
        complete = _complete_commits(listed)
        record_files = _published(listed, complete)
        serving_files = _published(serving_listed, complete)
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
        listed = tuple(sorted(self._files.names(_serving_dir(target_key))))
        if cached is not None and cached.listed == listed and not cached.pending:
            files, depth, pending = cached.files, cached.depth, False
        else:
            files, pending = self._visible_serving(listed)
            depth = min((_serving_depth(rel) for rel in files), default=None)
        self._listed[target_key] = _Listing(now, listed, files, depth, pending)
        return files, depth

    def _visible_serving(self, listed: Iterable[str]) -> tuple[tuple[str, ...], bool]:
        """The serving files that stand alone or belong to a complete commit, and whether any
        other was left out. Commits seen complete once are remembered, so the record files are
        listed only when a serving file of a commit not seen complete yet appears."""
        visible, waiting = [], []
        for rel in listed:
            commit = _commit_of(rel)
            if commit is None or commit[0] in self._complete:
                visible.append(rel)
            else:
                waiting.append((rel, commit[0]))
        if waiting:
            self._complete |= _complete_commits(self._files.list(RECORDS_DIR, sizes=False))
            visible.extend(rel for rel, commit in waiting if commit in self._complete)
        return tuple(sorted(visible)), len(visible) < len(listed)

    def _relist_serving(self, target_key: str) -> tuple[str, ...]:
        self._listed.pop(target_key, None)
        return self._serving_files(target_key)[0]

    def _read_serving(self, rel: str, target_key: str) -> pa.Table:
        cached = self._serving_tables.get(rel)
        if cached is None:
            table = self._files.open(rel).read()
            table = table.append_column(ARROW_SCHEMA.field("target_key"), _constant(target_key, table.num_rows))
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
                      if _may_hold(metadata.row_group(number).column(column).statistics, workload_key, high)]
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
        return [TuningRecord.from_row(row) for row in _rank_rows(list(rows.values()), k, per_layout)]

    def _index(self, target_key: str, files: tuple[str, ...]) -> _ServingIndex:
        index = self._indexes.get(target_key)
        if index is not None and index.files == files:
            return index
        for _attempt in range(_READ_RETRIES):
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
                _serving_dir(target_key) + "/")]:
            del self._serving_tables[rel]
        table = pa.concat_tables(tables) if tables else ARROW_SCHEMA.empty_table()
        index = _ServingIndex(table, files)
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
        return index.best(workload_key, canonical, k, layout, mode, prefix, per_layout)

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
        index = _ServingIndex(top_per_group(table, k))
        return index.best(workload_key, target, k, layout, mode, prefix, per_layout)

    # -- compaction ---------------------------------------------------------------------------

    def _merge_serving(self, target_key: str) -> None:
        """Fold a target key's serving files into one once commits have piled up more than
        :data:`SERVING_MERGE_FILES`; the merged file keeps the shallowest depth it covers."""
        listed = self._files.names(_serving_dir(target_key))
        if len(listed) <= SERVING_MERGE_FILES:
            return
        files, _ = self._visible_serving(listed)  # files of incomplete commits stay as they are
        if len(files) <= 1:
            return
        try:
            tables = [self._files.open(rel).read() for rel in files]
        except FileNotFoundError:
            return  # another process is merging the same files
        depth = min(_serving_depth(rel) for rel in files)
        merged = top_per_group(_dedupe(pa.concat_tables(tables)), depth)
        final = f"{_serving_dir(target_key)}/part-n{depth}-{uuid.uuid4().hex}-of0.parquet"
        self._files.write(merged.select(SERVING_FILE_SCHEMA.names), final, SERVING_ROW_GROUP)
        for rel in files:
            self._files.delete(rel)
        self._invalidate()

    def compact(self) -> dict[str, Any]:
        """Merge each partition's files into one sorted file; rebuild the serving view from
        the records (deduplicated, deepest nbest seen); delete the leftovers of killed writers.
        Query answers do not change."""
        # Serving files first: a serving file listed here whose commit is complete in the
        # record listing that follows has its records in that listing, so the rebuilt view
        # covers it; one whose commit is not complete yet is left alone.
        serving_listed = self._files.list(SERVING_DIR)
        record_listed = self._files.list(RECORDS_DIR)
        complete = _complete_commits(record_listed)
        abandoned = self._remove_abandoned(record_listed, serving_listed, complete)
        serving_files = _published(serving_listed, complete)
        record_files = _published(record_listed, complete)
        depths = [_serving_depth(rel) for rel in serving_files]
        depth = max(depths) if depths else DEFAULT_NBEST
        by_partition: dict[tuple[str, str], list[str]] = {}
        for rel in record_files:
            partition = _partition_of(rel)
            by_partition.setdefault((partition["target_key"], partition["layout"]), []).append(rel)
        serving_parts: dict[str, list[pa.Table]] = {}
        replaced: list[str] = []
        for (target_key, layout), rels in sorted(by_partition.items()):
            try:
                tables = [self._read_record_file(rel, list(ARROW_SCHEMA.names)) for rel in sorted(rels)]
            except FileNotFoundError:
                continue  # another compaction got here first
            table = _dedupe(pa.concat_tables(tables))
            commit = _commit_of(rels[0])
            # A file of a many-file commit is rewritten even alone: deleting its siblings in
            # other partitions would leave it in an incomplete commit, which no reader sees.
            if len(rels) > 1 or (commit is not None and commit[1] > 1):
                ordered = table.sort_by([("workload_key", "ascending"), ("cost_s", "ascending"),
                                         ("record_id", "ascending")])
                final = f"{_records_dir(target_key, layout)}/part-{uuid.uuid4().hex}-1of1.parquet"
                self._files.write(ordered.select(RECORD_FILE_SCHEMA.names), final, COMPACT_ROW_GROUP)
                replaced.extend(rels)
            serving_parts.setdefault(target_key, []).append(top_per_group(table, depth))
        # Every merged file is published before any file it replaces is deleted.
        for target_key, parts in serving_parts.items():
            serving = _sort_for_serving(pa.concat_tables(parts)).select(SERVING_FILE_SCHEMA.names)
            if serving.num_rows:
                final = f"{_serving_dir(target_key)}/part-n{depth}-{uuid.uuid4().hex}-of0.parquet"
                self._files.write(serving, final, SERVING_ROW_GROUP)
        for target_key in serving_parts:
            for rel in serving_files:
                if rel.startswith(_serving_dir(target_key) + "/"):
                    self._files.delete(rel)
        for rel in replaced:
            self._files.delete(rel)
        for rel in self._files.stale_staged(STALE_STAGING_S):
            self._files.delete(rel)
        self._invalidate()
        self._indexes.clear()
        self._serving_tables.clear()
        after = self._files.list(RECORDS_DIR)
        return {
            "record_files_before": len(record_files),
            "record_files_after": len(_published(after, _complete_commits(after))),
            "record_files_merged": len(replaced),
            "serving_files_before": len(serving_files),
            "serving_files_after": len(self._files.list(SERVING_DIR)),
            "serving_depth": depth,
            "abandoned_files_removed": abandoned,
        }


def _normalize_filters(filters: dict[str, Any]) -> dict[str, set]:
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
