"""Tune a network: its tasks (workloads with weights) under one trial budget, round by round,
the next task chosen by the task scheduler (:mod:`lorien.search.task_scheduler`).

Each round is one job (the task's job with ``trials`` = the round's size) run through a job
manager: in this process (default), ``local`` (child processes) or ``dask``. A round resumes
from the warehouse: the dialect reads what was measured for the task before, never measures
it again and trains its model on it; the round's records are committed when it ends. So a
run that is stopped resumes where it stopped (its trials count toward the budget), and
records of a log (``resume_log``) are committed to the warehouse first and count the same way.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorien.errors import ConfigError
from lorien.search.task_scheduler import SchedulerTask, TaskScheduler
from lorien.tune.config import TuneConfig
from lorien.tune.jobspec import job_id_of
from lorien.tune.managers.base import Completion, JobManager, JobOutcome, Task, execute_job

#: Retries of a round whose worker died.
MAX_RETRIES = 2


@dataclass
class TaskState:
    """One task of the network as the summary shows it."""

    name: str
    weight: float
    workload_key: str
    flop: float | None
    trials: int = 0
    best_cost_s: float = math.inf

    @property
    def best_gflops(self) -> float | None:
        return self.flop / self.best_cost_s / 1e9 if self.flop and math.isfinite(self.best_cost_s) else None


@dataclass
class NetworkSummary:
    """A network run: per-task outcomes and the estimated latency after every round."""

    strategy: str
    budget: int
    tasks: list[TaskState]
    history: list[tuple[float, int, float]] = field(default_factory=list)
    resumed_trials: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def latency_s(self) -> float:
        """Estimated network latency: sum of weight x best latency (inf while a task has none)."""
        return sum(t.weight * t.best_cost_s for t in self.tasks)

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (``lorien tune --json``; unknown latencies are null)."""
        def seconds(value: float) -> float | None:
            return value if math.isfinite(value) else None

        return {"strategy": self.strategy, "budget": self.budget, "trials": self.trials,
                "resumed_trials": self.resumed_trials, "latency_s": seconds(self.latency_s),
                "tasks": [{"name": t.name, "weight": t.weight, "workload_key": t.workload_key, "trials": t.trials,
                           "best_cost_s": seconds(t.best_cost_s), "best_gflops": t.best_gflops}
                          for t in self.tasks],
                "history": [{"elapsed_s": round(e, 3), "trials": n, "latency_s": seconds(v)}
                            for e, n, v in self.history],
                "failures": self.failures}


class InlineManager(JobManager):
    """Runs each round right here, one at a time (measurement workers are reused across rounds)."""

    capacity = 1

    def __init__(self, store_uri: str | None, runner: Callable[..., Any] | None = None):
        self.store_uri, self.runner = store_uri, runner
        self._done: list[Completion] = []

    def submit(self, task: Task) -> None:
        self._done.append(Completion(task, outcome=execute_job(task, self.store_uri, self.runner)))

    def wait(self, timeout_s: float) -> list[Completion]:
        done, self._done = self._done, []
        return done

    def close(self, cancel: bool = False) -> None:
        self._done.clear()


@dataclass(frozen=True)
class RoundRunner:
    """Picklable runner of one round: the tuning loop, appending to the task's native log."""

    log_dir: str | None

    def __call__(self, spec: dict[str, Any], store: Any, **options: Any) -> Any:
        """Tune the round; ``options`` are the job manager's (``resume``, ``on_batch``, ``source``:
        the manager commits each batch)."""
        from lorien.tune.local import log_path_for
        from lorien.tune.loop import tune_job

        log_path = str(log_path_for(Path(self.log_dir), spec)) if self.log_dir else None
        return tune_job(spec, store, commit=False, log_path=log_path, **options).records


