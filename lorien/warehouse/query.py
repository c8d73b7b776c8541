"""Queries over any store that need more than one call: TopHub-style exports, output rows."""

from __future__ import annotations

from lorien.dialect import format_owner
from lorien.record import TuningRecord, record_summary, table_to_records  # noqa: F401 - record_summary lives beside the record
from lorien.target import match_mode, match_tier, parse_target
from lorien.warehouse.base import Store


def export_records(store: Store, target: str, log_format: str, best_only: bool = True,
                   by_alternate_key: bool = False, exact: bool = False) -> list[TuningRecord]:
    """Records of the stored targets matching ``target`` (as in ``Store.best``) in one
    format's dialect.

    ``best_only`` keeps one record per (workload_key, layout): the most specific target
    match first, then the fastest valid record, ordered by workload, the shape of a TopHub
    log that TVM's ``ApplyHistoryBest`` reads; otherwise every matching record is returned.
    In the ``meta_schedule`` format, whose ``run_secs`` TVM compares with its own, a workload's
    records measured by TVM (``measured_by`` tvm, or ingested from TVM's logs) come before
    those Lorien's engine measured: the engine's latencies are another machine model's and do
    not rank against TVM's (a job's ``remeasure_with_tvm`` leaves both kinds in the store).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from lorien.warehouse.parquet import group_starts

    mode = match_mode(exact, by_alternate_key)
    parsed = parse_target(target)
    filters = {"dialect": format_owner(log_format), "target_key": parsed.alternate_key}
    if mode == "exact":
        filters["target"] = parsed.canonical
    table = store.scan(filters)
    stored_targets = pc.cast(table.column("target"), pa.string())
    distinct = pc.unique(stored_targets).to_pylist()
    tier_of = {stored: match_tier(parsed.canonical, stored, mode) for stored in distinct}
    matched = [stored for stored in distinct if tier_of[stored] is not None]
    keep = pc.is_in(stored_targets, value_set=pa.array(matched, pa.string()))
    if best_only:
        keep = pc.and_(keep, pc.is_valid(table.column("cost_s")))
    table = table.filter(keep)
    if not best_only or table.num_rows == 0:
        return table_to_records(table)
    tiers = pa.array([tier_of[stored] for stored in pc.cast(table.column("target"), pa.string()).to_pylist()])
    columns = {"workload_key": pc.cast(table.column("workload_key"), pa.string()),
               "layout": pc.cast(table.column("layout"), pa.string()), "tier": tiers}
    if log_format == "meta_schedule":
        columns["engine_measured"] = pa.array(_engine_measured(table.column("build").to_pylist()))
    keys = pa.table({**columns, "cost_s": table.column("cost_s"), "record_id": table.column("record_id")})
    order = pc.sort_indices(keys, sort_keys=[(name, "ascending") for name in keys.column_names]).to_numpy()
    starts = group_starts(keys.take(order), ("workload_key", "layout"))
    return table_to_records(table.take(np.asarray(order[starts])))


def _engine_measured(builds: list[str | None]) -> list[bool]:
    """Whether each record (by its ``build`` JSON) was measured by Lorien's engine."""
    from lorien.record import MEASURED_BY_ENGINE, measured_by_of

    memo: dict[str | None, bool] = {}
    for build in builds:
        if build not in memo:
            memo[build] = measured_by_of(build) == MEASURED_BY_ENGINE
    return [memo[build] for build in builds]
