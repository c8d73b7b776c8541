"""What the tuning loop (:mod:`lorien.tune.loop`) needs of an auto-scheduler job: sketches of
the workload's DAG, a tuner over their space, candidates built and measured by the engine,
records as Ansor log lines.

With the ``xgb`` tuner the model also learns from the store's records of other workloads of
the same function on the same target family (``transfer``, on by default): one cost model for
a network's similar layers, as Ansor shares one model across tasks. The loop replays the
workload's own records (never measured again) and commits batch by batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

import lorien.builtin_workloads  # noqa: F401 - registers the built-in workloads
from dialects.auto_scheduler.records import make_record
from dialects.auto_scheduler.space import SketchSpace, shape_features
from dialects.auto_scheduler.steps import replay_steps
from lorien import workload_registry
from lorien.engine.cpu import engine_target
from lorien.errors import ConfigError
from lorien.record import TuningRecord
from lorien.search.xgb import history_by_workload
from lorien.tune.job import TuneJob, job_workload_key, template_free_tuner
from lorien.tune.loop import TuneContext

#: The xgb tuner's defaults here (beside :data:`lorien.tune.job.TEMPLATE_FREE_XGB_DEFAULTS`).
#: ``guide_refine`` (an evolution on a pre-trained guide's score from the best measured
#: programs, every plan) stays 0: measured against 0 with 64 on the benchmark's three held-out
#: layers (``benchmarks/guide_refine_ab.py``, 6 interleaved pairs of 64-trial runs), it changed
#: neither the trials to 95 % of the best (ratio 1.000) nor the best found (0.995 at 64 trials).
AUTO_SCHEDULER_XGB_DEFAULTS: dict[str, Any] = {"guide_refine": 0}


@functools.lru_cache(maxsize=16)
def cached_dag(workload_key: str):
    """Workload DAGs are rebuilt in measurement workers from their key; cache them."""
    return workload_registry.workload_dag(workload_key)


@functools.lru_cache(maxsize=16)
def cached_space(workload_key: str) -> SketchSpace:
    return SketchSpace(cached_dag(workload_key), workload_registry.parse_workload_key(workload_key)[1])


def _ensure_registered(entry: tuple[str, dict[str, Any]]) -> None:
    workload_registry.deserialize_workload_registry_entry(entry)


@dataclass(frozen=True)
class StepsBuilder:
    """Picklable ``() -> (schedule, tensors)`` of one candidate (Ansor steps) of a workload;
    carries the workload's registry entry so a fresh worker process can rebuild it."""

    workload_key: str
    entry: tuple[str, Any]
    steps_json: str
    layout_rewrite: bool = False

    def __call__(self) -> tuple[Any, list[Any]]:
        _ensure_registered(self.entry)
        replay = replay_steps(cached_dag(self.workload_key), orjson.loads(self.steps_json), self.layout_rewrite)
        return replay.schedule, replay.args


@dataclass(frozen=True)
class WorkloadReference:
    """Picklable NumPy reference of a workload: its expected outputs from its inputs."""

    workload_key: str
    entry: tuple[str, Any]

    def __call__(self, *inputs: Any) -> Any:
        _ensure_registered(self.entry)
        return workload_registry.reference_of(self.workload_key)(*inputs)


def _entry(workload_key: str) -> tuple[str, Any]:
    name, entry = workload_registry.serialize_workload_registry_entry(workload_key)
    return name, orjson.loads(orjson.dumps(entry))


def measure_steps(workload_key: str, candidates: Sequence[list[list[Any]]],
                  measure: dict[str, Any] | None = None, target: str | None = None,
                  layout_rewrite: bool = False, best_cost_s: float = math.inf) -> list[Any]:
    """Build and measure candidates (lists of Ansor steps) in isolated workers for the CPU
    ``target`` (default this host), each output checked against NumPy; one MeasureResult per
    candidate. ``layout_rewrite``: weights packed as the loops read them, before the timing
    (:mod:`dialects.auto_scheduler.layout`); ``best_cost_s``: the job's fastest so far, as for
    ``measure_batch``."""
    from lorien.engine.measure import MeasureInput, MeasureOption, measure_batch

    try:
        option = MeasureOption(**(measure or {}))
    except TypeError as exc:
        raise ConfigError(f"bad measure options {measure}: {exc}") from exc
    entry = _entry(workload_key)
    reference = WorkloadReference(workload_key, entry)
    inputs = [MeasureInput(StepsBuilder(workload_key, entry, orjson.dumps(steps).decode(), layout_rewrite), reference,
                           target=target) for steps in candidates]
    return measure_batch(inputs, option, best_cost_s=best_cost_s)


def job_layout_rewrite(job: TuneJob, workload_key: str) -> bool:
    """Whether a job measures its candidates with the weights' layout rewritten: the job's
    ``layout_rewrite`` (default true, as TVM tunes a network's tasks) where the workload has
    weights (a convolution's or dense layer's second input)."""
    from dialects.auto_scheduler.layout import layout_free_placeholders

    return bool(job.option("layout_rewrite")) and bool(layout_free_placeholders(cached_dag(workload_key)))


