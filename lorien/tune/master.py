"""The tuning master: hands jobs to a manager, retries lost attempts, traces every change.

``run_jobs(jobs, manager="local" | "dask" | "aws-batch", trace_file=F)`` writes each state
change to the trace F before acting on it. Run again with the same trace file and jobs
already ``done`` (or ``failed`` for good) are skipped. Every attempt resumes from what the
job committed before (its batches are committed as they are measured): a retried job, a job
the killed master left ``running``, or a job of an earlier run into the same store measures
only what is missing from its budget, and a complete job nothing.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorien.errors import ConfigError
from lorien.tune.jobspec import Job, JobList, canonical_json, load_job
from lorien.tune.local import workload_name
from lorien.tune.managers import create_manager
from lorien.tune.managers.base import (
    Completion,
    JobManager,
    Runner,
    Task,
    execute_job,
)
from lorien.tune.resume import JobJournal, jobs_with_records
from lorien.tune.trace import JobState, TraceWriter, read_events, read_trace

DEFAULT_MAX_RETRIES = 2


@dataclass
class RunSummary:
    """What a run did. ``skipped`` jobs were finished by an earlier run of the same trace."""

    total: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    retried: int = 0
    reused: int = 0
    records: int = 0
    measured: int = 0
    resumed: int = 0
    elapsed_s: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)

    @property
    def jobs_per_s(self) -> float:
        ran = self.done + self.failed
        return ran / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        return (f"jobs={self.total} done={self.done} failed={self.failed} skipped={self.skipped} "
                f"retried={self.retried} reused={self.reused} records={self.records} "
                f"measured={self.measured} resumed={self.resumed} elapsed_s={self.elapsed_s:.2f}")


class _Tracer:
    """The trace writer, or nothing when no trace file was asked for."""

    def __init__(self, trace_file: str | Path | None):
        self._writer = TraceWriter(trace_file) if trace_file else None

    def __call__(self, job_id: str, state: str, **fields: Any) -> None:
        if self._writer is not None:
            self._writer.write(job_id, state, **fields)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _as_jobs(jobs: JobList | Iterable[Job | dict[str, Any]]) -> tuple[list[Job], list[ConfigError]]:
    if isinstance(jobs, JobList):
        return list(jobs.jobs), list(jobs.errors)
    parsed: list[Job] = []
    errors: list[ConfigError] = []
    for index, job in enumerate(jobs):
        if isinstance(job, Job):
            parsed.append(job)
            continue
        try:
            parsed.append(Job.from_spec(job, where=f"jobs[{index}]"))
        except ConfigError as exc:
            errors.append(exc)
    return parsed, errors


def _error_id(error: ConfigError) -> str:
    import hashlib

    return "invalid-" + hashlib.blake2b(str(error).encode(), digest_size=6).hexdigest()


def run_jobs(jobs: JobList | Iterable[Job | dict[str, Any]], manager: str | JobManager = "local",
             trace_file: str | Path | None = None, store_uri: str | None = None,
             max_retries: int = DEFAULT_MAX_RETRIES, runner: Runner | None = None,
             retry_failed: bool = False, log: Callable[[str], None] | None = None,
             progress: bool = False, **manager_options: Any) -> RunSummary:
    """Run every job through ``manager`` and return what happened.

    ``runner(job_spec, store_uri) -> records`` replaces the dialect's tune (tests and
    benchmarks). A lost attempt (dead worker, unexpected exception) is retried up to
    ``max_retries`` times; a LorienError (bad workload, unknown dialect) fails the job at
    once. ``manager_options`` go to the manager (``workers``, ``scheduler``, ``job_queue``...).
    ``progress`` shows jobs done / running / failed on stderr (a bar, or a line per job).
    """
    from lorien.progress import Progress

    log = log or (lambda message: print(message, file=sys.stderr))
    started = time.monotonic()
    job_list, invalid = _as_jobs(jobs)
    unique: dict[str, Job] = {}
    for job in job_list:
        unique.setdefault(job.job_id, job)
    summary = RunSummary(total=len(unique) + len(invalid))
    previous: dict[str, JobState] = {}
    if trace_file and Path(trace_file).exists():
        _events, torn_lines = read_events(trace_file)
        if torn_lines:
            log(f"trace {trace_file}: ignored torn line(s) {torn_lines} (a killed master's last write)")
        previous = read_trace(trace_file)
    trace = _Tracer(trace_file)
    to_run: list[tuple[Job, int]] = []
    try:
        for error in invalid:
            error_id = _error_id(error)
            trace(error_id, "failed", error=str(error), attempt=0)
            log(f"job {error_id}: failed: {error}")
            summary.failed += 1
            summary.failures[error_id] = str(error)
            summary.states[error_id] = "failed"
        for job in unique.values():
            known = previous.get(job.job_id)
            if known is not None and (known.state == "done" or (known.state == "failed" and not retry_failed)):
                summary.skipped += 1
                summary.states[job.job_id] = known.state
                continue
            if known is None:
                trace(job.job_id, "pending", label=job.label, spec=job.spec)
            to_run.append((job, (known.attempt if known else 0) + 1))
        # Every attempt resumes from the store, but a job the store holds nothing of need not
        # scan it for itself: one scan for all jobs tells them (and an unreachable store fails
        # once, here). A job the trace knows looks anyway: a dead master's attempt may still
        # be committing it. Batch containers always look (the master may not reach the store).
        with_records = (jobs_with_records(store_uri, [job.job_id for job, _ in to_run])
                        if to_run and store_uri and manager != "aws-batch" else None)
        queue = deque(Task(job.job_id, job.spec, attempt, check_existing=with_records is None
                           or job.job_id in with_records or job.job_id in previous) for job, attempt in to_run)
        if queue:
            owned = isinstance(manager, str)
            job_manager = (create_manager(manager, store_uri=store_uri, runner=runner, **manager_options)
                           if isinstance(manager, str) else manager)
            try:
                with Progress(len(queue), "tune", unit="job", enabled=progress) as bar:
                    _drive(job_manager, queue, trace, summary, max_retries, bar.write if progress else log, bar)
            finally:
                if owned:
                    job_manager.close(cancel=sys.exc_info()[0] is not None)
    finally:
        trace.close()
    summary.elapsed_s = time.monotonic() - started
    return summary


def _drive(manager: JobManager, queue: deque[Task], trace: _Tracer, summary: RunSummary,
           max_retries: int, log: Callable[[str], None], bar: Any) -> None:
    in_flight = 0
    while queue or in_flight:
        while queue and in_flight < manager.capacity:
            task = queue.popleft()
            trace(task.job_id, "running", attempt=task.attempt)
            manager.submit(task)
            in_flight += 1
        for completion in manager.wait(timeout_s=1.0):
            in_flight -= 1
            retry = _settle(completion, trace, summary, max_retries, log)
            if retry is not None:
                queue.append(retry)
                continue
            task = completion.task
            bar.step(f"{summary.states[task.job_id]} {workload_name(task.spec)} ({task.job_id}); "
                     f"done {summary.done}, running {in_flight}, failed {summary.failed}")


def _settle(completion: Completion, trace: _Tracer, summary: RunSummary, max_retries: int,
            log: Callable[[str], None]) -> Task | None:
    """Trace one finished attempt; returns the next attempt when the job is retried."""
    task, outcome = completion.task, completion.outcome
    if outcome is not None and not outcome.error:
        trace(task.job_id, "done", attempt=task.attempt, worker=outcome.worker, records=outcome.records,
              measured=outcome.measured, resumed=outcome.resumed or None, reused=outcome.reused or None,
              superseded=outcome.superseded or None)
        summary.done += 1
        summary.records += outcome.records
        summary.measured += outcome.measured
        summary.resumed += outcome.resumed
        summary.reused += int(outcome.reused)
        summary.states[task.job_id] = "done"
        return None
    if outcome is not None:
        trace(task.job_id, "failed", attempt=task.attempt, worker=outcome.worker, error=outcome.error)
        log(f"job {task.job_id}: failed: {outcome.error}")
        summary.failed += 1
        summary.failures[task.job_id] = outcome.error
        summary.states[task.job_id] = "failed"
        return None
    if task.attempt <= max_retries:
        trace(task.job_id, "retried", attempt=task.attempt, error=completion.lost)
        log(f"job {task.job_id}: attempt {task.attempt} lost ({completion.lost}); retrying")
        summary.retried += 1
        return Task(task.job_id, task.spec, task.attempt + 1, check_existing=True)
    error = f"gave up after {task.attempt} attempts; last: {completion.lost}"
    trace(task.job_id, "failed", attempt=task.attempt, error=error)
    log(f"job {task.job_id}: failed: {error}")
    summary.failed += 1
    summary.failures[task.job_id] = error
    summary.states[task.job_id] = "failed"
    return None


def run_job_uri(uri: str, store_uri: str | None = None, runner: Runner | None = None) -> dict[str, Any]:
    """``lorien tune --job URI``: run one job spec here and commit straight to the store.

    Used inside AWS Batch containers. Each batch is committed to the store and kept beside the
    spec (:class:`lorien.tune.resume.JobJournal`), so a retried container resumes from the
    store and from there (whatever the store keeps) and measures only the rest; a complete job
    is not measured again. The outcome is written next to the spec as ``<spec>.result.json``.
    """
    from lorien.warehouse.archive import write_bytes_uri

    job = load_job(uri)
    journal = JobJournal(uri)
    outcome = execute_job(Task(job.job_id, job.spec, attempt=1, check_existing=True), store_uri, runner,
                          guard=journal)
    result = outcome.to_dict()
    write_bytes_uri(journal.result_uri, canonical_json(result).encode())
    return result


def format_summary(summary: RunSummary) -> str:
    lines = [summary.line()]
    for job_id, error in summary.failures.items():
        lines.append(f"  failed {job_id}: {error}")
    return "\n".join(lines)


def summary_json(summary: RunSummary, store_uri: str | None = None) -> str:
    """The run summary as one JSON object (``lorien tune --manager ... --json``)."""
    return json.dumps({"store": store_uri, "total": summary.total, "done": summary.done,
                       "failed": summary.failed, "skipped": summary.skipped, "retried": summary.retried,
                       "reused": summary.reused, "records": summary.records, "measured": summary.measured,
                       "resumed": summary.resumed,
                       "elapsed_s": round(summary.elapsed_s, 3), "failures": summary.failures,
                       "states": summary.states})


def tune_command(args: Any) -> int:
    """``lorien tune`` with ``--job``, ``--manager`` or ``--trace-file`` (called from lorien.cli).

    ``--job URI`` runs one job spec here and commits to ``--store`` / ``$LORIEN_STORE`` (what an
    AWS Batch container runs); otherwise the config's jobs go through the chosen manager.
    """
    from lorien.warehouse import resolve_store_uri

    if args.job:
        result = run_job_uri(args.job, resolve_store_uri(args.store))
        print(json.dumps(result, sort_keys=True))  # one JSON object, with or without --json
        if result["error"]:
            print(f"lorien tune: job {result['job_id']} failed: {result['error']}", file=sys.stderr)
            return 1
        return 0
    if not args.config:
        raise ConfigError("give a tuning CONFIG.yaml (see docs/tuning.md) or --job URI")
    from lorien.tune.config import load_tune_config

    config = load_tune_config(args.config)
    cost_model = getattr(args, "cost_model", None)
    for job in config.jobs:
        job.update({key: value for key, value in (("trials", args.trials), ("tuner", args.tuner))
                    if value is not None})
        if cost_model:
            job["cost_model"] = str(Path(cost_model).resolve())
    store_uri = resolve_store_uri(args.store, config.store_uri)
    options: dict[str, Any] = {"workers": args.workers, "measure_slots": args.measure_slots}
    if args.manager == "dask":
        options["scheduler"] = args.scheduler
    if args.manager == "aws-batch":
        missing = [flag for flag, value in (("--job-queue", args.job_queue),
                                            ("--job-definition", args.job_definition),
                                            ("--spec-prefix", args.spec_prefix)) if not value]
        if missing:
            raise ConfigError(f"--manager aws-batch needs {', '.join(missing)}")
        options = {"job_queue": args.job_queue, "job_definition": args.job_definition,
                   "spec_prefix": args.spec_prefix, "region": args.region}
    summary = run_jobs(config.jobs, manager=args.manager or "local", trace_file=args.trace_file,
                       store_uri=store_uri, max_retries=args.max_retries,
                       progress=not args.no_progress, **options)
    from lorien.warehouse.base import build_serving_indexes

    build_serving_indexes(store_uri)  # once, after every worker committed
    print(summary_json(summary, store_uri) if args.json else format_summary(summary))
    return 1 if summary.failed else 0
