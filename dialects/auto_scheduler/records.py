"""Auto-scheduler records: the workload and the transform steps of a TuningRecord."""

from __future__ import annotations

from typing import Any

import orjson

from lorien.errors import DialectError
from lorien.record import TuningRecord

#: Step kinds of Ansor's transform-step vocabulary, by their two- to four-letter record tag.
STEP_KINDS = {
    "AN": "annotation", "FU": "fuse", "PR": "pragma", "RE": "reorder", "SP": "split",
    "FSP": "follow_split", "FFSP": "follow_fused_split", "SA": "storage_align",
    "CA": "compute_at", "CI": "compute_inline", "CR": "compute_root", "CHR": "cache_read",
    "CHW": "cache_write", "RF": "rfactor",
}


def workload(record: TuningRecord) -> tuple[str, list[Any]]:
    """(func_name, args) of an auto-scheduler record's workload key."""
    value = orjson.loads(record.workload_key)
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise DialectError(f"record {record.record_id}: workload key {record.workload_key[:120]!r} is not [func_name, args...]")
    return value[0], value[1:]


def steps(record: TuningRecord) -> list[list[Any]]:
    """The transform steps of an auto-scheduler record (its ``config``)."""
    value = orjson.loads(record.config)
    if not isinstance(value, list) or not all(isinstance(step, list) and step for step in value):
        raise DialectError(f"record {record.record_id}: config is not a list of steps: {record.config[:120]!r}")
    for step in value:
        if step[0] not in STEP_KINDS:
            raise DialectError(f"record {record.record_id}: unknown step kind {step[0]!r} in {step!r}")
    return value
