"""Tune one AutoTVM job: propose configs, build and measure them, stream records out.

Every batch of measured candidates becomes TuningRecords that are committed to the store
(and appended to the AutoTVM log) before the next batch starts, so an interrupted run keeps
everything it measured. A resumed job replays what it measured before into its tuner (see
:func:`replay`) and measures only the rest of its budget.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from dialects.autotvm.records import encode, make_record
from dialects.autotvm.space import ConfigEntity, entity_features
from dialects.autotvm.templates import Task, instantiate
from lorien.errors import ConfigError, DialectError
from lorien.record import TuningRecord
from lorien.search import Tuner, create
from lorien.search.xgb import history_by_workload
from lorien.tune.progress import BatchCallback, BatchSink, TuneProgress, finish_batch
from lorien.tune.resume import job_source


@functools.lru_cache(maxsize=32)
def cached_task(task_name: str, args_json: str) -> Task:
    """Tasks are rebuilt in measurement workers from (task_name, args JSON); cache them."""
    return instantiate(task_name, orjson.loads(args_json))


@dataclass(frozen=True)
class ConfigBuilder:
    """Picklable ``() -> (schedule, tensors)`` of one config of one task."""

    task_name: str
    args_json: str
    entity_json: str

    def config(self) -> ConfigEntity:
        return cached_task(self.task_name, self.args_json).space.from_json_entity(orjson.loads(self.entity_json))

    def __call__(self) -> tuple[Any, list[Any]]:
        return cached_task(self.task_name, self.args_json).instantiate(self.config())


@dataclass(frozen=True)
class ConfigReference:
    """Picklable NumPy reference: expected outputs of the kernel of one config."""

    task_name: str
    args_json: str
    entity_json: str

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        task = cached_task(self.task_name, self.args_json)
        config = task.space.from_json_entity(orjson.loads(self.entity_json))
        return task.reference(config, *inputs)


def measure_inputs(task_name: str, args: Sequence[Any], configs: Sequence[ConfigEntity],
                   target: str | None = None) -> list[Any]:
    """Engine measure inputs of configs, built and run for ``target`` (default this host)."""
    from lorien.engine.measure import MeasureInput

    args_json = orjson.dumps(list(args)).decode()
    inputs = []
    for config in configs:
        entity_json = orjson.dumps(config.to_json_entity()).decode()
        inputs.append(MeasureInput(builder=ConfigBuilder(task_name, args_json, entity_json),
                                   reference=ConfigReference(task_name, args_json, entity_json), target=target))
    return inputs


def measure_configs(task_name: str, args: Sequence[Any], configs: Sequence[ConfigEntity],
                    measure: dict[str, Any] | None = None, target: str | None = None) -> list[Any]:
    """Build and measure configs for ``target`` (default this host) in isolated workers; one
    MeasureResult per config."""
    from lorien.engine.measure import MeasureOption, measure_batch

    try:
        option = MeasureOption(**(measure or {}))
    except TypeError as exc:
        raise ConfigError(f"bad measure options {measure}: {exc}") from exc
    return measure_batch(measure_inputs(task_name, args, configs, target), option)


def transfer_history(task: Task, store: Any, target_key: str, limit: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    """(features, normalized throughput) of valid warehouse records of the same template.

    Throughput is normalized per workload (best = 1), so workloads of different sizes teach
    the model which knob values are good relative to each other.
    """
    table = store.scan(filters={"task_name": task.name, "target_key": target_key},
                       columns=["workload_key", "config", "costs", "error_no"])
    rows = table.to_pylist()[-limit:]
    names = list(task.space.space_map)
    width = len(task.space.features_of(task.space.get(0)))
    per_workload: dict[str, list[tuple[list[float], float]]] = {}
    for row in rows:
        if row["error_no"] != 0 or not row["costs"]:
            continue
        try:
            entity = {item[0]: item for item in orjson.loads(row["config"])["entity"]}
            features = []
            for name in names:
                _, kind, value = entity[name]
                features += _knob_feature(task, name, kind, value)
        except (KeyError, TypeError, ValueError):
            continue
        if len(features) != width:
            continue
        per_workload.setdefault(row["workload_key"], []).append((features, 1.0 / float(np.mean(row["costs"]))))
    return history_by_workload(per_workload, width)


def _knob_feature(task: Task, name: str, kind: str, value: Any) -> list[float]:
    from dialects.autotvm.space import OtherOptionSpace, entity_from_json

    space = task.space.space_map[name]
    entity = entity_from_json(kind, value)
    if isinstance(space, OtherOptionSpace) and not all(isinstance(e.val, (bool, int, float)) for e in space):
        return [float(space.index_of(entity))]
    return entity_features(entity)


def make_tuner(job: dict[str, Any], task: Task) -> Tuner:
    """The job's tuner over the task's space; ``feature_type: itervar`` adds loop features."""
    options = dict(job.get("tuner_options") or {})
    if options.get("feature_type") == "itervar":
        from dialects.autotvm.loop_features import LoopFeatureFn

        options["feature_fn"] = LoopFeatureFn(task)
    return create(job.get("tuner", "random"), task.space, seed=job.get("seed", 0), **options)


def replay(task: Task, tuner: Tuner, progress: TuneProgress, records: Sequence[TuningRecord],
           batch_size: int) -> None:
    """Replay a job's earlier measurements (oldest first) into a fresh tuner, in batches as they
    were measured: the tuner never proposes them again and learns from them (the xgb tuner is
    trained on them before its first plan); they count as trials of the budget (and for early
    stopping)."""
    measured: dict[int, tuple[ConfigEntity, TuningRecord]] = {}
    for record in records:
        try:
            config = task.space.from_json_entity(orjson.loads(record.config)["entity"])
        except (DialectError, KeyError, TypeError, ValueError) as exc:
            raise DialectError(f"record {record.record_id} of this job does not fit the space of "
                               f"{task.name} ({exc}); was the template changed since it was measured?") from None
        measured.setdefault(config.index, (config, record))
    pairs = list(measured.values())
    for start in range(0, len(pairs), batch_size):
        configs = [config for config, _ in pairs[start:start + batch_size]]
        results = [record for _, record in pairs[start:start + batch_size]]
        tuner.replay([config.index for config in configs], results)
        progress.count(configs, results, [])
    progress.resumed = progress.trials


def tune_job(job: dict[str, Any], store_uri: str | None = None, log_path: str | Path | None = None,
             on_batch: BatchCallback | None = None, source: str | None = None,
             commit: bool = True, resume: Sequence[TuningRecord] = ()) -> TuneProgress:
    """Tune one job dict (team schema); with ``commit``, each measured batch is committed to
    ``store_uri`` (None: the default store). ``resume``: the job's earlier measurements, replayed
    (:func:`replay`) and counted against ``trials``; only the rest is measured."""
    from lorien.engine.cpu import cpu_target
    from lorien.target import parse_target

    for key in ("task_name", "args"):
        if key not in job:
            raise ConfigError(f"autotvm job needs {key!r}: {job!r:.200}")
    task_name, args = job["task_name"], list(job["args"])
    target = parse_target(job.get("target") or "llvm")
    cpu_target(target).check_runnable()
    task = cached_task(task_name, orjson.dumps(args).decode())
    tuner = make_tuner(job, task)
    trials = min(int(job.get("trials", 16)), len(task.space))
    batch_size = int(job.get("batch_size", 8))
    early_stopping = job.get("early_stopping")
    nbest = job.get("commit_nbest", 20)
    source = source or job.get("source") or job_source(job, "autotvm")

    store = None
    if commit:
        from lorien.warehouse import open_store

        store = open_store(store_uri)
    if job.get("transfer") and store is not None and job.get("tuner") == "xgb":
        features, scores = transfer_history(task, store, target.alternate_key)
        tuner.load_history(features, scores)  # type: ignore[attr-defined]
    if job.get("warm_start_model"):
        if job.get("tuner") != "xgb":
            raise ConfigError(f"warm_start_model needs tuner 'xgb', got tuner {job.get('tuner')!r} "
                              f"for {task_name} with model {job['warm_start_model']!r}")
        from lorien.costmodel import warm_start_tuner

        warm_start_tuner(tuner, str(job["warm_start_model"]), task_name, args,
                         samples=int(job.get("warm_start_samples", 512)), seed=int(job.get("seed", 0)),
                         target=target.canonical)

    progress = TuneProgress(total=trials)
    replay(task, tuner, progress, resume, batch_size)
    if progress.resumed and on_batch is not None:
        on_batch(progress, [])
    sink = BatchSink(store, nbest, log_path, encode)
    try:
        while progress.trials < trials and tuner.has_next() and not progress.stalled(early_stopping):
            indices = tuner.next_batch(min(batch_size, trials - progress.trials))
            if not indices:
                break
            configs = [task.config(i) for i in indices]
            results = measure_configs(task_name, args, configs, job.get("measure"), target.canonical)
            records = [make_record(target.canonical, task_name, args, config, list(result.costs),
                                   int(result.error_no), float(result.all_cost), float(result.timestamp),
                                   source=source)
                       for config, result in zip(configs, results, strict=True)]
            if not finish_batch(tuner, indices, configs, results, records, progress, sink, on_batch, early_stopping):
                break
    finally:
        sink.close()
        if store is not None:
            store.close()
    return progress

