"""The ``local`` manager: a pool of worker processes on this machine, one process per attempt.

Each attempt runs in its own child process and sends its outcome back through a pipe. A
child that dies without answering (SIGKILL, segfault, out of memory) is detected through its
process sentinel and reported as lost, so the master retries that job alone. Children die
with the master (Linux parent-death signal), so a resumed master never races an orphan.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
from dataclasses import dataclass
from typing import Any

from lorien.tune.managers.base import (
    Completion,
    JobManager,
    JobOutcome,
    Runner,
    Task,
    execute_job,
    warm_up_store,
)


@dataclass
class _Running:
    task: Task
    process: Any
    conn: Any


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this child when the master dies, so a killed master leaves no
    orphan measuring (and committing) behind the back of the resumed one."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def _child_main(conn: Any, task: Task, store_uri: str | None, runner: Runner | None,
                measure_slots: int | None, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    try:
        outcome = execute_job(task, store_uri, runner, measure_slots)
    except Exception as exc:
        conn.send({"crashed": f"{type(exc).__name__}: {exc}"})
        raise
    conn.send(outcome.to_dict())
    conn.close()


class LocalManager(JobManager):
    """Runs up to ``workers`` attempts at once in child processes of this process."""

    def __init__(self, store_uri: str | None = None, runner: Runner | None = None,
                 workers: int | None = None, measure_slots: int | None = None,
                 start_method: str = "fork"):
        self.store_uri = store_uri
        self.runner = runner
        self.measure_slots = measure_slots
        self.capacity = workers or os.cpu_count() or 1
        self._context = multiprocessing.get_context(start_method)
        self._running: dict[int, _Running] = {}
        self._warm_dialects: set[str] = set()
        if start_method == "fork":
            warm_up_store(store_uri)

    def _warm_up_dialect(self, name: str) -> None:
        """Import a job's dialect here once, so forked children do not each import it."""
        if self.runner is not None or name in self._warm_dialects:
            return
        self._warm_dialects.add(name)
        from lorien.dialect import get_dialect
        from lorien.errors import DialectError

        try:
            get_dialect(name)
        except DialectError:
            return  # the job's own attempt reports it

    def submit(self, task: Task) -> None:
        self._warm_up_dialect(str(task.spec.get("dialect")))
        parent_conn, child_conn = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_child_main, name=f"lorien-job-{task.job_id}",
            args=(child_conn, task, self.store_uri, self.runner, self.measure_slots, os.getpid()),
        )
        process.start()
        child_conn.close()
        self._running[process.sentinel] = _Running(task, process, parent_conn)

    def wait(self, timeout_s: float) -> list[Completion]:
        if not self._running:
            return []
        ready = multiprocessing.connection.wait(list(self._running), timeout=timeout_s)
        completions = []
        for sentinel in ready:
            running = self._running.pop(sentinel)
            running.process.join()
            completions.append(self._completion(running))
        return completions

    @staticmethod
    def _completion(running: _Running) -> Completion:
        try:
            if running.conn.poll():
                message = running.conn.recv()
                if "crashed" in message:
                    return Completion(running.task, lost=f"attempt raised {message['crashed']}")
                return Completion(running.task, outcome=JobOutcome(**message))
        except (EOFError, OSError):
            pass
        finally:
            running.conn.close()
        code = running.process.exitcode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        return Completion(running.task, lost=f"worker process {running.process.pid} died ({how})")

    def close(self, cancel: bool = False) -> None:
        for running in self._running.values():
            if cancel:
                running.process.kill()
            running.process.join()
            running.conn.close()
        self._running.clear()
