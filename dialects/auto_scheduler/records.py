"""Auto-scheduler records: the workload and the transform steps of a TuningRecord."""

from __future__ import annotations

import os
from typing import Any

import orjson

from lorien.errors import DialectError
from lorien.formats.ansor import DEFAULT_VERSION
from lorien.record import FAILED_COST_S, TuningRecord

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


def hardware_params() -> list[int]:
    """TVM's ``HardwareParams`` of this CPU as an Ansor line writes them: cores, vector bytes,
    cache line bytes, then the GPU fields (0)."""
    from lorien.engine.x86 import vector_lanes

    return [os.cpu_count() or 1, 4 * vector_lanes(), 64, 0, 0, 0, 0, 0]


def native_line(target: str, workload_key: str, steps: list[list[Any]], costs: list[float], error_no: int,
                all_cost: float, timestamp: float, layout_rewrite: bool = False) -> dict[str, Any]:
    """The Ansor (v0.6) line of one measurement, as data: the task is the workload key, the
    target, hardware params, no target host, the layout rewrite option (TVM's 2,
    ``REWRITE_FOR_PRE_TRANSFORMED``, when the weights were packed before the timing, else 0)
    and no task inputs."""
    if error_no != 0 and not costs:
        costs = [FAILED_COST_S]
    from dialects.auto_scheduler.layout import REWRITE_FOR_PRE_TRANSFORMED

    option = REWRITE_FOR_PRE_TRANSFORMED if layout_rewrite else 0
    return {"i": [[workload_key, target, hardware_params(), "", option, []], [[], steps]],
            "r": [list(costs), int(error_no), float(all_cost), float(timestamp)], "v": DEFAULT_VERSION}


def make_record(target: str, workload_key: str, steps: list[list[Any]], costs: list[float], error_no: int,
                all_cost: float, timestamp: float, source: str = "lorien tune",
                layout_rewrite: bool = False) -> TuningRecord:
    """A TuningRecord of one measurement, decoded from its Ansor line (so it exports unchanged)."""
    from lorien.engine.build import build_info
    from lorien.engine.cpu import engine_target
    from lorien.formats.ansor import decode_value

    line = native_line(target, workload_key, steps, costs, error_no, all_cost, timestamp, layout_rewrite)
    record = decode_value(line, source)
    return record.with_changes(build=build_info(engine_target(target)), source=source)


def layout_rewritten(record: TuningRecord) -> bool:
    """Whether a record was measured with its weights' layout rewritten: its task's
    ``layout_rewrite_option`` is TVM's ``REWRITE_FOR_PRE_TRANSFORMED`` (2)."""
    from dialects.auto_scheduler.layout import REWRITE_FOR_PRE_TRANSFORMED

    extra = orjson.loads(record.extra) if record.extra else {}
    return extra.get("layout_rewrite_option") == REWRITE_FOR_PRE_TRANSFORMED
