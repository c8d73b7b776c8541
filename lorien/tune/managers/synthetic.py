"""A synthetic runner: measures nothing, sleeps instead, for testing and benchmarking the
orchestration itself (managers, retries, resume) apart from the cost of real tuning.

Job fields it reads: ``trials`` (records to produce), ``batch_size`` (trials per batch handed
to ``on_batch``, default 1) and ``measure``: ``sleep_s`` (seconds per trial), ``log_dir``
(each execution appends ``job_id pid`` to ``executions.log`` there, and each trial whose
measurement completes ``job_id trial`` to ``measured.log``, so a test can count reruns and
trials measured twice), ``crash_once_dir`` (the first execution of each job SIGKILLs its own
process halfway, once per job). ``args`` with a negative number is a workload that cannot be
built (WorkloadError). It resumes as a dialect does: trials whose config (``{"trial": i}``)
is among ``resume`` are not measured again. Record timestamps are wall-clock times, so a
trial measured twice produces two distinct records.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lorien.errors import WorkloadError
from lorien.record import TuningRecord
from lorien.target import parse_target
from lorien.tune.jobspec import job_id_of
from lorien.tune.progress import TuneProgress


def synthetic_runner(spec: dict[str, Any], store: Any, resume: Sequence[TuningRecord] = (),
                     on_batch: Callable[[TuneProgress, list[TuningRecord]], None] | None = None,
                     **_options: Any) -> list[TuningRecord]:
    """Produce the ``spec["trials"]`` fake records not in ``resume``, sleeping
    ``measure.sleep_s`` per trial, handing them to ``on_batch`` ``batch_size`` at a time."""
    job_id = job_id_of(spec)
    measure = spec.get("measure") or {}
    args = spec.get("args") or []
    if any(isinstance(value, (int, float)) and value < 0 for value in args):
        raise WorkloadError(f"cannot build {spec.get('task_name')!r} with args {args}: negative shape")
    log_dir = Path(measure["log_dir"]) if measure.get("log_dir") else None
    if log_dir is not None:
        with open(log_dir / "executions.log", "a") as log:
            log.write(f"{job_id} {os.getpid()}\n")
    crash_marker = Path(measure["crash_once_dir"]) / f"{job_id}.crashed" if measure.get("crash_once_dir") else None
    target = parse_target(spec["target"])
    rng = random.Random(spec.get("seed", 0))
    trials = int(spec["trials"])
    done = {json.loads(record.config).get("trial") for record in resume}
    progress = TuneProgress(total=trials, trials=len(done), resumed=len(done))
    records: list[TuningRecord] = []
    batch: list[TuningRecord] = []
    for trial in range(trials):
        cost = rng.uniform(1e-4, 1e-3)
        if trial in done:
            continue
        time.sleep(float(measure.get("sleep_s", 0.0)))
        if crash_marker is not None and trial == trials // 2 and not crash_marker.exists():
            crash_marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        if log_dir is not None:
            with open(log_dir / "measured.log", "a") as log:
                log.write(f"{job_id} {trial}\n")
        batch.append(TuningRecord(
            dialect=spec["dialect"], target=target.canonical, target_key=target.alternate_key,
            workload_key=f"{spec.get('task_name', 'synthetic')}#{json.dumps(args)}",
            task_name=spec.get("task_name", "synthetic"), args=json.dumps(args), layout="",
            config=json.dumps({"trial": trial}), costs=[cost], timestamp=time.time(), flop=1e6,
        ))
        progress.trials += 1
        if len(batch) >= int(spec.get("batch_size", 1)):
            _hand_over(batch, records, progress, on_batch)
            batch = []
    _hand_over(batch, records, progress, on_batch)
    return records


def _hand_over(batch: list[TuningRecord], records: list[TuningRecord], progress: TuneProgress,
               on_batch: Callable[[TuneProgress, list[TuningRecord]], None] | None) -> None:
    if batch:
        records += batch
        progress.records = records
        if on_batch is not None:
            on_batch(progress, batch)
