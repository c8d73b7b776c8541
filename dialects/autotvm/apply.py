"""Apply one given config (e.g. a TopHub line) to our engine, build it and measure it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dialects.autotvm.space import ConfigEntity
from dialects.autotvm.tuning import cached_task, measure_configs
from lorien.errors import ConfigError, DialectError, RecordParseError
from lorien.record import TuningRecord


@dataclass
class AppliedConfig:
    """The outcome of applying one config: the measured record and its numbers."""

    record: TuningRecord
    config: ConfigEntity
    error_msg: str = ""
    logged_cost_s: float | None = None
    logged_target: str = ""

    @property
    def gflops(self) -> float | None:
        return self.record.gflops

    @property
    def latency_s(self) -> float | None:
        return self.record.cost_s


def resolve_config(task_name: str, args: list[Any], config: Any) -> ConfigEntity:
    """A config of the task from an index, an entity list, or an AutoTVM config object."""
    task = cached_task(task_name, orjson.dumps(args).decode())
    if isinstance(config, str):
        try:
            config = orjson.loads(config)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"config is not JSON: {config[:200]!r}") from exc
    if isinstance(config, bool):
        raise ConfigError(f"config must be an index, an entity list or a config object, got {config!r}")
    if isinstance(config, int):
        return task.config(config)
    if isinstance(config, dict):
        if "entity" not in config:
            raise ConfigError(f"config object has no 'entity': {config!r:.200}")
        config = config["entity"]
    if not isinstance(config, list):
        raise ConfigError(f"config must be an index, an entity list or a config object, got {config!r:.200}")
    return task.space.from_json_entity(config)


def apply_config(task_name: str, args: list[Any], config: Any, target: str | None = None,
                 measure: dict[str, Any] | None = None, store_uri: str | None = None,
                 source: str = "lorien apply") -> AppliedConfig:
    """Build and measure ``config`` of ``(task_name, args)`` for ``target`` (default this host's
    CPU; its -mcpu and -num-cores are honoured) on this host; optionally commit it."""
    from dialects.autotvm.records import make_record
    from lorien.target import host_target, parse_target

    entity = resolve_config(task_name, list(args), config)
    target_text = parse_target(target).canonical if target else host_target().canonical
    (result,) = measure_configs(task_name, list(args), [entity], measure, target_text)
    record = make_record(target_text, task_name, list(args), entity, list(result.costs), int(result.error_no),
                         float(result.all_cost), float(result.timestamp), source=source)
    if store_uri is not None:
        from lorien.warehouse import open_store

        with open_store(store_uri) as store:
            store.commit([record])
    return AppliedConfig(record=record, config=entity, error_msg=getattr(result, "error_msg", "") or "")


def read_log_line(path: str | Path, line_no: int) -> tuple[str, list[Any], list[Any]]:
    """(task_name, args, entity list) of line ``line_no`` (1-based, comments count) of an AutoTVM log."""
    task_name, args, entity, _row = _log_row(path, line_no)
    return task_name, args, entity


def _log_row(path: str | Path, line_no: int) -> tuple[str, list[Any], list[Any], dict[str, Any]]:
    from lorien.formats.base import log_line

    text = log_line(path, line_no)
    try:
        row = orjson.loads(text)
        _target, task_name, args = row["input"][:3]
        entity = row["config"]["entity"]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RecordParseError(f"not an AutoTVM 0.2 record: {exc}", str(path), line_no) from exc
    if not isinstance(task_name, str) or not isinstance(args, list):
        raise RecordParseError("input must be [target, task_name, args, ...]", str(path), line_no)
    return task_name, args, entity, row


def apply_log_line(path: str | Path, line_no: int, **options: Any) -> AppliedConfig:
    """Apply the config of one AutoTVM log line (e.g. a TopHub record) and measure it here."""
    task_name, args, entity, row = _log_row(path, line_no)
    try:
        applied = apply_config(task_name, args, entity, **options)
    except DialectError as exc:
        raise DialectError(f"{path}:{line_no}: {exc}") from exc
    result = row.get("result") or []
    if len(result) >= 2 and result[1] == 0 and result[0]:
        applied.logged_cost_s = sum(result[0]) / len(result[0])
        applied.logged_target = str(row["input"][0])
    return applied
