"""A master killed with SIGKILL mid-run and resumed from its trace measures no finished job twice,
with the local manager and with a Dask cluster whose tasks outlive the master."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from lorien.tune.jobspec import Job
from lorien.tune.managers.synthetic import synthetic_runner
from lorien.tune.master import run_jobs
from lorien.tune.trace import read_trace
from lorien.warehouse import open_store

pytest.importorskip("distributed")

import test_managers_dask  # noqa: E402  (tests/test_managers_dask.py)

#: The fixture of a real `dask scheduler` with two `dask worker` processes.
dask_cluster = test_managers_dask.dask_cluster

MASTER_SCRIPT = """
import json, sys
from lorien.tune.master import run_jobs
from lorien.tune.managers.synthetic import synthetic_runner
jobs = json.load(open(sys.argv[1]))
run_jobs(jobs, store_uri=sys.argv[2], trace_file=sys.argv[3], runner=synthetic_runner, workers=2)
"""


def _done_jobs(trace_file: Path) -> set[str]:
    if not trace_file.exists():
        return set()
    return {job_id for job_id, state in read_trace(trace_file).items() if state.state == "done"}


def _sleepy_jobs(tmp_path, sleep_s: float) -> list[dict]:
    """Eight small synthetic jobs that log each execution under tmp_path/logs; written to jobs.json."""
    (tmp_path / "logs").mkdir()
    jobs = [{"dialect": "autotvm", "task_name": "dense", "args": [index + 1, 8, 8], "target": "llvm",
             "trials": 3, "batch_size": 1, "measure": {"sleep_s": sleep_s, "log_dir": str(tmp_path / "logs")}}
            for index in range(8)]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    return jobs


def _kill_after_three_done(master: subprocess.Popen, trace_file, jobs: list[dict]) -> set[str]:
    """SIGKILL the master once its trace shows three finished jobs; the jobs finished by then."""
    deadline = time.monotonic() + 120
    while len(_done_jobs(trace_file)) < 3 and time.monotonic() < deadline and master.poll() is None:
        time.sleep(0.02)
    os.kill(master.pid, signal.SIGKILL)
    master.wait()
    finished_before_kill = _done_jobs(trace_file)
    assert 3 <= len(finished_before_kill) < len(jobs)
    return finished_before_kill


def _assert_each_finished_job_ran_once_and_stored_all(tmp_path, store_uri: str, finished_before_kill: set[str],
                                                     jobs: list[dict]) -> None:
    runs = Counter(line.split()[0] for line in (tmp_path / "logs" / "executions.log").read_text().splitlines())
    assert all(runs[job_id] == 1 for job_id in finished_before_kill)
    with open_store(store_uri) as store:
        sources = Counter(store.scan(columns=["source"]).column("source").to_pylist())
    assert sorted(sources.values()) == [3] * len(jobs)


@pytest.mark.slow
def test_a_killed_master_resumes_from_its_trace_without_measuring_a_finished_job_twice(tmp_path, monkeypatch):
    monkeypatch.setenv("LORIEN_MEASURE_LOCK_DIR", str(tmp_path / "locks"))
    jobs = _sleepy_jobs(tmp_path, 0.15)
    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    trace_file = tmp_path / "trace.jsonl"
    master = subprocess.Popen([sys.executable, "-c", MASTER_SCRIPT, str(tmp_path / "jobs.json"), store_uri,
                               str(trace_file)], stderr=subprocess.DEVNULL)
    finished_before_kill = _kill_after_three_done(master, trace_file, jobs)

    summary = run_jobs(jobs, store_uri=store_uri, trace_file=trace_file, runner=synthetic_runner, workers=2)

    assert summary.skipped == len(finished_before_kill)
    assert summary.done + summary.skipped == len(jobs)
    assert _done_jobs(trace_file) == {Job.from_spec(job).job_id for job in jobs}
    _assert_each_finished_job_ran_once_and_stored_all(tmp_path, store_uri, finished_before_kill, jobs)


DASK_MASTER_SCRIPT = """
import json, sys
from lorien.tune.master import run_jobs
from lorien.tune.managers.synthetic import synthetic_runner
jobs = json.load(open(sys.argv[1]))
run_jobs(jobs, manager="dask", scheduler=sys.argv[4], store_uri=sys.argv[2], trace_file=sys.argv[3],
         runner=synthetic_runner)
"""


@pytest.mark.slow
def test_a_killed_dask_master_resumes_while_its_tasks_still_run_and_nothing_is_duplicated(dask_cluster, tmp_path):
    jobs = _sleepy_jobs(tmp_path, 0.2)
    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    trace_file = tmp_path / "trace.jsonl"
    master = subprocess.Popen([sys.executable, "-c", DASK_MASTER_SCRIPT, str(tmp_path / "jobs.json"), store_uri,
                               str(trace_file), dask_cluster], stderr=subprocess.DEVNULL)
    finished_before_kill = _kill_after_three_done(master, trace_file, jobs)

    summary = run_jobs(jobs, manager="dask", scheduler=dask_cluster, store_uri=store_uri, trace_file=trace_file,
                       runner=synthetic_runner)

    assert (summary.done + summary.skipped, summary.failed) == (len(jobs), 0)
    _assert_each_finished_job_ran_once_and_stored_all(tmp_path, store_uri, finished_before_kill, jobs)
