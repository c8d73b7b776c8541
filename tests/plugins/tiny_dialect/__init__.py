"""A fourth dialect, shipped outside Lorien as a third party would: one workload (``vscale``,
``y = 2 x + 1`` over N floats), one knob (the vectorized tile), its own log format (``tiny``
JSON lines). It registers through the ``lorien.dialects`` entry point of the
``lorien_tiny_dialect`` distribution beside it; nothing in ``lorien/`` knows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lorien.dialect import Dialect
from lorien.errors import DialectError, RecordParseError
from lorien.record import TuningRecord
from lorien.search import create
from lorien.search.base import MixedRadixSpace
from lorien.target import parse_target

TASK = "vscale"
TILES = (1, 2, 4, 8, 16, 32)


def workload_key(n: int) -> str:
    return f"{TASK}#{n}"


def extent_of(key: str) -> int:
    try:
        name, n = key.split("#")
        assert name == TASK
        return int(n)
    except (AssertionError, ValueError):
        raise DialectError(f"not a tiny workload key: {key!r}") from None


@dataclass
class TileSpace(MixedRadixSpace):
    """One knob: the tile of the vectorized inner loop."""

    dims: list[int]

    def get(self, index: int) -> dict[str, int]:
        return {"tile": TILES[self.knob_indices(index)[0]]}


@dataclass(frozen=True)
class Builder:
    n: int
    tile: int

    def __call__(self) -> tuple[Any, list[Any]]:
        from lorien.engine import te
        from lorien.engine.schedule import create_schedule

        x = te.placeholder((self.n,), name="x")
        y = te.compute((self.n,), lambda i: x[i] * 2.0 + 1.0, name="y")
        s = create_schedule(y)
        _, inner = s[y].split(y.op.axis[0], factor=self.tile)
        s[y].vectorize(inner)
        return s, [x, y]


def reference(x: np.ndarray) -> list[np.ndarray]:
    return [x * 2.0 + 1.0]


def make_record(target: str, n: int, config: dict[str, int], costs: list[float], error_no: int,
                all_cost: float, timestamp: float, source: str = "") -> TuningRecord:
    parsed = parse_target(target)
    return TuningRecord(dialect="tiny", target=parsed.canonical, target_key=parsed.alternate_key,
                        workload_key=workload_key(n), task_name=TASK, args=json.dumps([n]), layout="NA",
                        config=json.dumps(config, sort_keys=True), costs=list(costs), error_no=error_no,
                        all_cost=all_cost, timestamp=timestamp, flop=2.0 * n, source=source, target_raw=target)


class TinyCodec:
    """``tiny`` logs: one JSON object a line, ``{"tiny": 1, "n", "target", "config", "costs", ...}``."""

    FORMAT = "tiny"
    DIALECT = "tiny"
    LOG_SUFFIX = ".tiny.jsonl"

    def claims_value(self, value: Any) -> bool:
        return isinstance(value, dict) and value.get("tiny") == 1

    def decode_line(self, line: str | bytes, path: str | None = None, lineno: int | None = None) -> TuningRecord:
        try:
            value = json.loads(line)
            return make_record(value["target"], int(value["n"]), value["config"], value["costs"],
                               int(value["error_no"]), float(value["all_cost"]), float(value["timestamp"]),
                               source=f"{path}:{lineno}" if path else "")
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordParseError(f"{path}:{lineno}: not a tiny record: {exc}") from None

    def iter_records(self, path: str | Path, strict: bool = False) -> Iterator[TuningRecord | RecordParseError]:
        with open(path) as handle:
            for lineno, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    yield self.decode_line(line, str(path), lineno)
                except RecordParseError as exc:
                    if strict:
                        raise
                    yield exc

    def encode_record(self, record: TuningRecord) -> str:
        return json.dumps({"tiny": 1, "n": extent_of(record.workload_key), "target": record.target,
                           "config": json.loads(record.config), "costs": record.costs, "error_no": record.error_no,
                           "all_cost": record.all_cost, "timestamp": record.timestamp})


class TinyDialect(Dialect):
    name = "tiny"

    def record_formats(self) -> list[str]:
        return ["tiny"]

    def codecs(self) -> list[Any]:
        return [TinyCodec()]

    def claims_workload_key(self, key: str) -> bool:
        return key.startswith(f"{TASK}#")

    def workload_key(self, task_name: str, args: list[Any]) -> str:
        return workload_key(int(args[0]))

    def describe_workload(self, key: str) -> tuple[str, float | None]:
        return "NA", 2.0 * extent_of(key)

    def expand_workload(self, op: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
        if op != TASK or set(params) != {"N"}:
            raise DialectError(f"the tiny dialect knows only '{TASK}: {{N: ..}}', got {op}: {params}")
        return TASK, [int(params["N"])]

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        return {"n": extent_of(record.workload_key), **json.loads(record.config)}

    def tuning_context(self, job: Any, store: Any) -> Any:
        from lorien.engine.measure import MeasureInput, MeasureOption, measure_batch
        from lorien.tune.loop import TuneContext

        n = int(job.args[0])
        space = TileSpace(dims=[len(TILES)])
        target = parse_target(job.target).canonical

        def measure(configs: list[dict[str, int]]) -> list[Any]:
            inputs = [MeasureInput(Builder(n, config["tile"]), reference, target=target) for config in configs]
            return measure_batch(inputs, MeasureOption(**job.measure))

        def to_records(configs: list[dict[str, int]], results: list[Any], source: str) -> list[TuningRecord]:
            return [make_record(target, n, config, list(r.costs), int(r.error_no), float(r.all_cost),
                                float(r.timestamp), source) for config, r in zip(configs, results, strict=True)]

        return TuneContext(workload_key=workload_key(n), task_name=TASK, space=space,
                           tuner=create(job.tuner, space, seed=job.seed, **job.tuner_options), measure=measure,
                           to_records=to_records,
                           index_of=lambda record: TILES.index(json.loads(record.config)["tile"]),
                           encode_log=TinyCodec().encode_record)


DIALECT = TinyDialect()
