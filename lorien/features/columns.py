"""Feature columns as Arrow arrays: what a dialect's batch featurizer and the pipeline share."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def feature_array(values: list[Any]) -> pa.Array:
    """An Arrow array of one feature column: booleans become 0/1, numbers mixed with strings
    become strings, a column of only None becomes float (all null)."""
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        values = [int(v) if isinstance(v, bool) else v for v in values]
        try:
            array = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return pa.array([None if v is None else str(v) for v in values], type=pa.string())
    if pa.types.is_null(array.type):
        return array.cast(pa.float64())
    if pa.types.is_boolean(array.type):
        return array.cast(pa.int64())
    return array


def rows_to_columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Column lists of feature dicts, in first-seen order; a feature a row lacks is None there."""
    columns: dict[str, list[Any]] = {}
    for i, row in enumerate(rows):
        for name, value in row.items():
            column = columns.get(name)
            if column is None:
                column = columns[name] = [None] * i
            column.append(value)
        if len(row) != len(columns):
            for column in columns.values():
                if len(column) <= i:
                    column.append(None)
    return columns
