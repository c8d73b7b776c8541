"""The aws-batch manager against moto's server Batch API: submit, describe, cancel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid

import boto3
import pytest

from lorien.errors import ConfigError
from lorien.tune.jobspec import Job, load_job, result_uri
from lorien.tune.managers.aws_batch import CANCEL_REASON, AwsBatchManager
from lorien.tune.managers.base import Task
from lorien.tune.managers.synthetic import synthetic_runner
from lorien.tune.master import run_job_uri, run_jobs
from lorien.tune.trace import read_trace
from lorien.warehouse import open_store
from lorien.warehouse.archive import read_text_uri

JOB = {"dialect": "autotvm", "task_name": "dense", "args": [4, 8, 8], "target": "llvm", "trials": 2, "batch_size": 1}
REAL_JOB = {"dialect": "autotvm", "task_name": "dense_nopack.x86",
            "args": [["TENSOR", [16, 16], "float32"], ["TENSOR", [16, 16], "float32"], None, "float32"],
            "target": "llvm", "tuner": "random", "trials": 2}


def _moto_api(endpoint: str, path: str, body: dict) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/{path}", data=json.dumps(body).encode(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass


@pytest.fixture
def batch_setup(moto_server, s3_bucket):
    """A job queue on an unmanaged compute environment and a job definition on the moto server."""
    name = f"lorien-{uuid.uuid4().hex[:8]}"
    iam = boto3.client("iam", endpoint_url=moto_server)
    batch = boto3.client("batch", endpoint_url=moto_server)
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    environment = batch.create_compute_environment(computeEnvironmentName=name, type="UNMANAGED",
                                                   state="ENABLED", serviceRole=role)
    batch.create_job_queue(jobQueueName=name, state="ENABLED", priority=1, computeEnvironmentOrder=[
        {"order": 1, "computeEnvironment": environment["computeEnvironmentArn"]}])
    batch.register_job_definition(jobDefinitionName=name, type="container", containerProperties={
        "image": "lorien:latest", "vcpus": 1, "memory": 512, "command": ["lorien", "--help"]})
    return {"job_queue": name, "job_definition": name, "client": batch,
            "spec_prefix": f"s3://{s3_bucket}/specs?endpoint_url={moto_server}&region=us-east-1"}


@pytest.fixture
def jobs_succeed_at_once(moto_server):
    """moto's Batch without Docker: every submitted job SUCCEEDS immediately."""
    _moto_api(moto_server, "config", {"batch": {"use_docker": False}})
    yield
    _moto_api(moto_server, "config", {"batch": {"use_docker": True}})


@pytest.fixture
def jobs_stay_submitted(moto_server):
    """moto's Batch keeps jobs SUBMITTED (no container ever starts), so they can be cancelled."""
    _moto_api(moto_server, "config", {"batch": {"use_docker": True}})
    _moto_api(moto_server, "state-manager/set-transition",
              {"model_name": "batch::job", "transition": {"progression": "manual", "times": 10**9}})
    yield
    _moto_api(moto_server, "state-manager/unset-transition", {"model_name": "batch::job"})


def test_submit_uploads_the_spec_and_runs_lorien_tune_job_in_the_container(batch_setup, jobs_succeed_at_once,
                                                                         tmp_path):
    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    setup = {key: batch_setup[key] for key in ("job_queue", "job_definition", "spec_prefix", "client")}
    summary = run_jobs([JOB], manager="aws-batch", store_uri=store_uri, poll_s=0.1,
                       trace_file=tmp_path / "t.jsonl", **setup)
    assert (summary.done, summary.failed) == (1, 0)
    job = Job.from_spec(JOB)
    batch_id = read_trace(tmp_path / "t.jsonl")[job.job_id].worker.removeprefix("aws-batch:")
    described = batch_setup["client"].describe_jobs(jobs=[batch_id])["jobs"][0]
    command = described["container"]["command"]
    assert command[:3] == ["lorien", "tune", "--job"]
    assert load_job(command[3]).job_id == job.job_id
    assert {"name": "LORIEN_STORE", "value": store_uri} in described["container"]["environment"]


def test_the_container_command_commits_to_the_store_and_the_master_reads_its_outcome(
        batch_setup, jobs_succeed_at_once, tmp_path, moto_server):
    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    manager = AwsBatchManager(store_uri=store_uri, poll_s=0.0, **batch_setup)
    job = Job.from_spec(REAL_JOB)
    manager.submit(Task(job.job_id, job.spec, attempt=1, check_existing=False))
    batch_id = next(iter(manager.in_flight))
    container = manager.describe([batch_id])[batch_id]["container"]
    environment = {item["name"]: item["value"] for item in container["environment"]}

    def run_container() -> dict:
        """What the Batch container does: the job's command with the job's environment."""
        finished = subprocess.run([sys.executable, "-m", "lorien.cli", *container["command"][1:]],
                                  env={**os.environ, **environment}, capture_output=True, text=True,
                                  timeout=300, check=False)
        assert finished.returncode == 0, finished.stderr
        return json.loads(finished.stdout)

    assert run_container()["records"] == 2
    completions = manager.wait(timeout_s=5)
    assert completions[0].outcome.records == 2
    assert json.loads(read_text_uri(result_uri(container["command"][3])))["records"] == 2
    assert run_container()["reused"] is True  # a Batch-level retry measures nothing again
    with open_store(store_uri) as store:
        assert store.scan(columns=["record_id"]).num_rows == 2


