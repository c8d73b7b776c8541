"""Build kernels of MetaSchedule records on Lorien's engine, measure traces in isolated workers,
and replay whole JSONDatabases with every kernel checked against NumPy.

A record's workload is found from its ``extra``: the TIR module of a database entry (by its
content hash, in the store or among the entries this process has read, or carried in the
record); a workload tuned here is an entry ``[hash, {"lorien_dag": DAG as plain data}]``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from dialects.meta_schedule.trace import replay_trace
from dialects.meta_schedule.workload import dag_of_module, workload_key_of
from lorien.engine.dag import ComputeDAG
from lorien.engine.replay import ReplayOutcome
from lorien.errors import ConfigError, LorienError, RecordParseError, WorkloadError
from lorien.record import TuningRecord

LORIEN_DAG = "lorien_dag"


def workload_entry(record: TuningRecord, store: Any = None, entries: Mapping[str, str] | None = None) -> list[Any]:
    """The workload entry ``[shash, module]`` of a MetaSchedule record: carried in its extra,
    or found by its content hash in ``entries`` (hash -> text, e.g. of its database), in
    ``store`` or among the entries this process has read."""
    from lorien.formats.meta_schedule import known_workloads

    extra = orjson.loads(record.extra) if record.extra else {}
    if "workload" in extra:
        return list(extra["workload"])
    digest = extra.get("workload_hash")
    if digest is None:
        raise WorkloadError(f"record {record.record_id} names no MetaSchedule workload in its extra")
    text = (entries or {}).get(digest) or (store.get_workloads([digest]).get(digest) if store is not None else None) \
        or known_workloads([digest]).get(digest)
    if text is None:
        raise WorkloadError(f"record {record.record_id}: the entry of MetaSchedule workload {digest} is not at hand "
                            f"(compile from the store it was ingested into, or read its database first)")
    return orjson.loads(text)


def workload_dag(record: TuningRecord, store: Any = None, entries: Mapping[str, str] | None = None) -> ComputeDAG:
    """The compute DAG of a MetaSchedule record's workload (see :func:`workload_entry`)."""
    return _module_dag(orjson.dumps(workload_entry(record, store, entries)).decode())


@functools.lru_cache(maxsize=16)
def _module_dag(entry_text: str) -> ComputeDAG:
    """The DAG of a workload entry: a TVM TIR module, or ``{"lorien_dag": ...}`` (tuned here)."""
    entry = orjson.loads(entry_text)
    if is_lorien_entry(entry):
        return ComputeDAG.from_json(entry[1][LORIEN_DAG])
    return dag_of_module(entry[1])


def lorien_entry(dag: ComputeDAG) -> list[Any]:
    """The workload entry ``[structural hash, {"lorien_dag": DAG}]`` of a workload defined with
    Lorien's compute DSL (what a record tuned here carries and a JSONDatabase export writes)."""
    return [workload_key_of(dag), {LORIEN_DAG: dag.to_json()}]


def is_lorien_entry(entry: Sequence[Any]) -> bool:
    """Whether a workload entry is a Lorien compute DAG (tuned here), not a TVM module."""
    return isinstance(entry[1], dict) and LORIEN_DAG in entry[1]


@functools.lru_cache(maxsize=16)
def dag_from_json(dag_json: str) -> ComputeDAG:
    """A compute DAG from its JSON text (:meth:`ComputeDAG.to_json`), cached for workers."""
    return ComputeDAG.from_json(orjson.loads(dag_json))


def dag_text(dag: ComputeDAG) -> str:
    """The JSON text of a DAG, what builders and references carry to worker processes."""
    return orjson.dumps(dag.to_json()).decode()


def _kernel(dag: ComputeDAG, trace: Any, target: str | None, workload_key: str):
    from lorien.engine.build import build
    from lorien.engine.cpu import engine_target

    replay = replay_trace(dag, trace)
    kernel = build(replay.schedule, replay.args, target=engine_target(target))
    kernel.workload_key, kernel.trace, kernel.notes, kernel.tensors = workload_key, trace, replay.notes, replay.args
    return kernel


def compile_record(record: TuningRecord, target: str | None = None, store: Any = None):
    """The kernel of a MetaSchedule record: its trace replayed on its workload.

    The kernel carries ``workload_key``, ``trace``, ``notes`` and ``tensors`` (its arguments).
    """
    return _kernel(workload_dag(record, store), orjson.loads(record.config), target, record.workload_key)


