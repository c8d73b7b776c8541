"""The ``lorien tune`` YAML: workloads to tune, the tuner, budgets, measurement, the store.

Read with ``yaml.safe_load`` only. Schema (every key but ``workloads`` is optional)::

    store: parquet:./lorien-warehouse   # default: $LORIEN_STORE or ./lorien-warehouse
    log_dir: ./tuning-logs               # default: <store dir>/logs for a local store
    target: llvm                         # default: the host CPU (llvm -mcpu=<host>)
    dialect: autotvm
    tuner: xgb                           # grid | random | ga | xgb, or {kind: ga, pop_size: 32, ...}
    trials: 64                           # measured candidates per workload (at most)
    batch_size: 8                        # candidates built and measured per batch
    early_stopping: 32                   # stop a workload after this many trials without improvement
    seed: 0
    commit_nbest: 20                     # best records per workload kept in the serving view
    warm_start_model: models/dense       # xgb only: prime the tuner with a trained cost model (lorien train)
    measure: {number: 1, repeat: 3, min_repeat_ms: 0, flush_cache: false,
              build_timeout_s: 10, run_timeout_s: 10, check_correctness: true,
              stop_slower_repeats: true,     # a candidate that cannot beat the job's fastest stops its repeats
              overlap_runs: true}            # time candidates of fewer threads than cores while the rest build
    workloads:
      - dense: {M: 64, N: 64, K: 64}               # op shorthand (dense, batch_matmul, conv2d, depthwise_conv2d)
      - conv2d: {N: 1, C: 64, H: 56, W: 56, K: 64, kernel: 3, stride: 1, padding: 1, layout: NCHWc}
      - task_name: conv2d_NCHWc.x86               # or a template name and its AutoTVM args
        args: [["TENSOR", [1, 64, 56, 56], "float32"], ...]
        trials: 128                                # per-workload overrides: tuner, trials, seed, name, ...
      - dense: {M: 128, N: 768, K: 768}           # as `lorien extract` writes a task:
        weight: 4                                  #   occurrences in the models (positive number, default 1)
        models: [bert]                             #   the models it came from
        epilogue: {bias: 3, bias+add: 1}           #   elementwise ops seen after it, per pattern
    task_scheduler: {strategy: gradient, trials: 2000, round_trials: 16}   # tune the workloads as one network

Each workload becomes one job dict (the team's job schema), checked as a
:class:`lorien.tune.job.TuneJob` (defaults: :data:`lorien.tune.job.JOB_DEFAULTS`; options a
dialect declares are accepted for that dialect only) and tuned by the one loop,
:func:`lorien.tune.loop.tune_job`. ``weight``, ``models`` and
``epilogue`` are carried into the job as they are: the weight is what a task scheduler
splits a network's budget by (``task_scheduler``, docs/auto_scheduler.md). An op shorthand
with ``models`` or ``epilogue`` is a task found in models and is expanded by the dialect's
``expand_model_task``: a dialect whose tasks are the anchor operator alone (autotvm) tunes the
same task whatever the epilogue; the template-free ones (auto_scheduler, meta_schedule) tune
the model's NCHW convolution with its bias/relu epilogue, and refuse, naming them, an epilogue
they cannot fuse (a residual add, relu6) or several different ones in one task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lorien.errors import ConfigError, DialectError
from lorien.tune.job import COMMON_KEYS, JOB_DEFAULTS, TuneJob, dialect_option_keys

#: Keys of the YAML's top level besides the job keys.
CONFIG_KEYS = {"store", "log_dir", "workloads", "task_scheduler"}
#: Keys a workload entry may set (or the top level, for every workload): the common job keys
#: but the workload's own, and the options the registered dialects declare.
WORKLOAD_KEYS = {"task_name", "args", "workload_key", "tuner_options", "round"}


def job_keys() -> set[str]:
    """Keys a workload entry may override (and the top level may set for all)."""
    return (COMMON_KEYS - WORKLOAD_KEYS) | dialect_option_keys()


@dataclass
class TuneConfig:
    """A parsed tuning configuration: the jobs, where records go, where logs go."""

    jobs: list[dict[str, Any]]
    store_uri: str | None = None
    log_dir: str | None = None
    source: str = "<config>"
    settings: dict[str, Any] = field(default_factory=dict)
    task_scheduler: dict[str, Any] | None = None


def load_tune_config(path: str | Path) -> TuneConfig:
    """Read and validate a tuning YAML file; errors name the file and the offending entry."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read tuning config {path}: {exc}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    return parse_tune_config(document, source=str(path))


def parse_tune_config(document: Any, source: str = "<config>") -> TuneConfig:
    """Validate a parsed YAML document and expand its workloads into job dicts."""
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: a tuning config is a mapping with a 'workloads' list, got {document!r:.80}")
    keys = job_keys()
    unknown = set(document) - CONFIG_KEYS - keys
    if unknown:
        raise ConfigError(f"{source}: unknown keys {sorted(unknown)} (known: {sorted(CONFIG_KEYS | keys)})")
    workloads = document.get("workloads")
    if not isinstance(workloads, list) or not workloads:
        raise ConfigError(f"{source}: 'workloads' must be a non-empty list")
    settings = {**JOB_DEFAULTS, **{k: v for k, v in document.items() if k in keys}}
    base = Path(source).parent if source != "<config>" else None
    jobs = [_job(entry, settings, f"{source}: workloads[{i}]", base) for i, entry in enumerate(workloads)]
    store_uri = document.get("store")
    log_dir = document.get("log_dir")
    task_scheduler = None
    if "task_scheduler" in document:
        task_scheduler = scheduler_settings(document["task_scheduler"], source)
    return TuneConfig(jobs=jobs, store_uri=store_uri, log_dir=log_dir, source=source, settings=settings,
                      task_scheduler=task_scheduler)


