"""Apply one MetaSchedule record (a line of a JSONDatabase) or a given trace here: replay the
trace on the workload, build the kernel, check it against NumPy and measure it (``lorien apply``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from dialects.meta_schedule.compile import measure_traces, workload_dag
from dialects.meta_schedule.records import args_info, make_record
from dialects.meta_schedule.trace import parse_trace, replay_trace
from lorien.dialect import AppliedConfig, apply_logged
from lorien.engine.cpu import engine_target
from lorien.errors import ConfigError
from lorien.record import TuningRecord


def apply_record(logged: TuningRecord, trace: Any = None, target: str | None = None,
                 measure: dict[str, Any] | None = None, store_uri: str | None = None,
                 source: str = "lorien apply", entries: dict[str, str] | None = None) -> AppliedConfig:
    """Replay ``trace`` (default: the record's own) on the workload of ``logged``, then build,
    check and measure it on this host; optionally commit the measured record to ``store_uri``.

    ``entries`` (hash -> text) are workload entries at hand, e.g. those of the record's
    database. An instruction that cannot be applied raises TraceError before anything is
    measured."""
    from lorien.target import host_target, parse_target

    trace = orjson.loads(logged.config) if trace is None else trace
    if isinstance(trace, str):
        try:
            trace = orjson.loads(trace)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"a trace is JSON [instructions, decisions], got {trace[:200]!r}") from exc
    parse_trace(trace)
    dag = workload_dag(logged, entries=entries)
    replay = replay_trace(dag, trace)
    target_text = parse_target(target).canonical if target else host_target().canonical
    (result,) = measure_traces(dag, [trace], measure, engine_target(target_text))
    extra = orjson.loads(logged.extra) if logged.extra else {}
    record = make_record(target_text, logged.workload_key, trace, list(result.costs), int(result.error_no),
                         float(result.all_cost), float(result.timestamp), args_info(dag), logged.flop,
                         logged.task_name, {k: v for k, v in extra.items() if k != "record_fields"}, source)
    if store_uri is not None:
        from lorien.warehouse import open_store

        with open_store(store_uri) as store:
            store.commit([record])
    return AppliedConfig(record=record, config_text=orjson.dumps(trace).decode(),
                         error_msg=getattr(result, "error_msg", "") or "", notes=replay.notes)


def read_database_line(path: str | Path, line_no: int) -> TuningRecord:
    """The record of line ``line_no`` (1-based) of a database's tuning-record file (``path``
    is the database directory or either file of its pair)."""
    from lorien.formats.base import log_line
    from lorien.formats.meta_schedule import decode_line, pair_paths

    return decode_line(log_line(pair_paths(path)[1], line_no), path, line_no)


def apply_log_line(path: str | Path, line_no: int, **options: Any) -> AppliedConfig:
    """Apply the trace of one JSONDatabase record and measure it here; the database's own
    latency and target are kept beside ours."""
    from lorien.formats.meta_schedule import workload_texts

    logged = read_database_line(path, line_no)
    entries = workload_texts(path)
    return apply_logged(str(path), line_no, logged, lambda: apply_record(logged, entries=entries, **options))
