"""Tune one meta_schedule job: the design space of the workload's compute DAG
(:mod:`dialects.meta_schedule.space`), evolutionary search guided by an XGBoost cost model
on trace features (``lorien.search``: ``xgb`` with ``optimizer: evolution``), traces built and
measured by the engine, records in MetaSchedule's form streamed out batch by batch.

A job names a workload as the other dialects do (an op shorthand, or ``task_name`` and
``args`` of one of the auto-scheduler's registered layer functions: dense, batch_matmul,
conv2d NHWC/NCHW, depthwise); its MetaSchedule workload key is the structural hash of the
DAG. Every record carries its workload entry (``[hash, {"lorien_dag": ...}]``), so it compiles
and exports with nothing else at hand. Traces measured before for the same workload and
target (in the store) are not measured again.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import orjson

from dialects.auto_scheduler import registry, workloads  # noqa: F401 - registers the built-in workloads
from dialects.auto_scheduler.dag import ComputeDAG
from dialects.auto_scheduler.tuning import job_workload_key, make_tuner
from dialects.meta_schedule.compile import lorien_entry, measure_traces
from dialects.meta_schedule.records import args_info, make_record
from dialects.meta_schedule.space import TraceSpace
from lorien.engine.cpu import engine_target
from lorien.errors import ConfigError
from lorien.record import TuningRecord
from lorien.search import result_cost
from lorien.tune.progress import BatchCallback, BatchSink, TuneProgress, tune_batches
from lorien.tune.resume import job_source

DIALECT = "meta_schedule"


@functools.lru_cache(maxsize=16)
def job_dag(registry_key: str) -> ComputeDAG:
    """The compute DAG of a registered workload (cached: one space per workload)."""
    return registry.workload_dag(registry_key)


@functools.lru_cache(maxsize=16)
def cached_space(registry_key: str) -> TraceSpace:
    return TraceSpace(job_dag(registry_key))


def history_from_store(store: Any, workload_key: str, target: str) -> list[TuningRecord]:
    """MetaSchedule records of a workload on a target already in the store."""
    from lorien.target import parse_target

    table = store.scan(filters={"workload_key": workload_key, "target": target, "dialect": DIALECT,
                                "target_key": parse_target(target).alternate_key})
    return [TuningRecord.from_row(row) for row in table.to_pylist()]


def tune_job(job: dict[str, Any], store_uri: str | None = None, on_batch: BatchCallback | None = None,
             source: str | None = None, commit: bool = True) -> TuneProgress:
    """Tune one job dict: ``trials`` new traces, committing each batch to ``store_uri``
    (None: the default store; with ``commit=False`` the store is only read)."""
    if job.get("warm_start_model"):
        raise ConfigError("'warm_start_model' is an autotvm option: its cost models are trained on template knobs")
    registry_key = job_workload_key(job)
    source = source or job.get("source") or job_source(job, DIALECT)
    return tune_dag(job_dag(registry_key), job, store_uri, on_batch, source, commit,
                    space=cached_space(registry_key), task_name=str(job.get("task_name", registry_key)))


def tune_dag(dag: ComputeDAG, job: dict[str, Any], store_uri: str | None = None,
             on_batch: BatchCallback | None = None, source: str | None = None, commit: bool = True,
             space: TraceSpace | None = None, task_name: str | None = None) -> TuneProgress:
    """Tune any computation defined with Lorien's compute DSL (a DAG of its I/O tensors) with a
    job's options (``trials``, ``batch_size``, ``tuner``, ``measure``, ``target``, ...)."""
    from lorien.target import parse_target
    from lorien.warehouse import open_store

    space = space or TraceSpace(dag)
    tuner = make_tuner(job, space)
    entry = lorien_entry(dag)
    workload_key = str(entry[0])
    target = parse_target(job.get("target") or "llvm").canonical
    source = source or job.get("source") or "lorien meta_schedule"
    extra = {"workload": entry}
    info, flop, layout = args_info(dag), dag.flop(), dag.layout()
    task_name = task_name or next(t.name for t in reversed(dag.ops))
    store = open_store(store_uri) if commit or store_uri is not None else None
    try:
        history = history_from_store(store, workload_key, target) if store is not None else []
        measured: dict[bytes, Any] = {orjson.dumps(orjson.loads(r.config)): r for r in history}
        progress = TuneProgress(total=int(job.get("trials", 16)))
        if history:
            best = min(history, key=result_cost)
            if math.isfinite(result_cost(best)):
                progress.best_cost_s, progress.best_config = result_cost(best), orjson.loads(best.config)

        def to_records(traces: list[Any], results: list[Any]) -> list[TuningRecord]:
            return [make_record(target, workload_key, trace, list(r.costs), int(r.error_no), float(r.all_cost),
                                float(r.timestamp), info, flop, task_name, extra, source, layout)
                    for trace, r in zip(traces, results, strict=True)]

        sink = BatchSink(store if commit else None, job.get("commit_nbest", 20), None, lambda record: "")
        tune_batches(tuner, space, progress, measured, int(job.get("batch_size", 16)), job.get("early_stopping"),
                     sink, lambda traces: measure_traces(dag, traces, job.get("measure"), engine_target(target)), to_records, on_batch)
    finally:
        if store is not None:
            store.close()
    return progress
