"""The dialect plugin boundary.

A dialect (autotvm, auto_scheduler, meta_schedule, or a third party's) is a package that
registers one object under the entry-point group ``lorien.dialects``. The core finds
dialects only through :func:`get_dialect` and :func:`available_dialects`; it never imports
a dialect package by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorien.errors import DialectError, WorkloadError
from lorien.record import TuningRecord

if TYPE_CHECKING:
    from lorien.tune.job import TuneJob
    from lorien.tune.loop import TuneContext

ENTRY_POINT_GROUP = "lorien.dialects"


@dataclass(frozen=True)
class JobOption:
    """One option a dialect declares for its jobs: its default, the types it accepts, and what
    it does (shown in errors)."""

    default: Any
    types: type | tuple[type, ...]
    help: str = ""


class Dialect(ABC):
    """What a dialect provides to the core. Methods a dialect cannot offer raise DialectError."""

    #: Short name stored in every record's ``dialect`` field.
    name: str = ""
    #: Options this dialect's jobs may set besides the common ones (:mod:`lorien.tune.job`),
    #: with their defaults; the tuning YAML and job files accept them, and no other dialect's.
    job_options: Mapping[str, JobOption] = {}

    @abstractmethod
    def record_formats(self) -> list[str]:
        """Names of the log formats (see :mod:`lorien.formats`) whose records this dialect owns."""

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        """Flat named features of one record's workload and config (phase 1 of featurization)."""
        raise DialectError(f"dialect {self.name!r} has no feature extractor")

    def workload_key(self, task_name: str, args: list[Any]) -> str:
        """The dialect's workload key of a job's (task_name, args)."""
        raise DialectError(f"dialect {self.name!r} has no workload keys")

    def describe_workload(self, workload_key: str) -> tuple[str, float | None]:
        """(layout, FLOP count) of a workload; ``("NA", None)`` when unknown (and logged once)."""
        raise DialectError(f"dialect {self.name!r} cannot describe workloads")

    def template_of(self, record: TuningRecord) -> str:
        """The template (group) a record is featurized under; the task name by default."""
        return record.task_name

    def check_job(self, job: TuneJob) -> None:
        """Check a job's workload and options beyond their types (DialectError names what is
        wrong); called when the job is read, before anything is measured."""
        return None

    def tuning_context(self, job: TuneJob, store: Any) -> TuneContext:
        """What the one tuning loop (:mod:`lorien.tune.loop`) needs to tune ``job``: the space, a
        tuner over it, how candidates are measured and become records. ``store`` (an open store,
        or None) is where transfer history and seeds may be read from; the loop itself replays
        the workload's own records."""
        raise DialectError(f"dialect {self.name!r} cannot tune")

    def expand_workload(self, op: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
        """(task_name, args) of a tuning-YAML op shorthand (``dense: {M: .., N: .., K: ..}``)."""
        raise DialectError(f"dialect {self.name!r} has no op shorthands; give task_name and args")

    def compile_record(self, record: TuningRecord, target: str | None = None, store: Any = None) -> Any:
        """A kernel (:class:`lorien.engine.Kernel`) built with a stored record's config; ``store``
        is where a record that names its workload by reference finds it."""
        raise DialectError(f"dialect {self.name!r} cannot compile records")

    def compile_default(self, workload_key: str, target: str | None = None) -> Any:
        """A kernel of a workload built with a default (untuned) schedule."""
        raise DialectError(f"dialect {self.name!r} has no default schedule for {workload_key}")

    def write_log(self, records: list[TuningRecord], log_format: str, path: str | Path,
                  workloads: Mapping[str, str] | None = None, **options: Any) -> int:
        """Write records in one of this dialect's formats for ``lorien export -o PATH``, as its
        tuning system reads them (:func:`lorien.formats.write_log`; a dialect whose records
        need converting first overrides this); returns the records written. Options the core
        passes: ``lorien_workloads`` (meta_schedule: keep workloads tuned here in Lorien's form)."""
        from lorien.formats import write_log

        return write_log(records, log_format, path, workloads)

    def apply_log_line(self, path: str, line_no: int, **options: Any) -> AppliedConfig:
        """Build and measure here the config of one record of a log in this dialect's format
        (``lorien apply --log F --line N``). Options: ``target``, ``measure``, ``store_uri``
        (commit the measured record there)."""
        raise DialectError(f"dialect {self.name!r} cannot apply a logged config")

    def apply_config(self, workload_key: str, config: str, **options: Any) -> AppliedConfig:
        """Build and measure here one config (JSON text, the dialect's form) of a workload key
        (``lorien apply --workload-key K --config C``); options as for apply_log_line."""
        raise DialectError(f"dialect {self.name!r} cannot apply a config")


@dataclass
class AppliedConfig:
    """One config built and measured here: its record, the config as the dialect prints it,
    and, for a logged record, what the log said it cost and where; ``notes`` say how it ran
    here when that differs from the log (e.g. GPU bindings run as CPU loops)."""

    record: TuningRecord
    config_text: str
    error_msg: str = ""
    logged_cost_s: float | None = None
    logged_target: str = ""
    notes: list[str] = field(default_factory=list)


def apply_logged(path: str, line_no: int, logged: TuningRecord, apply: Callable[[], AppliedConfig]) -> AppliedConfig:
    """Run ``apply()`` on a record read from line ``line_no`` of ``path``: its errors name the
    file and line, and the log's own latency and target are kept beside ours."""
    try:
        applied = apply()
    except WorkloadError as exc:
        raise WorkloadError(f"{path}:{line_no}: {exc}") from exc
    except DialectError as exc:
        raise DialectError(f"{path}:{line_no}: {exc}") from exc
    if logged.is_valid:
        applied.logged_cost_s, applied.logged_target = logged.cost_s, logged.target_raw
    return applied


def dialect_of_workload_key(workload_key: str) -> str:
    """The dialect a workload key belongs to by its form: a JSON list ``["func", ...]`` is an
    auto-scheduler key, a decimal number a MetaSchedule structural hash, anything else an
    AutoTVM key ``task#arg#...``."""
    key = workload_key.strip()
    if key.startswith("["):
        return "auto_scheduler"
    return "meta_schedule" if key.isdigit() else "autotvm"


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_dialects() -> list[str]:
    """Names of every dialect registered through the ``lorien.dialects`` entry points."""
    return sorted(_entry_points())


@cache
def get_dialect(name: str) -> Dialect:
    """Load the dialect registered under ``name``."""
    eps = _entry_points()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none installed"
        raise DialectError(f"unknown dialect {name!r} (known: {known})")
    try:
        dialect = eps[name].load()
    except ImportError as exc:
        raise DialectError(f"dialect {name!r} failed to load from {eps[name].value}: {exc}") from exc
    if isinstance(dialect, type):
        dialect = dialect()
    return dialect
