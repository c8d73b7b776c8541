"""Tune one meta_schedule job: the design space of the workload's compute DAG
(:mod:`dialects.meta_schedule.space`), evolutionary search guided by an XGBoost cost model
on trace features (``lorien.search``: ``xgb`` with ``optimizer: evolution``), traces built and
measured by the engine, records in MetaSchedule's form streamed out batch by batch.

A job names a workload as the other dialects do (an op shorthand, or ``task_name`` and
``args`` of a registered workload function such as the layers of
:mod:`lorien.builtin_workloads`: dense, batch_matmul, conv2d NHWC/NCHW, depthwise); its
MetaSchedule workload key is the structural hash of the DAG. Every record carries its
workload entry (``[hash, {"lorien_dag": ...}]``), so it compiles and exports with nothing
else at hand. The one tuning loop (:mod:`lorien.tune.loop`) resumes
from the store's traces of the workload and commits batch by batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import orjson

import lorien.builtin_workloads  # noqa: F401 - registers the built-in workloads
from dialects.meta_schedule.compile import lorien_entry, measure_traces
from dialects.meta_schedule.records import args_info, make_record
from dialects.meta_schedule.space import TraceSpace
from dialects.meta_schedule.workload import workload_key_of
from lorien import workload_registry
from lorien.engine.build import build_info
from lorien.engine.cpu import engine_target
from lorien.engine.dag import ComputeDAG
from lorien.errors import LorienError
from lorien.record import TuningRecord
from lorien.tune.job import TuneJob, job_workload_key, template_free_tuner
from lorien.tune.loop import TuneContext
from lorien.tune.progress import TuneProgress

DIALECT = "meta_schedule"
#: A design space of at most this many points is lowered whole when its job starts, so that
#: points giving one engine program are measured once (:func:`program_keys`).
DEDUP_SPACE_MAX = 64
#: ``remeasure_with_tvm`` times its finalists in at least this many rounds, taking turns, whatever
#: the job's ``repeat``: with the 3 rounds of a tuning job, one busy moment of a shared machine
#: (a round 1.8x the others, seen on the BERT layer's tasks) moved a finalist's mean by a third
#: and chose between finalists closer than that (docs/models.md).
REMEASURE_ROUNDS = 9
#: The xgb tuner's defaults here (beside :data:`lorien.tune.job.TEMPLATE_FREE_XGB_DEFAULTS`):
#: ``guide_refine`` 64, so a guided run also evolves candidates on the pre-trained guide's score
#: from its best measured traces every plan. Without it the guided runs picked among fresh random
#: traces and the knob model's few candidates, and stalled where the scratch run's evolution
#: climbed (znver3, 2026-11-29: guided runs ended 0.63-0.97 of scratch on 4 of 6 pairs); with it,
#: on the same model, `pretrained_trials_speedup_meta_schedule` 0.98 -> 1.86 (docs/costmodel.md).
#: auto_scheduler keeps 0 (measured there without a gain).
#: ``guide_first_refine`` 256 (over 4 generations): the first batch is picked from an evolution
#: on the guide's score as well, started from its favourites of the random pool: the best of 128
#: random traces ran at 0.56-0.82 of a 300-trial run's best on the held-out layers, so picking
#: among them alone could not start near it (12 pairs of 64-trial runs, raw counts:
#: speedup 1.48 -> 2.63, final 0.996 -> 1.052; docs/costmodel.md).
META_SCHEDULE_XGB_DEFAULTS: dict[str, Any] = {"guide_refine": 64, "guide_first_refine": 256}
#: From this round on the finalists race: one whose fastest timing is slower than the slowest
#: timing of the one ahead is timed no more, and the rounds end when one is left or those left
#: tie (medians within ``RACE_TIE`` of the leader's,
#: :meth:`~dialects.meta_schedule.tvm_measure.TvmMeasurer._race`); every finalist is timed in
#: at least this many rounds, TVM's own runner's ``repeat``.
REMEASURE_RACE_FROM = 3


@functools.lru_cache(maxsize=16)
def job_dag(registry_key: str) -> ComputeDAG:
    """The compute DAG of a registered workload (cached: one space per workload)."""
    return workload_registry.workload_dag(registry_key)


@functools.lru_cache(maxsize=16)
def cached_space(registry_key: str) -> TraceSpace:
    return TraceSpace(job_dag(registry_key))


def tuning_context(job: TuneJob, store: Any) -> TuneContext:
    """The loop's view of one meta_schedule job on a registered workload function, or on the TVM
    module of its ``workload_file`` (a task of ``lorien extract --dialect meta_schedule``)."""
    if job.option("workload_file") is not None:
        from dialects.meta_schedule.relax_tasks import workload_of_file
        from dialects.meta_schedule.workload import dag_of_module

        entry = workload_of_file(job.option("workload_file"), job.workload_key)
        return dag_context(dag_of_module(entry[1]), job, task_name=job.task_name or None, entry=entry, store=store)
    registry_key = job_workload_key(job)
    return dag_context(job_dag(registry_key), job, space=cached_space(registry_key),
                       task_name=job.task_name or registry_key, store=store)


def dag_context(dag: ComputeDAG, job: TuneJob, space: TraceSpace | None = None,
                task_name: str | None = None, entry: list[Any] | None = None, store: Any = None) -> TuneContext:
    """The loop's view of tuning any computation defined with Lorien's compute DSL (a DAG of its
    I/O tensors): its design space, the job's tuner, traces measured by the engine, records
    that carry their workload entry (``entry``: TVM's ``[shash, module]`` the DAG was read from,
    kept unchanged; default: the DAG's own). With ``remeasure_with_tvm: N`` the job ends by
    re-measuring its best ``N`` traces with TVM (:func:`remeasure_best`; ``store``: where
    traces TVM measured before are found)."""
    from lorien.target import parse_target

    space = space or TraceSpace(dag)
    entry = entry or lorien_entry(dag)
    workload_key = str(entry[0])
    target = parse_target(job.target).canonical
    extra = {"workload": entry}
    info, flop, layout = args_info(dag), dag.flop(), dag.layout()
    task_name = task_name or next(t.name for t in reversed(dag.ops))

    measure_target = engine_measure_target(target)
    engine_build = build_info(measure_target)  # what the engine's records say measured them

    def to_records(traces: list[Any], results: list[Any], source: str) -> list[TuningRecord]:
        return [make_record(target, workload_key, trace, list(r.costs), int(r.error_no), float(r.all_cost),
                            float(r.timestamp), info, flop, task_name, extra, source, layout,
                            r.extra.get("build") or engine_build)
                for trace, r in zip(traces, results, strict=True)]

    config_key = trace_key(program_keys(dag, space, engine_target(target)))
    on_engine = job.option("measure_with") != "tvm"
    finish = None
    if (job.option("remeasure_with_tvm") or 0) > 0 and on_engine:
        finish = remeasure_best(dag, job, target, entry, to_records, store, config_key)
    tuner = template_free_tuner(job, space, META_SCHEDULE_XGB_DEFAULTS)
    if store is not None and job.option("transfer") and hasattr(tuner, "add_seeds"):
        tuner.add_seeds(transfer_seeds(store, space, workload_key, task_name, target, info))
    return TuneContext(
        workload_key=workload_key, task_name=task_name, space=space, tuner=tuner,
        measure=job_measure(dag, job, target, measure_target, entry), to_records=to_records, index_of=lambda record: None,
        config_key=config_key, record_key=lambda record: config_key(orjson.loads(record.config)),
        finish=finish, schedule_of=functools.partial(_schedule_of, space),
        builds_ahead=on_engine, build_costs=on_engine, measure_target=measure_target if on_engine else None)


def transfer_seeds(store: Any, space: TraceSpace, workload_key: str, task_name: str, target: str,
                   args: Any = None, limit: int = 4000) -> list[int]:
    """Points of this workload's space nearest to the best valid trace of every other workload
    of the same function (``task_name``) the store holds for the target's family
    (:meth:`TraceSpace.nearest_point`), the workloads of the closest shapes first (``args``:
    this workload's, as records carry them); the newest ``limit`` records are scanned. A trace
    of a TVM module (no Lorien DAG to rebuild its space from) or of another block structure is
    skipped."""
    import math

    from dialects.meta_schedule.compile import is_lorien_entry
    from lorien.target import parse_target

    table = store.scan(filters={"task_name": task_name, "dialect": "meta_schedule",
                                "target_key": parse_target(target).alternate_key},
                       columns=["workload_key", "args", "config", "costs", "error_no", "extra"])
    best: dict[str, tuple[float, dict[str, Any]]] = {}
    for row in table.slice(max(0, table.num_rows - limit)).to_pylist():  # the newest, not every row as Python
        if row["workload_key"] == workload_key or row["error_no"] != 0 or not row["costs"]:
            continue
        cost = min(float(c) for c in row["costs"])
        if row["workload_key"] not in best or cost < best[row["workload_key"]][0]:
            best[row["workload_key"]] = (cost, row)

    def shape(args_json: Any) -> list[float]:
        try:
            tensors = orjson.loads(args_json) if isinstance(args_json, (str, bytes)) else args_json
            return [math.log2(max(1, int(d))) for t in tensors for d in t[2]]
        except (TypeError, ValueError, IndexError, orjson.JSONDecodeError):
            return []

    here = shape(args)

    def distance(row: dict[str, Any]) -> float:
        there = shape(row["args"])
        return sum(abs(a - b) for a, b in zip(there, here, strict=True)) if len(there) == len(here) else math.inf

    seeds: list[int] = []
    for _, row in sorted(best.values(), key=lambda item: distance(item[1])):
        try:
            entry = (orjson.loads(row["extra"]) if row["extra"] else {}).get("workload")
            if not entry or not is_lorien_entry(entry):
                continue
            source = TraceSpace(ComputeDAG.from_json(entry[1]["lorien_dag"]), space.cores)
            positions = source.positions_of(orjson.loads(row["config"]))
        except (LorienError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            continue  # a record this version cannot read back is no seed; the job tunes on without it
        index = space.nearest_point(source, positions) if positions is not None else None
        if index is not None:
            seeds.append(index)
    return list(dict.fromkeys(seeds))


def program_keys(dag: ComputeDAG, space: TraceSpace, target: str | None) -> dict[bytes, bytes]:
    """For a space of at most :data:`DEDUP_SPACE_MAX` points (a task with no block to tile has
    12: unroll step x parallel extent), each point's trace JSON mapped to the trace JSON of the
    first point that lowers to the same engine program for ``target``; empty for a larger space.
    The 12 points of such a task mostly give one or two programs (and TVM one or two modules), and
    TVM's MetaSchedule measures each distinct module once (it skips candidates whose module it
    measured); without this a job measured the same program up to ``trials`` times, and
    re-measured it with TVM. A point that does not lower keeps its own key (its measurement
    reports why)."""
    from dialects.meta_schedule.trace import replay_trace
    from lorien.engine import cpu
    from lorien.engine.lower import lower

    if len(space) > DEDUP_SPACE_MAX:
        return {}
    first: dict[str, bytes] = {}
    keys: dict[bytes, bytes] = {}
    with cpu.building_for(target):
        for index in range(len(space)):
            trace = space.get(index)
            key = orjson.dumps(trace)
            try:
                replay = replay_trace(dag, trace)
                program = str(lower(replay.schedule, list(replay.args), "kernel"))
            except Exception:  # noqa: BLE001 - measured as it is, where its error is recorded
                continue
            keys[key] = first.setdefault(program, key)
    return keys


def trace_key(canonical: dict[bytes, bytes]) -> Callable[[Any], bytes]:
    """A trace's identity in the loop: its JSON, or (``canonical``, :func:`program_keys`) the JSON of
    the first trace of the space that gives its program; the key is a trace, as remeasuring needs."""
    def key_of(trace: Any) -> bytes:
        text = orjson.dumps(trace)
        return canonical.get(text, text)

    return key_of


def _schedule_of(space: TraceSpace, trace: list[Any]) -> tuple[Any, list[Any]]:
    """The engine schedule of a trace replayed on the space's DAG, not built."""
    replay = space.replay(trace)
    return replay.schedule, replay.args


def job_measure(dag: ComputeDAG, job: TuneJob, target: str, measure_target: str | None,
                entry: list[Any] | None = None) -> Callable[[list[Any]], list[Any]]:
    """How a job's traces are measured: by Lorien's engine for ``measure_target``
    (:func:`engine_measure_target` of ``target``), or with ``measure_with: tvm`` built and timed by
    TVM (:mod:`dialects.meta_schedule.tvm_measure`; the records say which)."""
    if job.option("measure_with") == "tvm":
        from dialects.meta_schedule.tvm_measure import TvmMeasurer

        return TvmMeasurer(dag, job.measure, target, entry)
    from lorien.engine.measure import keeping_fastest

    return keeping_fastest(lambda traces, best_cost_s, ahead=(), build_costs=None: measure_traces(
        dag, traces, job.measure, measure_target, best_cost_s, ahead, build_costs))


def engine_measure_target(target: str) -> str | None:
    """The target Lorien's engine times a job's traces for: the job's CPU target (this host for
    a GPU target, as :func:`~lorien.engine.cpu.engine_target`), its parallel loops on as many threads as TVM's runtime will give the
    built model (:func:`~dialects.meta_schedule.tvm_measure.tvm_runtime_threads`) unless the
    target names ``-num-cores``. With all the online CPUs, as the engine's default, the engine
    timed the BERT layer's FFN candidates on 2 threads where TVM ran them on 1, and ranked them
    unlike TVM (docs/models.md, "The BERT layer per task")."""
    from dialects.meta_schedule.tvm_measure import tvm_runtime_threads
    from lorien.target import parse_target

    text = engine_target(target)
    if text is None or parse_target(text).get("num-cores") is not None:
        return text
    return f"{text} -num-cores={tvm_runtime_threads()}"


def remeasure_best(dag: ComputeDAG, job: TuneJob, target: str, entry: list[Any],
                   to_records: Callable[[list[Any], list[Any], str], list[TuningRecord]],
                   store: Any, config_key: Callable[[Any], bytes] = orjson.dumps,
                   ) -> Callable[[dict[bytes, Any], str], list[TuningRecord]]:
    """The end of a job with ``remeasure_with_tvm: N``: the ``N`` fastest traces Lorien's engine
    measured for the workload (this run's and the store's) built and timed by TVM
    (:class:`~dialects.meta_schedule.tvm_measure.TvmMeasurer`, the job's ``measure`` with at least
    :data:`REMEASURE_ROUNDS` rounds, racing from round :data:`REMEASURE_RACE_FROM`), as new records whose build says ``measured_by: tvm``. Traces
    TVM already measured for the workload and target (in the store) are not measured again; ``config_key``: the loop's identity of a
    trace (:func:`trace_key`), which ``measured`` is keyed by."""
    import math

    from lorien.engine.measure import MeasureOption
    from lorien.record import MEASURED_BY_TVM
    from lorien.search.base import result_cost
    from lorien.tune.loop import stored_history

    rounds = max(int(job.measure.get("repeat", MeasureOption.repeat)), REMEASURE_ROUNDS)
    measure = {**job.measure, "repeat": rounds}

    def finish(measured: dict[bytes, Any], source: str) -> list[TuningRecord]:
        from dialects.meta_schedule.tvm_measure import TvmMeasurer

        done = set()
        if store is not None:
            done = {config_key(orjson.loads(record.config)) for record in stored_history(store, job, str(entry[0]))
                    if record.measured_by == MEASURED_BY_TVM}
        ranked = sorted((result_cost(result), key) for key, result in measured.items()
                        if math.isfinite(result_cost(result)) and getattr(result, "measured_by", None) != MEASURED_BY_TVM)
        best = [key for _, key in ranked if key not in done][:int(job.option("remeasure_with_tvm"))]
        if not best:
            return []
        traces = [orjson.loads(key) for key in best]
        measurer = TvmMeasurer(dag, measure, target, entry, race_from=REMEASURE_RACE_FROM)
        return to_records(traces, measurer(traces), source)

    return finish


def tune_dag(dag: ComputeDAG, job: dict[str, Any], store: Any = None, **options: Any) -> TuneProgress:
    """Tune any computation defined with Lorien's compute DSL with a job's options (``trials``,
    ``batch_size``, ``tuner``, ``measure``, ``target``, ...) in the one tuning loop; ``store``
    and ``options`` as for :func:`lorien.tune.loop.tune_job`."""
    from lorien.tune.loop import tune_job

    key = workload_key_of(dag)
    spec = {"task_name": next(t.name for t in reversed(dag.ops)), "args": [], **job, "workload_key": key,
            "dialect": DIALECT, "target": job.get("target") or "llvm"}
    parsed = TuneJob.from_spec(spec)
    if isinstance(store, str):
        from lorien.warehouse import open_store

        with open_store(store) as opened:
            return tune_job(parsed, opened, context=dag_context(dag, parsed, store=opened), **options)
    return tune_job(parsed, store, context=dag_context(dag, parsed, store=store), **options)
