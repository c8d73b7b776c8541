"""The dask manager against a real Dask scheduler and worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from lorien.errors import ConfigError
from lorien.tune.jobspec import Job
from lorien.tune.managers.base import committed_records
from lorien.tune.managers.synthetic import synthetic_runner
from lorien.tune.master import run_jobs
from lorien.tune.trace import read_events, read_trace
from lorien.warehouse import open_store

pytest.importorskip("distributed")

from servers import free_port  # noqa: E402  (tests/servers.py, loaded as a pytest plugin)


def synthetic_jobs(count: int, tmp_path: Path, **measure: object) -> list[dict]:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return [{"dialect": "autotvm", "task_name": "dense", "args": [index + 1, 8, 8], "target": "llvm",
             "trials": 3, "batch_size": 1, "measure": {"log_dir": str(tmp_path / "logs"), **measure}}
            for index in range(count)]


def _wait_for_workers(address: str, count: int, timeout_s: float = 60.0) -> None:
    from distributed import Client

    with Client(address, timeout="30s") as client:
        client.wait_for_workers(count, timeout=timeout_s)


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """A `dask scheduler` and two `dask worker` processes on 127.0.0.1 (allowed-failures 0, so
    a dead worker's task comes back to the master at once). Shared by a module's tests: their
    jobs differ (each test's log_dir is in its specs), so their ids and scheduler state do too."""
    tmp_path = tmp_path_factory.mktemp("dask")
    env = {**os.environ,
           "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0",
           "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0",
           "LORIEN_MEASURE_LOCK_DIR": str(tmp_path / "locks")}
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    log = open(tmp_path / "dask.log", "wb")  # noqa: SIM115
    processes = [subprocess.Popen([*dask, "--host", "127.0.0.1", "--port", str(port),
                                   "--dashboard-address", ":0"], env=env, stdout=log, stderr=log)]
    worker = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
              "--nworkers", "1", "--host", "127.0.0.1", "--dashboard-address", ":0",
              "--local-directory", str(tmp_path / "dask-worker")]
    processes += [subprocess.Popen(worker, env=env, stdout=log, stderr=log) for _ in range(2)]
    try:
        _wait_for_workers(address, 2)
        yield address
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()


def _pids_started(tmp_path: Path) -> list[tuple[str, int]]:
    log = tmp_path / "logs" / "executions.log"
    if not log.exists():
        return []
    return [(line.split()[0], int(line.split()[1])) for line in log.read_text().splitlines()]


def test_jobs_run_on_a_running_scheduler_given_by_address(dask_cluster, tmp_path, store_uri):
    jobs = synthetic_jobs(4, tmp_path)
    summary = run_jobs(jobs, manager="dask", scheduler=dask_cluster, store_uri=store_uri,
                       runner=synthetic_runner, trace_file=tmp_path / "t.jsonl")
    assert (summary.done, summary.failed, summary.records) == (4, 0, 12)
    workers = {state.worker for state in read_trace(tmp_path / "t.jsonl").values()}
    assert all(worker and str(os.getpid()) not in worker for worker in workers)


def _measured(tmp_path: Path) -> Counter:
    log = tmp_path / "logs" / "measured.log"
    return Counter(tuple(line.split()) for line in log.read_text().splitlines()) if log.exists() else Counter()


def test_a_dask_worker_killed_mid_job_resumes_the_job_and_measures_every_trial_once(dask_cluster, tmp_path,
                                                                                    store_uri):
    """A worker process SIGKILLed after its job committed two trials (one batch each): Dask
    reports the task lost, the master retries it, the retry resumes from the two and measures
    only the rest. Every trial of every job is measured exactly once; the store holds them all."""
    import threading

    jobs = [{**job, "trials": 6} for job in synthetic_jobs(4, tmp_path, sleep_s=0.3)]
    trace_file = tmp_path / "t.jsonl"
    result = {}
    master = threading.Thread(target=lambda: result.update(summary=run_jobs(
        jobs, manager="dask", scheduler=dask_cluster, store_uri=store_uri, runner=synthetic_runner,
        trace_file=trace_file, log=lambda message: None)))
    master.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            _pids_started(tmp_path) and committed_records(store_uri, _pids_started(tmp_path)[0][0]) >= 2):
        time.sleep(0.05)
    victim_job, victim_pid = _pids_started(tmp_path)[0]
    os.kill(victim_pid, 9)
    master.join(timeout=120)
    summary = result["summary"]
    assert (summary.done, summary.failed, summary.records) == (4, 0, 24)
    victim = read_trace(trace_file)[victim_job]
    assert victim.history[-3:] == ["retried", "running", "done"]
    done = [event for event in read_events(trace_file)[0] if event["job_id"] == victim_job and event["state"] == "done"]
    assert done[0]["resumed"] >= 2 and done[0]["resumed"] + done[0]["measured"] == 6
    measured = _measured(tmp_path)
    assert len(measured) == 24 and set(measured.values()) == {1}
    with open_store(store_uri) as store:
        sources = Counter(store.scan(columns=["source"]).column("source").to_pylist())
    assert sorted(sources.values()) == [6, 6, 6, 6]


