"""What every job manager shares: the task handed to a worker, what comes back, the code a
worker runs for one job, and the per-host measurement slot.

A worker runs :func:`execute_job`: it takes a measurement slot on its host (so two jobs
never measure on the same cores at once), tunes the job through its dialect (or a test's
``runner``), tags every record with the job id and commits them to the store in one commit.
A retried or resumed job first looks in the store for that tag: if the job's records are
already there, nothing is measured again and nothing is duplicated.
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

#: ``runner(job_spec, store_uri) -> records``; the default tunes through the job's dialect.
Runner = Callable[[dict[str, Any], "str | None"], Iterable[TuningRecord]]

SOURCE_PREFIX = "lorien-job:"
MEASURE_LOCK_DIR_ENV = "LORIEN_MEASURE_LOCK_DIR"
MEASURE_SLOTS_ENV = "LORIEN_MEASURE_SLOTS"


@dataclass(frozen=True)
class Task:
    """One attempt of one job, as handed to a manager."""

    job_id: str
    spec: dict[str, Any]
    attempt: int
    check_existing: bool


@dataclass
class JobOutcome:
    """What a worker reports for one attempt. ``error`` set means a permanent failure
    (bad input: the job would fail the same way again)."""

    job_id: str
    attempt: int
    worker: str
    records: int = 0
    reused: bool = False
    error: str = ""
    elapsed_s: float = 0.0

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


def source_tag(job_id: str) -> str:
    """The ``source`` every record of a job is committed with."""
    return f"{SOURCE_PREFIX}{job_id}"


def job_source_tag(job: dict[str, Any]) -> str:
    """The source tag of a job's records when it runs through a manager (so resume finds them)."""
    from lorien.tune.jobspec import job_id_of

    return source_tag(job_id_of(job))


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def dialect_runner(spec: dict[str, Any], store_uri: str | None) -> Iterable[TuningRecord]:
    """The default runner: ``get_dialect(job["dialect"]).tune(job, store_uri, commit=False)``.

    The dialect only measures; :func:`execute_job` commits the whole job once, so a lost
    attempt leaves no partial records behind for its retry to duplicate.
    """
    from lorien.dialect import get_dialect

    return get_dialect(spec["dialect"]).tune(spec, store_uri, commit=False)


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


class CommitGuard:
    """Where the attempts of one job learn that the job is already committed. This default
    knows nothing (the store is asked instead); the dask manager's guard asks the scheduler."""

    def committed(self) -> int | None:
        """Records committed by an earlier attempt of the job, or None if none is known."""
        return None

    def remember(self, records: int) -> None:
        """Note that the job's records are committed."""


def execute_job(task: Task, store_uri: str | None, runner: Runner | None = None,
                measure_slots: int | None = None, guard: CommitGuard | None = None) -> JobOutcome:
    """Run one attempt of one job on this worker and commit its records once.

    A LorienError (unknown dialect, a workload that cannot be built, a bad spec) becomes a
    permanent failure in the outcome; anything else propagates and the attempt is retried.
    """
    guard = guard or CommitGuard()
    started = time.monotonic()
    outcome = JobOutcome(job_id=task.job_id, attempt=task.attempt, worker=worker_name())
    try:
        existing = guard.committed()
        if existing is None and task.check_existing:
            existing = committed_records(store_uri, task.job_id) or None
        if existing is not None:
            outcome.records, outcome.reused = existing, True
            outcome.elapsed_s = time.monotonic() - started
            return outcome
        tag = source_tag(task.job_id)
        with measurement_slot(measure_slots):
            records = [record.with_changes(source=tag, record_id=record.record_id)
                       for record in (runner or dialect_runner)(task.spec, store_uri)]
        outcome.records = len(records)
        if store_uri is not None and records:
            # A retried or resumed job may race an attempt thought lost (a dead master's
            # worker still running): if that one committed while this one measured, keep its
            # records, not ours.
            existing = guard.committed()
            if existing is None and task.check_existing:
                existing = committed_records(store_uri, task.job_id) or None
            if existing is not None:
                outcome.records, outcome.reused = existing, True
            else:
                from lorien.warehouse import open_store

                with open_store(store_uri) as store:
                    store.commit(records, nbest=task.spec.get("commit_nbest"))
            guard.remember(outcome.records)
    except LorienError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.elapsed_s = time.monotonic() - started
    return outcome


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
