"""AutoTVM records: measured configs <-> TuningRecord, through the AutoTVM log codec.

A measurement becomes the AutoTVM 0.2 JSON line TVM would write
(``{"input": [target, task, args, {}], "config": {...}, "result": [...], ...}``) and is
decoded by :mod:`lorien.formats`, so records we produce are byte-for-byte the records an
ingested TVM log gives, and export back to native lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from dialects.autotvm.features import config_entity
from dialects.autotvm.space import ConfigEntity
from lorien import __version__
from lorien.engine.build import build_info
from lorien.errors import DialectError
from lorien.record import FAILED_COST_S, TuningRecord

FORMAT = "autotvm"
#: ``tvm_version`` written into the lines of records Lorien measures itself.
TVM_VERSION_TAG = f"lorien-{__version__}"


def native_line(target: str, task_name: str, args: Sequence[Any], config: ConfigEntity | dict[str, Any],
                costs: Sequence[float], error_no: int, all_cost: float, timestamp: float) -> str:
    """The AutoTVM 0.2 log line of one measurement."""
    config_json = config.to_json_dict() if isinstance(config, ConfigEntity) else config
    if error_no != 0 and not costs:
        costs = [FAILED_COST_S]
    row = {
        "input": [target, task_name, list(args), {}],
        "config": config_json,
        "result": [list(costs), int(error_no), float(all_cost), float(timestamp)],
        "version": 0.2,
        "tvm_version": TVM_VERSION_TAG,
    }
    return orjson.dumps(row).decode()


def make_record(target: str, task_name: str, args: Sequence[Any], config: ConfigEntity | dict[str, Any],
                costs: Sequence[float], error_no: int, all_cost: float, timestamp: float,
                source: str = "lorien tune") -> TuningRecord:
    """A TuningRecord of one measurement, decoded from its native line."""
    from lorien.formats import decode_line

    line = native_line(target, task_name, args, config, costs, error_no, all_cost, timestamp)
    record = decode_line(line, FORMAT)
    return record.with_changes(build=build_info(target), source=source)


def record_config(record: TuningRecord) -> tuple[str, list[Any], list[list[Any]]]:
    """(task_name, args, entity list) of an AutoTVM record."""
    if record.dialect != FORMAT:
        raise DialectError(f"record {record.record_id} is a {record.dialect!r} record, not autotvm")
    args = orjson.loads(record.args)
    return record.task_name, args, config_entity(record.config)


def encode(record: TuningRecord) -> str:
    """The native AutoTVM line of a record."""
    from lorien.formats import encode_record

    return encode_record(record, FORMAT)