def test_without_a_scheduler_a_local_cluster_of_worker_processes_is_started(tmp_path, store_uri,
                                                                            monkeypatch):
    monkeypatch.setenv("LORIEN_MEASURE_LOCK_DIR", str(tmp_path / "locks"))
    jobs = synthetic_jobs(3, tmp_path)
    summary = run_jobs(jobs, manager="dask", workers=2, store_uri=store_uri, runner=synthetic_runner)
    assert (summary.done, summary.records) == (3, 9)
    pids = {pid for _job, pid in _pids_started(tmp_path)}
    assert os.getpid() not in pids


def test_an_unreachable_scheduler_is_one_clear_error(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=f"cannot reach the Dask scheduler at {address}"):
        run_jobs([Job.from_spec(synthetic_jobs(1, tmp_path)[0])], manager="dask", scheduler=address,
                 runner=synthetic_runner, connect_timeout_s=2)


def test_a_recomputed_task_of_a_committed_job_returns_its_outcome_without_measuring(dask_cluster, tmp_path,
                                                                                    store_uri):
    from distributed import Client

    from lorien.tune.managers.base import Task
    from lorien.tune.managers.dask import run_dask_task

    job = Job.from_spec(synthetic_jobs(1, tmp_path)[0])
    with Client(dask_cluster) as client:
        first = client.submit(run_dask_task, Task(job.job_id, job.spec, 1, False), store_uri,
                              synthetic_runner, None, pure=False).result()
        again = client.submit(run_dask_task, Task(job.job_id, job.spec, 1, False), store_uri,
                              synthetic_runner, None, pure=False).result()
    assert (first.reused, again.reused, again.records) == (False, True, 3)
    assert [job_id for job_id, _pid in _pids_started(tmp_path)] == [job.job_id]


def test_an_attempt_taken_over_by_a_later_one_stops_before_its_next_commit(dask_cluster, tmp_path, store_uri):
    """A dead master's task still running (attempt 1) and a resumed master's attempt 2 of the
    same job, on two measurement slots at once: attempt 2 claims the job and resumes from what
    attempt 1 committed; attempt 1 stops at its next batch instead of measuring on."""
    from distributed import Client

    from lorien.tune.managers.base import Task
    from lorien.tune.managers.dask import run_dask_task

    job = Job.from_spec({**synthetic_jobs(1, tmp_path, sleep_s=0.3)[0], "trials": 8})
    with Client(dask_cluster) as client:
        first = client.submit(run_dask_task, Task(job.job_id, job.spec, 1, True), store_uri, synthetic_runner, 2,
                              pure=False)
        deadline = time.monotonic() + 60
        while len(_measured(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        second = client.submit(run_dask_task, Task(job.job_id, job.spec, 2, True), store_uri, synthetic_runner, 2,
                               pure=False)
        first, second = first.result(timeout=60), second.result(timeout=60)
    assert first.superseded and first.measured < 8
    assert not second.superseded and second.resumed >= 2 and second.records == 8
    with open_store(store_uri) as store:
        configs = set(store.scan(columns=["config"]).column("config").to_pylist())
    assert len(configs) == 8
