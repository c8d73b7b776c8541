"""Auto-scheduler (Ansor) JSON lines, versions v0.2 to v0.6.

A line is ``{"i": [[workload_key, target, hardware_params?, target_host?, layout_rewrite?],
[stages, steps]], "r": [costs, error_no, all_cost, timestamp], "v": "v0.5"}``; how many task
fields follow the target depends on the version. The record keeps the workload key string as
written, the steps as ``config`` and the task fields after the target in ``extra``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from lorien.errors import DialectError, RecordParseError, TargetError
from lorien.formats.base import costs_list, error_number, iter_lines, number, parse_error
from lorien.record import TuningRecord
from lorien.target import parse_target
from lorien.workload import LAYOUT_NA, warn_unknown_flop

FORMAT = "ansor"
#: The ``dialect`` of the records this codec decodes and writes.
DIALECT = "auto_scheduler"
#: A line log; the suffix of its files (the auto-scheduler's ``*.json``).
LOG_SUFFIX = ".json"
#: Version written for records that did not come from an auto-scheduler log.
DEFAULT_VERSION = "v0.6"
#: Names of the task fields after the workload key and target, in log order.
TASK_FIELDS = ("hardware_params", "target_host", "layout_rewrite_option")

_workload_cache: dict[str, tuple[str, str, str, float | None]] = {}


def _layout_and_flop(workload_key: str, func_name: str) -> tuple[str, float | None]:
    """What the auto_scheduler dialect's workload registry says about a workload."""
    from lorien.plugins import get_dialect

    try:
        describe = get_dialect(DIALECT).describe_workload
    except DialectError as exc:
        warn_unknown_flop(func_name, f"no auto_scheduler dialect to describe the workload ({exc})")
        return LAYOUT_NA, None
    return describe(workload_key)


def _workload(workload_key: str) -> tuple[str, str, str, float | None]:
    """(task_name, args JSON, layout, flop) of a workload key ``["func", arg, ...]``.

    Workloads the registry knows are remembered; unknown ones are asked again, since a
    workload may be registered later in the same process.
    """
    found = _workload_cache.get(workload_key)
    if found is None:
        try:
            value = orjson.loads(workload_key)
        except orjson.JSONDecodeError as exc:
            raise RecordParseError(f"workload key {workload_key!r} is not JSON") from exc
        if type(value) is not list or not value or type(value[0]) is not str:
            raise RecordParseError(f"workload key {workload_key!r} is not [func_name, args...]")
        layout, flop = _layout_and_flop(workload_key, value[0])
        found = (value[0], orjson.dumps(value[1:]).decode(), layout, flop)
        if flop is not None:
            _workload_cache[workload_key] = found
    return found


def decode_value(data: Any, source: str = "") -> TuningRecord:
    """A TuningRecord from one parsed auto-scheduler line."""
    if type(data) is not dict or "i" not in data or "r" not in data:
        raise RecordParseError("an auto-scheduler record is an object with 'i' and 'r'")
    inp, result = data["i"], data["r"]
    if (type(inp) is not list or len(inp) != 2 or type(inp[0]) is not list or len(inp[0]) < 2
            or type(inp[1]) is not list or len(inp[1]) != 2):
        raise RecordParseError(f"'i' must be [[workload_key, target, ...], [stages, steps]], got {str(inp)[:120]!r}")
    task, (stages, steps) = inp
    workload_key, target_raw = task[0], task[1]
    if type(workload_key) is not str or type(target_raw) is not str:
        raise RecordParseError(f"task {task[:2]!r} needs a workload key string and a target string")
    if type(result) is not list or len(result) != 4:
        raise RecordParseError(f"'r' {result!r} is not [costs, error_no, all_cost, timestamp]")
    costs = costs_list(result[0])
    error_no = error_number(result[1])
    all_cost = number(result[2], "all_cost")
    timestamp = number(result[3], "timestamp")
    try:
        target = parse_target(target_raw)
    except TargetError as exc:
        raise RecordParseError(f"unknown or unparseable target in record: {exc}") from exc
    task_name, args, layout, flop = _workload(workload_key)
    extra: dict[str, Any] = {name: value for name, value in data.items() if name not in ("i", "r")}
    for name, value in zip(TASK_FIELDS, task[2:], strict=False):
        extra[name] = value
    if len(task) > 2 + len(TASK_FIELDS):
        extra["task_tail"] = task[2 + len(TASK_FIELDS):]
    if stages:
        extra["stages"] = stages
    return TuningRecord(
        dialect=DIALECT, target=target.canonical, target_key=target.alternate_key,
        workload_key=workload_key, task_name=task_name, args=args, layout=layout,
        config=orjson.dumps(steps).decode(), costs=costs, error_no=error_no, all_cost=all_cost,
        timestamp=timestamp, flop=flop, extra=orjson.dumps(extra).decode(), source=source,
        target_raw=target_raw,
    )


def claims_value(value: Any) -> bool:
    """Whether one JSON-decoded log line is an auto-scheduler record (``{"i", "r", "v": "v0.x"}``)."""
    return isinstance(value, dict) and "i" in value and "r" in value and isinstance(value.get("v"), str)


def decode_line(line: str | bytes, path: str | None = None, lineno: int | None = None) -> TuningRecord:
    """One auto-scheduler log line as a TuningRecord; RecordParseError names the file and line."""
    try:
        return decode_value(orjson.loads(line), "" if path is None else str(path))
    except (RecordParseError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise parse_error(exc, path, lineno) from exc


def iter_records(path: str | Path, strict: bool = False) -> Iterator[TuningRecord | RecordParseError]:
    """Every record (or the error of every bad line) of an auto-scheduler log, in file order."""
    for lineno, line in iter_lines(path):
        try:
            yield decode_line(line, str(path), lineno)
        except RecordParseError as error:
            if strict:
                raise
            yield error


def _json_number(value: float) -> float | int:
    """Auto-scheduler writes whole-second timestamps as integers; keep them so (but not -0.0,
    whose sign an integer would lose)."""
    return int(value) if value.is_integer() and math.copysign(1.0, value) > 0 else value


def encode_record(record: TuningRecord) -> str:
    """The auto-scheduler log line of a record."""
    extra = orjson.loads(record.extra) if record.extra else {}
    task: list[Any] = [record.workload_key, record.target_raw]
    for name in TASK_FIELDS:
        if name not in extra:
            break
        task.append(extra.pop(name))
    task.extend(extra.pop("task_tail", []))
    stages = extra.pop("stages", [])
    line: dict[str, Any] = {
        "i": [task, [stages, orjson.loads(record.config)]],
        "r": [list(record.costs), record.error_no, record.all_cost, _json_number(record.timestamp)],
    }
    line.update(extra)
    line.setdefault("v", DEFAULT_VERSION)
    return json.dumps(line)
