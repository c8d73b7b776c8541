"""The layout of a parquet store: directories, partition paths, file names and which
commits are complete (see the package docstring), and the test hook that pauses a writer."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterable

import pyarrow as pa

from lorien.errors import StoreError
from lorien.partitions import (  # noqa: F401 - the store's layout, in one place
    NULL_PARTITION,
    SERVING_DIR,
    decode_partition,
    encode_partition,
    serving_dir,
)
from lorien.record import ARROW_SCHEMA

RECORDS_DIR = "records"
#: Workload entries records refer to by content hash (MetaSchedule IRModules): one file each.
WORKLOADS_DIR = "workloads"
WORKLOAD_FILE_SCHEMA = pa.schema([("workload_hash", pa.string()), ("entry", pa.string())])
HASH_TEXT = re.compile(r"[0-9a-f]{32}")
STAGING_DIR = "_staging"
#: Serving depth when a commit names none: best records kept per (target, workload, layout).
DEFAULT_NBEST = 20
#: Hive's name for a null/empty partition value.
PARTITION_COLUMNS = ("target_key", "layout")
#: Columns stored in record files: the partition columns live in the path only.
RECORD_FILE_SCHEMA = pa.schema([f for f in ARROW_SCHEMA if f.name not in PARTITION_COLUMNS])
SERVING_FILE_SCHEMA = pa.schema([f for f in ARROW_SCHEMA if f.name != "target_key"])
#: Rows per row group of serving files; small so a single lookup reads little.
SERVING_ROW_GROUP = 2048
COMPACT_ROW_GROUP = 65536
#: How often an S3 store re-lists its serving files (a local store lists them again when the
#: directory's mtime changes; see ParquetStore._serving_files).
S3_REFRESH_INTERVAL_S = 1.0
#: A target key's serving files are merged when a commit leaves more than this many.
SERVING_MERGE_FILES = 32
#: Rows one serving merge after a commit reads at most (smallest files first), so that its
#: memory does not grow with the store; larger files are left to ``compact()``.
SERVING_MERGE_ROWS = 65536
#: Staged files older than this are leftovers of killed writers; compaction deletes them.
STALE_STAGING_S = 3600.0
#: An incomplete commit whose newest file is older than this was abandoned by a killed writer;
#: the next commit or compaction deletes it. Publishing a commit takes far less than this.
ABANDONED_COMMIT_S = 3600.0
#: Test hook: a point of the publication (``serving:<i>`` after the i-th serving file,
#: ``record:<i>`` after the i-th record file) where a writer stops until SIGUSR1, so a test can
#: kill it there. Unset in normal use.
PAUSE_ENV = "LORIEN_PARQUET_PAUSE_AT"
READ_RETRIES = 3


# ---- partition paths ------------------------------------------------------------------------

def records_dir(target_key: str, layout: str) -> str:
    return f"{RECORDS_DIR}/target_key={encode_partition(target_key)}/layout={encode_partition(layout)}"


def partition_of(rel_path: str) -> dict[str, str]:
    """``{"target_key": .., "layout": ..}`` from a record or serving file's relative path."""
    values = {}
    for segment in rel_path.split("/")[1:-1]:
        name, sep, value = segment.partition("=")
        if sep:
            values[name] = decode_partition(value)
    return values


def serving_depth(rel_path: str) -> int:
    """The nbest a serving file was written with, from its name ``part-n<depth>-<uuid>``."""
    name = rel_path.rsplit("/", 1)[-1]
    try:
        return int(name.split("-")[1][1:])
    except (IndexError, ValueError) as exc:
        raise StoreError(f"serving file with a malformed name: {rel_path!r}") from exc


def commit_of(rel_path: str) -> tuple[str, int] | None:
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


def complete_commits(record_files: Iterable[str]) -> set[str]:
    """Ids of the commits all of whose record files are in ``record_files``."""
    seen: dict[str, int] = {}
    wanted: dict[str, int] = {}
    for rel in record_files:
        commit = commit_of(rel)
        if commit is not None:
            seen[commit[0]] = seen.get(commit[0], 0) + 1
            wanted[commit[0]] = commit[1]
    return {commit for commit, count in seen.items() if count >= wanted[commit]}


def published(files: dict[str, int], complete: set[str]) -> dict[str, int]:
    """The files that stand alone or belong to a complete commit."""
    visible = {}
    for rel, size in files.items():
        commit = commit_of(rel)
        if commit is None or commit[0] in complete:
            visible[rel] = size
    return visible


class Resume(Exception):
    """Raised by the SIGUSR1 handler of :func:`pause_point` to end the pause."""


def pause_point(name: str) -> None:
    """Test hook: when :data:`PAUSE_ENV` names this point, say so on stderr and sleep until
    SIGUSR1 (then go on) or a kill."""
    if os.environ.get(PAUSE_ENV) != name:
        return
    import signal

    def resume(signum: int, frame: object) -> None:
        raise Resume

    previous = signal.signal(signal.SIGUSR1, resume)
    try:
        sys.stderr.write(f"lorien: paused at {name}\n")
        sys.stderr.flush()
        time.sleep(3600)
    except Resume:
        pass
    finally:
        signal.signal(signal.SIGUSR1, previous)
