"""Log codecs, both directions, lossless: TVM's three formats, and those dialects ship.

- ``autotvm``: AutoTVM JSON lines (record layouts 0.1 and 0.2), e.g. TopHub logs.
- ``ansor``: auto-scheduler JSON lines (``{"i": .., "r": .., "v": "v0.x"}``).
- ``meta_schedule``: a MetaSchedule JSONDatabase directory (``database_workload.json`` +
  ``database_tuning_record.json``); either file of the pair also names the database.

Reading then writing a log gives back records JSON-equal to the input, line for line.

A codec is a module or object that states its facts -- ``FORMAT`` (its name), ``DIALECT``
(the ``dialect`` of the records it decodes and writes), ``LOG_SUFFIX`` (a line log's file
suffix; None for a directory, whose codec names the files it holds in ``DIRECTORY_FILES``) -- and offers ``decode_line(line, path, lineno)``,
``iter_records(path, strict)`` and ``encode_record(record)``. A line log's codec recognises
its records (``claims_value(value)``: one JSON-decoded line); a directory's codec recognises
the directory (``is_database(path)``) and writes it (``write_database(records, path,
workloads)``). ``iter_tables`` (a fast path to Arrow tables) and ``referenced_hashes`` /
``hashes_in_extras`` / ``known_workloads`` (records that name their workload by hash, the
entries kept in the store beside them) are optional. A dialect shipped outside Lorien adds its
own codecs through :meth:`lorien.dialect.Dialect.codecs`; which dialect owns a format is what
the registered dialects declare (:func:`lorien.dialect.format_owner`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from lorien.errors import DialectError, RecordParseError, UnknownFormatError
from lorien.formats import ansor, autotvm, meta_schedule
from lorien.formats.base import LogReadResult, is_skipped
from lorien.record import TuningRecord, records_to_table

__all__ = [
    "LogReadResult", "codec_of", "codecs", "decode_line", "detect_format", "encode_record", "format_of_line",
    "iter_log_tables",
    "line_formats", "log_suffix", "read_log", "write_log",
]

logger = logging.getLogger(__name__)

#: TVM's formats, read and written by Lorien itself.
BUILTIN_CODECS = {codec.FORMAT: codec for codec in (autotvm, ansor, meta_schedule)}
#: How many record-bearing lines detection looks at before giving up.
_DETECT_LINES = 20


def codecs() -> dict[str, Any]:
    """Every codec by format name: TVM's, then those of the registered dialects
    (:meth:`lorien.dialect.Dialect.codecs`). A dialect that fails to load is logged and left out,
    so that one broken plugin does not stop Lorien from reading TVM's logs."""
    from lorien.plugins import available_dialects, get_dialect

    found: dict[str, Any] = dict(BUILTIN_CODECS)
    for name in available_dialects():
        try:
            shipped = get_dialect(name).codecs()
        except DialectError as exc:
            logger.warning("dialect %s: its log codecs are not available: %s", name, exc)
            continue
        for codec in shipped:
            if found.setdefault(codec.FORMAT, codec) is not codec:
                raise DialectError(f"dialect {name!r} ships a codec for log format {codec.FORMAT!r}, "
                                   f"which another codec already reads")
    return found


def codec_of(format: str) -> Any:
    """The codec of a format; UnknownFormatError names the value and the known formats."""
    found = codecs()
    if format not in found:
        raise UnknownFormatError(f"unknown log format {format!r} (known: {', '.join(found)})")
    return found[format]


def format_of_line(line: str | bytes) -> str:
    """The line-log format one log line is a record of, asked of every line codec;
    UnknownFormatError (or orjson's JSONDecodeError for a line that is no JSON) otherwise."""
    value = orjson.loads(line)
    for name, codec in codecs().items():
        if codec.LOG_SUFFIX is not None and codec.claims_value(value):
            return name
    raise UnknownFormatError(f"not a record of a known line-log format ({', '.join(line_formats())}): {line!r:.120}")


def line_formats() -> list[str]:
    """The formats whose logs are files of one record per line (``lorien query --format``)."""
    return [name for name, codec in codecs().items() if codec.LOG_SUFFIX is not None]


