"""MetaSchedule JSONDatabase: the file pair ``database_workload.json`` (one ``[shash, module]``
per line) and ``database_tuning_record.json`` (one ``[workload_index, [trace, run_secs,
target, args_info]]`` per line).

A record's workload key is the workload's structural hash. Its ``extra`` keeps the workload
index and ``workload_hash``, the content hash of the workload entry (:func:`entry_hash`).
Entries (an IRModule each, often tens of kilobytes) are kept once per workload, never once
per record: this module remembers every entry it reads (:func:`remember_workloads`), a
warehouse stores them beside the records (``Store.put_workloads``), and
:func:`write_database` looks them up there, so the pair can be written back JSON-equal to the
input. Records written by older Lorien versions carry the entry itself (``extra.workload``);
they are read as before.

A tuning-record line has no place for what Lorien measured beyond TVM's fields (timestamp,
all_cost, build) nor for what a workload Lorien tuned is called (task name, layout, FLOPs
of a ``lorien_dag`` entry). Where a record's value differs from what its line gives back,
:func:`write_database` keeps it in a third file, ``lorien_record_fields.json`` (one
``{"line": hash of the record line, field: value, ...}`` per such record; TVM reads only
the pair and ignores it), and reading the database restores it, so exporting records and
ingesting the database into the same store stores nothing new.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from lorien.errors import RecordParseError, TargetError
from lorien.formats.base import costs_list, iter_lines, parse_error
from lorien.formats.tir import TirSummary, safe_summarize
from lorien.record import FAILED_COST_S, ErrorNo, TuningRecord
from lorien.target import parse_target, parse_target_dict
from lorien.workload import LAYOUT_NA, negative_dimension

FORMAT = "meta_schedule"
#: The ``dialect`` of the records this codec decodes and writes.
DIALECT = "meta_schedule"
#: Not a line log: a database directory holding WORKLOAD_FILE and RECORD_FILE.
LOG_SUFFIX = None
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
#: What a directory of this format holds (named when a directory is not one).
DIRECTORY_FILES = (WORKLOAD_FILE, RECORD_FILE)
FIELDS_FILE = "lorien_record_fields.json"
#: Record fields a tuning-record line cannot hold, kept in FIELDS_FILE when they differ from
#: what the line gives back (``extra`` only when it names its workload by hash).
KEPT_FIELDS = ("task_name", "layout", "flop", "all_cost", "timestamp", "build", "extra")


def entry_text(entry: Any) -> str:
    """The compact JSON of a workload entry (what the workload file holds, one per line)."""
    return orjson.dumps(entry).decode()


def entry_hash(text: str) -> str:
    """The content hash of a workload entry's compact JSON: 32 hex digits of its SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class WorkloadEntry:
    """One line of database_workload.json and what Lorien reads from its module."""

    entry: list[Any]
    summary: TirSummary
    text: str = field(default="", compare=False)
    digest: str = field(default="", compare=False)

    @property
    def shash(self) -> str:
        return str(self.entry[0])


#: Workload entries met in this process (content hash -> compact JSON): what lets records read
#: from a database be written back without carrying their module. Bounded; see remember_workloads.
_KNOWN: dict[str, str] = {}
_KNOWN_LOCK = threading.Lock()
MAX_KNOWN_BYTES = 256 << 20


def remember_workloads(entries: Mapping[str, str]) -> None:
    """Keep workload entries (hash -> compact JSON) for :func:`write_database` in this process."""
    with _KNOWN_LOCK:
        if sum(map(len, _KNOWN.values())) + sum(map(len, entries.values())) > MAX_KNOWN_BYTES:
            _KNOWN.clear()
        _KNOWN.update(entries)


def known_workloads(hashes: Iterable[str]) -> dict[str, str]:
    """The entries of ``hashes`` that this process has read (hash -> compact JSON)."""
    with _KNOWN_LOCK:
        return {digest: _KNOWN[digest] for digest in hashes if digest in _KNOWN}


def workload_texts(path: str | Path) -> dict[str, str]:
    """The workload entries of a database (hash -> compact JSON), lines that parse."""
    return {entry.digest: entry.text for entry in read_workloads(path)[0].values()}


