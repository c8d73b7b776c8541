"""Job managers: where the master's jobs run.

- ``local``: child processes of the master on this machine.
- ``dask``: a running Dask scheduler (``scheduler="tcp://host:8786"``) or a local cluster.
- ``aws-batch``: AWS Batch jobs running ``lorien tune --job s3://...`` in containers.

``create_manager(kind, **options)`` maps the short name to an implementation.
"""

from __future__ import annotations

from typing import Any

from lorien.errors import ConfigError
from lorien.tune.managers.base import Completion, JobManager, JobOutcome, Task, execute_job

MANAGERS = ("local", "dask", "aws-batch")


def create_manager(kind: str, **options: Any) -> JobManager:
    """A job manager by name; ``options`` go to its constructor (``None`` values dropped)."""
    options = {name: value for name, value in options.items() if value is not None}
    if kind == "local":
        from lorien.tune.managers.local import LocalManager

        return LocalManager(**options)
    if kind == "dask":
        from lorien.tune.managers.dask import DaskManager

        return DaskManager(**options)
    if kind == "aws-batch":
        from lorien.tune.managers.aws_batch import AwsBatchManager

        return AwsBatchManager(**options)
    raise ConfigError(f"unknown job manager {kind!r} (known: {', '.join(MANAGERS)})")


__all__ = ["MANAGERS", "Completion", "JobManager", "JobOutcome", "Task", "create_manager", "execute_job"]