def _resolve(path: str | Path, format: str | None) -> str:
    """The format to read ``path`` with; UnknownFormatError for a bad name or a missing path."""
    if format:
        codec_of(format)
        if not Path(path).exists():
            raise UnknownFormatError(f"{path}: no such log file or database directory")
        return format
    return detect_format(path)


def log_suffix(format: str) -> str | None:
    """The file suffix of a line-log format (``autotvm`` -> ``.log``); None for a format whose
    log is a directory (``meta_schedule``)."""
    return codec_of(format).LOG_SUFFIX


def _check_dialect(record: TuningRecord, format: str) -> None:
    dialect = codec_of(format).DIALECT
    if record.dialect != dialect:
        raise DialectError(f"record {record.record_id} of dialect {record.dialect!r} cannot be written as "
                           f"{format!r} (that format holds {dialect!r} records)")


def detect_format(path: str | Path) -> str:
    """The format of a log file or database directory, asked of every codec; UnknownFormatError
    names the file otherwise."""
    path = Path(path)
    found = codecs()
    directories = {name: codec for name, codec in found.items() if codec.LOG_SUFFIX is None}
    for name, codec in directories.items():
        if codec.is_database(path):
            return name
    if path.is_dir():
        needs = "; ".join(f"{name} needs {' and '.join(codec.DIRECTORY_FILES)}" for name, codec in directories.items())
        raise UnknownFormatError(f"{path}: a directory but not a database of a known format ({needs or 'none'})")
    if not path.is_file():
        raise UnknownFormatError(f"{path}: no such log file or database directory")
    lines = {name: codec for name, codec in found.items() if codec.LOG_SUFFIX is not None}
    seen = 0
    with open(path, "rb") as handle:
        for line in handle:
            if is_skipped(line):
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                value = None
            claimed = [name for name, codec in lines.items() if value is not None and codec.claims_value(value)]
            if claimed:
                return claimed[0]
            seen += 1
            if seen >= _DETECT_LINES:
                break
    raise UnknownFormatError(
        f"{path}: not a log of a known format (no recognisable record in its first {_DETECT_LINES} lines); "
        f"pass the format explicitly if it is one of {', '.join(found)}")


def read_log(path: str | Path, format: str | None = None, strict: bool = False) -> LogReadResult:
    """Every record of a log; bad lines become RecordParseErrors (``strict=True`` raises the first)."""
    format = _resolve(path, format)
    records: list[TuningRecord] = []
    errors: list[RecordParseError] = []
    for item in codec_of(format).iter_records(path, strict=strict):
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
    codec = codec_of(format)
    if hasattr(codec, "iter_tables"):
        yield from codec.iter_tables(path, strict=strict, batch_size=batch_size, workers=workers,
                                     dictionary=dictionary)
        return
    records: list[TuningRecord] = []
    errors: list[RecordParseError] = []
    for item in codec.iter_records(path, strict=strict):
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
    _check_dialect(record, format)
    return codec_of(format).encode_record(record)


def decode_line(line: str | bytes, format: str, path: str | Path | None = None,
                lineno: int | None = None) -> TuningRecord:
    """One native log line as a TuningRecord (meta_schedule needs ``path`` to find the workloads)."""
    return codec_of(format).decode_line(line, None if path is None else str(path), lineno)


def write_log(records: Iterable[TuningRecord], format: str, path: str | Path,
              workloads: Mapping[str, str] | None = None) -> int:
    """Write records in a native format; for a directory format (meta_schedule) ``path`` is the
    database directory and ``workloads`` (hash -> entry, e.g. ``Store.get_workloads``) the
    workload entries the records refer to, beyond those this process has read.

    Returns the number of records written.
    """
    codec = codec_of(format)
    if codec.LOG_SUFFIX is None:
        records = list(records)
        for record in records:
            _check_dialect(record, format)
        return codec.write_database(records, path, workloads)
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            _check_dialect(record, format)
            handle.write(codec.encode_record(record))
            handle.write("\n")
            count += 1
    return count
