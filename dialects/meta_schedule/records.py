"""MetaSchedule records: the trace (instructions and sampling decisions) of a TuningRecord."""

from __future__ import annotations

from typing import Any

import orjson

from lorien.errors import DialectError
from lorien.record import TuningRecord


def trace(record: TuningRecord) -> tuple[list[list[Any]], dict[int, Any]]:
    """(instructions, decisions by instruction index) of a MetaSchedule record's trace."""
    from dialects.meta_schedule.trace import parse_trace

    try:
        return parse_trace(orjson.loads(record.config))
    except DialectError as exc:
        raise DialectError(f"record {record.record_id}: {exc}") from exc


def tensor_shapes(record: TuningRecord) -> list[tuple[str, list[int]]]:
    """(dtype, shape) of each argument of the workload, from the record's args_info."""
    value = orjson.loads(record.args)
    shapes = []
    for arg in value or []:
        if isinstance(arg, list) and len(arg) == 3 and arg[0] == "TENSOR":
            shapes.append((str(arg[1]), list(arg[2])))
    return shapes


def make_record(target: str, workload_key: str, trace: Any, costs: list[float], error_no: int, all_cost: float,
                timestamp: float, args_info: list[Any], flop: float | None, task_name: str, extra: dict[str, Any],
                source: str = "lorien tune", layout: str = "NA", build: str | None = None) -> TuningRecord:
    """A TuningRecord of one measured trace, in MetaSchedule's record form (run_secs, the target
    as TVM's JSON dict, args_info); ``extra`` says where its workload is, ``build`` what measured
    it (default: Lorien's engine for ``target``)."""
    from lorien.engine.build import build_info
    from lorien.engine.cpu import engine_target
    from lorien.record import FAILED_COST_S
    from lorien.target import parse_target

    parsed = parse_target(target)
    if error_no != 0 and not costs:
        costs = [FAILED_COST_S]
    return TuningRecord(
        dialect="meta_schedule", target=parsed.canonical, target_key=parsed.alternate_key, workload_key=workload_key,
        task_name=task_name, args=orjson.dumps(args_info).decode(), layout=layout,
        config=orjson.dumps(trace).decode(), costs=list(costs), error_no=int(error_no), all_cost=float(all_cost),
        timestamp=float(timestamp), flop=flop, extra=orjson.dumps(extra).decode(), source=source,
        target_raw=orjson.dumps(target_dict(parsed)).decode(), build=build or build_info(engine_target(parsed.canonical)))


def target_dict(target: Any) -> dict[str, Any]:
    """TVM's JSON dict form of a parsed target (``{"kind": "llvm", "keys": [...], ...}``)."""
    value: dict[str, Any] = {"kind": target.kind}
    for key, option in sorted(target.options.items()):
        value[key.lstrip("-")] = list(option) if isinstance(option, tuple) else option
    return value


def args_info(dag: Any) -> list[Any]:
    """MetaSchedule's ``args_info`` of a DAG's arguments: ``["TENSOR", dtype, shape]`` each."""
    return [["TENSOR", t.dtype, list(t.shape)] for t in dag.io_tensors]
