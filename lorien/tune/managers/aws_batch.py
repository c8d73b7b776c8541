"""The ``aws-batch`` manager: each attempt is an AWS Batch job running
``lorien tune --job s3://.../JOB_ID.json`` in a container, which commits straight to the store.

The master uploads each job spec (plain JSON) under ``spec_prefix``, submits it to
``job_queue`` with ``job_definition`` (the container command and ``LORIEN_STORE`` are set
through container overrides), polls ``describe_jobs``, and reads the outcome the container
writes next to the spec (``JOB_ID.result.json``). A Batch job that fails without a Lorien
error (host lost, spot reclaimed, out of memory) is retried by the master; a Lorien error
(exit code 1 and an error in the outcome) fails the job for good. Credentials come from
the standard AWS chain and are never put into commands, environments, traces or messages.
"""

from __future__ import annotations

import json
import time
from typing import Any

from lorien.errors import ConfigError, StoreError
from lorien.tune.jobspec import result_uri
from lorien.tune.managers.base import Completion, JobManager, JobOutcome, Runner, Task

#: Batch states before a container starts (cancel_job applies); later ones need terminate_job.
BEFORE_START = ("SUBMITTED", "PENDING", "RUNNABLE")
CANCEL_REASON = "cancelled by the lorien tuning master"


class AwsBatchManager(JobManager):
    """Submits, describes and cancels AWS Batch jobs through boto3."""

    def __init__(self, job_queue: str, job_definition: str, spec_prefix: str,
                 store_uri: str | None = None, runner: Runner | None = None,
                 endpoint_url: str | None = None, region: str | None = None,
                 poll_s: float = 10.0, capacity: int = 1000, command: list[str] | None = None,
                 client: Any = None):
        if runner is not None:
            raise ConfigError("the aws-batch manager runs `lorien tune --job` in containers; "
                              "a Python runner cannot be shipped to it")
        if not spec_prefix.startswith("s3://"):
            raise ConfigError(f"aws-batch needs an s3:// spec prefix for job specs, got {spec_prefix!r}")
        import boto3

        self.job_queue = job_queue
        self.job_definition = job_definition
        self.spec_prefix = spec_prefix
        self.store_uri = store_uri
        self.poll_s = poll_s
        self.capacity = capacity
        self.command = command or ["lorien", "tune", "--job"]
        self.client = client or boto3.client("batch", endpoint_url=endpoint_url, region_name=region)
        self._in_flight: dict[str, tuple[Task, str]] = {}
        self._last_status: dict[str, str] = {}
        self._last_poll = 0.0

    def spec_uri(self, job_id: str) -> str:
        """Where a job's spec is uploaded (query options of the prefix kept)."""
        path, sep, query = self.spec_prefix.partition("?")
        return f"{path.rstrip('/')}/{job_id}.json{sep}{query}"

    def submit(self, task: Task) -> None:
        from lorien.warehouse.archive import write_bytes_uri

        spec_uri = self.spec_uri(task.job_id)
        write_bytes_uri(spec_uri, json.dumps(task.spec, sort_keys=True).encode())
        overrides: dict[str, Any] = {"command": [*self.command, spec_uri]}
        if self.store_uri:
            overrides["environment"] = [{"name": "LORIEN_STORE", "value": self.store_uri}]
        response = self._call("submit_job", jobName=f"lorien-{task.job_id}-attempt-{task.attempt}",
                              jobQueue=self.job_queue, jobDefinition=self.job_definition,
                              containerOverrides=overrides)
        self._in_flight[response["jobId"]] = (task, spec_uri)

    def describe(self, batch_job_ids: list[str]) -> dict[str, dict[str, Any]]:
        """``describe_jobs`` for any number of ids (100 per call), keyed by Batch job id."""
        described: dict[str, dict[str, Any]] = {}
        for start in range(0, len(batch_job_ids), 100):
            response = self._call("describe_jobs", jobs=batch_job_ids[start:start + 100])
            described.update({job["jobId"]: job for job in response["jobs"]})
        return described

    def wait(self, timeout_s: float) -> list[Completion]:
        if not self._in_flight:
            return []
        pause = self._last_poll + self.poll_s - time.monotonic()
        if pause > 0:
            time.sleep(min(pause, timeout_s))
            if pause > timeout_s:
                return []
        self._last_poll = time.monotonic()
        completions = []
        for batch_id, job in self.describe(list(self._in_flight)).items():
            self._last_status[batch_id] = job["status"]
            if job["status"] in ("SUCCEEDED", "FAILED"):
                task, spec_uri = self._in_flight.pop(batch_id)
                completions.append(self._completion(task, spec_uri, batch_id, job))
        return completions

    def _completion(self, task: Task, spec_uri: str, batch_id: str, job: dict[str, Any]) -> Completion:
        result = _read_result(result_uri(spec_uri))
        worker = f"aws-batch:{batch_id}"
        if job["status"] == "SUCCEEDED":
            result = result or {}
            return Completion(task, outcome=JobOutcome(
                task.job_id, task.attempt, worker, records=int(result.get("records", 0)),
                reused=bool(result.get("reused")), measured=int(result.get("measured", 0)),
                resumed=int(result.get("resumed", 0)), superseded=bool(result.get("superseded"))))
        if result and result.get("error"):
            return Completion(task, outcome=JobOutcome(task.job_id, task.attempt, worker,
                                                       error=str(result["error"])))
        exit_code = job.get("container", {}).get("exitCode")
        reason = job.get("statusReason", "no reason given")
        return Completion(task, lost=f"Batch job {batch_id} failed ({reason}; exit code {exit_code})")

    def cancel(self, batch_job_id: str, reason: str = CANCEL_REASON) -> None:
        """Cancel a job that has not started, terminate one that has."""
        status = self._last_status.get(batch_job_id, "SUBMITTED")
        action = "cancel_job" if status in BEFORE_START else "terminate_job"
        self._call(action, jobId=batch_job_id, reason=reason)

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for batch_id in list(self._in_flight):
                self.cancel(batch_id)
        self._in_flight.clear()

    @property
    def in_flight(self) -> dict[str, str]:
        """Batch job id -> Lorien job id of the attempts not yet finished."""
        return {batch_id: task.job_id for batch_id, (task, _uri) in self._in_flight.items()}

    def _call(self, action: str, **params: Any) -> dict[str, Any]:
        import botocore.exceptions

        try:
            return getattr(self.client, action)(**params)
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            raise ConfigError(f"AWS Batch {action} failed: {error.get('Code', '?')}: "
                              f"{error.get('Message', '')}") from None
        except botocore.exceptions.EndpointConnectionError as exc:
            raise ConfigError(f"AWS Batch endpoint unreachable for {action}: {exc}") from None
        except botocore.exceptions.NoCredentialsError:
            raise ConfigError(f"no AWS credentials for Batch {action}; use the standard AWS chain "
                              "(AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, instance role)") from None


def _read_result(uri: str) -> dict[str, Any] | None:
    """The outcome a container wrote next to its spec, or None when it wrote none."""
    from lorien.warehouse.archive import read_text_uri

    try:
        return json.loads(read_text_uri(uri))
    except StoreError:
        return None
