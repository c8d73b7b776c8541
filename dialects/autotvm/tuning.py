"""What the tuning loop (:mod:`lorien.tune.loop`) needs of an AutoTVM job: the template's
config space, the job's tuner, configs built and measured in isolated workers, records in
AutoTVM's form. The loop resumes, commits, logs and reports.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
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
from lorien.tune.job import TuneJob
from lorien.tune.loop import TuneContext


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
                    measure: dict[str, Any] | None = None, target: str | None = None,
                    best_cost_s: float = math.inf) -> list[Any]:
    """Build and measure configs for ``target`` (default this host) in isolated workers; one
    MeasureResult per config (``best_cost_s``: the job's fastest so far, as for ``measure_batch``)."""
    from lorien.engine.measure import MeasureOption, measure_batch

    try:
        option = MeasureOption(**(measure or {}))
    except TypeError as exc:
        raise ConfigError(f"bad measure options {measure}: {exc}") from exc
    return measure_batch(measure_inputs(task_name, args, configs, target), option, best_cost_s=best_cost_s)


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
            # a record from before an optional knob takes its first value
            entity = {item[0]: item for item in task.space.complete_entity(orjson.loads(row["config"])["entity"])}
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


def make_tuner(job: TuneJob, task: Task) -> Tuner:
    """The job's tuner over the task's space; ``feature_type: itervar`` adds loop features."""
    options = dict(job.tuner_options)
    if options.get("feature_type") == "itervar":
        from dialects.autotvm.loop_features import LoopFeatureFn

        options["feature_fn"] = LoopFeatureFn(task)
    return create(job.tuner, task.space, seed=job.seed, **options)


def check_job(job: TuneJob) -> None:
    """A warm start needs the model-based tuner."""
    if job.option("warm_start_model") and job.tuner != "xgb":
        raise DialectError(f"warm_start_model needs tuner 'xgb', got tuner {job.tuner!r} for {job.task_name} "
                           f"with model {job.option('warm_start_model')!r}")


def tuning_context(job: TuneJob, store: Any) -> TuneContext:
    """The loop's view of one AutoTVM job: the template's config space, the job's tuner over it
    (primed with the store's records of other workloads of the template under ``transfer``, or
    with a trained model under ``warm_start_model``), configs measured in isolated workers."""
    from lorien.engine.cpu import cpu_target
    from lorien.target import parse_target
    from lorien.workload import autotvm_workload_key

    if not job.task_name:
        raise ConfigError(f"autotvm job needs 'task_name' and 'args': {job.spec!r:.200}")
    task_name, args = job.task_name, list(job.args)
    target = parse_target(job.target)
    cpu_target(target).check_runnable()
    task = cached_task(task_name, orjson.dumps(args).decode())
    tuner = make_tuner(job, task)
    if job.option("transfer") and store is not None and job.tuner == "xgb":
        features, scores = transfer_history(task, store, target.alternate_key)
        tuner.load_history(features, scores)  # type: ignore[attr-defined]
    if job.option("warm_start_model"):
        from lorien.costmodel import warm_start_tuner

        warm_start_tuner(tuner, str(job.option("warm_start_model")), task_name, args,
                         samples=int(job.option("warm_start_samples")), seed=job.seed, target=target.canonical)

    def to_records(configs: list[ConfigEntity], results: list[Any], source: str) -> list[TuningRecord]:
        return [make_record(target.canonical, task_name, args, config, list(result.costs), int(result.error_no),
                            float(result.all_cost), float(result.timestamp), source=source)
                for config, result in zip(configs, results, strict=True)]

    def index_of(record: TuningRecord) -> int:
        try:
            return task.space.from_json_entity(orjson.loads(record.config)["entity"]).index
        except (DialectError, KeyError, TypeError, ValueError) as exc:
            raise DialectError(f"its config is not a point of {task.name}'s space: {exc}") from None

    from lorien.engine.measure import keeping_fastest

    return TuneContext(
        workload_key=autotvm_workload_key(task_name, args), task_name=task_name, space=task.space, tuner=tuner,
        measure=keeping_fastest(lambda configs, best_cost_s: measure_configs(
            task_name, args, configs, job.measure, target.canonical, best_cost_s)),
        to_records=to_records, index_of=index_of,
        config_key=lambda config: orjson.dumps(config.to_json_entity()), record_key=_entity_key,
        encode_log=encode, config_summary=lambda config: config.to_json_entity(),
        schedule_of=functools.partial(_schedule_of, task, target.canonical))


def _schedule_of(task: Task, target: str, config: ConfigEntity) -> tuple[Any, list[Any]]:
    """The engine schedule of a config, instantiated for the target's CPU (not built)."""
    from lorien.engine.cpu import building_for

    with building_for(target):
        return task.instantiate(config)


def _entity_key(record: TuningRecord) -> bytes:
    """A stored record's config entity, comparable with a proposed config's."""
    try:
        return orjson.dumps(orjson.loads(record.config)["entity"])
    except (KeyError, TypeError, ValueError):
        return record.config.encode()