def test_a_container_killed_mid_job_is_resumed_from_the_jobs_journal_on_s3(batch_setup, jobs_succeed_at_once,
                                                                          tmp_path):
    """The container commits each batch to the store and to the job's journal beside its spec
    on S3. Killed after two batches, its retry -- here committing to a store that holds none of
    the job's records, as a DynamoDB store keeps only the best configs -- resumes from the
    journal and measures only the rest."""
    import time

    from lorien.tune.resume import JobJournal
    from lorien.warehouse.archive import list_uri

    manager = AwsBatchManager(store_uri=f"parquet:{tmp_path / 'warehouse'}", poll_s=0.0, **batch_setup)
    job = Job.from_spec({**REAL_JOB, "trials": 10, "batch_size": 2})
    manager.submit(Task(job.job_id, job.spec, attempt=1, check_existing=True))
    batch_id = next(iter(manager.in_flight))
    container = manager.describe([batch_id])[batch_id]["container"]
    spec_uri = container["command"][3]
    journal = JobJournal(spec_uri)
    environment = {item["name"]: item["value"] for item in container["environment"]}
    command = [sys.executable, "-m", "lorien.cli", *container["command"][1:]]
    killed = subprocess.Popen(command, env={**os.environ, **environment}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while len(list_uri(journal.records_uri)) < 2 and time.monotonic() < deadline and killed.poll() is None:
        time.sleep(0.2)
    killed.kill()
    killed.wait()
    kept = {record.config for record in journal.records()}
    assert 4 <= len(kept) < 10, "the container was not killed mid-job"
    retry = subprocess.run(command, env={**os.environ, **environment, "LORIEN_STORE": f"parquet:{tmp_path / 'other'}"},
                           capture_output=True, text=True, timeout=300, check=False)
    assert retry.returncode == 0, retry.stderr
    outcome = json.loads(retry.stdout)
    assert (outcome["resumed"], outcome["measured"], outcome["records"]) == (len(kept), 10 - len(kept), 10)
    journalled = [record.config for record in journal.records()]
    assert sorted(journalled) == sorted(set(journalled)) and set(journalled) >= kept and len(journalled) == 10
    with open_store(f"parquet:{tmp_path / 'other'}") as store:
        measured_now = set(store.scan(columns=["config"]).column("config").to_pylist())
    assert len(measured_now) == 10 - len(kept) and measured_now.isdisjoint(kept)
    assert manager.wait(timeout_s=5)[0].outcome.records == 10


def test_a_container_whose_job_a_later_attempt_claimed_stops_before_its_next_commit(s3_bucket, moto_server,
                                                                                   tmp_path):
    from lorien.tune.resume import JobJournal
    from lorien.warehouse.archive import write_bytes_uri

    spec = {**JOB, "trials": 4, "measure": {"log_dir": str(tmp_path)}}
    spec_uri = write_bytes_uri(f"s3://{s3_bucket}/specs/taken.json?endpoint_url={moto_server}&region=us-east-1",
                               json.dumps(spec).encode())

    def taken_over_after_one_batch(job_spec, store_uri, on_batch, **options):
        def commit_then_lose_the_job(progress, records):
            on_batch(progress, records)
            JobJournal(spec_uri, token="a-later-attempt").claim()
        return synthetic_runner(job_spec, store_uri, on_batch=commit_then_lose_the_job, **options)

    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    result = run_job_uri(spec_uri, store_uri, runner=taken_over_after_one_batch)
    assert (result["superseded"], result["measured"], result["error"]) == (True, 1, "")
    assert JobJournal(spec_uri).committed() is None  # the job is not complete: its new owner goes on
    with open_store(store_uri) as store:
        assert store.scan(columns=["record_id"]).num_rows == 1


def test_a_lorien_error_in_the_container_fails_the_job_without_retry(batch_setup, jobs_succeed_at_once,
                                                                     tmp_path):
    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    manager = AwsBatchManager(store_uri=store_uri, poll_s=0.0, **batch_setup)
    job = Job.from_spec({**REAL_JOB, "dialect": "nosuch"})
    manager.submit(Task(job.job_id, job.spec, attempt=1, check_existing=False))
    batch_id = next(iter(manager.in_flight))
    spec_uri = manager.describe([batch_id])[batch_id]["container"]["command"][3]
    assert run_job_uri(spec_uri, store_uri)["error"].startswith("DialectError: unknown dialect 'nosuch'")
    described = {"status": "FAILED", "container": {"exitCode": 1}, "statusReason": "Essential container exited"}
    completion = manager._completion(*manager._in_flight[batch_id], batch_id, described)
    assert completion.outcome.error.startswith("DialectError") and not completion.lost


def test_cancel_stops_submitted_jobs(batch_setup, jobs_stay_submitted):
    manager = AwsBatchManager(poll_s=0.0, **batch_setup)
    job = Job.from_spec(JOB)
    manager.submit(Task(job.job_id, job.spec, attempt=1, check_existing=False))
    assert manager.wait(timeout_s=1) == []
    batch_id = next(iter(manager.in_flight))
    assert manager.describe([batch_id])[batch_id]["status"] == "SUBMITTED"
    manager.close(cancel=True)
    assert manager.describe([batch_id])[batch_id]["statusReason"] == CANCEL_REASON


def test_an_unknown_job_queue_is_one_clear_error(batch_setup, jobs_succeed_at_once):
    setup = {**batch_setup, "job_queue": "no-such-queue"}
    manager = AwsBatchManager(poll_s=0.0, **setup)
    job = Job.from_spec(JOB)
    with pytest.raises(ConfigError, match="AWS Batch submit_job failed: .*no-such-queue"):
        manager.submit(Task(job.job_id, job.spec, attempt=1, check_existing=False))


def test_a_python_runner_cannot_be_shipped_to_batch(batch_setup):
    with pytest.raises(ConfigError, match="runs `lorien tune --job` in containers"):
        AwsBatchManager(runner=synthetic_runner, **batch_setup)
