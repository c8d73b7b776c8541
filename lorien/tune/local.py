"""``lorien tune CONFIG.yaml`` on one machine: workloads one after another, a progress bar
each, records committed batch by batch, full AutoTVM-style logs beside the warehouse, and a
summary table at the end (also when interrupted)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from lorien.tune.config import TuneConfig
from lorien.tune.job import JOB_DEFAULTS


@dataclass
class WorkloadSummary:
    """The outcome of tuning one workload."""

    name: str
    task_name: str
    trials: int = 0
    resumed: int = 0
    errors: int = 0
    best_cost_s: float | None = None
    best_gflops: float | None = None
    committed: int = 0
    elapsed_s: float = 0.0
    log_path: str = ""
    interrupted: bool = False
    best_config: list[Any] | None = None
    workload_key: str = ""
    store_uri: str = ""

    @property
    def trials_per_s(self) -> float:
        """Trials measured per second in this run (resumed ones took no time here)."""
        return (self.trials - self.resumed) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        """One line for a log: trials, errors, best GFLOPS and latency."""
        best = (f"best {self.best_gflops:.2f} GFLOPS ({self.best_cost_s * 1e3:.4f} ms)"
                if self.best_gflops is not None and self.best_cost_s is not None else "no valid config")
        resumed = f" ({self.resumed} resumed from the store)" if self.resumed else ""
        return (f"{self.name}: {self.trials} trials{resumed}, {self.errors} errors, {best}, "
                f"{self.committed} committed" + (" (interrupted)" if self.interrupted else ""))

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (``lorien tune --json``)."""
        return {**asdict(self), "trials_per_s": round(self.trials_per_s, 3)}


def workload_name(job: dict[str, Any]) -> str:
    """A short readable name: the job's ``name`` or the task and its tensor shapes."""
    if job.get("name"):
        return str(job["name"])
    args = job.get("args", [])
    shapes = ["x".join(str(d) for d in arg[1]) for arg in args
              if isinstance(arg, list) and arg and arg[0] == "TENSOR"]
    if not shapes and args:  # plain arguments (auto_scheduler workload functions)
        shapes = [json.dumps(args, separators=(",", ":"))[1:-1]]
    return f"{job.get('task_name', '?')} {' '.join(shapes)}".strip()


def default_log_dir(store_uri: str | None) -> Path:
    """``<store dir>/logs`` for a local parquet store, ``./lorien-logs`` otherwise."""
    from lorien.warehouse import resolve_store_uri

    scheme, _, location = resolve_store_uri(store_uri).partition(":")
    if scheme == "parquet" and "://" not in location:
        return Path(location.partition("?")[0]) / "logs"
    return Path("lorien-logs")


def log_path_for(log_dir: Path, job: dict[str, Any]) -> Path:
    """One native log per workload and target: ``<task>.<hash>.log`` (AutoTVM), ``.json`` (Ansor)."""
    from lorien.dialect import native_log_format
    from lorien.tune.jobspec import canonical_json

    digest = hashlib.blake2b(canonical_json([job.get("task_name"), job.get("args"), job.get("target")]).encode(),
                             digest_size=6).hexdigest()
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", str(job.get("task_name", "job")))
    suffix = (native_log_format(str(job.get("dialect") or JOB_DEFAULTS["dialect"])) or ("", ".log"))[1]
    return log_dir / f"{stem}.{digest}{suffix}"