def check_kernel(kernel: Any, dag: ComputeDAG, seed: int = 0, rtol: float = 1e-3, atol: float = 1e-3,
                 expected: list[np.ndarray] | None = None) -> float:
    """Run a kernel on random inputs (from ``seed``) and compare its outputs with the DAG's
    NumPy evaluation (or ``expected``, computed from the same inputs); returns the largest
    absolute error, raises WorkloadError when an output differs."""
    inputs = reference_inputs(dag, seed)
    arrays, given = [], iter(inputs)
    for spec in kernel.args:
        arrays.append(np.zeros(spec.shape, spec.dtype) if spec.is_output else next(given))
    kernel(*arrays)
    want = expected if expected is not None else dag.evaluate(*inputs)
    worst = 0.0
    outputs = [(a, spec) for a, spec in zip(arrays, kernel.args, strict=True) if spec.is_output]
    for (got, spec), value in zip(outputs, want, strict=True):
        error = float(np.max(np.abs(got.astype(np.float64) - value.astype(np.float64))))
        if not np.allclose(got, value, rtol=rtol, atol=atol, equal_nan=True):
            raise WorkloadError(f"output {spec.name!r} differs from the NumPy reference (max abs error {error:.3g})")
        worst = max(worst, error)
    return worst


def reference_inputs(dag: ComputeDAG, seed: int) -> list[np.ndarray]:
    """Random inputs of a DAG in [-1, 1), one array per input tensor in argument order."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, t.shape).astype(t.dtype) for t in dag.io_tensors if t not in dag.outputs]


def replay_database(path: str | Path, check: bool = True) -> list[ReplayOutcome]:
    """Replay every record of a MetaSchedule JSONDatabase on Lorien's engine: each trace builds
    a kernel whose output is checked against NumPy (one reference per workload); an
    instruction that cannot be applied is reported with its index, name and why, a line that
    does not parse with its error."""
    from lorien.formats.meta_schedule import iter_records, pair_paths

    record_file = str(pair_paths(path)[1])
    outcomes: list[ReplayOutcome] = []
    expected: dict[str, list[np.ndarray]] = {}
    for line, item in enumerate(iter_records(path), 1):
        if isinstance(item, RecordParseError):
            outcomes.append(ReplayOutcome(record_file, line, "", "failed", str(item)))
            continue
        try:
            dag = workload_dag(item)
            kernel = _kernel(dag, orjson.loads(item.config), None, item.workload_key)
            error = None
            if check:
                if item.workload_key not in expected:
                    expected[item.workload_key] = dag.evaluate(*reference_inputs(dag, 0))
                error = check_kernel(kernel, dag, expected=expected[item.workload_key])
        except LorienError as exc:
            outcomes.append(ReplayOutcome(record_file, line, item.workload_key, "failed", str(exc)))
            continue
        outcomes.append(ReplayOutcome(record_file, line, item.workload_key, "ok", max_error=error, notes=kernel.notes))
    return outcomes


@dataclass(frozen=True)
class TraceBuilder:
    """Picklable ``() -> (schedule, tensors)`` of one trace on a DAG (carried as JSON text)."""

    dag_json: str
    trace_json: str

    def __call__(self) -> tuple[Any, list[Any]]:
        replay = replay_trace(dag_from_json(self.dag_json), orjson.loads(self.trace_json))
        return replay.schedule, replay.args


@dataclass(frozen=True)
class DagReference:
    """Picklable NumPy reference of a DAG: its outputs evaluated from its inputs."""

    dag_json: str

    def __call__(self, *inputs: Any) -> Any:
        return dag_from_json(self.dag_json).evaluate(*inputs)


def measure_traces(dag: ComputeDAG, traces: Sequence[Any], measure: dict[str, Any] | None = None,
                   target: str | None = None, best_cost_s: float = math.inf,
                   ahead: Sequence[Any] = (), build_costs: Sequence[float] | None = None) -> list[Any]:
    """Build and measure traces in isolated workers for the CPU ``target`` (default this host),
    each output checked against NumPy; one MeasureResult per trace (``best_cost_s``: the job's
    fastest so far; ``ahead``: traces later calls measure, built with these; ``build_costs``: a
    guess at each trace's build time, the longest started first; as for ``measure_batch``)."""
    from lorien.engine.measure import MeasureInput, MeasureOption, measure_batch

    try:
        option = MeasureOption(**(measure or {}))
    except TypeError as exc:
        raise ConfigError(f"bad measure options {measure}: {exc}") from exc
    text = dag_text(dag)
    reference = DagReference(text)
    inputs, built_ahead = ([MeasureInput(TraceBuilder(text, orjson.dumps(trace).decode()), reference, target=target)
                            for trace in group] for group in (traces, ahead))
    return measure_batch(inputs, option, best_cost_s=best_cost_s, ahead=built_ahead, build_costs=build_costs)
