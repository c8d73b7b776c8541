"""The master's append-only trace: one JSON line per job state change, fsync'd.

States: ``pending`` (known to the master), ``running`` (handed to a worker, with its attempt
number), ``retried`` (the attempt was lost and the job goes back in the queue), ``done``
(records committed, with their count) and ``failed`` (final, with the error message).
Reading a trace gives each job's latest state; a last line cut short by a killed master is
ignored, so ``--trace-file`` can always resume.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorien.errors import ConfigError

STATES = ("pending", "running", "retried", "done", "failed")
FINISHED_STATES = ("done", "failed")


@dataclass
class JobState:
    """What the trace knows about one job."""

    job_id: str
    state: str
    attempt: int = 0
    worker: str = ""
    error: str = ""
    records: int = 0
    label: str = ""
    spec: dict[str, Any] | None = None
    history: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


class TraceWriter:
    """Appends events to a trace file; each line is flushed and fsync'd before returning."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._ends_cleanly()

    def _ends_cleanly(self) -> None:
        """A killed master may have left half a line: start ours on a fresh line."""
        size = self.path.stat().st_size
        if size == 0:
            return
        with open(self.path, "rb") as existing:
            existing.seek(size - 1)
            if existing.read(1) != b"\n":
                self._file.write("\n")
                self._file.flush()

    def write(self, job_id: str, state: str, **fields: Any) -> None:
        if state not in STATES:
            raise ValueError(f"unknown job state {state!r} (known: {', '.join(STATES)})")
        event = {"ts": round(time.time(), 6), "job_id": job_id, "state": state}
        event.update({name: value for name, value in fields.items() if value is not None})
        self._file.write(json.dumps(event, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[int]]:
    """Every complete event of a trace in order, and the numbers of torn lines skipped.

    A line cut short by a killed master does not parse and is skipped (a resumed master
    starts on a fresh line). A line that parses but is not an event raises ConfigError.
    """
    path = Path(path)
    if not path.exists():
        return [], []
    events: list[dict[str, Any]] = []
    torn_lines: list[int] = []
    with open(path, encoding="utf-8", errors="replace") as trace:
        for lineno, line in enumerate(trace, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                torn_lines.append(lineno)
                continue
            if not isinstance(event, dict) or "job_id" not in event or event.get("state") not in STATES:
                raise ConfigError(f"{path}:{lineno}: not a trace event: {line[:120]!r}")
            events.append(event)
    return events, torn_lines


def read_trace(path: str | os.PathLike[str]) -> dict[str, JobState]:
    """Latest state of every job in a trace, keyed by job id."""
    jobs: dict[str, JobState] = {}
    events, _torn_lines = read_events(path)
    for event in events:
        job_id = event["job_id"]
        state = jobs.get(job_id)
        if state is None:
            state = jobs[job_id] = JobState(job_id=job_id, state=event["state"])
        state.state = event["state"]
        state.history.append(event["state"])
        for name in ("attempt", "worker", "error", "records", "label"):
            if name in event:
                setattr(state, name, event[name])
        if "spec" in event:
            state.spec = event["spec"]
        if event["state"] == "running":
            state.error = ""
    return jobs


def worker_name() -> str:
    """``host:pid`` of the calling process, as written in ``running``/``done`` events."""
    return f"{socket.gethostname()}:{os.getpid()}"
