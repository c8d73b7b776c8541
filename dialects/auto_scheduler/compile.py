"""Build kernels of auto-scheduler workloads: from a record's steps, or with a default schedule,
and replay whole Ansor logs with every kernel checked against NumPy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

import lorien.builtin_workloads  # noqa: F401 - registers the built-in workloads
from dialects.auto_scheduler.steps import replay_steps
from lorien import workload_registry
from lorien.engine.arrays import logical_arrays
from lorien.engine.cpu import engine_target
from lorien.engine.replay import Replay, ReplayOutcome
from lorien.errors import LorienError, WorkloadError
from lorien.record import TuningRecord


def replay_record(record: TuningRecord, dag: Any = None) -> Replay:
    """The engine schedule of a record's steps on its registered workload (``dag``, when the
    caller has built it), the weights' layout rewritten when the record was measured so
    (``layout_rewrite_option`` 2)."""
    from dialects.auto_scheduler.records import layout_rewritten

    dag = dag if dag is not None else workload_registry.workload_dag(record.workload_key)
    return replay_steps(dag, orjson.loads(record.config), layout_rewritten(record))


def _kernel(replay: Replay, target: str | None, workload_key: str, steps: list[Any]):
    from lorien.engine.build import build

    kernel = build(replay.schedule, replay.args, target=target)
    kernel.workload_key, kernel.steps, kernel.notes, kernel.tensors = workload_key, steps, replay.notes, replay.args
    return kernel


def compile_record(record: TuningRecord, target: str | None = None):
    """The kernel of an auto-scheduler record (its steps replayed on the registered workload).

    The kernel carries ``workload_key``, ``steps``, ``notes`` (e.g. GPU bindings run as CPU
    loops) and ``tensors`` (its arguments, inputs and outputs in order). A record measured with
    the weights' layout rewritten gives a kernel that takes them packed:
    ``kernel.pack_arguments(data, weight, out)`` makes its arrays from the logical ones.
    """
    return _kernel(replay_record(record), engine_target(target), record.workload_key, orjson.loads(record.config))


def compile_default(workload_key: str, target: str | None = None):
    """The kernel of a workload built with the default schedule of its first sketch."""
    from dialects.auto_scheduler.sketch import default_steps

    dag = workload_registry.workload_dag(workload_key)
    steps = default_steps(dag)
    return _kernel(replay_steps(dag, steps), engine_target(target), workload_key, steps)


def check_kernel(kernel: Any, workload_key: str, seed: int = 0, rtol: float = 1e-3, atol: float = 1e-3) -> float:
    """Run a kernel on random inputs and compare every output with the NumPy reference;
    returns the largest absolute error, raises WorkloadError when an output differs."""
    logical = logical_arrays(kernel.args, seed)
    arrays = kernel.pack_arguments(*logical)
    kernel(*arrays)
    expected = workload_registry.reference_of(workload_key)(*[a for a, spec in zip(logical, kernel.args, strict=True)
                                                     if not spec.is_output])
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    outputs = [(a, spec) for a, spec in zip(arrays, kernel.args, strict=True) if spec.is_output]
    worst = 0.0
    for (got, spec), want in zip(outputs, expected, strict=True):
        error = float(np.max(np.abs(got.astype(np.float64) - np.asarray(want, np.float64))))
        if not np.allclose(got, want, rtol=rtol, atol=atol):
            raise WorkloadError(f"output {spec.name!r} differs from the NumPy reference (max abs error {error:.3g})")
        worst = max(worst, error)
    return worst


def replay_log(path: str | Path, check: bool = True) -> list[ReplayOutcome]:
    """Replay every record of an Ansor log on Lorien's engine: each registered workload's steps
    build a kernel whose output is checked against NumPy; a workload nobody registered is
    reported with its key (never guessed), a step that cannot be applied with its index, a
    line that does not parse with its error."""
    from lorien.errors import RecordParseError
    from lorien.formats.ansor import decode_line
    from lorien.formats.base import iter_lines

    outcomes = []
    for number, (line, text) in enumerate(iter_lines(path)):
        try:
            record = decode_line(text, str(path), line)
        except RecordParseError as exc:
            outcomes.append(ReplayOutcome(str(path), line, "", "failed", str(exc)))
            continue
        key, steps = record.workload_key, orjson.loads(record.config)
        try:
            dag = workload_registry.workload_dag(key)
        except workload_registry.UnregisteredWorkloadError as exc:
            outcomes.append(ReplayOutcome(str(path), line, key, "unregistered", str(exc)))
            continue
        try:
            replay = replay_record(record, dag)
            kernel = _kernel(replay, None, key, steps)
            error = check_kernel(kernel, key, seed=number) if check else None
        except LorienError as exc:
            outcomes.append(ReplayOutcome(str(path), line, key, "failed", str(exc)))
            continue
        outcomes.append(ReplayOutcome(str(path), line, key, "ok", max_error=error, notes=replay.notes))
    return outcomes