def tune_workload(job: dict[str, Any], store_uri: str | None = None, log_dir: str | Path | None = None,
                  progress: bool = True, stream: TextIO | None = None) -> WorkloadSummary:
    """Tune one job through its dialect into ``store_uri`` (None: the default store), with a
    progress bar; returns its summary.

    The job resumes from what it committed before (an interrupted run of the same workload with
    the same settings): those trials are replayed, not measured again, and count against its
    budget. A KeyboardInterrupt stops the workload after committing what was measured; the
    summary (marked ``interrupted``) is attached to the exception as ``exc.summary`` and re-raised.
    """
    from lorien.progress import Progress
    from lorien.tune.jobspec import Job
    from lorien.tune.loop import tune_job
    from lorien.tune.resume import earlier_records, source_tag
    from lorien.warehouse import open_store, resolve_store_uri

    store_uri = resolve_store_uri(store_uri)
    name = workload_name(job)
    directory = Path(log_dir) if log_dir is not None else default_log_dir(store_uri)
    summary = WorkloadSummary(name=name, task_name=str(job.get("task_name")), store_uri=store_uri)
    flop = _flop(job)
    # A bar on a terminal; in a log, one line when the workload is done (below).
    bar = Progress(int(job.get("trials", 0)), name[:48], unit="trial", enabled=progress, stream=stream)
    started = time.monotonic()

    def on_batch(state: Any, records: list[Any]) -> None:
        summary.trials, summary.errors, summary.committed = state.trials, state.errors, state.committed
        summary.resumed, summary.log_path = state.resumed, state.log_path
        if records and not summary.workload_key:
            summary.workload_key = records[0].workload_key
        if math.isfinite(state.best_cost_s):
            summary.best_cost_s = state.best_cost_s
            summary.best_gflops = flop / state.best_cost_s / 1e9 if flop else None
            summary.best_config = state.best_config
        if bar.is_bar:
            bar.step(f"best {summary.best_gflops:.2f} GFLOPS, errors {state.errors}"
                     if summary.best_gflops is not None else f"errors {state.errors}", count=state.trials - bar.done)

    job_id = Job.from_spec(job).job_id
    try:
        with open_store(store_uri) as store:
            earlier = earlier_records(store, job_id, job.get("target"))
            summary.workload_key = earlier[0].workload_key if earlier else ""
            state = tune_job(job, store, log_path=log_path_for(directory, job), on_batch=on_batch,
                             source=source_tag(job_id), resume=earlier)
        on_batch(state, [])
    except KeyboardInterrupt as exc:
        summary.interrupted = True
        summary.elapsed_s = time.monotonic() - started
        exc.summary = summary  # type: ignore[attr-defined]
        raise
    finally:
        bar.close()
    summary.elapsed_s = time.monotonic() - started
    if progress and not bar.is_bar:
        print(f"tune: {summary.line()}", file=stream or sys.stderr, flush=True)
    return summary


def _flop(job: dict[str, Any]) -> float | None:
    """FLOPs of a job's workload, as its dialect counts them (None when unknown)."""
    from lorien.dialect import get_dialect
    from lorien.errors import LorienError

    try:
        dialect = get_dialect(job.get("dialect") or JOB_DEFAULTS["dialect"])
        return dialect.describe_workload(dialect.workload_key(str(job.get("task_name")), job.get("args") or []))[1]
    except (LorienError, ValueError):
        return None


def tune_config(config: TuneConfig, progress: bool = True, stream: TextIO | None = None,
                log_dir: str | Path | None = None, store_uri: str | None = None) -> list[WorkloadSummary]:
    """Tune every workload of a config in order, into ``store_uri``, else the config's store,
    else the default store. On KeyboardInterrupt the summaries so far (the interrupted one
    included) are attached to the exception as ``exc.summaries``."""
    from lorien.warehouse import resolve_store_uri

    store = resolve_store_uri(store_uri, config.store_uri)
    logs = log_dir or config.log_dir
    summaries: list[WorkloadSummary] = []
    for job in config.jobs:
        try:
            summaries.append(tune_workload(job, store, logs, progress=progress, stream=stream))
        except KeyboardInterrupt as exc:
            summaries.append(exc.summary)  # type: ignore[attr-defined]
            exc.summaries = summaries  # type: ignore[attr-defined]
            raise
    return summaries


def format_summary(summaries: list[WorkloadSummary]) -> str:
    """A plain-text table: workload, best GFLOPS, latency, trials (and how many were resumed from
    the store), errors, trials/s (of the trials measured in this run)."""
    header = ("workload", "best GFLOPS", "latency (ms)", "trials", "errors", "trials/s")
    rows = []
    for s in summaries:
        rows.append((
            s.name + (" (interrupted)" if s.interrupted else ""),
            f"{s.best_gflops:.2f}" if s.best_gflops is not None else "-",
            f"{s.best_cost_s * 1e3:.4f}" if s.best_cost_s is not None else "-",
            f"{s.trials} ({s.resumed} resumed)" if s.resumed else str(s.trials), str(s.errors),
            f"{s.trials_per_s:.2f}",
        ))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths, strict=True)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])
