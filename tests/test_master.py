"""The tuning master: job specs, the trace file, the local manager, retries and resume."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from lorien.errors import ConfigError
from lorien.tune.jobspec import Job, load_job, load_jobs, parse_document
from lorien.tune.managers.base import committed_records, measurement_slot, source_tag
from lorien.tune.managers.synthetic import synthetic_runner
from lorien.tune.master import run_jobs
from lorien.tune.trace import TraceWriter, read_events, read_trace
from lorien.warehouse import open_store

DENSE_JOB = {"dialect": "autotvm", "task_name": "dense.x86",
             "args": [["TENSOR", [16, 16], "float32"], ["TENSOR", [16, 16], "float32"]],
             "target": "llvm", "tuner": "random", "trials": 3, "seed": 1}


def synthetic_jobs(count: int, tmp_path: Path, **measure: object) -> list[dict]:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return [{"dialect": "autotvm", "task_name": "dense", "args": [index + 1, 16, 16], "target": "llvm",
             "trials": 3, "batch_size": 1, "measure": {"log_dir": str(tmp_path / "logs"), **measure}}
            for index in range(count)]


def executions(tmp_path: Path) -> list[str]:
    log = tmp_path / "logs" / "executions.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def measured_trials(tmp_path: Path) -> Counter:
    """How many times each (job, trial) of the synthetic runner was measured."""
    log = tmp_path / "logs" / "measured.log"
    return Counter(tuple(line.split()) for line in log.read_text().splitlines()) if log.exists() else Counter()


@pytest.fixture(autouse=True)
def private_measure_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("LORIEN_MEASURE_LOCK_DIR", str(tmp_path / "locks"))


# ---- job specs ----------------------------------------------------------------------------

def test_job_id_is_a_hash_of_the_spec_so_equal_specs_share_it():
    first = Job.from_spec(DENSE_JOB)
    again = Job.from_spec(json.loads(json.dumps(DENSE_JOB)))
    other = Job.from_spec({**DENSE_JOB, "seed": 2})
    assert first.job_id == again.job_id
    assert first.job_id != other.job_id


def test_a_job_gets_the_agreed_defaults():
    spec = Job.from_spec({key: DENSE_JOB[key] for key in ("dialect", "task_name", "args", "target")}).spec
    assert spec["tuner"] == "random" and spec["seed"] == 0 and spec["commit_nbest"] == 20
    assert spec["measure"] == {}


def test_a_yaml_job_list_with_defaults_is_read(tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text("defaults: {target: llvm, trials: 2}\n"
                    "jobs:\n"
                    "  - {dialect: autotvm, task_name: dense.x86, args: [1, 2]}\n"
                    "  - {dialect: autotvm, task_name: dense.x86, args: [3, 4], trials: 5}\n")
    job_list = load_jobs(path)
    assert [job.spec["trials"] for job in job_list.jobs] == [2, 5]
    assert all(job.spec["target"] == "llvm" for job in job_list.jobs)


def test_a_python_object_tag_in_a_spec_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("dialect: autotvm\ntarget: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(ConfigError, match=r"evil.yaml:2: refused YAML tag.*plain data"):
        load_jobs(path)
    assert not Path("pwned").exists()


def test_a_spec_that_does_not_parse_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"dialect": "autotvm",\n "target": }')
    with pytest.raises(ConfigError, match=r"broken.json:2: invalid JSON"):
        load_jobs(path)


def test_an_invalid_entry_is_reported_and_the_rest_of_the_list_is_kept():
    document = parse_document("- {dialect: autotvm, task_name: d, args: [1], target: llvm}\n"
                              "- {dialect: autotvm, task_name: d, args: [1], target: llvm, trials: many}\n")
    from lorien.tune.jobspec import jobs_from_document

    job_list = jobs_from_document(document, "list.yaml")
    assert len(job_list.jobs) == 1
    assert len(job_list.errors) == 1
    assert "list.yaml: jobs[1]: field 'trials' must be int, got 'many'" in str(job_list.errors[0])


def test_load_job_reads_a_spec_from_s3(moto_server, s3_client, s3_bucket):
    s3_client.put_object(Bucket=s3_bucket, Key="specs/one.json", Body=json.dumps(DENSE_JOB).encode())
    job = load_job(f"s3://{s3_bucket}/specs/one.json?endpoint_url={moto_server}&region=us-east-1")
    assert job.job_id == Job.from_spec(DENSE_JOB).job_id


# ---- trace ---------------------------------------------------------------------------------

def test_the_trace_gives_each_jobs_latest_state(tmp_path):
    with TraceWriter(tmp_path / "t.jsonl") as trace:
        trace.write("a", "pending")
        trace.write("a", "running", attempt=1)
        trace.write("a", "retried", attempt=1, error="worker died")
        trace.write("a", "running", attempt=2)
        trace.write("a", "done", attempt=2, records=3, worker="host:1")
        trace.write("b", "running", attempt=1)
    states = read_trace(tmp_path / "t.jsonl")
    assert (states["a"].state, states["a"].attempt, states["a"].records) == ("done", 2, 3)
    assert states["a"].history == ["pending", "running", "retried", "running", "done"]
    assert states["b"].state == "running"


def test_a_torn_last_line_from_a_killed_master_is_ignored_and_writing_resumes_cleanly(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as trace:
        trace.write("a", "done", attempt=1, records=2)
    with open(path, "a") as file:
        file.write('{"job_id": "b", "state": "do')
    with TraceWriter(path) as trace:
        trace.write("b", "done", attempt=1, records=1)
    events, torn = read_events(path)
    assert [event["job_id"] for event in events] == ["a", "b"]
    assert torn == [2]
    assert read_trace(path)["b"].state == "done"


def test_a_file_that_is_not_a_trace_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(ConfigError, match="t.jsonl:1: not a trace event"):
        read_trace(path)


# ---- local manager and master ------------------------------------------------------------

def test_local_jobs_commit_their_records_tagged_with_the_job_id(tmp_path, store_uri):
    jobs = synthetic_jobs(3, tmp_path)
    summary = run_jobs(jobs, store_uri=store_uri, runner=synthetic_runner, workers=2)
    assert (summary.done, summary.failed, summary.records) == (3, 0, 9)
    with open_store(store_uri) as store:
        sources = store.scan(columns=["source"]).column("source").to_pylist()
    assert sorted(set(sources)) == sorted(source_tag(Job.from_spec(job).job_id) for job in jobs)


def test_a_crashed_local_worker_process_is_retried_and_records_are_not_duplicated(tmp_path, store_uri):
    (tmp_path / "crash").mkdir()
    jobs = synthetic_jobs(3, tmp_path, crash_once_dir=str(tmp_path / "crash"))
    trace_file = tmp_path / "trace.jsonl"
    summary = run_jobs(jobs, store_uri=store_uri, runner=synthetic_runner, workers=2,
                       trace_file=trace_file)
    assert (summary.done, summary.retried, summary.records) == (3, 3, 9)
    states = read_trace(trace_file)
    assert all(state.history == ["pending", "running", "retried", "running", "done"]
               for state in states.values())
    assert any("SIGKILL" in event.get("error", "") for event in read_events(trace_file)[0])
    with open_store(store_uri) as store:
        assert store.scan(columns=["record_id"]).num_rows == 9


def test_a_local_worker_killed_mid_job_is_resumed_and_measures_every_trial_once(tmp_path, store_uri):
    """Each job's first worker commits trials 0-2 batch by batch, then SIGKILLs itself while
    measuring trial 3; the retry replays 0-2 and measures only 3-5."""
    (tmp_path / "crash").mkdir()
    jobs = [{**job, "trials": 6} for job in synthetic_jobs(3, tmp_path, crash_once_dir=str(tmp_path / "crash"))]
    trace_file = tmp_path / "trace.jsonl"
    summary = run_jobs(jobs, store_uri=store_uri, runner=synthetic_runner, workers=2, trace_file=trace_file)
    assert (summary.done, summary.retried, summary.records) == (3, 3, 18)
    assert (summary.resumed, summary.measured) == (9, 9)
    measured = measured_trials(tmp_path)
    assert len(measured) == 18 and set(measured.values()) == {1}  # the budget, none measured twice
    done = [event for event in read_events(trace_file)[0] if event["state"] == "done"]
    assert {(event["resumed"], event["measured"]) for event in done} == {(3, 3)}
    with open_store(store_uri) as store:
        table = store.scan(columns=["source", "config"])
    assert table.num_rows == 18
    assert len(set(zip(table.column("source").to_pylist(), table.column("config").to_pylist(), strict=True))) == 18


def _pid_logging_runner(spec, store_uri, **options):
    """The dialect's own runner, after noting this worker's pid (so a test can kill it)."""
    from lorien.tune.managers.base import dialect_runner

    with open(spec["measure"]["pid_file"], "a") as pids:
        pids.write(f"{os.getpid()}\n")
    return dialect_runner({**spec, "measure": {k: v for k, v in spec["measure"].items() if k != "pid_file"}},
                          store_uri, **options)


def test_a_real_autotvm_job_killed_mid_job_resumes_its_tuner_from_the_committed_batches(tmp_path, store_uri):
    """The autotvm dialect under the local manager: the worker is SIGKILLed once two batches
    are committed; the retry replays them into the tuner and measures only the rest."""
    import threading
    import time

    job = {"dialect": "autotvm", "task_name": "dense_pack.x86", "target": "llvm",
           "args": [["TENSOR", [8, 16], "float32"], ["TENSOR", [16, 16], "float32"], None, "float32"],
           "trials": 12, "batch_size": 2, "tuner": "xgb", "tuner_options": {"plan_size": 4},
           "measure": {"repeat": 2, "build_timeout_s": 60, "pid_file": str(tmp_path / "pids")}}
    job_id = Job.from_spec(job).job_id
    trace_file = tmp_path / "trace.jsonl"
    result = {}
    master = threading.Thread(target=lambda: result.update(summary=run_jobs(
        [job], store_uri=store_uri, runner=_pid_logging_runner, trace_file=trace_file, log=lambda message: None)))
    master.start()
    deadline = time.monotonic() + 120
    committed = 0
    while committed < 4 and time.monotonic() < deadline and master.is_alive():
        time.sleep(0.1)
        if (tmp_path / "warehouse" / "records").exists():
            committed = committed_records(store_uri, job_id)
    os.kill(int((tmp_path / "pids").read_text().split()[0]), signal.SIGKILL)
    master.join(timeout=300)
    summary = result["summary"]
    assert (summary.done, summary.retried, summary.records) == (1, 1, 12)
    done = read_events(trace_file)[0][-1]
    assert done["state"] == "done" and done["resumed"] >= 4 and done["resumed"] + done["measured"] == 12
    with open_store(store_uri) as store:
        configs = store.scan(columns=["config"]).column("config").to_pylist()
    assert len(configs) == len(set(configs)) == 12


def test_a_job_that_keeps_dying_fails_after_max_retries(tmp_path):
    def always_crash_runner(spec, store_uri, **options):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)

    summary = run_jobs(synthetic_jobs(1, tmp_path), runner=always_crash_runner, max_retries=1,
                       trace_file=tmp_path / "t.jsonl")
    assert (summary.done, summary.failed, summary.retried) == (0, 1, 1)
    assert "gave up after 2 attempts" in next(iter(summary.failures.values()))


def test_bad_workloads_and_bad_specs_fail_alone_and_the_batch_goes_on(tmp_path, store_uri):
    jobs = synthetic_jobs(2, tmp_path)
    jobs.append({**jobs[0], "args": [-4, 16, 16]})
    jobs.append({"dialect": "autotvm", "target": "llvm"})
    trace_file = tmp_path / "t.jsonl"
    summary = run_jobs(jobs, store_uri=store_uri, runner=synthetic_runner, trace_file=trace_file)
    assert (summary.done, summary.failed) == (2, 2)
    errors = sorted(state.error for state in read_trace(trace_file).values() if state.state == "failed")
    assert errors[0].startswith("WorkloadError: cannot build 'dense' with args [-4, 16, 16]")
    assert "jobs[3]: a job needs 'task_name' and 'args'" in errors[1]


def test_an_unknown_dialect_is_one_clear_failure(tmp_path):
    summary = run_jobs([{**DENSE_JOB, "dialect": "nosuch"}], trace_file=tmp_path / "t.jsonl")
    assert summary.failed == 1
    assert "DialectError: unknown dialect 'nosuch'" in next(iter(summary.failures.values()))


def test_resuming_with_the_trace_skips_finished_jobs(tmp_path, store_uri):
    jobs = synthetic_jobs(4, tmp_path)
    trace_file = tmp_path / "t.jsonl"
    first = run_jobs(jobs[:2], store_uri=store_uri, runner=synthetic_runner, trace_file=trace_file)
    second = run_jobs(jobs, store_uri=store_uri, runner=synthetic_runner, trace_file=trace_file)
    assert (first.done, second.done, second.skipped) == (2, 2, 2)
    ran = executions(tmp_path)
    assert len(ran) == len(set(ran)) == 4


def test_a_job_left_running_whose_records_are_committed_is_not_measured_again(tmp_path, store_uri):
    jobs = synthetic_jobs(1, tmp_path)
    job = Job.from_spec(jobs[0])
    run_jobs(jobs, store_uri=store_uri, runner=synthetic_runner)
    trace_file = tmp_path / "t.jsonl"
    with TraceWriter(trace_file) as trace:
        trace.write(job.job_id, "pending", spec=job.spec)
        trace.write(job.job_id, "running", attempt=1)
    summary = run_jobs(jobs, store_uri=store_uri, runner=synthetic_runner, trace_file=trace_file)
    assert (summary.done, summary.reused, summary.records) == (1, 1, 3)
    assert executions(tmp_path) == [job.job_id]


def _take_slot_and_report(lock_dir: Path, released_marker: Path, queue) -> None:
    with measurement_slot(1, lock_dir=lock_dir):
        queue.put(released_marker.exists())


def test_one_measurement_slot_per_host_makes_other_processes_wait(tmp_path):
    import multiprocessing
    import time

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    marker = tmp_path / "released"
    with measurement_slot(1, lock_dir=tmp_path):
        child = context.Process(target=_take_slot_and_report, args=(tmp_path, marker, queue))
        child.start()
        time.sleep(0.5)
        marker.touch()
    assert queue.get(timeout=30) is True
    child.join()


def test_with_two_slots_a_holder_is_pinned_to_half_the_cores(tmp_path):
    import os

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    with measurement_slot(2, lock_dir=tmp_path):
        assert len(os.sched_getaffinity(0)) == len(cores) // 2
    assert sorted(os.sched_getaffinity(0)) == cores


def test_an_unreachable_store_is_one_clear_error_before_any_job_runs(tmp_path, aws_credentials):
    from lorien.errors import StoreUnreachableError

    store_uri = "parquet:s3://no-bucket/prefix?endpoint_url=http://127.0.0.1:9&region=us-east-1"
    with pytest.raises(StoreUnreachableError, match="127.0.0.1:9"):
        run_jobs(synthetic_jobs(2, tmp_path), store_uri=store_uri, runner=synthetic_runner)
    assert executions(tmp_path) == []
