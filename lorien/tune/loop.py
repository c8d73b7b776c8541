"""The one tuning loop, for every dialect.

A dialect hands the loop what only it knows about one job (:class:`TuneContext`, from
:meth:`lorien.dialect.Dialect.tuning_context`): the workload's search space and a tuner over
it, how a batch of configs is built and measured, how (config, result) becomes a record, how a
stored record maps back to a point of the space, and how a record is written in its native
log. The loop does the rest, the same way for all of them:

1. **Resume.** The store's records of the same workload, target and dialect are replayed into
   the tuner first: it never proposes their configs again and learns from them. Those among
   them that this job measured before (``resume``: an interrupted run, a killed worker's
   attempt) count against the job's ``trials``, so only the rest of the budget is measured.
2. **Propose, measure, commit.** Each batch is measured, committed to the store (and appended
   to the native log) before the tuner learns from it and the next batch is proposed, so a
   killed run keeps everything it measured.
3. **Report.** ``on_batch(progress, records)`` after every batch (the job managers commit
   there), early stopping, and the :class:`TuneProgress` the summary is made from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from lorien.errors import DialectError
from lorien.record import TuningRecord
from lorien.search.base import Tuner, result_cost
from lorien.tune.job import TuneJob
from lorien.tune.progress import BatchCallback, BatchSink, TuneProgress, tune_batches


def config_json_key(config: Any) -> bytes:
    """The identity of a config: its compact JSON (the default of :class:`TuneContext`)."""
    return orjson.dumps(config)


def record_json_key(record: TuningRecord) -> bytes:
    """The identity of a stored record's config, comparable with :func:`config_json_key`."""
    return orjson.dumps(orjson.loads(record.config))


@dataclass
class TuneContext:
    """What a dialect hands the loop for one job.

    - ``space``/``tuner``: the search space (``len``, ``get(index) -> config``) and the job's
      tuner over it (transfer history, seeds and warm starts already given to it).
    - ``measure(configs) -> results``: build and measure a batch, one MeasureResult each.
    - ``to_records(configs, results, source) -> records``.
    - ``index_of(record) -> index | None``: the point of the space a stored record measured
      (None when the record is not in this space; raise DialectError where that means the
      record cannot belong to this job).
    - ``config_key``/``record_key``: one identity for a proposed config and a stored record's
      config, so nothing is measured twice even where several points give one config.
    - ``encode_log(record) -> line``: the record in the dialect's native log (None: no log).
    - ``config_summary(config)``: the best config as the summary shows it (JSON data).
    - ``schedule_of(config) -> (schedule, tensors)``: the engine schedule of a config, not
      built (program features are computed from it, so a job's ``cost_model`` can guide the
      tuner; None: this dialect's candidates cannot be guided by one).
    - ``builds_ahead``: ``measure(configs, ahead)`` also takes configs later batches will measure
      (the tuner knows them before this batch's results), to build them with this batch; they are
      measured, not built again, by later calls.
    - ``build_costs``: ``measure(configs, build_costs=[...])`` takes a guess at each config's build
      time (a guided tuner's, :meth:`lorien.search.xgb.XGBTuner.build_costs`) and starts the
      longest builds first; the configs are still measured in the order given.
    - ``measure_target``: the target the engine times this job's candidates for, where it is not
      the job's own (a meta_schedule job times on TVM's runtime threads: ``-num-cores`` added);
      a ``cost_model``'s target features (``tg_cores``, ...) describe it, as its records' build does.
    - ``finish(measured, source) -> records``: run once after the last batch, given every known
      config's result by its key (this run's MeasureResults, stored records); its records
      (e.g. the best configs measured again another way) are committed and reported like a
      batch's, without counting as trials. None: nothing.
    """

    workload_key: str
    task_name: str
    space: Any
    tuner: Tuner
    measure: Callable[[list[Any]], list[Any]]
    to_records: Callable[[list[Any], list[Any], str], list[TuningRecord]]
    index_of: Callable[[TuningRecord], int | None]
    config_key: Callable[[Any], bytes] = config_json_key
    record_key: Callable[[TuningRecord], bytes] = record_json_key
    encode_log: Callable[[TuningRecord], str] | None = None
    config_summary: Callable[[Any], Any] = lambda config: config
    schedule_of: Callable[[Any], tuple[Any, list[Any]]] | None = None
    finish: Callable[[dict[bytes, Any], str], list[TuningRecord]] | None = None
    builds_ahead: bool = False
    build_costs: bool = False
    measure_target: str | None = None


def stored_history(store: Any, job: TuneJob, workload_key: str) -> list[TuningRecord]:
    """Records of a workload on the job's target and dialect already in the store, oldest first."""
    from lorien.target import parse_target

    target = parse_target(job.target)
    table = store.scan(filters={"workload_key": workload_key, "target": target.canonical,
                                "dialect": job.dialect, "target_key": target.alternate_key})
    records = [TuningRecord.from_row(row) for row in table.to_pylist()]
    return sorted(records, key=lambda record: (record.timestamp, record.record_id))


