"""Pour tuning logs into a warehouse: files or whole directories, any of TVM's three formats.

Lines that fail to parse are reported with file and line and skipped; with ``strict`` the
whole ingest is refused and nothing is committed. A MetaSchedule database's workload entries
are kept in the store (``Store.put_workloads``) before its first records; entries are
content-addressed, so one kept by an ingest that is then refused is invisible and harmless.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lorien.allocator import release_freed_memory
from lorien.errors import LorienError, RecordParseError
from lorien.warehouse import CommitResult, open_store
from lorien.warehouse.base import build_serving_indexes_of

#: Files picked up when a directory is walked (named files are always read).
LOG_SUFFIXES = (".log", ".json", ".jsonl")
#: A directory holding this file is one MetaSchedule JSONDatabase (the pair, and the record
#: fields Lorien keeps beside it, are read together).
META_SCHEDULE_RECORDS = "database_tuning_record.json"
META_SCHEDULE_FILES = ("database_workload.json", META_SCHEDULE_RECORDS, "lorien_record_fields.json")


@dataclass
class FileReport:
    """What one log gave: records read, newly stored, already stored, bad lines, and the
    tasks whose FLOPs are unknown (their records have no GFLOPS; said once per file)."""

    path: str
    format: str
    records: int = 0
    stored: int = 0
    duplicates: int = 0
    errors: list[RecordParseError] = field(default_factory=list)
    flop_unknown: set[str] = field(default_factory=set)

    def summary(self) -> str:
        return (f"{self.path} [{self.format}]: {self.records} records, {self.stored} stored, "
                f"{self.duplicates} already stored, {len(self.errors)} bad lines")

    def flop_note(self) -> str:
        """One line on the tasks without a FLOP count, or "" when every task has one."""
        if not self.flop_unknown:
            return ""
        names = sorted(self.flop_unknown)
        shown = ", ".join(repr(name) for name in names[:3]) + (", ..." if len(names) > 3 else "")
        return (f"FLOPs unknown for {len(names)} task(s) ({shown}): no FLOP formula or registered compute "
                "definition, so their records have no GFLOPS")

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "records": self.records, "stored": self.stored,
                "duplicates": self.duplicates, "bad_lines": [str(error) for error in self.errors],
                "flop_unknown_tasks": sorted(self.flop_unknown)}


@dataclass
class IngestReport:
    """Per-file reports and totals of one ingest."""

    store_uri: str
    files: list[FileReport] = field(default_factory=list)
    seconds: float = 0.0
    #: seconds spent after the commits building the store's persisted serving index (not in ``seconds``)
    index_seconds: float = 0.0

    @property
    def records(self) -> int:
        return sum(report.records for report in self.files)

    @property
    def stored(self) -> int:
        return sum(report.stored for report in self.files)

    @property
    def duplicates(self) -> int:
        return sum(report.duplicates for report in self.files)

    @property
    def errors(self) -> list[RecordParseError]:
        return [error for report in self.files for error in report.errors]

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        return (f"{len(self.files)} files, {self.records} records, {self.stored} stored, "
                f"{self.duplicates} already stored, {len(self.errors)} bad lines, "
                f"{self.seconds:.2f} s ({self.records_per_s:,.0f} records/s) into {self.store_uri}")

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``lorien ingest --json``)."""
        return {"store": self.store_uri, "files": [report.to_dict() for report in self.files],
                "records": self.records, "stored": self.stored, "duplicates": self.duplicates,
                "bad_lines": len(self.errors), "seconds": round(self.seconds, 3),
                "records_per_s": round(self.records_per_s, 1), "serving_index_s": round(self.index_seconds, 3)}


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Logs named by ``paths``; directories are walked (sorted, hidden entries skipped)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(_walk(path))
        elif path.is_file():
            found.append(path)
        else:
            raise LorienError(f"no such log file or directory: {str(raw)!r}")
    return found