def _describe(job: dict[str, Any]) -> tuple[str, float | None, str]:
    """(workload key, FLOPs, similarity group) of a job, through its dialect."""
    from lorien.dialect import get_dialect

    dialect = get_dialect(job["dialect"])
    key = dialect.workload_key(job["task_name"], list(job["args"]))
    return key, dialect.describe_workload(key)[1], f"{job['dialect']}:{job['task_name']}"


def _measured(store: Any, state: TaskState, target: str, dialect: str) -> tuple[int, float]:
    """(records, best latency) of a task already in the store."""
    from lorien.target import parse_target

    filters = {"workload_key": state.workload_key, "target": target, "dialect": dialect,
               "target_key": parse_target(target).alternate_key}
    count = store.scan(filters=filters, columns=["record_id"]).num_rows
    best = store.best(state.workload_key, target, k=1)
    return count, best[0].cost_s if best and best[0].cost_s else math.inf


def tune_network(config: TuneConfig, settings: dict[str, Any], store_uri: str, manager: str | None = None,
                 log_dir: str | Path | None = None, resume_log: str | Path | None = None,
                 progress: bool = True, log: Callable[[str], None] | None = None,
                 **manager_options: Any) -> NetworkSummary:
    """Tune ``config``'s jobs as one network under ``settings`` (the ``task_scheduler`` mapping)."""
    from lorien.tune.local import default_log_dir, workload_name
    from lorien.warehouse import open_store

    log = log or (lambda message: print(message, file=sys.stderr))
    jobs = config.jobs
    if resume_log is not None:
        from lorien.ingest import ingest_paths

        report = ingest_paths([str(resume_log)], store_uri=store_uri)
        log(f"resume log {resume_log}: {report.summary()}")
    states, scheduler_tasks = [], []
    for job in jobs:
        key, flop, group = _describe(job)
        weight = float(job.get("weight", 1.0))
        states.append(TaskState(workload_name(job), weight, key, flop))
        scheduler_tasks.append(SchedulerTask(workload_name(job), weight, flop, group))
    scheduler = TaskScheduler(scheduler_tasks, **{k: v for k, v in settings.items()
                                                  if k in ("strategy", "alpha", "beta", "backward_window_size",
                                                           "max_failed_rounds", "seed")})
    budget, round_trials = int(settings["trials"]), int(settings["round_trials"])
    summary = NetworkSummary(scheduler.strategy, budget, states)
    with open_store(store_uri) as store:
        for task_id, (state, job) in enumerate(zip(states, jobs, strict=True)):
            count, best = _measured(store, state, job["target"], job["dialect"])
            state.trials, state.best_cost_s = count, best
            scheduler.resume(task_id, count, best, round_trials)
    summary.resumed_trials = summary.trials
    started = time.monotonic()
    summary.history.append((0.0, summary.trials, summary.latency_s))
    logs = str(log_dir if log_dir is not None else default_log_dir(store_uri))
    runner = RoundRunner(logs)
    if manager is None:
        job_manager: JobManager = InlineManager(store_uri, runner)
    else:
        from lorien.tune.managers import create_manager

        if manager == "aws-batch":
            raise ConfigError("the task scheduler runs rounds locally or on Dask (--manager local or dask)")
        job_manager = create_manager(manager, store_uri=store_uri, runner=runner, **manager_options)
    try:
        _drive(scheduler, jobs, states, summary, job_manager, store_uri, budget, round_trials, started, progress,
               log)
    except KeyboardInterrupt as exc:
        exc.summary = summary  # type: ignore[attr-defined]
        raise
    finally:
        job_manager.close(cancel=sys.exc_info()[0] is not None)
    return summary


def round_spec(job: dict[str, Any], trials: int, round_: int) -> dict[str, Any]:
    """The job of one round of a task: ``trials`` trials, numbered, with a seed of its own
    (the job's seed, plus the round number less one), so that rounds draw fresh random
    candidates instead of repeating the first round's draws."""
    spec = {**job, "trials": trials, "round": round_, "seed": int(job.get("seed") or 0) + round_ - 1}
    spec.pop("weight", None)
    return spec