def tune_job(job: TuneJob | dict[str, Any], store: Any = None, *, resume: Sequence[TuningRecord] = (),
             on_batch: BatchCallback | None = None, source: str | None = None, commit: bool = True,
             log_path: str | Path | None = None, context: TuneContext | None = None) -> TuneProgress:
    """Tune one job with its dialect. ``store`` is an open store (records are read from it to
    resume, and each batch is committed to it unless ``commit`` is False, as under a job
    manager that commits in ``on_batch``), a store URI (opened for the job), or None (nothing
    read, nothing committed).
    ``resume``: this job's earlier measurements (by its ``source`` tag), counted against
    ``trials``; ``source``: the tag of the records (default: the job's ``lorien-job:<id>``);
    ``log_path``: the native log to append each batch to, where the dialect has one;
    ``context``: a ready :class:`TuneContext` instead of the dialect's (tuning a computation
    that is not a registered workload)."""
    from lorien.dialect import get_dialect
    from lorien.tune.resume import job_source

    if isinstance(store, str):  # a URI: open it for this job
        from lorien.warehouse import open_store

        with open_store(store) as opened:
            return tune_job(job, opened, resume=resume, on_batch=on_batch, source=source, commit=commit,
                            log_path=log_path, context=context)
    job = TuneJob.from_spec(job)
    source = source or job_source(job.spec, job.dialect)
    context = context or get_dialect(job.dialect).tuning_context(job, store)
    guided_by: dict[str, Any] | None = None
    if job.cost_model:
        from lorien.costmodel.pretrained import guide_tuner

        guided_by = guide_tuner(context, job)
    history = stored_history(store, job, context.workload_key) if store is not None else []
    progress = TuneProgress(total=job.trials, summarize=context.config_summary)
    measured = replay_history(context, progress, history, resume, job.batch_size)
    if progress.resumed and on_batch is not None:
        on_batch(progress, [])
    encode = context.encode_log
    progress.log_path = str(log_path) if log_path is not None and encode is not None else ""
    sink = BatchSink(store if commit else None, job.commit_nbest, progress.log_path or None,
                     encode or (lambda record: ""))

    def to_records(configs: list[Any], results: list[Any]) -> list[TuningRecord]:
        records = context.to_records(configs, results, source)
        if guided_by is not None:  # the build JSON says which model chose the candidate
            for record in records:
                build = orjson.loads(record.build) if record.build else {}
                record.build = orjson.dumps({**build, "cost_model": guided_by}).decode()
        return records

    tune_batches(context.tuner, context.space, progress, measured, job.batch_size, job.early_stopping, sink,
                 context.measure, to_records, on_batch, context.config_key, context.builds_ahead,
                 context.build_costs)
    if context.finish is not None:
        finished = context.finish(measured, source)
        if finished:
            if commit and store is not None:
                store.commit(finished, nbest=job.commit_nbest)
                progress.committed += len(finished)
            progress.records.extend(finished)
            if on_batch is not None:
                on_batch(progress, finished)
    return progress


def replay_history(context: TuneContext, progress: TuneProgress, history: Sequence[TuningRecord],
                   resume: Sequence[TuningRecord], batch_size: int) -> dict[bytes, Any]:
    """Replay stored records into the tuner, oldest first, in batches as they were measured:
    their points are never proposed again and the tuner learns from them. This job's own
    earlier measurements (``resume``) count as trials (one that does not fit the space is an
    error naming it); the others are known but cost nothing (one that does not fit the space,
    e.g. measured with an older template, is only never measured again).
    Returns every known config's result by its key (what the loop never measures again)."""
    own = {context.record_key(record) for record in resume}
    measured: dict[bytes, Any] = {}
    points: dict[bytes, int | None] = {}
    pending: list[tuple[int, TuningRecord]] = []
    for record in [*history, *resume]:
        key = context.record_key(record)
        if key in measured:
            continue
        measured[key] = record
        try:
            points[key] = context.index_of(record)
        except DialectError as exc:
            if key not in own:  # another job's record (an older template, an ingested log): known, not a point
                points[key] = None
                continue
            raise DialectError(f"record {record.record_id} of {context.task_name} does not fit its search space "
                               f"({exc}); was the workload's space changed since it was measured?") from None
        if points[key] is not None and points[key] not in context.tuner.visited:
            pending.append((points[key], record))
    for start in range(0, len(pending), batch_size):
        batch = pending[start:start + batch_size]
        context.tuner.replay([index for index, _ in batch], [record for _, record in batch])
    progress.trials = progress.resumed = len(own & set(measured))
    progress.errors = sum(1 for key in own & set(measured) if math.isinf(result_cost(measured[key])))
    best_key = min(measured, key=lambda key: result_cost(measured[key]), default=None)
    if best_key is not None and math.isfinite(result_cost(measured[best_key])):
        index = points[best_key]
        progress.best_cost_s = result_cost(measured[best_key])
        progress.best_config = (progress.summarize(context.space.get(index)) if index is not None
                                else orjson.loads(measured[best_key].config))
    progress.last_improvement = progress.trials  # early stopping counts from here
    return measured