def transfer_rows(store: Any, workload_key: str, target: str, limit: int = 4000) -> list[dict[str, Any]]:
    """Valid records (as rows: workload_key, args, config, costs) of other workloads of the
    same function on the target's family, the newest ``limit`` records scanned."""
    from lorien.target import parse_target

    name, _ = workload_registry.parse_workload_key(workload_key)
    table = store.scan(filters={"task_name": name, "dialect": "auto_scheduler",
                                "target_key": parse_target(target).alternate_key},
                       columns=["workload_key", "args", "config", "costs", "error_no"])
    return [row for row in table.to_pylist()[-limit:]
            if row["workload_key"] != workload_key and row["error_no"] == 0 and row["costs"]]


def transfer_history(store: Any, space: SketchSpace, workload_key: str, target: str, limit: int = 4000,
                     rows: Sequence[dict[str, Any]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(features, normalized throughput) of valid records of other workloads of the same
    function on the target's family (``rows``: :func:`transfer_rows`, read from ``store`` when
    not given); throughput is normalized per workload (best = 1)."""
    rows = transfer_rows(store, workload_key, target, limit) if rows is None else rows
    per_workload: dict[str, list[tuple[np.ndarray, float]]] = {}
    for row in rows:
        features = space.features_of_steps(orjson.loads(row["config"]), orjson.loads(row["args"]))
        if features is not None:
            per_workload.setdefault(row["workload_key"], []).append((features, 1.0 / float(np.mean(row["costs"]))))
    return history_by_workload(per_workload, sum(table_.shape[1] for table_ in space.knob_feature_tables()))


def transfer_seeds(store: Any, space: SketchSpace, workload_key: str, target: str, limit: int = 4000,
                   rows: Sequence[dict[str, Any]] | None = None) -> list[int]:
    """Points of this workload's space nearest to the best valid program of every other
    workload of the same function on the target's family (:meth:`SketchSpace.nearest_point`;
    ``rows`` as for :func:`transfer_history`), the workloads of the closest shapes first; a
    program that fits no sketch here is skipped."""
    rows = transfer_rows(store, workload_key, target, limit) if rows is None else rows
    best: dict[str, tuple[float, str, str]] = {}
    for row in rows:
        cost = float(np.mean(row["costs"]))
        if row["workload_key"] not in best or cost < best[row["workload_key"]][0]:
            best[row["workload_key"]] = (cost, row["args"], row["config"])
    here = np.array(space.shape_features, dtype=float)

    def distance(args: str) -> float:
        there = np.array(shape_features(orjson.loads(args)), dtype=float)
        return float(np.abs(there - here).sum()) if there.shape == here.shape else math.inf

    seeds = []
    for *_, config in sorted(best.values(), key=lambda item: distance(item[1])):
        index = space.nearest_point(orjson.loads(config))
        if index is not None:
            seeds.append(index)
    return list(dict.fromkeys(seeds))


def tuning_context(job: TuneJob, store: Any) -> TuneContext:
    """The loop's view of one auto-scheduler job: the sketch space of its DAG, the job's tuner
    (with ``transfer``, taught by the store's records of other workloads of the same function
    and seeded with their best programs), candidates measured in isolated workers."""
    from lorien.formats import encode_record
    from lorien.target import parse_target

    workload_key = job_workload_key(job)
    target = parse_target(job.target).canonical
    space = cached_space(workload_key)
    tuner = template_free_tuner(job, space, AUTO_SCHEDULER_XGB_DEFAULTS)
    if store is not None and job.option("transfer") and hasattr(tuner, "load_history"):
        rows = transfer_rows(store, workload_key, target)  # one scan for the model and the seeds
        tuner.load_history(*transfer_history(store, space, workload_key, target, rows=rows))
        if hasattr(tuner, "add_seeds"):
            tuner.add_seeds(transfer_seeds(store, space, workload_key, target, rows=rows))
    rewrite = job_layout_rewrite(job, workload_key)

    def to_records(candidates: list[Any], results: list[Any], source: str) -> list[TuningRecord]:
        return [make_record(target, workload_key, steps, list(r.costs), int(r.error_no), float(r.all_cost),
                            float(r.timestamp), source=source, layout_rewrite=rewrite)
                for steps, r in zip(candidates, results, strict=True)]

    from lorien.engine.measure import keeping_fastest

    return TuneContext(
        workload_key=workload_key, task_name=workload_registry.parse_workload_key(workload_key)[0], space=space,
        tuner=tuner,
        measure=keeping_fastest(lambda candidates, best_cost_s: measure_steps(
            workload_key, candidates, job.measure, engine_target(target), rewrite, best_cost_s)),
        to_records=to_records, index_of=lambda record: space.index_of_steps(orjson.loads(record.config)),
        encode_log=lambda record: encode_record(record, "ansor"),
        schedule_of=functools.partial(_schedule_of, workload_key, rewrite))


def _schedule_of(workload_key: str, layout_rewrite: bool, steps: list[list[Any]]) -> tuple[Any, list[Any]]:
    """The engine schedule of a candidate's steps (as measured: weights rewritten or not), not built."""
    replay = replay_steps(cached_dag(workload_key), steps, layout_rewrite)
    return replay.schedule, replay.args
