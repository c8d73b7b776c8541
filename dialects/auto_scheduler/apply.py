"""Apply one given Ansor record (e.g. a line of a TVM log) here: replay its steps, build the
kernel, check it against NumPy and measure it (``lorien apply``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from dialects.auto_scheduler.steps import replay_steps
from lorien import workload_registry
from lorien.dialect import AppliedConfig, apply_logged
from lorien.errors import ConfigError
from lorien.record import TuningRecord


def apply_steps(workload_key: str, steps: Any, target: str | None = None, measure: dict[str, Any] | None = None,
                store_uri: str | None = None, source: str = "lorien apply",
                layout_rewrite: bool = False) -> AppliedConfig:
    """Replay ``steps`` (a list, or its JSON) on the registered workload, then build, check and
    measure the kernel on this host; optionally commit the record to ``store_uri``.
    ``layout_rewrite``: the weights packed as the loops read them, before the timing.

    A step that cannot be applied raises StepError before anything is measured.
    """
    from dialects.auto_scheduler.records import make_record
    from dialects.auto_scheduler.tuning import measure_steps
    from lorien.engine.cpu import engine_target
    from lorien.target import host_target, parse_target

    if isinstance(steps, str):
        try:
            steps = orjson.loads(steps)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"steps are not JSON: {steps[:200]!r}") from exc
    if not isinstance(steps, list) or not all(isinstance(step, list) and step for step in steps):
        raise ConfigError(f"an Ansor config is a list of steps, got {steps!r:.200}")
    replay = replay_steps(workload_registry.workload_dag(workload_key), steps, layout_rewrite)
    target_text = parse_target(target).canonical if target else host_target().canonical
    (result,) = measure_steps(workload_key, [steps], measure, engine_target(target_text), layout_rewrite)
    record = make_record(target_text, workload_key, steps, list(result.costs), int(result.error_no),
                         float(result.all_cost), float(result.timestamp), source=source,
                         layout_rewrite=bool(replay.packed))
    if store_uri is not None:
        from lorien.warehouse import open_store

        with open_store(store_uri) as store:
            store.commit([record])
    return AppliedConfig(record=record, config_text=json.dumps(steps), error_msg=getattr(result, "error_msg", "") or "",
                         notes=replay.notes)


def read_log_line(path: str | Path, line_no: int) -> TuningRecord:
    """The record of line ``line_no`` (1-based, comment lines count) of an Ansor log."""
    from lorien.formats.ansor import decode_line
    from lorien.formats.base import log_line

    return decode_line(log_line(path, line_no), str(path), line_no)


def apply_log_line(path: str | Path, line_no: int, **options: Any) -> AppliedConfig:
    """Apply the steps of one Ansor log line and measure them here, the weights' layout
    rewritten when the log's task says so; the log's own latency and target are kept beside ours."""
    from dialects.auto_scheduler.records import layout_rewritten

    logged = read_log_line(path, line_no)
    options.setdefault("layout_rewrite", layout_rewritten(logged))
    return apply_logged(str(path), line_no, logged, lambda: apply_steps(logged.workload_key, orjson.loads(logged.config), **options))
