"""TuningRecord: one measured candidate, the one data model every part shares.

A record keeps the dialect-native schedule (``config``) and whatever else the native log
line carried (``extra``) as JSON text, so that a record ingested from a TVM log is exported
back JSON-equal to its input.
"""

from __future__ import annotations

import enum
import hashlib
import math
import struct
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import pyarrow as pa


class ErrorNo(enum.IntEnum):
    """Failure kinds of a measurement, numbered as TVM's ``MeasureErrorNo``."""

    NO_ERROR = 0
    INSTANTIATION_ERROR = 1
    COMPILE_HOST = 2
    COMPILE_DEVICE = 3
    RUNTIME_DEVICE = 4
    WRONG_ANSWER = 5
    BUILD_TIMEOUT = 6
    RUN_TIMEOUT = 7
    UNKNOWN_ERROR = 8


#: Who measured a record's costs, by the ``measured_by`` of its ``build`` JSON
#: (:attr:`TuningRecord.measured_by`): Lorien's engine, TVM's builder and runner (the build
#: then names ``tvm_version`` and ``runner``), or the log a record was ingested from (its
#: ``build`` says nothing: the latencies are whatever the tool that wrote the log measured).
MEASURED_BY_ENGINE, MEASURED_BY_TVM, MEASURED_BY_LOG = "lorien", "tvm", "log"


def build_fields(build: str | None) -> dict:
    """A record's ``build`` JSON as a dict: empty where the build is empty, not JSON or not an object."""
    try:
        value = orjson.loads(build) if build else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def measured_by_of(build: str | None) -> str:
    """Who measured a record's costs, by its ``build`` JSON: its ``measured_by``; a build that
    names only Lorien's ``engine`` (records from before the field) is the engine's; an empty
    build (an ingested log line) is :data:`MEASURED_BY_LOG`."""
    value = build_fields(build)
    if value.get("measured_by"):
        return str(value["measured_by"])
    return MEASURED_BY_ENGINE if str(value.get("engine", "")).startswith("lorien") else MEASURED_BY_LOG


#: Cost given to failed candidates in TVM logs (``MAX_FLOAT``-like sentinel, seconds).
FAILED_COST_S = 1e10


