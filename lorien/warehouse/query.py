"""Queries over any store that need more than one call: TopHub-style exports, output rows."""

from __future__ import annotations

from lorien.errors import UnknownFormatError
from lorien.record import TuningRecord, table_to_records
from lorien.target import parse_target
from lorien.warehouse.base import Store

#: Log format -> the dialect whose records it carries.
FORMAT_DIALECTS = {"autotvm": "autotvm", "ansor": "auto_scheduler", "meta_schedule": "meta_schedule"}


def dialect_of_format(log_format: str) -> str:
    try:
        return FORMAT_DIALECTS[log_format]
    except KeyError:
        known = ", ".join(FORMAT_DIALECTS)
        raise UnknownFormatError(f"unknown log format {log_format!r} (known: {known})") from None


def export_records(store: Store, target: str, log_format: str, best_only: bool = True,
                   by_alternate_key: bool = False) -> list[TuningRecord]:
    """Records of one target in one format's dialect, ordered by workload then cost.

    ``best_only`` keeps the fastest valid record per (target, workload_key, layout), the shape
    of a TopHub log that TVM's ``ApplyHistoryBest`` reads; otherwise every record is returned.
    """
    from lorien.warehouse.parquet import top_per_group

    dialect = dialect_of_format(log_format)
    parsed = parse_target(target)
    filters = {"dialect": dialect}
    if by_alternate_key:
        filters["target_key"] = parsed.alternate_key
    else:
        filters["target"] = parsed.canonical
    table = store.scan(filters)
    return table_to_records(top_per_group(table, 1) if best_only else table)


def record_summary(record: TuningRecord) -> dict[str, object]:
    """The fields a person reads first, for table and JSON output."""
    cost_s = record.cost_s
    gflops = record.gflops
    return {
        "cost_us": None if cost_s is None else round(cost_s * 1e6, 3),
        "gflops": None if gflops is None else round(gflops, 2),
        "layout": record.layout,
        "target": record.target,
        "workload_key": record.workload_key,
        "config": record.config,
        "record_id": record.record_id,
    }
