"""The typed tuning job: one workload, one dialect, tuner and budget, and one table of defaults.

A job travels as plain data (the spec dict of :mod:`lorien.tune.jobspec`: YAML, JSON, a Dask
task, an AWS Batch spec file), and is read once into a :class:`TuneJob` where it is tuned.
:data:`JOB_DEFAULTS` is the only place a default is written: the YAML reader, the job-file
reader and the tuning loop all take theirs from it. Options that only one dialect knows
(``layout_rewrite`` of the auto_scheduler, ``warm_start_model`` of autotvm, ...) are declared
by that dialect (:attr:`lorien.dialect.Dialect.job_options`) and checked against it here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lorien.dialect import JobOption
from lorien.errors import ConfigError, DialectError

if TYPE_CHECKING:
    from lorien.search.base import Tuner

__all__ = ["COMMON_KEYS", "JOB_DEFAULTS", "TEMPLATE_FREE_XGB_DEFAULTS", "JobOption", "TuneJob", "check_common",
           "dialect_option_keys", "job_workload_key", "template_free_tuner"]

#: Every job gets these unless it says otherwise.
JOB_DEFAULTS: dict[str, Any] = {
    "dialect": "autotvm",
    "tuner": "random",
    "trials": 32,
    "batch_size": 8,
    "seed": 0,
    "commit_nbest": 20,
    "measure": {},
    "weight": 1,
}

#: Keys every job may carry, whatever its dialect (``round``: the task scheduler's round
#: number, which makes each round a job of its own).
COMMON_KEYS = {"dialect", "target", "task_name", "args", "workload_key", "name", "tuner", "tuner_options",
               "trials", "batch_size", "early_stopping", "seed", "commit_nbest", "measure", "weight", "models",
               "epilogue", "round", "cost_model"}
MEASURE_KEYS = {"number", "repeat", "min_repeat_ms", "flush_cache", "build_timeout_s", "run_timeout_s",
                "check_correctness", "rtol", "atol", "seed", "stop_slower_repeats", "overlap_runs"}
#: Options the ``xgb`` tuner gets over a template-free space (auto-scheduler sketches,
#: MetaSchedule traces) unless the job says otherwise: its model is searched by evolution.
TEMPLATE_FREE_XGB_DEFAULTS: dict[str, Any] = {"optimizer": "evolution", "plan_size": 16, "weighted": True}


@dataclass(frozen=True)
class TuneJob:
    """One tuning job, checked. ``options`` holds the dialect's own options (declared by the
    dialect, defaults filled in); ``spec`` is the plain-data form the job was read from."""

    dialect: str
    target: str
    task_name: str
    args: list[Any]
    workload_key: str = ""
    name: str = ""
    tuner: str = JOB_DEFAULTS["tuner"]
    tuner_options: dict[str, Any] = field(default_factory=dict)
    trials: int = JOB_DEFAULTS["trials"]
    batch_size: int = JOB_DEFAULTS["batch_size"]
    early_stopping: int | None = None
    seed: int = JOB_DEFAULTS["seed"]
    commit_nbest: int = JOB_DEFAULTS["commit_nbest"]
    measure: dict[str, Any] = field(default_factory=dict)
    weight: float = JOB_DEFAULTS["weight"]
    models: list[str] | None = None
    epilogue: dict[str, Any] | None = None
    #: A pre-trained program-feature model (``lorien train`` on ``lorien featurize --features
    #: program`` output) that guides the xgb tuner from the first batch (:mod:`lorien.costmodel.pretrained`).
    cost_model: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | TuneJob, where: str = "job") -> TuneJob:
        """Check a job spec (a mapping, as YAML and job files give it) against the common keys
        and its dialect's declared options; ConfigError names ``where`` and the value."""
        if isinstance(spec, TuneJob):
            return spec
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: a job is a mapping, got {spec!r:.80}")
        from lorien.dialect import get_dialect

        name = spec.get("dialect") or JOB_DEFAULTS["dialect"]
        dialect = get_dialect(str(name))  # DialectError names the dialects there are
        declared = dict(dialect.job_options)
        unknown = set(spec) - COMMON_KEYS - set(declared)
        if unknown:
            raise ConfigError(f"{where}: unknown job keys {sorted(unknown)} for dialect {name!r} (known: "
                              f"{sorted(COMMON_KEYS | set(declared))}){_owners(unknown)}")
        job = {**JOB_DEFAULTS, **spec}
        check_common(job, where)
        options = {}
        for key, option in declared.items():
            value = job.get(key, option.default)
            if value is not None and (not isinstance(value, option.types) or
                                      (isinstance(value, bool) and option.types in (int, float))):
                raise ConfigError(f"{where}: {key!r} must be {_type_name(option.types)}, got {value!r:.80} "
                                  f"({name} option: {option.help})")
            options[key] = value
        workload_key = str(job.get("workload_key") or "")
        if not workload_key and not ("task_name" in job and "args" in job):
            raise ConfigError(f"{where}: a job needs 'task_name' and 'args' (or 'workload_key'): {spec!r:.200}")
        tuned = cls(dialect=str(name), target=str(job.get("target") or "llvm"),
                    task_name=str(job.get("task_name") or ""), args=list(job.get("args") or []),
                    workload_key=workload_key, name=str(job.get("name") or ""), tuner=job["tuner"],
                    tuner_options=dict(job.get("tuner_options") or {}), trials=job["trials"],
                    batch_size=job["batch_size"], early_stopping=job.get("early_stopping"), seed=job["seed"],
                    commit_nbest=job["commit_nbest"], measure=dict(job["measure"]), weight=job["weight"],
                    models=job.get("models"), epilogue=job.get("epilogue"), cost_model=job.get("cost_model"),
                    options=options, spec=dict(spec))
        try:
            dialect.check_job(tuned)
        except DialectError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        return tuned

    def option(self, key: str) -> Any:
        """A dialect option of this job (its declared default when the job did not set it)."""
        return self.options[key]