def arrow_schema():
    """The Arrow schema of a record table (:data:`ARROW_SCHEMA`; pyarrow is imported on first use,
    so that what only reads records, a one-shot ``lorien query``, never imports it)."""
    schema = globals().get("ARROW_SCHEMA")
    if schema is not None:
        return schema
    import pyarrow as pa

    schema = globals()["ARROW_SCHEMA"] = pa.schema(
        [
            pa.field("record_id", pa.string(), nullable=False),
            pa.field("dialect", pa.string(), nullable=False),
            pa.field("target", pa.string(), nullable=False),
            pa.field("target_key", pa.string(), nullable=False),
            pa.field("target_raw", pa.string(), nullable=False),
            pa.field("workload_key", pa.string(), nullable=False),
            pa.field("task_name", pa.string(), nullable=False),
            pa.field("args", pa.string(), nullable=False),
            pa.field("layout", pa.string(), nullable=False),
            pa.field("config", pa.string(), nullable=False),
            pa.field("costs", pa.list_(pa.float64()), nullable=False),
            pa.field("cost_s", pa.float64(), nullable=True),
            pa.field("error_no", pa.int32(), nullable=False),
            pa.field("all_cost", pa.float64(), nullable=False),
            pa.field("timestamp", pa.float64(), nullable=False),
            pa.field("flop", pa.float64(), nullable=True),
            pa.field("build", pa.string(), nullable=False),
            pa.field("extra", pa.string(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
        ]
    )
    return schema


def __getattr__(name: str):
    if name == "ARROW_SCHEMA":
        return arrow_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Fields that identify a measurement; two records equal on these are the same record.
IDENTITY_FIELDS = ("dialect", "target", "workload_key", "layout", "config", "costs", "error_no", "timestamp")


def mean_cost_s(costs: list[float] | tuple[float, ...], error_no: int) -> float | None:
    """Mean seconds per run of a valid record; None for failed or empty records."""
    if error_no != 0 or not costs:
        return None
    value = sum(costs) / len(costs)
    if not math.isfinite(value) or value <= 0:
        return None
    return value


def record_id_head(dialect: str, target: str, workload_key: str, layout: str) -> bytes:
    """First part of a record id's hashed payload: the SHA-256 of what names the workload (shared
    by all its records, so computed once per workload, and short whatever the workload key)."""
    return hashlib.sha256(orjson.dumps([dialect, target, workload_key, layout])).digest()


def record_id_numbers(costs: list[float] | tuple[float, ...], error_no: int, timestamp: float) -> bytes:
    """Last part of a record id's hashed payload: costs, error_no and timestamp as little-endian
    float64 / int64 words, the number of costs last (so the payload reads back from its end)."""
    return struct.pack(f"<{len(costs)}dqdq", *costs, error_no, timestamp, len(costs))


def compute_record_id(dialect: str, target: str, workload_key: str, layout: str, config: str,
                      costs: list[float] | tuple[float, ...], error_no: int, timestamp: float) -> str:
    """Content hash of a record's identity fields; equal records get equal ids.

    The first 16 bytes (as hex) of the SHA-256 of :func:`record_id_head` (32 bytes) + the config
    text (UTF-8) + :func:`record_id_numbers`; numbers are hashed by value (``1`` and ``1.0`` are the
    same cost), so ingest can build the payloads of a whole batch from its Arrow columns.
    SHA-256 because CPUs hash it in hardware (SHA extensions): the fastest digest hashlib offers.
    """
    payload = record_id_head(dialect, target, workload_key, layout) + config.encode() + record_id_numbers(
        costs, error_no, timestamp)
    return hashlib.sha256(payload).hexdigest()[:32]


#: The field names of TuningRecord (and of any subclass), found once per class by from_row.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass(slots=True)
class TuningRecord:
    """One measured candidate schedule of one workload on one target."""

    dialect: str
    target: str
    target_key: str
    workload_key: str
    task_name: str
    args: str
    layout: str
    config: str
    costs: list[float]
    error_no: int = 0
    all_cost: float = 0.0
    timestamp: float = 0.0
    flop: float | None = None
    build: str = "{}"
    extra: str = "{}"
    source: str = ""
    target_raw: str = ""
    record_id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.target_raw:
            self.target_raw = self.target
        if not self.record_id:
            self.record_id = compute_record_id(
                self.dialect, self.target, self.workload_key, self.layout, self.config,
                self.costs, self.error_no, self.timestamp,
            )

    @property
    def cost_s(self) -> float | None:
        return mean_cost_s(self.costs, self.error_no)

    @property
    def measured_by(self) -> str:
        """Who measured this record's costs (:func:`measured_by_of` its build JSON)."""
        return measured_by_of(self.build)

    @property
    def measured_threads(self) -> int | None:
        """The threads its costs were timed on, as its build JSON says (None: it does not say)."""
        threads = build_fields(self.build).get("threads")
        return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1 else None

    @property
    def measured_target(self) -> str | None:
        """The target to time its config again as it was timed: its target on the threads its
        build names (a meta_schedule job times on TVM's runtime threads, the other dialects on every
        CPU); None where the build names none or the target already says ``-num-cores``."""
        from lorien.target import parse_target

        threads = self.measured_threads
        if threads is None or parse_target(self.target).get("num-cores") is not None:
            return None
        return f"{self.target} -num-cores={threads}"

    @property
    def is_valid(self) -> bool:
        return self.cost_s is not None

    @property
    def gflops(self) -> float | None:
        """Throughput in GFLOPS, or None when the record failed or its flop count is unknown."""
        cost = self.cost_s
        if cost is None or self.flop is None:
            return None
        return self.flop / cost / 1e9

    def args_value(self) -> object:
        return orjson.loads(self.args)

    def config_value(self) -> object:
        return orjson.loads(self.config)

    def with_changes(self, **changes: object) -> TuningRecord:
        """A copy with some fields changed and the record id recomputed."""
        changes.setdefault("record_id", "")
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_row(self) -> dict[str, object]:
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        row["cost_s"] = self.cost_s
        return row

    @classmethod
    def from_row(cls, row: dict[str, object]) -> TuningRecord:
        names = _FIELD_NAMES.get(cls)
        if names is None:  # dataclasses.fields() costs more than the rest of this together
            names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
        values = {name: row[name] for name in names if name in row}
        values["costs"] = list(values.get("costs") or [])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]


def records_to_table(records: list[TuningRecord]) -> pa.Table:
    """Arrow table (schema :data:`ARROW_SCHEMA`) of a list of records."""
    import pyarrow as pa

    schema = arrow_schema()
    columns: dict[str, list] = {f.name: [] for f in schema}
    for record in records:
        for name, column in columns.items():
            column.append(record.cost_s if name == "cost_s" else getattr(record, name))
    return pa.Table.from_pydict(columns, schema=schema)


def table_to_records(table: pa.Table) -> list[TuningRecord]:
    return [TuningRecord.from_row(row) for row in table.to_pylist()]


def record_summary(record: TuningRecord) -> dict[str, object]:
    """The fields a person reads first, for table and JSON output; ``path`` is the schedule path
    the config took, as its dialect names it (:meth:`lorien.dialect.Dialect.schedule_path`)."""
    cost_s = record.cost_s
    gflops = record.gflops
    return {
        "cost_us": None if cost_s is None else round(cost_s * 1e6, 3),
        "gflops": None if gflops is None else round(gflops, 2),
        "layout": record.layout,
        "target": record.target,
        "measured_by": record.measured_by,
        "workload_key": record.workload_key,
        "path": schedule_path(record),
        "config": record.config,
        "record_id": record.record_id,
    }


def schedule_path(record: TuningRecord) -> str | None:
    """The schedule path a record's config took, as its dialect names it; None where the
    dialect names none or is not installed."""
    from lorien.errors import DialectError
    from lorien.plugins import get_dialect

    try:
        dialect = get_dialect(record.dialect)
    except DialectError:
        return None
    return dialect.schedule_path(record)
