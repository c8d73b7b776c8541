"""MetaSchedule records: the trace (instructions and sampling decisions) of a TuningRecord."""

from __future__ import annotations

from typing import Any

import orjson

from lorien.errors import DialectError
from lorien.record import TuningRecord


def trace(record: TuningRecord) -> tuple[list[list[Any]], dict[int, Any]]:
    """(instructions, decisions by instruction index) of a MetaSchedule record's trace."""
    value = orjson.loads(record.config)
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], list):
        raise DialectError(f"record {record.record_id}: config is not a trace [instructions, decisions]: {record.config[:120]!r}")
    instructions, decisions = value
    by_index: dict[int, Any] = {}
    for item in decisions or []:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int):
            raise DialectError(f"record {record.record_id}: malformed trace decision {item!r}")
        by_index[item[0]] = item[1]
    return instructions, by_index


def tensor_shapes(record: TuningRecord) -> list[tuple[str, list[int]]]:
    """(dtype, shape) of each argument of the workload, from the record's args_info."""
    value = orjson.loads(record.args)
    shapes = []
    for arg in value or []:
        if isinstance(arg, list) and len(arg) == 3 and arg[0] == "TENSOR":
            shapes.append((str(arg[1]), list(arg[2])))
    return shapes