def _drive(scheduler: TaskScheduler, jobs: list[dict[str, Any]], states: list[TaskState], summary: NetworkSummary,
           manager: JobManager, store_uri: str, budget: int, round_trials: int, started: float, progress: bool,
           log: Callable[[str], None]) -> None:
    from lorien.warehouse import open_store

    in_flight: dict[str, tuple[int, int]] = {}  # job id -> (task, trials asked)
    rounds = 0
    while True:
        planned = sum(trials for _, trials in in_flight.values())
        while len(in_flight) < manager.capacity and summary.trials + planned < budget:
            task_id = scheduler.next_task(busy={t for t, _ in in_flight.values()})
            if task_id is None:
                break
            trials = min(round_trials, budget - summary.trials - planned)
            spec = round_spec(jobs[task_id], trials, scheduler.rounds[task_id] + 1)
            job_id = job_id_of(spec)
            in_flight[job_id] = (task_id, trials)
            planned += trials
            manager.submit(Task(job_id, spec, attempt=1, check_existing=False))
        if not in_flight:
            return
        for completion in manager.wait(timeout_s=1.0):
            task_id, asked = in_flight.pop(completion.task.job_id)
            state = states[task_id]
            outcome: JobOutcome | None = completion.outcome
            if outcome is None and completion.task.attempt <= MAX_RETRIES:
                log(f"round of {state.name} lost ({completion.lost}); retrying")
                retry = completion.task
                in_flight[retry.job_id] = (task_id, asked)
                manager.submit(Task(retry.job_id, retry.spec, retry.attempt + 1, check_existing=True))
                continue
            rounds += 1
            if outcome is None or outcome.error:
                problem = outcome.error if outcome is not None else completion.lost
                summary.failures.append(f"{state.name}: {problem}")
                log(f"round of {state.name} failed: {problem}")
                scheduler.update(task_id, 0, math.inf)
                continue
            with open_store(store_uri) as store:
                measured, best = _measured(store, state, jobs[task_id]["target"], jobs[task_id]["dialect"])
            new = max(0, measured - state.trials)
            state.trials, state.best_cost_s = measured, best
            scheduler.update(task_id, new, best)
            summary.history.append((time.monotonic() - started, summary.trials, summary.latency_s))
            if progress:
                latency = summary.latency_s
                log(f"round {rounds}: {state.name} +{new} trials, best {_ms(best)} ms; network "
                    f"{_ms(latency)} ms after {summary.trials}/{budget} trials")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f}" if math.isfinite(seconds) else "-"


def format_network_summary(summary: NetworkSummary) -> str:
    """Per-task table, the estimated network latency, and how it fell over the run."""
    header = ("task", "weight", "trials", "latency (ms)", "GFLOPS", "weight x latency (ms)")
    rows = [(t.name, f"{t.weight:g}", str(t.trials), _ms(t.best_cost_s),
             f"{t.best_gflops:.2f}" if t.best_gflops is not None else "-", _ms(t.weight * t.best_cost_s))
            for t in summary.tasks]
    lines = _table(header, rows)
    lines.append("")
    resumed = f", {summary.resumed_trials} resumed" if summary.resumed_trials else ""
    lines.append(f"network ({summary.strategy}): {summary.trials} trials{resumed} of a budget of {summary.budget}; "
                 f"estimated latency {_ms(summary.latency_s)} ms")
    lines.append("")
    lines.append("estimated latency over time:")
    lines.extend("  " + line for line in _table(
        ("elapsed (s)", "trials", "latency (ms)"),
        [(f"{elapsed:.1f}", str(trials), _ms(latency)) for elapsed, trials, latency in summary.history]))
    for failure in summary.failures:
        lines.append(f"failed round: {failure}")
    return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return [line(header), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]
