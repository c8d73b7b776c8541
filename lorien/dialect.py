"""The dialect plugin boundary.

A dialect (autotvm, auto_scheduler, meta_schedule, or a third party's) is a package that
registers one object under the entry-point group ``lorien.dialects``. The core finds
dialects only through :func:`get_dialect` and :func:`available_dialects`; it never imports
a dialect package by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from lorien.errors import DialectError, WorkloadError
from lorien.record import TuningRecord

ENTRY_POINT_GROUP = "lorien.dialects"


class Dialect(ABC):
    """What a dialect provides to the core. Methods a dialect cannot offer raise DialectError."""

    #: Short name stored in every record's ``dialect`` field.
    name: str = ""
    #: Whether ``tune`` continues from the store's records of the job's workload without
    #: measuring them again (what the task scheduler's rounds need).
    resumes_from_store: bool = False

    @abstractmethod
    def record_formats(self) -> list[str]:
        """Names of the log formats (see :mod:`lorien.formats`) whose records this dialect owns."""

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        """Flat named features of one record's workload and config (phase 1 of featurization)."""
        raise DialectError(f"dialect {self.name!r} has no feature extractor")

    def featurize_batch(self, records: Any) -> tuple[list[tuple[list[int], dict[str, Any]]], list[tuple[int, str]]]:
        """The features of :meth:`featurize` of many records (an Arrow table of the record
        schema): ``(positions, columns)`` groups, each column a list or Arrow array of one
        value per position, and ``(position, reason)`` of every record not featurized. This
        default featurizes record by record; a dialect overrides it to work column-wise."""
        if type(self).featurize is Dialect.featurize:
            raise DialectError(f"dialect {self.name!r} has no feature extractor")
        rows: list[dict[str, Any]] = []
        positions: list[int] = []
        failed: list[tuple[int, str]] = []
        for position, row in enumerate(records.to_pylist()):
            try:
                rows.append(self.featurize(TuningRecord.from_row(row)))
            except DialectError as exc:
                failed.append((position, str(exc)))
                continue
            positions.append(position)
        names = dict.fromkeys(name for row in rows for name in row)
        return [(positions, {name: [row.get(name) for row in rows] for name in names})] if rows else [], failed

    def proposal_space(self, workload_key: str) -> Any:
        """The config space of a workload that zero-shot proposal samples, scores with a cost
        model and measures: an object with ``task_name`` (the template a model was trained
        under), ``args``, ``len()``, ``config(index)`` (a JSON-ready config),
        ``features(configs)`` (the workload and knob features :meth:`featurize` gives records
        of those configs) and ``measure(configs, target, measure, source)`` (one record each)."""
        raise DialectError(f"dialect {self.name!r} cannot propose configs for unseen workloads")

    def workload_key(self, task_name: str, args: list[Any]) -> str:
        """The dialect's workload key of a job's (task_name, args)."""
        raise DialectError(f"dialect {self.name!r} has no workload keys")

    def describe_workload(self, workload_key: str) -> tuple[str, float | None]:
        """(layout, FLOP count) of a workload; ``("NA", None)`` when unknown (and logged once)."""
        raise DialectError(f"dialect {self.name!r} cannot describe workloads")

    def template_of(self, record: TuningRecord) -> str:
        """The template (group) a record is featurized under; the task name by default."""
        return record.task_name

    def tune(self, job: dict[str, Any], store_uri: str | None, **options: Any) -> Iterable[TuningRecord]:
        """Tune one job (a workload, tuner and ``trials`` budget); return the records measured.

        Options the core passes (docs/orchestration.md, "Resume: the dialect contract"):

        - ``resume``: the job's measurements committed before (by a killed attempt, or by an
          earlier run into the same store), one record per config, oldest first. Replay them
          into the tuner -- it never proposes them again, a model-based tuner is trained on them
          before its first proposal -- count them as trials of the budget, and measure only the
          rest; return only what was measured now. Where they do not fit the job's search
          space, raise a DialectError naming the record.
        - ``on_batch(progress, records)``: called after each measured batch, before the next is
          proposed, with a :class:`lorien.tune.progress.TuneProgress` (``trials`` counting the
          ``resumed`` ones) and that batch's records -- and once with no records after replaying
          ``resume``, if anything was. The orchestration layer commits there.
        - ``commit``: commit each batch to ``store_uri`` as it is measured (default True);
          False under a job manager, which commits in ``on_batch``.
        - ``source``: the ``source`` of the records (the job's ``lorien-job:<id>`` tag).
        """
        raise DialectError(f"dialect {self.name!r} cannot tune")

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
