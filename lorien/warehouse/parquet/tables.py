"""Arrow table helpers of the parquet store: conforming, deduplicating, splitting by
partition, ranking and the best-per-group view."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lorien.errors import StoreError
from lorien.record import ARROW_SCHEMA, TuningRecord, mean_cost_s, records_to_table
from lorien.warehouse.parquet.ids import id_halves
from lorien.warehouse.parquet.layout import SERVING_FILE_SCHEMA

#: Columns with few distinct values, dictionary-encoded in files; the rest (configs, ids,
#: costs) are nearly unique, and trying to dictionary-encode them only costs time.
DICTIONARY_COLUMNS = ["dialect", "target", "target_key", "target_raw", "workload_key", "task_name", "args",
                      "layout", "build", "extra", "source"]


#: Rows decoded at a time when a table with dictionary-encoded columns is written (and the row
#: group size of a file written without one).
WRITE_SLICE_ROWS = 65536


def write_parquet(table: pa.Table, where: Any, row_group_size: int | None) -> None:
    """Write a table as one Parquet file; dictionary-encoded columns are decoded a slice of
    rows at a time, so a write never holds a second, decoded copy of the whole table."""
    schema = pa.schema([field.with_type(plain_type(field.type)) for field in table.schema])
    dictionary = [name for name in DICTIONARY_COLUMNS if name in table.column_names]
    step = row_group_size or WRITE_SLICE_ROWS
    with pq.ParquetWriter(where, schema, use_dictionary=dictionary) as writer:
        for start in range(0, max(table.num_rows, 1), step):
            writer.write_table(decoded(table.slice(start, step)), row_group_size=step)


def plain_type(type_: pa.DataType) -> pa.DataType:
    return type_.value_type if pa.types.is_dictionary(type_) else type_


def decoded(table: pa.Table) -> pa.Table:
    """The table with its dictionary-encoded columns decoded (files and sorts take plain columns)."""
    if not any(pa.types.is_dictionary(field.type) for field in table.schema):
        return table
    return table.cast(pa.schema([field.with_type(plain_type(field.type)) for field in table.schema]))


def constant(value: str, length: int) -> pa.Array:
    return pa.array([value], pa.string()).take(np.zeros(length, dtype=np.int32))


def conform(records: Iterable[TuningRecord] | pa.Table) -> pa.Table:
    """Records as a table of :data:`ARROW_SCHEMA`'s columns and types (cost_s filled in when
    missing), dictionary-encoded string columns left encoded."""
    if not isinstance(records, pa.Table):
        return records_to_table(list(records))
    table = records
    if "cost_s" not in table.column_names:
        costs = table.column("costs").to_pylist()
        errors = table.column("error_no").to_pylist()
        table = table.append_column("cost_s", pa.array(
            [mean_cost_s(c, e) for c, e in zip(costs, errors, strict=True)], pa.float64()))
    missing = [name for name in ARROW_SCHEMA.names if name not in table.column_names]
    if missing:
        raise StoreError(f"cannot commit a table without column(s) {missing}")
    table = table.select(ARROW_SCHEMA.names)

    def stays_encoded(field: pa.Field) -> bool:
        given = table.schema.field(field.name).type
        return pa.types.is_dictionary(given) and given.value_type == field.type

    # a dictionary-encoded column of the schema's type stays encoded until its file is written:
    # splitting and ranking then move indices, not strings (the files hold plain columns)
    return table.cast(pa.schema([table.schema.field(field.name) if stays_encoded(field) else field
                                 for field in ARROW_SCHEMA]))


def serving_dictionary_columns() -> list[str]:
    """The columns of a serving file read dictionary-encoded (they repeat per workload)."""
    return [name for name in DICTIONARY_COLUMNS if name in SERVING_FILE_SCHEMA.names]


def dedupe(table: pa.Table) -> pa.Table:
    """The table with only the first row of each record_id, order kept."""
    import pyarrow.compute as pc

    rows = table.num_rows
    if rows <= 1:
        return table
    ids = table.column("record_id")
    halves = id_halves(ids, low=False)
    if halves is not None:
        ordered = np.sort(halves[0])
        if not np.any(ordered[1:] == ordered[:-1]):
            return table  # distinct high halves: distinct ids (equal ones go the exact way below)
    elif pc.count_distinct(ids).as_py() == rows:
        return table
    firsts = (pa.table({"id": ids, "row": pa.array(np.arange(rows, dtype=np.int64))})
              .group_by("id", use_threads=False).aggregate([("row", "min")]).column("row_min"))
    return table.take(np.sort(firsts.to_numpy()))


def split_by(table: pa.Table, columns: tuple[str, ...]) -> Iterator[tuple[tuple, pa.Table]]:
    """(key values, rows) for each distinct combination of ``columns``."""
    import pyarrow.compute as pc

    key_columns = decoded(table.select(list(columns)))
    keys = key_columns.group_by(list(columns), use_threads=False).aggregate([])
    combinations = list(zip(*(keys.column(name).to_pylist() for name in columns), strict=True))
    if len(combinations) == 1:
        yield combinations[0], table
        return
    for combination in combinations:
        mask = None
        for name, value in zip(columns, combination, strict=True):
            equal = pc.equal(key_columns.column(name), value)
            mask = equal if mask is None else pc.and_(mask, equal)
        yield combination, table.filter(mask)


SERVING_ORDER = [("workload_key", "ascending"), ("target", "ascending"), ("layout", "ascending"),
                 ("cost_s", "ascending"), ("record_id", "ascending")]


def sort_for_serving(table: pa.Table) -> pa.Table:
    return table.sort_by(SERVING_ORDER)


def top_per_group(table: pa.Table, nbest: int | None) -> pa.Table:
    """Valid rows only, the best ``nbest`` per (target, workload_key, layout), in serving order.

    Only the key columns are sorted; the wide columns are gathered once, for the kept rows."""
    import pyarrow.compute as pc

    valid_rows = np.flatnonzero(pc.is_valid(table.column("cost_s")).to_numpy(zero_copy_only=False))
    keys = decoded(table.select([name for name, _ in SERVING_ORDER]).take(valid_rows))
    order = pc.sort_indices(keys, sort_keys=SERVING_ORDER).to_numpy()
    rows = len(order)
    if nbest is not None and rows:
        positions = np.arange(rows)
        is_start = np.zeros(rows, dtype=bool)
        is_start[group_starts(keys.take(order), ("workload_key", "target", "layout"))] = True
        group_start = np.maximum.accumulate(np.where(is_start, positions, 0))
        order = order[positions - group_start < nbest]
    return table.take(valid_rows[order])


def group_starts(table: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """Row numbers where a new run of equal ``columns`` values begins, in a sorted table."""
    import pyarrow.compute as pc

    rows = table.num_rows
    changed = np.zeros(rows, dtype=bool)
    changed[:1] = True
    for name in columns:
        column = table.column(name)
        changed[1:] |= ~pc.equal(column.slice(1), column.slice(0, rows - 1)).to_numpy(zero_copy_only=False)
    return np.flatnonzero(changed)


def may_hold(statistics: Any, low: str, high: str) -> bool:
    """Whether a row group with these workload_key statistics can hold keys in [low, high]."""
    if statistics is None or not statistics.has_min_max:
        return True
    return statistics.min <= high and statistics.max >= low