def _job(entry: Any, settings: dict[str, Any], where: str, base: Path | None = None) -> dict[str, Any]:
    from lorien.dialect import get_dialect
    from lorien.target import host_target, parse_target

    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: a workload is a mapping, got {entry!r:.80}")
    keys = job_keys()
    overrides = {k: v for k, v in entry.items() if k in keys}
    job = {**settings, **overrides}
    workload = {k: v for k, v in entry.items() if k not in keys}
    if "args" in workload or ("task_name" in workload and "workload_key" not in workload):
        if set(workload) != {"task_name", "args"} or not isinstance(workload["args"], list):
            raise ConfigError(f"{where}: give 'task_name' and an 'args' list (AutoTVM task arguments), got {entry!r:.200}")
        task_name, args = workload["task_name"], workload["args"]
    elif "workload_key" in workload:  # a workload named by its key (lorien extract --dialect)
        if set(workload) - {"workload_key", "task_name"} or not isinstance(workload["workload_key"], (str, int)):
            raise ConfigError(f"{where}: a workload named by 'workload_key' may add 'task_name' only, got "
                              f"{entry!r:.200}")
        job["workload_key"] = str(workload["workload_key"])
        task_name, args = str(workload.get("task_name", "")), []
    elif len(workload) == 1:
        (op, params), = workload.items()
        if not isinstance(params, dict):
            raise ConfigError(f"{where}: '{op}' needs a mapping of parameters, got {params!r:.80}")
        try:
            dialect = get_dialect(job["dialect"])
            if job.get("models") is not None or job.get("epilogue") is not None:  # a task found in models
                task_name, args = dialect.expand_model_task(op, params, job.get("epilogue") or {})
            else:
                task_name, args = dialect.expand_workload(op, params)
        except DialectError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    else:
        raise ConfigError(f"{where}: expected one op shorthand (dense: {{M:.., N:.., K:..}}) or task_name + args,"
                          f" got keys {sorted(workload)}")
    job["task_name"], job["args"] = task_name, args
    if base is not None:
        _resolve_paths(job, base)
    _check_job(job, where)
    target = job.get("target") or host_target().canonical
    job["target"] = parse_target(target).canonical
    return job


def _resolve_paths(job: dict[str, Any], base: Path) -> None:
    """Options the job's dialect declares as paths (and ``cost_model``), relative to the YAML's
    directory, made absolute."""
    from lorien.dialect import get_dialect

    if isinstance(job.get("cost_model"), str) and not Path(job["cost_model"]).is_absolute():
        job["cost_model"] = str((base / job["cost_model"]).resolve())

    try:
        declared = get_dialect(str(job["dialect"])).job_options
    except DialectError:
        return  # an unknown dialect is named when the job is checked
    for key, option in declared.items():
        if option.path and isinstance(job.get(key), str) and not Path(job[key]).is_absolute():
            job[key] = str((base / job[key]).resolve())


def _check_job(job: dict[str, Any], where: str) -> None:
    """A tuner mapping becomes ``tuner`` + ``tuner_options``; then the job is checked as every
    job is (:meth:`lorien.tune.job.TuneJob.from_spec`: common keys, the dialect's options)."""
    tuner = job["tuner"]
    if isinstance(tuner, dict):
        if "kind" not in tuner:
            raise ConfigError(f"{where}: a tuner mapping needs 'kind', got {tuner!r}")
        job["tuner_options"] = {k: v for k, v in tuner.items() if k != "kind"}
        job["tuner"] = tuner["kind"]
    job["measure"] = dict(job.get("measure") or {})
    TuneJob.from_spec(job, where)


#: Keys of the ``task_scheduler`` mapping of a tuning YAML.
SCHEDULER_KEYS = {"strategy", "trials", "round_trials", "alpha", "beta", "backward_window_size",
                  "max_failed_rounds", "seed"}
SCHEDULER_DEFAULTS: dict[str, Any] = {"strategy": "gradient", "round_trials": 16}


def scheduler_settings(document: Any, where: str) -> dict[str, Any]:
    """The validated ``task_scheduler`` mapping of a tuning YAML (with defaults)."""
    if not isinstance(document, dict):
        raise ConfigError(f"{where}: 'task_scheduler' is a mapping (strategy, trials, round_trials, ...), "
                          f"got {document!r:.80}")
    unknown = set(document) - SCHEDULER_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown task_scheduler keys {sorted(unknown)} (known: {sorted(SCHEDULER_KEYS)})")
    settings = {**SCHEDULER_DEFAULTS, **document}
    for key in ("trials", "round_trials"):
        value = settings.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{where}: task_scheduler {key!r} must be a positive integer, got {value!r}")
    return settings
