"""What every job manager shares: the task handed to a worker, what comes back, the code a
worker runs for one job, and the per-host measurement slot.

A worker runs :func:`execute_job`: it takes a measurement slot on its host (so two jobs
never measure on the same cores at once), reads what earlier attempts of the job committed
(:mod:`lorien.tune.resume`), tunes the job through its dialect (or a test's ``runner``) from
there, and commits every measured batch as it completes, tagged with the job id. A worker
killed mid-job loses at most the batch it was measuring; its retry measures only the rest.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lorien.errors import LorienError
from lorien.record import TuningRecord
from lorien.tune.resume import (
    SOURCE_PREFIX,
    AttemptSuperseded,
    CommitGuard,
    earlier_records,
    source_tag,
)

#: ``runner(job_spec, store, **options) -> records``: ``store`` is the worker's open store (or
#: None), options as for :func:`lorien.tune.loop.tune_job` (``resume``, ``on_batch``,
#: ``source``); the default tunes in the one tuning loop, and the worker commits.
Runner = Callable[..., Iterable[TuningRecord]]

MEASURE_LOCK_DIR_ENV = "LORIEN_MEASURE_LOCK_DIR"
MEASURE_SLOTS_ENV = "LORIEN_MEASURE_SLOTS"

__all__ = ["SOURCE_PREFIX", "CommitGuard", "Completion", "JobManager", "JobOutcome", "Runner", "Task",
           "committed_records", "execute_job", "measurement_slot", "source_tag", "warm_up_store"]


@dataclass(frozen=True)
class Task:
    """One attempt of one job, as handed to a manager. ``check_existing``: read what earlier
    attempts or runs of the job committed and resume from it (False: measure the whole budget)."""

    job_id: str
    spec: dict[str, Any]
    attempt: int
    check_existing: bool


@dataclass
class JobOutcome:
    """What a worker reports for one attempt. ``error`` set means a permanent failure
    (bad input: the job would fail the same way again). ``records``: the job's records after
    this attempt, ``resumed`` of them committed before it and ``measured`` by it; ``reused``:
    the job was complete already, ``superseded``: a later attempt took the job over."""

    job_id: str
    attempt: int
    worker: str
    records: int = 0
    reused: bool = False
    error: str = ""
    elapsed_s: float = 0.0
    measured: int = 0
    resumed: int = 0
    superseded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Completion:
    """A finished attempt as the master sees it: an outcome, or a lost / crashed attempt."""

    task: Task
    outcome: JobOutcome | None = None
    lost: str = ""


class JobManager(ABC):
    """Runs tasks somewhere and reports them back as they complete."""

    #: How many tasks the master keeps in flight at once.
    capacity: int = 1

    @abstractmethod
    def submit(self, task: Task) -> None:
        """Start one attempt."""

    @abstractmethod
    def wait(self, timeout_s: float) -> list[Completion]:
        """Attempts finished since the last call (possibly none after ``timeout_s``)."""

    @abstractmethod
    def close(self, cancel: bool = False) -> None:
        """Release resources; with ``cancel``, stop attempts still in flight."""

    def __enter__(self) -> JobManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def dialect_runner(spec: dict[str, Any], store: Any, **options: Any) -> Iterable[TuningRecord]:
    """The default runner: the tuning loop reads ``store`` (to resume) and measures; it does not
    commit, :func:`execute_job` does (in ``on_batch``)."""
    from lorien.tune.loop import tune_job

    return tune_job(spec, store, commit=False, **options).records


def committed_records(store_uri: str | None, job_id: str) -> int:
    """How many records of ``job_id`` the store already holds."""
    if store_uri is None:
        return 0
    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        return store.scan(filters={"source": source_tag(job_id)}, columns=["record_id"]).num_rows


def warm_up_store(store_uri: str | None) -> None:
    """Open the store and run one empty lookup, importing what commits and lookups need, so
    that forked workers start warm."""
    if store_uri is None:
        return
    from lorien.errors import StoreError

    try:
        committed_records(store_uri, "warm-up")
    except StoreError:
        return  # a store that cannot be opened yet is reported by the jobs themselves


class _BatchCommitter:
    """Commits a job's batches as the loop measures them (``on_batch``), tagged with the job,
    after checking that no later attempt took the job over."""

    def __init__(self, task: Task, store: Any, guard: CommitGuard):
        self.task, self.store, self.guard = task, store, guard
        self.tag = source_tag(task.job_id)
        self.committed: set[str] = set()

    def on_batch(self, _progress: Any, records: list[TuningRecord]) -> None:
        self.commit(records)

    def commit(self, records: Iterable[TuningRecord]) -> None:
        batch = [record.with_changes(source=self.tag, record_id=record.record_id) for record in records
                 if record.record_id not in self.committed]
        if not batch:
            return
        if not self.guard.owns():
            raise AttemptSuperseded(f"job {self.task.job_id}: a later attempt took it over")
        if self.store is not None:
            self.store.commit(batch, nbest=self.task.spec.get("commit_nbest"))
        self.guard.keep(batch)
        self.committed.update(record.record_id for record in batch)


def execute_job(task: Task, store_uri: str | None, runner: Runner | None = None,
                measure_slots: int | None = None, guard: CommitGuard | None = None) -> JobOutcome:
    """Run one attempt of one job on this worker, committing batch by batch.

    A LorienError (unknown dialect, a workload that cannot be built, a bad spec) becomes a
    permanent failure in the outcome; anything else propagates and the attempt is retried.
    """
    guard = guard or CommitGuard()
    started = time.monotonic()
    outcome = JobOutcome(job_id=task.job_id, attempt=task.attempt, worker=worker_name())
    try:
        complete = guard.committed()
        if complete is not None:
            outcome.records, outcome.reused = complete, True
        else:
            with measurement_slot(measure_slots):
                _attempt(task, store_uri, runner or dialect_runner, guard, outcome)
    except LorienError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.elapsed_s = time.monotonic() - started
    return outcome


def _attempt(task: Task, store_uri: str | None, runner: Runner, guard: CommitGuard, outcome: JobOutcome) -> None:
    """Claim the job, read what is committed, tune the rest and commit it batch by batch. Runs
    holding the slot: an attempt that held it meanwhile may have finished or started the job,
    so the guard is asked again, and an attempt that finds the job claimed before reads the
    store even where the master found nothing of it (a dead master's late attempt)."""
    complete = guard.committed()
    if complete is not None:
        outcome.records, outcome.reused = complete, True
        return
    from lorien.warehouse import open_store

    claimed_before = guard.claim()
    store = open_store(store_uri) if store_uri is not None else None
    try:
        earlier = (earlier_records(store, task.job_id, task.spec.get("target"), guard)
                   if task.check_existing or claimed_before else [])
        outcome.resumed = len(earlier)
        if earlier and len(earlier) >= int(task.spec.get("trials", 0)):
            outcome.records, outcome.reused = len(earlier), True
            guard.remember(outcome.records)
            return
        committer = _BatchCommitter(task, store, guard)
        try:
            records = runner(task.spec, store, resume=earlier, on_batch=committer.on_batch, source=committer.tag)
            committer.commit(records)  # what a runner measured without handing it to on_batch
        except AttemptSuperseded:
            outcome.superseded = outcome.reused = True
    finally:
        if store is not None:
            store.close()
    outcome.measured = len(committer.committed)
    outcome.records = outcome.resumed + outcome.measured
    if not outcome.superseded:
        guard.remember(outcome.records)


@contextmanager
def measurement_slot(slots: int | None = None, lock_dir: str | os.PathLike[str] | None = None
                     ) -> Iterator[int]:
    """Hold one of ``slots`` measurement slots of this host while measuring.

    Slots are ``flock``ed files, shared by every Lorien worker process of the host and freed
    by the kernel when a holder dies. With more than one slot, the host's cores are split
    evenly and the holder is pinned to its share, so concurrent jobs never measure on the
    same cores. ``slots`` defaults to ``$LORIEN_MEASURE_SLOTS`` or 1 (one job measures at a
    time per host).
    """
    slots = slots or int(os.environ.get(MEASURE_SLOTS_ENV, "1"))
    cores = sorted(os.sched_getaffinity(0))
    slots = max(1, min(slots, len(cores)))
    directory = Path(lock_dir or os.environ.get(MEASURE_LOCK_DIR_ENV) or tempfile.gettempdir())
    directory.mkdir(parents=True, exist_ok=True)
    handles = [open(directory / f"lorien-measure-{index}-of-{slots}.lock", "a")  # noqa: SIM115
               for index in range(slots)]
    try:
        slot = _acquire_any(handles)
        if slots > 1:
            share = len(cores) // slots
            os.sched_setaffinity(0, cores[slot * share:(slot + 1) * share])
        try:
            yield slot
        finally:
            if slots > 1:
                os.sched_setaffinity(0, cores)
            fcntl.flock(handles[slot], fcntl.LOCK_UN)
    finally:
        for handle in handles:
            handle.close()


def _acquire_any(handles: list[Any], poll_s: float = 0.02) -> int:
    start = os.getpid() % len(handles)
    order = [(start + offset) % len(handles) for offset in range(len(handles))]
    while True:
        for index in order:
            try:
                fcntl.flock(handles[index], fcntl.LOCK_EX | fcntl.LOCK_NB)
                return index
            except BlockingIOError:
                continue
        time.sleep(poll_s)
