"""A synthetic runner: measures nothing, sleeps instead, for testing and benchmarking the
orchestration itself (managers, retries, resume) apart from the cost of real tuning.

Job fields it reads: ``trials`` (records to produce) and ``measure``:
``sleep_s`` (seconds per trial), ``log_dir`` (each execution appends ``job_id pid`` to
``executions.log`` there, so a test can count reruns), ``crash_once_dir`` (the first
execution of each job SIGKILLs its own process halfway, once per job). ``args`` with a
negative number is a workload that cannot be built (WorkloadError). Record timestamps are
wall-clock times, so a job measured twice would produce distinct records.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from lorien.errors import WorkloadError
from lorien.record import TuningRecord
from lorien.target import parse_target
from lorien.tune.jobspec import job_id_of


def synthetic_runner(spec: dict[str, Any], store_uri: str | None) -> list[TuningRecord]:
    """Produce ``spec["trials"]`` fake records after sleeping ``measure.sleep_s`` per trial."""
    job_id = job_id_of(spec)
    measure = spec.get("measure") or {}
    args = spec.get("args") or []
    if any(isinstance(value, (int, float)) and value < 0 for value in args):
        raise WorkloadError(f"cannot build {spec.get('task_name')!r} with args {args}: negative shape")
    if measure.get("log_dir"):
        with open(Path(measure["log_dir"]) / "executions.log", "a") as log:
            log.write(f"{job_id} {os.getpid()}\n")
    crash_marker = Path(measure["crash_once_dir"]) / f"{job_id}.crashed" if measure.get("crash_once_dir") else None
    target = parse_target(spec["target"])
    rng = random.Random(spec.get("seed", 0))
    records = []
    for trial in range(int(spec["trials"])):
        time.sleep(float(measure.get("sleep_s", 0.0)))
        if crash_marker is not None and trial == int(spec["trials"]) // 2 and not crash_marker.exists():
            crash_marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        records.append(TuningRecord(
            dialect=spec["dialect"], target=target.canonical, target_key=target.alternate_key,
            workload_key=f"{spec.get('task_name', 'synthetic')}#{json.dumps(args)}",
            task_name=spec.get("task_name", "synthetic"), args=json.dumps(args), layout="",
            config=json.dumps({"trial": trial}), costs=[rng.uniform(1e-4, 1e-3)],
            timestamp=time.time(), flop=1e6,
        ))
    return records
