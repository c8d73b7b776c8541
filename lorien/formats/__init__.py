"""Codecs for TVM's three tuning-log formats, both directions, lossless.

- ``autotvm``: AutoTVM JSON lines (record layouts 0.1 and 0.2), e.g. TopHub logs.
- ``ansor``: auto-scheduler JSON lines (``{"i": .., "r": .., "v": "v0.x"}``).
- ``meta_schedule``: a MetaSchedule JSONDatabase directory (``database_workload.json`` +
  ``database_tuning_record.json``); either file of the pair also names the database.

Reading then writing a log gives back records JSON-equal to the input, line for line.

Each codec module states its facts: ``FORMAT`` (its name), ``DIALECT`` (the ``dialect`` of the
records it decodes and writes) and ``LOG_SUFFIX`` (a line log's file suffix; None for a
directory). Which dialect owns a format for the rest of Lorien is what the registered dialects
declare (:func:`lorien.dialect.format_owner`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import orjson
import pyarrow as pa

from lorien.errors import DialectError, RecordParseError, UnknownFormatError
from lorien.formats import ansor, autotvm, meta_schedule
from lorien.formats.base import LogReadResult, is_skipped
from lorien.record import TuningRecord, records_to_table

__all__ = [
    "FORMATS", "LogReadResult", "decode_line", "detect_format", "encode_record", "iter_log_tables",
    "log_suffix", "read_log", "write_log",
]

_CODECS = {codec.FORMAT: codec for codec in (autotvm, ansor, meta_schedule)}
#: Log formats Lorien reads and writes.
FORMATS = tuple(_CODECS)
#: How many record-bearing lines detection looks at before giving up.
_DETECT_LINES = 20


def _check_format(format: str) -> str:
    if format not in _CODECS:
        raise UnknownFormatError(f"unknown log format {format!r} (known: {', '.join(FORMATS)})")
    return format


def _resolve(path: str | Path, format: str | None) -> str:
    """The format to read ``path`` with; UnknownFormatError for a bad name or a missing path."""
    if format:
        _check_format(format)
        if not Path(path).exists():
            raise UnknownFormatError(f"{path}: no such log file or MetaSchedule database directory")
        return format
    return detect_format(path)


def log_suffix(format: str) -> str | None:
    """The file suffix of a line-log format (``autotvm`` -> ``.log``); None for a format whose
    log is a directory (``meta_schedule``)."""
    return _CODECS[_check_format(format)].LOG_SUFFIX


def _check_dialect(record: TuningRecord, format: str) -> None:
    dialect = _CODECS[format].DIALECT
    if record.dialect != dialect:
        raise DialectError(f"record {record.record_id} of dialect {record.dialect!r} cannot be written as "
                           f"{format!r} (that format holds {dialect!r} records)")


def _format_of_value(value: object) -> str | None:
    if isinstance(value, dict):
        if "input" in value and "result" in value:
            return "autotvm"
        version = value.get("v")
        if "i" in value and "r" in value:
            if isinstance(version, str):
                return "ansor"
            if version == 0.1:
                return "autotvm"
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], int) and isinstance(value[1], list):
        return "meta_schedule"
    return None


def detect_format(path: str | Path) -> str:
    """``"autotvm"``, ``"ansor"`` or ``"meta_schedule"``; UnknownFormatError names the file otherwise."""
    path = Path(path)
    if meta_schedule.is_database(path):
        return "meta_schedule"
    if path.is_dir():
        raise UnknownFormatError(f"{path}: a directory but not a MetaSchedule database (it needs "
                                 f"{meta_schedule.WORKLOAD_FILE} and {meta_schedule.RECORD_FILE})")
    if not path.is_file():
        raise UnknownFormatError(f"{path}: no such log file or MetaSchedule database directory")
    seen = 0
    with open(path, "rb") as handle:
        for line in handle:
            if is_skipped(line):
                continue
            try:
                found = _format_of_value(orjson.loads(line))
            except orjson.JSONDecodeError:
                found = None
            if found is not None:
                return found
            seen += 1
            if seen >= _DETECT_LINES:
                break
    raise UnknownFormatError(
        f"{path}: not an AutoTVM, auto-scheduler or MetaSchedule log (no recognisable record in its first "
        f"{_DETECT_LINES} lines); pass the format explicitly if it is one of {', '.join(FORMATS)}")


def read_log(path: str | Path, format: str | None = None, strict: bool = False) -> LogReadResult:
    """Every record of a log; bad lines become RecordParseErrors (``strict=True`` raises the first)."""
    format = _resolve(path, format)
    records: list[TuningRecord] = []
    errors: list[RecordParseError] = []
    for item in _CODECS[format].iter_records(path, strict=strict):
        if isinstance(item, RecordParseError):
            errors.append(item)
        else:
            records.append(item)
    return LogReadResult(records=records, errors=errors, format=format, path=str(path))


def iter_log_tables(path: str | Path, format: str | None = None, strict: bool = False,
                    batch_size: int = 65536, workers: int | None = None, dictionary: bool = False
                    ) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    """Arrow tables (``lorien.record.ARROW_SCHEMA``) of a log, ``batch_size`` records at most each,
    with the errors of the bad lines met since the previous table; the fast path for ingest.

    Large AutoTVM logs are decoded by ``workers`` processes (default: one per free core, see
    :func:`lorien.formats.autotvm.iter_tables`); records come in file order either way. With
    ``dictionary`` some string columns may come dictionary-encoded (same values).
    """
    format = _resolve(path, format)
    if format == "autotvm":
        yield from autotvm.iter_tables(path, strict=strict, batch_size=batch_size, workers=workers,
                                       dictionary=dictionary)
        return
    records: list[TuningRecord] = []
    errors: list[RecordParseError] = []
    for item in _CODECS[format].iter_records(path, strict=strict):
        if isinstance(item, RecordParseError):
            errors.append(item)
            continue
        records.append(item)
        if len(records) >= batch_size:
            yield records_to_table(records), errors
            records, errors = [], []
    if records or errors:
        yield records_to_table(records), errors


def encode_record(record: TuningRecord, format: str) -> str:
    """The native log line of a record (for meta_schedule: its tuning-record line)."""
    _check_dialect(record, _check_format(format))
    return _CODECS[format].encode_record(record)


def decode_line(line: str | bytes, format: str, path: str | Path | None = None,
                lineno: int | None = None) -> TuningRecord:
    """One native log line as a TuningRecord (meta_schedule needs ``path`` to find the workloads)."""
    codec = _CODECS[_check_format(format)]
    return codec.decode_line(line, None if path is None else str(path), lineno)


def write_log(records: Iterable[TuningRecord], format: str, path: str | Path,
              workloads: Mapping[str, str] | None = None) -> int:
    """Write records in a native format; for meta_schedule ``path`` is the database directory
    and ``workloads`` (hash -> entry, e.g. ``Store.get_workloads``) the workload entries the
    records refer to, beyond those this process has read.

    Returns the number of records written.
    """
    format = _check_format(format)
    if format == "meta_schedule":
        records = list(records)
        for record in records:
            _check_dialect(record, format)
        return meta_schedule.write_database(records, path, workloads)
    codec = _CODECS[format]
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            _check_dialect(record, format)
            handle.write(codec.encode_record(record))
            handle.write("\n")
            count += 1
    return count