def referenced_hashes(records: Iterable[TuningRecord]) -> set[str]:
    """Workload hashes the records refer to (records carrying their entry refer to none)."""
    return hashes_in_extras(record.extra for record in records)


def hashes_in_extras(extras: Iterable[str | None]) -> set[str]:
    """Workload hashes named by records' ``extra`` texts (e.g. the distinct ones of a table)."""
    found = set()
    for text in extras:
        extra = orjson.loads(text) if text else {}
        if "workload_hash" in extra and "workload" not in extra:
            found.add(str(extra["workload_hash"]))
    return found


def pair_paths(path: str | Path) -> tuple[Path, Path]:
    """(workload file, record file) of a database directory or of either file of the pair."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    return directory / WORKLOAD_FILE, directory / RECORD_FILE


def fields_path(path: str | Path) -> Path:
    """The file of record fields beside a database's pair (see the module docstring)."""
    return pair_paths(path)[0].parent / FIELDS_FILE


def line_hash(data: Any) -> str:
    """The hash that ties a record's kept fields to its parsed tuning-record line."""
    return entry_hash(orjson.dumps(data).decode())


def read_kept_fields(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Kept record fields of a database by line hash (lines of equal hash in file order)."""
    kept: dict[str, list[dict[str, Any]]] = {}
    file = fields_path(path)
    if not file.is_file():
        return kept
    for lineno, line in iter_lines(file):
        try:
            value = orjson.loads(line)
            if type(value) is not dict or type(value.get("line")) is not str or \
                    not set(value) - {"line"} <= set(KEPT_FIELDS):
                raise RecordParseError(f"a line of {FIELDS_FILE} is {{\"line\": hash, field: value, ...}} with "
                                       f"fields of {KEPT_FIELDS}, got {str(value)[:100]!r}")
        except (RecordParseError, orjson.JSONDecodeError) as exc:
            raise parse_error(exc, str(file), lineno) from exc
        kept.setdefault(value.pop("line"), []).append(value)
    return kept


def kept_fields(record: TuningRecord, read_back: TuningRecord) -> dict[str, Any]:
    """The fields of ``record`` that its tuning-record line, read back, does not give."""
    kept = {}
    for name in KEPT_FIELDS:
        value = getattr(record, name)
        if value != getattr(read_back, name):
            if name == "extra" and "workload" in orjson.loads(value or "{}"):
                continue  # the entry inline: the line names the same entry by hash
            kept[name] = value
    return kept


def is_database(path: str | Path) -> bool:
    path = Path(path)
    if path.is_dir():
        return (path / WORKLOAD_FILE).is_file() and (path / RECORD_FILE).is_file()
    return path.name in (WORKLOAD_FILE, RECORD_FILE)


def read_workloads(path: str | Path, strict: bool = False
                   ) -> tuple[dict[int, WorkloadEntry], list[RecordParseError]]:
    """Workloads of a database by index, and the errors of lines that could not be read."""
    workload_file, _ = pair_paths(path)
    if not workload_file.is_file():
        raise RecordParseError(f"MetaSchedule database has no {WORKLOAD_FILE}", str(workload_file.parent))
    workloads: dict[int, WorkloadEntry] = {}
    errors: list[RecordParseError] = []
    index = 0
    for lineno, line in iter_lines(workload_file):
        try:
            entry = orjson.loads(line)
            if type(entry) is not list or len(entry) < 2 or type(entry[0]) not in (str, int):
                raise RecordParseError(f"a workload line is [shash, module], got {str(entry)[:80]!r}")
            text = entry_text(entry)
            workloads[index] = WorkloadEntry(entry, safe_summarize(entry[1]), text, entry_hash(text))
        except (RecordParseError, orjson.JSONDecodeError) as exc:
            error = parse_error(exc, str(workload_file), lineno)
            if strict:
                raise error from exc
            errors.append(error)
        index += 1
    remember_workloads({entry.digest: entry.text for entry in workloads.values()})
    return workloads, errors


def _target(value: Any) -> tuple[str, str, str]:
    """(canonical, alternate key, raw text) of a record's target (JSON dict or string)."""
    try:
        if isinstance(value, dict):
            target = parse_target_dict(value)
            return target.canonical, target.alternate_key, orjson.dumps(value).decode()
        if isinstance(value, str):
            target = parse_target(value)
            return target.canonical, target.alternate_key, value
    except TargetError as exc:
        raise RecordParseError(f"unknown or unparseable target in record: {exc}") from exc
    raise RecordParseError(f"record target {value!r} is neither a JSON object nor a string")


def decode_value(data: Any, workloads: dict[int, WorkloadEntry], source: str = "",
                 kept: Mapping[str, Any] | None = None) -> TuningRecord:
    """A TuningRecord from one parsed tuning-record line and the database's workloads; ``kept``
    (field -> value, from FIELDS_FILE) gives the fields the line cannot hold."""
    if type(data) is not list or len(data) != 2 or type(data[0]) is not int or type(data[1]) is not list:
        raise RecordParseError(f"a tuning record line is [workload_index, [trace, run_secs, target, args_info]], got {str(data)[:100]!r}")
    index, fields = data
    if len(fields) < 3:
        raise RecordParseError(f"tuning record {str(fields)[:100]!r} has no target")
    workload = workloads.get(index)
    if workload is None:
        raise RecordParseError(f"tuning record refers to workload index {index}, which the workload file does not hold")
    trace, run_secs, target_value = fields[0], fields[1], fields[2]
    args_info = fields[3] if len(fields) > 3 else None
    if type(trace) is not list:
        raise RecordParseError(f"trace {str(trace)[:80]!r} is not a JSON array")
    damaged = negative_dimension(args_info) if type(args_info) is list else None
    if damaged is not None:
        raise RecordParseError(f"tensor argument {damaged!r} has a negative dimension")
    target, target_key, target_raw = _target(target_value)
    extra: dict[str, Any] = {"workload_index": index, "workload_hash": workload.digest}
    if run_secs is None:
        costs, error_no = [], int(ErrorNo.UNKNOWN_ERROR)
        extra["run_secs"] = None
    else:
        costs = costs_list(run_secs, "run_secs")
        error_no = int(ErrorNo.UNKNOWN_ERROR) if costs and min(costs) >= FAILED_COST_S else 0
    if len(fields) != 4:
        extra["record_fields"] = len(fields)
    values: dict[str, Any] = {
        "task_name": workload.summary.main_block, "layout": LAYOUT_NA, "flop": workload.summary.flop,
        "all_cost": 0.0, "timestamp": 0.0, "build": "{}", "extra": orjson.dumps(extra).decode(), **(kept or {})}
    return TuningRecord(
        dialect=DIALECT, target=target, target_key=target_key, workload_key=workload.shash,
        args=orjson.dumps(args_info).decode(), config=orjson.dumps(trace).decode(), costs=costs,
        error_no=error_no, source=source, target_raw=target_raw, **values,
    )


_workload_cache: dict[tuple[str, float, float], tuple[dict[int, WorkloadEntry], dict[str, list[dict[str, Any]]]]] = {}


def _workloads_for(path: str | Path) -> tuple[dict[int, WorkloadEntry], dict[str, list[dict[str, Any]]]]:
    """(workloads by index, kept record fields by line hash) of a database, cached by mtimes."""
    workload_file, _ = pair_paths(path)
    try:
        stamp = workload_file.stat().st_mtime
    except OSError as exc:
        raise RecordParseError(f"MetaSchedule database has no readable {WORKLOAD_FILE}: {exc}", str(path)) from exc
    fields_file = fields_path(path)
    key = (str(workload_file.resolve()), stamp, fields_file.stat().st_mtime if fields_file.is_file() else 0.0)
    if key not in _workload_cache:
        _workload_cache[key] = read_workloads(workload_file)[0], read_kept_fields(path)
    return _workload_cache[key]


def decode_line(line: str | bytes, path: str | Path | None = None, lineno: int | None = None) -> TuningRecord:
    """One tuning-record line; ``path`` (the database or one of its files) locates the workloads."""
    if path is None:
        raise RecordParseError("a MetaSchedule record line needs the database path to resolve its workload")
    try:
        workloads, kept = _workloads_for(path)
        data = orjson.loads(line)
        found = kept.get(line_hash(data)) if kept else None
        return decode_value(data, workloads, str(path), found[0] if found else None)
    except (RecordParseError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise parse_error(exc, str(pair_paths(path)[1]), lineno) from exc


def iter_records(path: str | Path, strict: bool = False) -> Iterator[TuningRecord | RecordParseError]:
    """Every record of a database (or the error of every bad line), in record-file order."""
    workloads, errors = read_workloads(path, strict=strict)
    yield from errors
    kept = read_kept_fields(path)
    _, record_file = pair_paths(path)
    source = str(Path(path))
    for lineno, line in iter_lines(record_file):
        try:
            data = orjson.loads(line)
            queue = kept.get(line_hash(data)) if kept else None
            yield decode_value(data, workloads, source, queue.pop(0) if queue else None)
        except (RecordParseError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
            error = parse_error(exc, str(record_file), lineno)
            if strict:
                raise error from exc
            yield error


def _workload_of(record: TuningRecord, entries: Mapping[str, str]) -> tuple[int | None, str]:
    """(workload index, entry as compact JSON) of a record."""
    extra = orjson.loads(record.extra) if record.extra else {}
    if "workload" in extra:  # written by an older Lorien: the entry itself
        return extra.get("workload_index"), entry_text(extra["workload"])
    digest = extra.get("workload_hash")
    if digest is None:
        raise RecordParseError(f"record {record.record_id} has no MetaSchedule workload in its extra")
    text = entries.get(digest) or known_workloads([digest]).get(digest)
    if text is None:
        raise RecordParseError(
            f"record {record.record_id} refers to MetaSchedule workload {digest}, whose entry is not at hand "
            f"(read its database, or export from the warehouse it was ingested into)")
    return extra.get("workload_index"), text


def encode_record(record: TuningRecord, workload_index: int | None = None) -> str:
    """The tuning-record line of a record (its workload index from ``extra`` unless given)."""
    extra = orjson.loads(record.extra) if record.extra else {}
    index = workload_index if workload_index is not None else extra.get("workload_index", 0)
    run_secs: list[float] | None = None if "run_secs" in extra and extra["run_secs"] is None else list(record.costs)
    target: Any = orjson.loads(record.target_raw) if record.target_raw.startswith("{") else record.target_raw
    fields = [orjson.loads(record.config), run_secs, target, orjson.loads(record.args)]
    fields = fields[: extra.get("record_fields", 4)]
    return orjson.dumps([index, fields]).decode()


def write_database(records: Iterable[TuningRecord], directory: str | Path,
                   entries: Mapping[str, str] | None = None) -> int:
    """Write the JSONDatabase pair into ``directory``; returns the number of records written.

    A record's workload entry is looked up by its hash in ``entries`` (hash -> compact JSON,
    e.g. ``Store.get_workloads``), then among the entries this process has read; a record
    that names none at hand raises RecordParseError before anything is written. Workloads
    keep their original indices when the records carry a consistent, gap-free set; otherwise
    they are numbered in order of first appearance.
    """
    records = list(records)
    keyed = [_workload_of(record, entries or {}) for record in records]
    by_original: dict[int, str] = {}
    consistent = True
    for index, text in keyed:
        if index is None or by_original.setdefault(index, text) != text:
            consistent = False
    if consistent and sorted(by_original) == list(range(len(by_original))) and \
            len(set(by_original.values())) == len(by_original):
        order = [by_original[i] for i in range(len(by_original))]
    else:
        order = list(dict.fromkeys(text for _, text in keyed))
    position = {text: i for i, text in enumerate(order)}
    workloads = {i: WorkloadEntry(orjson.loads(text), safe_summarize(orjson.loads(text)[1]), text, entry_hash(text))
                 for i, text in enumerate(order)}
    lines, kept_lines = [], []
    for record, (_, text) in zip(records, keyed, strict=True):
        line = encode_record(record, position[text])
        data = orjson.loads(line)
        kept = kept_fields(record, decode_value(data, workloads))
        if kept:
            kept_lines.append(orjson.dumps({"line": line_hash(data), **kept}).decode())
        lines.append(line)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    workload_file, record_file = pair_paths(directory)
    workload_file.write_text("".join(f"{text}\n" for text in order), encoding="utf-8")
    record_file.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    if kept_lines:
        fields_path(directory).write_text("".join(f"{line}\n" for line in kept_lines), encoding="utf-8")
    else:
        fields_path(directory).unlink(missing_ok=True)
    return len(records)