def _walk(directory: Path) -> list[Path]:
    if (directory / META_SCHEDULE_RECORDS).is_file():
        return [directory]
    found: list[Path] = []
    for entry in sorted(os.scandir(directory), key=lambda item: item.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            found.extend(_walk(Path(entry.path)))
        elif entry.name.endswith(LOG_SUFFIXES) and entry.name not in META_SCHEDULE_FILES:
            found.append(Path(entry.path))
    return found


def ingest_paths(paths: Iterable[str | Path], store_uri: str | None = None, strict: bool = False,
                 nbest: int | None = None, format: str | None = None,  # noqa: A002
                 batch_size: int = 65536, on_file: Callable[[FileReport, int], None] | None = None,
                 serving_index: bool = True) -> IngestReport:
    """Read every log under ``paths`` and commit its records to the store at ``store_uri``.

    ``format`` is ``autotvm``, ``ansor`` or ``meta_schedule``; None or ``auto`` detects it per
    file. With ``strict`` the first bad line raises :class:`RecordParseError` and nothing is
    committed. Records are committed ``batch_size`` at a time as they are decoded, whichever
    logs they come from; memory grows with ``batch_size``, not with the logs (of the store's
    record ids it checks against, at most ``lorien.warehouse.parquet.ids.MEMORY_IDS`` are in
    memory, 16 bytes each, the others on disk). ``on_file(report, files_in_all)`` is called as
    each file is read (progress; its stored count may still wait on the batch it is in).
    Tasks whose FLOPs are unknown are counted per file (``FileReport.flop_unknown``) instead
    of being warned about one by one. With ``serving_index`` (the default) a store that keeps a
    persisted serving index (a local parquet store) builds it once the records are committed and
    the memory the commits freed is given back (:func:`lorien.warehouse.base.build_serving_indexes_of`;
    when nothing new was stored it finds the index already there, or builds one that is missing),
    so the next process answers ``best()`` without building one (``report.index_seconds``).
    """
    from lorien.formats import codec_of
    from lorien.workload import flop_warnings_counted_by_caller

    if batch_size < 1:
        raise LorienError(f"batch size must be a positive number of records, got {batch_size!r}")
    if format is not None and format != "auto":
        codec_of(format)  # UnknownFormatError names the known formats
    chosen_format = None if format in (None, "auto") else format
    logs = expand_paths(paths)
    started = time.perf_counter()
    store = open_store(store_uri)
    report = IngestReport(store_uri=store.uri)

    dictionary = getattr(store, "accepts_dictionary_columns", False)

    def ingest_all(batches: _Batches, put_workloads, announce: bool = True) -> None:
        report.files = []
        for log in logs:
            report.files.append(_ingest_one(log, chosen_format, strict, batch_size, batches, put_workloads,
                                            dictionary))
            if announce and on_file is not None:
                on_file(report.files[-1], len(logs))
        batches.flush()

    try:
        with flop_warnings_counted_by_caller():
            transaction = getattr(store, "transaction", None)
            if transaction is not None:
                with transaction(nbest, publish_each_batch=not strict, merge_rows=batch_size) as commit:
                    ingest_all(_Batches(commit.add, batch_size), store.put_workloads)
            else:
                if strict:  # validate every line before committing any
                    ingest_all(_Batches(None, batch_size), lambda entries: 0, announce=False)
                ingest_all(_Batches(lambda table, parts: store.commit(table, nbest), None), store.put_workloads)
        report.seconds = time.perf_counter() - started
        if serving_index:
            store.close()  # frees the record ids the commits checked first
            release_freed_memory()  # what the commits freed, so the build does not sit on it
            build_serving_indexes_of(store)
            report.index_seconds = time.perf_counter() - started - report.seconds
    finally:
        store.close()
    if not report.seconds:
        report.seconds = time.perf_counter() - started
    return report


class _Batches:
    """Tables of one or more logs gathered into commits of ``batch_size`` rows, so that a tree of
    many small logs (TenSet's layout: one file per task and platform) costs as many commits as
    one large log of the same records; each log's report gets its own stored and duplicate counts.
    ``add(table, parts)`` commits (None: only count); without ``batch_size`` each table is
    committed as it comes."""

    def __init__(self, add: Callable[[pa.Table, list[int]], CommitResult] | None, batch_size: int | None):
        self.add = add
        self.batch_size = batch_size
        self.tables: list[pa.Table] = []
        self.reports: list[FileReport] = []
        self.rows = 0

    def put(self, table: pa.Table, file_report: FileReport) -> None:
        file_report.records += table.num_rows
        if self.tables and table.schema != self.tables[0].schema:
            self.flush()  # tables of different encodings are committed apart
        self.tables.append(table)
        self.reports.append(file_report)
        self.rows += table.num_rows
        if self.batch_size is None or self.rows >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        if not self.tables:
            return
        tables, reports, parts = self.tables, self.reports, [table.num_rows for table in self.tables]
        self.tables, self.reports, self.rows = [], [], 0
        if self.add is None:
            return
        result = self.add(tables[0] if len(tables) == 1 else pa.concat_tables(tables), parts)
        stored_per_part = result.stored_per_part or [result.stored]
        for file_report, rows, stored in zip(reports, parts, stored_per_part, strict=True):
            file_report.stored += stored
            file_report.duplicates += rows - stored


def _ingest_one(log: Path, chosen_format: str | None, strict: bool, batch_size: int, batches: _Batches,
                put_workloads: Callable[[dict[str, str]], int], dictionary: bool = False) -> FileReport:
    from lorien.formats import codec_of, detect_format, iter_log_tables

    log_format = chosen_format or detect_format(log)
    codec = codec_of(log_format)
    file_report = FileReport(path=str(log), format=log_format)
    workloads_kept: set[str] = set()
    for table, errors in iter_log_tables(log, format=log_format, strict=False, batch_size=batch_size,
                                         dictionary=dictionary):
        if errors:
            if strict:
                raise errors[0]
            file_report.errors.extend(errors)
        if table.num_rows and hasattr(codec, "hashes_in_extras"):
            # records name their workload by hash: the entries they name are kept before them
            # (reading the database put its entries in the format's registry)
            wanted = codec.hashes_in_extras(pc.unique(table.column("extra")).to_pylist()) - workloads_kept
            entries = codec.known_workloads(wanted)
            if wanted - entries.keys():
                raise LorienError(f"{log}: workload entries {sorted(wanted - entries.keys())} went missing while reading")
            if entries:
                put_workloads(entries)
                workloads_kept |= wanted
        if table.num_rows:
            unknown = table.filter(pc.is_null(table.column("flop"))).column("task_name")
            file_report.flop_unknown.update(pc.unique(pc.cast(unknown, pa.string())).to_pylist())
            del unknown
            batches.put(table, file_report)
        del table  # a committed batch is not kept while the next one is decoded
    return file_report
