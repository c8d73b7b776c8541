"""The dialect plugin boundary.

A dialect (autotvm, auto_scheduler, meta_schedule, or a third party's) is a package that
registers one object under the entry-point group ``lorien.dialects``. The core finds
dialects only through :func:`get_dialect` and :func:`available_dialects` (of
:mod:`lorien.plugins`); it never imports a dialect package by name. What the core needs to
know about the dialects as a whole (which dialect owns a log format, whose workload key this
is) is derived at the end of this module from what each registered dialect declares.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorien.errors import DialectError, UnknownFormatError, WorkloadError
from lorien.plugins import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from lorien.plugins import available_dialects as available_dialects
from lorien.plugins import get_dialect as get_dialect
from lorien.record import TuningRecord


@dataclass(frozen=True)
class JobOption:
    """One option a dialect declares for its jobs: its default, the types it accepts, and what
    it does (shown in errors)."""

    default: Any
    types: type | tuple[type, ...]
    help: str = ""
    #: A file path: a relative one in a tuning YAML is relative to the YAML's directory.
    path: bool = False


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

    def codecs(self) -> list[Any]:
        """Codecs of log formats Lorien does not read itself (see :mod:`lorien.formats` for what
        a codec offers); TVM's formats are built in, so their dialects ship none."""
        return []

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

    def claims_workload_key(self, workload_key: str) -> bool | None:
        """Whether a workload key (stripped) has this dialect's form: True, False (the default),
        or None -- not by its form, but this dialect takes the keys no dialect claims (the
        fallback; :func:`dialect_of_workload_key` refuses a key two dialects claim)."""
        return False

    def schedule_path(self, record: TuningRecord) -> str | None:
        """Which of the workload's schedule paths a record's config took (a template's ``path``
        knob, the rfactor sketch or rule, ...), in a word a user reads; ``lorien query`` shows
        it. None where the config does not choose one. Reads the config only (no numpy: a
        query answers without it)."""
        return None

    def template_of(self, record: TuningRecord) -> str:
        """The template (group) a record is featurized under; the task name by default."""
        return record.task_name

    def check_job(self, job: Any) -> None:
        """Check a job (a :class:`lorien.tune.job.TuneJob`) beyond the types of its keys;
        DialectError names what is wrong. Called when the job is read, before anything is measured."""
        return None

    def tuning_context(self, job: Any, store: Any) -> Any:
        """What the one tuning loop (:mod:`lorien.tune.loop`) needs to tune ``job`` (a
        :class:`lorien.tune.job.TuneJob`): a :class:`lorien.tune.loop.TuneContext` with the
        space, a tuner over it, how candidates are measured and become records. ``store`` (an
        open store, or None) is where transfer history and seeds may be read from; the loop
        itself replays the workload's own records."""
        raise DialectError(f"dialect {self.name!r} cannot tune")

    def expand_workload(self, op: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
        """(task_name, args) of a tuning-YAML op shorthand (``dense: {M: .., N: .., K: ..}``)."""
        raise DialectError(f"dialect {self.name!r} has no op shorthands; give task_name and args")

    def expand_model_task(self, op: str, params: dict[str, Any], epilogue: Mapping[str, int]) -> tuple[str, list[Any]]:
        """(task_name, args) of an op shorthand ``lorien extract`` found in models (an entry with
        ``models`` or ``epilogue``: the elementwise patterns seen after the op, with counts; the
        models' convolutions are NCHW). By default the anchor operator alone, as
        :meth:`expand_workload` (a dialect whose tasks are the anchor op, like AutoTVM's templates).
        A dialect that fuses epilogues into its tasks tunes the op with its epilogue and layout as
        the model has them, or raises DialectError naming the op, layout and epilogue it cannot."""
        return self.expand_workload(op, params)

    def compile_record(self, record: TuningRecord, target: str | None = None, store: Any = None) -> Any:
        """A kernel (:class:`lorien.engine.Kernel`) built with a stored record's config; ``store``
        is where a record that names its workload by reference finds it."""
        raise DialectError(f"dialect {self.name!r} cannot compile records")

    def schedule_record(self, record: TuningRecord, store: Any = None) -> tuple[Any, list[Any]]:
        """(engine schedule, kernel arguments) of a stored record's config, not built: what
        program features (:mod:`lorien.features.program`) are computed from. ``store`` as for
        :meth:`compile_record`."""
        raise DialectError(f"dialect {self.name!r} cannot lower records to the engine")

    def compile_default(self, workload_key: str, target: str | None = None) -> Any:
        """A kernel of a workload built with a default (untuned) schedule."""
        raise DialectError(f"dialect {self.name!r} has no default schedule for {workload_key}")

    def write_log(self, records: list[TuningRecord], log_format: str, path: str | Path,
                  workloads: Mapping[str, str] | None = None, **options: Any) -> int:
        """Write records in one of this dialect's formats for ``lorien export -o PATH``, as its
        tuning system reads them (:func:`lorien.formats.write_log`; a dialect whose records
        need converting first overrides this); returns the records written. Options the core
        passes: ``lorien_workloads`` (meta_schedule: keep workloads tuned here in Lorien's form),
        ``measure_with_tvm`` (re-measure with TVM every record Lorien's engine measured and write
        TVM's latencies; a dialect that cannot raises DialectError)."""
        from lorien.formats import write_log

        if options.get("measure_with_tvm"):
            raise DialectError(f"dialect {self.name!r} cannot re-measure its records with TVM")
        return write_log(records, log_format, path, workloads)

    def apply_log_line(self, path: str, line_no: int, **options: Any) -> AppliedConfig:
        """Build and measure here the config of one record of a log in this dialect's format
        (``lorien apply --log F --line N``). Options: ``target``, ``measure``, ``store_uri``
        (commit the measured record there)."""
        raise DialectError(f"dialect {self.name!r} cannot apply a logged config")

    def extract_model_tasks(self, models: list[str], inputs: list[str], batch_size: int | None = None,
                            target: str | None = None, skip_untunable: bool = False) -> Any:
        """The tasks of models as this dialect's tuning system sees them (``lorien extract
        --dialect NAME``): a :class:`lorien.models.extract.ModelTasks` whose jobs name each task
        by this dialect's workload key, with the files that define the workloads."""
        raise DialectError(f"dialect {self.name!r} does not extract model tasks of its own; "
                           f"lorien extract without --dialect writes op shorthands every dialect reads")

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


# ---- tables derived from the registered dialects ----------------------------------------------

def dialect_formats() -> dict[str, str]:
    """Log format -> the dialect whose records it holds, from every registered dialect's
    :meth:`Dialect.record_formats` (``{"autotvm": "autotvm", "ansor": "auto_scheduler", ...}``)."""
    owners: dict[str, str] = {}
    for name in available_dialects():
        for log_format in get_dialect(name).record_formats():
            if owners.setdefault(log_format, name) != name:
                raise DialectError(f"log format {log_format!r} is claimed by dialects {owners[log_format]!r} "
                                   f"and {name!r}")
    return owners


def format_owner(log_format: str) -> str:
    """The dialect whose records a log format holds (``ansor`` -> ``auto_scheduler``)."""
    owners = dialect_formats()
    if log_format not in owners:
        raise UnknownFormatError(f"unknown log format {log_format!r} (known: {', '.join(owners)})")
    return owners[log_format]


def native_log_format(dialect: str) -> tuple[str, str] | None:
    """(format, file suffix) of the line log a dialect's records are natively written to
    (``auto_scheduler`` -> ``("ansor", ".json")``); None for a dialect that is not registered
    or whose formats are no line logs (MetaSchedule's JSONDatabase is a directory)."""
    from lorien.formats import codecs

    if dialect not in available_dialects():
        return None
    known = codecs()
    for log_format in get_dialect(dialect).record_formats():
        suffix = known[log_format].LOG_SUFFIX if log_format in known else None
        if suffix is not None:
            return log_format, suffix
    return None


def dialect_of_workload_key(workload_key: str) -> str:
    """The dialect a workload key belongs to, by asking every registered dialect
    (:meth:`Dialect.claims_workload_key`): the one that claims it, else the one fallback. For
    the built-in dialects a JSON list ``["func", ...]`` is an auto-scheduler key, a decimal
    number a MetaSchedule structural hash, anything else an AutoTVM key ``task#arg#...``."""
    key = workload_key.strip()
    claims = {name: get_dialect(name).claims_workload_key(key) for name in available_dialects()}
    for claim in (True, None):
        claimants = [name for name, said in claims.items() if said is claim]
        if len(claimants) == 1:
            return claimants[0]
        if claimants:
            kind = "claimed by" if claim else "the fallback of"
            raise DialectError(f"workload key {workload_key!r} is {kind} several dialects ({', '.join(claimants)}); "
                               f"name the dialect")
    raise DialectError(f"no dialect claims workload key {workload_key!r} (known: {', '.join(claims) or 'none'})")