def job_workload_key(job: TuneJob) -> str:
    """The key of a job's workload among the registered workload functions
    (:mod:`lorien.workload_registry`): its ``workload_key``, or that of ``task_name`` + ``args``."""
    if job.workload_key:
        return job.workload_key
    from lorien.workload_registry import make_workload_key

    return make_workload_key(job.task_name, list(job.args))


def template_free_tuner(job: TuneJob, space: Any, xgb_defaults: dict[str, Any] | None = None) -> Tuner:
    """The job's tuner over a template-free space (sketches, traces); ``xgb`` searches its model
    by evolution (:data:`TEMPLATE_FREE_XGB_DEFAULTS`, then the dialect's ``xgb_defaults``, unless
    the job's ``tuner_options`` say otherwise)."""
    from lorien.search import create

    options = ({**TEMPLATE_FREE_XGB_DEFAULTS, **(xgb_defaults or {}), **job.tuner_options} if job.tuner == "xgb"
               else dict(job.tuner_options))
    return create(job.tuner, space, seed=job.seed, **options)


def check_common(job: dict[str, Any], where: str) -> None:
    """Check the keys every job shares (types, ranges, measure keys, tuner name); normalizes
    ``measure`` to a dict in place."""
    from lorien.search import available_tuners

    if job["tuner"] not in available_tuners():
        raise ConfigError(f"{where}: unknown tuner {job['tuner']!r} (known: {', '.join(available_tuners())})")
    if not isinstance(job.get("tuner_options") or {}, dict):
        raise ConfigError(f"{where}: 'tuner_options' must be a mapping, got {job['tuner_options']!r:.80}")
    for key in ("trials", "batch_size", "commit_nbest"):
        value = job.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    stopping = job.get("early_stopping")
    if stopping is not None and (not isinstance(stopping, int) or isinstance(stopping, bool) or stopping < 1):
        raise ConfigError(f"{where}: 'early_stopping' must be a positive integer, got {stopping!r}")
    if not isinstance(job.get("seed"), int) or isinstance(job.get("seed"), bool):
        raise ConfigError(f"{where}: 'seed' must be an integer, got {job.get('seed')!r}")
    from lorien.models.tasks import check_epilogue, check_weight

    check_weight(job["weight"], where)
    models = job.get("models")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
        raise ConfigError(f"{where}: 'models' must be a list of model names, got {models!r:.80}")
    if job.get("epilogue") is not None:
        check_epilogue(job["epilogue"], where)
    if job.get("cost_model") is not None:
        from lorien.costmodel.pretrained import check_cost_model_path

        if job["tuner"] != "xgb":
            raise ConfigError(f"{where}: 'cost_model' guides the xgb tuner; set tuner: xgb (or lorien tune --tuner "
                              f"xgb), got tuner {job['tuner']!r}")
        check_cost_model_path(job["cost_model"], where)
    measure = job.get("measure") or {}
    if not isinstance(measure, dict) or set(measure) - MEASURE_KEYS:
        raise ConfigError(f"{where}: 'measure' keys must be among {sorted(MEASURE_KEYS)}, got {measure!r:.200}")
    from lorien.engine.measure import MeasureOption

    try:  # a bad value is refused here, before a run opens its store or writes its log
        MeasureOption(**measure)
    except TypeError as exc:
        raise ConfigError(f"{where}: bad measure options {measure}: {exc}") from exc
    job["measure"] = dict(measure)


def dialect_option_keys() -> set[str]:
    """The job options any registered dialect declares (a tuning YAML may set them at its top)."""
    from lorien.dialect import available_dialects, get_dialect

    return {key for name in available_dialects() for key in get_dialect(name).job_options}


def _owners(keys: set[str]) -> str:
    """``; 'layout_rewrite' is an option of auto_scheduler`` for keys other dialects declare."""
    from lorien.dialect import available_dialects, get_dialect

    notes = []
    for key in sorted(keys):
        owners = [name for name in available_dialects() if key in get_dialect(name).job_options]
        if owners:
            notes.append(f"{key!r} is an option of {', '.join(owners)}")
    return ("; " + "; ".join(notes)) if notes else ""


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               dict: "a mapping", list: "a list"}


def _type_name(types: type | tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in (types if isinstance(types, tuple) else (types,)))
