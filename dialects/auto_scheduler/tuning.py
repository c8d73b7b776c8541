"""Tune one auto-scheduler job: sketches of the workload's DAG, a tuner over their space,
candidates built and measured by the engine, records streamed out batch by batch.

A job resumes from what was measured before: records of the same workload and target (from
the store, or passed as ``history``) are never measured again, and teach the tuner's model
first. With the ``xgb`` tuner the model also learns from the store's records of other
workloads of the same function on the same target family (``transfer``, on by default): one
cost model for a network's similar layers, as Ansor shares one model across tasks. Each
measured batch is committed to the store (and appended to the Ansor log) before the next
batch starts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from dialects.auto_scheduler import registry, workloads  # noqa: F401 - registers the built-in workloads
from dialects.auto_scheduler.records import make_record
from dialects.auto_scheduler.space import SketchSpace, shape_features
from dialects.auto_scheduler.steps import replay_steps
from lorien.engine.cpu import engine_target
from lorien.errors import ConfigError
from lorien.record import TuningRecord
from lorien.search import Tuner, create, result_cost
from lorien.search.xgb import history_by_workload
from lorien.tune.progress import BatchCallback, BatchSink, TuneProgress, tune_batches
from lorien.tune.resume import job_source

#: Options the ``xgb`` tuner gets in this dialect unless the job says otherwise.
XGB_DEFAULTS = {"optimizer": "evolution", "plan_size": 16, "weighted": True}


@functools.lru_cache(maxsize=16)
def cached_dag(workload_key: str):
    """Workload DAGs are rebuilt in measurement workers from their key; cache them."""
    return registry.workload_dag(workload_key)


@functools.lru_cache(maxsize=16)
def cached_space(workload_key: str) -> SketchSpace:
    return SketchSpace(cached_dag(workload_key), registry.parse_workload_key(workload_key)[1])


def _ensure_registered(entry: tuple[str, dict[str, Any]]) -> None:
    registry.deserialize_workload_registry_entry(entry)


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
        return registry.reference_of(self.workload_key)(*inputs)


def _entry(workload_key: str) -> tuple[str, Any]:
    name, entry = registry.serialize_workload_registry_entry(workload_key)
    return name, orjson.loads(orjson.dumps(entry))


def measure_steps(workload_key: str, candidates: Sequence[list[list[Any]]],
                  measure: dict[str, Any] | None = None, target: str | None = None,
                  layout_rewrite: bool = False) -> list[Any]:
    """Build and measure candidates (lists of Ansor steps) in isolated workers for the CPU
    ``target`` (default this host), each output checked against NumPy; one MeasureResult per
    candidate. ``layout_rewrite``: weights packed as the loops read them, before the timing
    (:mod:`dialects.auto_scheduler.layout`)."""
    from lorien.engine.measure import MeasureInput, MeasureOption, measure_batch

    try:
        option = MeasureOption(**(measure or {}))
    except TypeError as exc:
        raise ConfigError(f"bad measure options {measure}: {exc}") from exc
    entry = _entry(workload_key)
    reference = WorkloadReference(workload_key, entry)
    inputs = [MeasureInput(StepsBuilder(workload_key, entry, orjson.dumps(steps).decode(), layout_rewrite), reference,
                           target=target) for steps in candidates]
    return measure_batch(inputs, option)


def job_workload_key(job: dict[str, Any]) -> str:
    """The workload key of a job (``workload_key``, or ``task_name`` + ``args``)."""
    if job.get("workload_key"):
        return str(job["workload_key"])
    for key in ("task_name", "args"):
        if key not in job:
            raise ConfigError(f"auto_scheduler job needs 'task_name' and 'args' (or 'workload_key'): {job!r:.200}")
    return registry.make_workload_key(job["task_name"], list(job["args"]))


def job_layout_rewrite(job: dict[str, Any], workload_key: str) -> bool:
    """Whether a job measures its candidates with the weights' layout rewritten: the job's
    ``layout_rewrite`` (default true, as TVM tunes a network's tasks) where the workload has
    weights (a convolution's or dense layer's second input)."""
    from dialects.auto_scheduler.layout import layout_free_placeholders

    return bool(job.get("layout_rewrite", True)) and bool(layout_free_placeholders(cached_dag(workload_key)))


def make_tuner(job: dict[str, Any], space: SketchSpace) -> Tuner:
    """The job's tuner over the sketch space; ``xgb`` searches the model by evolution."""
    kind = job.get("tuner", "xgb")
    options = dict(job.get("tuner_options") or {})
    if kind == "xgb":
        options = {**XGB_DEFAULTS, **options}
    return create(kind, space, seed=job.get("seed", 0), **options)


def history_from_store(store: Any, workload_key: str, target: str) -> list[TuningRecord]:
    """Auto-scheduler records of a workload on a target already in the store."""
    from lorien.record import TuningRecord
    from lorien.target import parse_target

    table = store.scan(filters={"workload_key": workload_key, "target": target, "dialect": "auto_scheduler",
                                "target_key": parse_target(target).alternate_key})
    return [TuningRecord.from_row(row) for row in table.to_pylist()]


def transfer_rows(store: Any, workload_key: str, target: str, limit: int = 4000) -> list[dict[str, Any]]:
    """Valid records (as rows: workload_key, args, config, costs) of other workloads of the
    same function on the target's family, the newest ``limit`` records scanned."""
    from lorien.target import parse_target

    name, _ = registry.parse_workload_key(workload_key)
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


def tune_job(job: dict[str, Any], store_uri: str | None = None, log_path: str | Path | None = None,
             on_batch: BatchCallback | None = None, source: str | None = None, commit: bool = True,
             history: Sequence[TuningRecord] | None = None,
             resume: Sequence[TuningRecord] = ()) -> TuneProgress:
    """Tune one job dict: ``trials`` new candidates, committing each batch to ``store_uri``
    (None: the default store; with ``commit=False`` the store is only read).

    ``history``: records measured before (default: the store's records of the workload and
    target); they are never measured again and train the tuner first. ``resume``: this job's
    own earlier measurements (a retried attempt's, from the orchestration layer); they are
    history too and also count against ``trials``, so only the rest is measured.
    """
    from lorien.target import parse_target

    if job.get("warm_start_model"):
        raise ConfigError("'warm_start_model' is an autotvm option: its cost models are trained on template knobs")
    workload_key = job_workload_key(job)
    target = parse_target(job.get("target") or "llvm").canonical
    space = cached_space(workload_key)
    tuner = make_tuner(job, space)
    batch_size = int(job.get("batch_size", 16))
    early_stopping = job.get("early_stopping")
    nbest = job.get("commit_nbest", 20)
    source = source or job.get("source") or job_source(job, "auto_scheduler")

    store = None
    if commit or store_uri is not None:
        from lorien.warehouse import open_store

        store = open_store(store_uri)  # None: the default store
    try:
        if history is None:
            history = history_from_store(store, workload_key, target) if store is not None else []
        if store is not None and job.get("transfer", True) and hasattr(tuner, "load_history"):
            rows = transfer_rows(store, workload_key, target)  # one scan for the model and the seeds
            tuner.load_history(*transfer_history(store, space, workload_key, target, rows=rows))
            if hasattr(tuner, "add_seeds"):
                tuner.add_seeds(transfer_seeds(store, space, workload_key, target, rows=rows))
        history = [*history, *resume]
        measured: dict[bytes, Any] = {orjson.dumps(orjson.loads(r.config)): r for r in history}
        resumed = _resume(tuner, space, history)
        trials = min(max(0, int(job.get("trials", 16)) - len(resume)), len(space) - len(tuner.visited))
        progress = TuneProgress(total=trials + len(resume), trials=len(resume), resumed=len(resume))
        if resumed:
            best = min(resumed, key=lambda r: result_cost(r))
            if math.isfinite(result_cost(best)):
                progress.best_cost_s, progress.best_config = result_cost(best), orjson.loads(best.config)
        if resume and on_batch is not None:
            on_batch(progress, [])
        _tune(job, workload_key, target, space, tuner, progress, measured, batch_size, early_stopping, nbest,
              source, store if commit else None, log_path, on_batch)
    finally:
        if store is not None:
            store.close()
    return progress


def _resume(tuner: Tuner, space: SketchSpace, history: Sequence[TuningRecord]) -> list[TuningRecord]:
    """Mark the points of earlier records measured and teach the tuner their results."""
    indices, records = [], []
    for record in history:
        index = space.index_of_steps(orjson.loads(record.config))
        if index is not None and index not in tuner.visited:
            tuner.visited.add(index)
            indices.append(index)
            records.append(record)
    if indices:
        tuner.update(indices, records)
    return records


def _tune(job, workload_key, target, space, tuner, progress, measured, batch_size, early_stopping, nbest, source,
          store, log_path, on_batch) -> None:
    from lorien.formats import encode_record

    rewrite = job_layout_rewrite(job, workload_key)

    def to_records(candidates: list[Any], results: list[Any]) -> list[TuningRecord]:
        return [make_record(target, workload_key, steps, list(r.costs), int(r.error_no), float(r.all_cost),
                            float(r.timestamp), source=source, layout_rewrite=rewrite)
                for steps, r in zip(candidates, results, strict=True)]

    sink = BatchSink(store, nbest, log_path, lambda record: encode_record(record, "ansor"))
    tune_batches(tuner, space, progress, measured, batch_size, early_stopping, sink,
                 lambda candidates: measure_steps(workload_key, candidates, job.get("measure"), engine_target(target),
                                                  rewrite),
                 to_records, on_batch)
