"""The ``dask`` manager: jobs as tasks on a Dask cluster.

Connects to a running scheduler (``scheduler="tcp://host:8786"``, e.g. started with
``dask scheduler`` and ``dask worker`` on each machine) or starts a local cluster of worker
processes. Each attempt is one task with a unique key. A worker that dies takes its running
task with it; Dask reports it as ``KilledWorker`` (a local cluster is started with
``allowed-failures`` 0 and ``worker-saturation`` 1.0, so that happens at once and only to
the task that was running) and the master retries it itself, tracing each retry. Worker
processes are not daemonic, so a job's measurement may start its own worker processes.
The scheduler remembers which jobs are complete, so a finished task that Dask recomputes
(its result died with its worker) returns the outcome instead of measuring again, and which
attempt measures each job, so a dead master's task still running stops before its next commit
once a resumed master's attempt took the job over. Measurement on one host is serialized by
the per-host measurement slot (:func:`lorien.tune.managers.base.measurement_slot`), whatever
number of workers share it.
"""

from __future__ import annotations

from typing import Any

from lorien.errors import ConfigError
from lorien.tune.managers.base import (
    Completion,
    JobManager,
    JobOutcome,
    Runner,
    Task,
    execute_job,
)
from lorien.tune.resume import CommitGuard


class DaskManager(JobManager):
    """Submits each attempt as a Dask task; ``capacity`` bounds tasks queued at the scheduler."""

    def __init__(self, store_uri: str | None = None, runner: Runner | None = None,
                 scheduler: str | None = None, workers: int = 2, threads_per_worker: int = 1,
                 measure_slots: int | None = None, capacity: int = 10_000,
                 connect_timeout_s: float = 10.0, client: Any = None):
        try:
            import dask
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise ConfigError("the dask manager needs dask[distributed]: pip install 'lorien[dask]'") from exc
        self.store_uri = store_uri
        self.runner = runner
        self.measure_slots = measure_slots
        self.capacity = capacity
        self._cluster = None
        self._owns_client = client is None
        if client is not None:
            self.client = client
        elif scheduler:
            try:
                self.client = Client(scheduler, timeout=f"{connect_timeout_s}s")
            except OSError as exc:
                raise ConfigError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc
        else:
            with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                                  "distributed.scheduler.worker-saturation": 1.0,
                                  "distributed.worker.daemon": False}):
                self._cluster = LocalCluster(n_workers=workers, threads_per_worker=threads_per_worker,
                                             processes=True, dashboard_address=None)
            self.client = Client(self._cluster)
        self._futures: dict[str, tuple[Task, Any]] = {}

    @property
    def scheduler_address(self) -> str:
        return self.client.scheduler.address

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes of the local cluster this manager started."""
        if self._cluster is None:
            return []
        pids = []
        for nanny in self._cluster.workers.values():
            worker_process = getattr(nanny, "process", None)
            process = getattr(worker_process, "process", None)
            if process is not None and process.pid:
                pids.append(process.pid)
        return sorted(pids)

    def submit(self, task: Task) -> None:
        key = f"lorien-job-{task.job_id}-attempt-{task.attempt}"
        future = self.client.submit(run_dask_task, task, self.store_uri, self.runner, self.measure_slots,
                                    key=key, pure=False, retries=0)
        self._futures[key] = (task, future)

    def wait(self, timeout_s: float) -> list[Completion]:
        from distributed import wait

        if not self._futures:
            return []
        futures = [future for _task, future in self._futures.values()]
        try:
            finished = wait(futures, timeout=timeout_s, return_when="FIRST_COMPLETED").done
        except TimeoutError:
            return []
        completions = []
        for future in finished:
            task, _ = self._futures.pop(future.key)
            completions.append(self._completion(task, future))
            future.release()  # a result left on a worker would be recomputed if that worker died
        return completions

    @staticmethod
    def _completion(task: Task, future: Any) -> Completion:
        from distributed import CancelledError, KilledWorker

        if future.status == "finished":
            outcome = future.result()
            return Completion(task, outcome=outcome if isinstance(outcome, JobOutcome)
                              else JobOutcome(**outcome))
        try:
            error = future.exception()
        except CancelledError:
            return Completion(task, lost="task was cancelled (scheduler lost?)")
        if isinstance(error, KilledWorker):
            return Completion(task, lost=f"Dask worker died running it ({error})")
        return Completion(task, lost=f"attempt raised {type(error).__name__}: {error}")

    def close(self, cancel: bool = False) -> None:
        if cancel and self._futures:
            self.client.cancel([future for _task, future in self._futures.values()])
        self._futures.clear()
        if self._owns_client:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()



class SchedulerCommitGuard(CommitGuard):
    """A job's state kept in the scheduler's metadata: its record count once complete (a finished
    task that Dask recomputes, or a resumed master's attempt of a job the dead master's task
    completed, then measures nothing again) and the attempt measuring it now (a dead master's
    task still running stops before its next commit once a resumed master's attempt claimed the
    job; the batch it was measuring then is all that may be measured twice).

    No scheduler lock is taken around commits: a lock held by a killed worker stays taken
    until its lease times out, which stalls every retry of that job."""

    def __init__(self, job_id: str):
        import uuid

        from distributed import get_client

        self.client = get_client()
        self.job_id = job_id
        self.token = uuid.uuid4().hex
        self.metadata_key = ["lorien-job-committed", job_id]
        self.owner_key = ["lorien-job-owner", job_id]

    def committed(self) -> int | None:
        return self.client.get_metadata(self.metadata_key, default=None)

    def remember(self, records: int) -> None:
        self.client.set_metadata(self.metadata_key, records)

    def claim(self) -> bool:
        claimed_before = self.client.get_metadata(self.owner_key, default=None) is not None
        self.client.set_metadata(self.owner_key, self.token)
        return claimed_before

    def owns(self) -> bool:
        return self.client.get_metadata(self.owner_key, default=self.token) == self.token


def run_dask_task(task: Task, store_uri: str | None, runner: Runner | None,
                  measure_slots: int | None) -> JobOutcome:
    """One attempt on a Dask worker, guarded by the scheduler (see SchedulerCommitGuard)."""
    return execute_job(task, store_uri, runner, measure_slots, guard=SchedulerCommitGuard(task.job_id))
