"""The auto_scheduler Dialect object the core finds through the ``lorien.dialects`` entry point."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lorien.dialect import AppliedConfig, Dialect, JobOption
from lorien.errors import WorkloadError
from lorien.record import TuningRecord
from lorien.workload import LAYOUT_NA, warn_unknown_flop

if TYPE_CHECKING:
    from lorien.tune.job import TuneJob
    from lorien.tune.loop import TuneContext


class AutoSchedulerDialect(Dialect):
    """Auto-scheduler (Ansor): template-free schedules as transform steps, JSON-line records."""

    name = "auto_scheduler"
    job_options = {
        "transfer": JobOption(True, bool, "xgb tuner: learn from and seed with the store's records of the "
                                          "same function's other workloads"),
        "layout_rewrite": JobOption(True, bool, "measure with the weights packed as the loops read them"),
    }

    def record_formats(self) -> list[str]:
        return ["ansor"]

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        from dialects.auto_scheduler import features

        return features.featurize(record)

    def schedule_path(self, record: TuningRecord) -> str | None:
        """``rfactor`` for the GEMV sketch (its steps factor the reduction: RF), else
        ``multi_level_tiling`` where a split step tiles a loop in levels, else None."""
        steps = record.config_value()
        if any(step[0] == "RF" for step in steps):
            return "rfactor"
        return "multi_level_tiling" if any(step[0] == "SP" and len(step[4]) > 1 for step in steps) else None

    def workload_key(self, task_name: str, args: list[Any]) -> str:
        import lorien.builtin_workloads  # noqa: F401 - registers the built-in workloads
        from lorien import workload_registry

        return workload_registry.make_workload_key(task_name, args)

    def claims_workload_key(self, workload_key: str) -> bool | None:
        """A JSON list ``["func_name_or_hash", args...]``."""
        return workload_key.startswith("[")

    def describe_workload(self, workload_key: str) -> tuple[str, float | None]:
        """Layout and FLOPs of a registered workload from its compute DAG; a workload nobody
        registered (a DAG hash from a graph) has unknown FLOPs."""
        import lorien.builtin_workloads  # noqa: F401 - registers the built-in workloads
        from lorien import workload_registry

        try:
            dag = workload_registry.workload_dag(workload_key)
        except WorkloadError as exc:
            name = workload_key
            try:
                name = workload_registry.parse_workload_key(workload_key)[0]
            except WorkloadError:
                pass
            warn_unknown_flop(name, str(exc))
            return LAYOUT_NA, None
        try:
            flop = dag.flop()
        except OverflowError:
            flop = math.inf
        if not (math.isfinite(flop) and flop >= 0):
            warn_unknown_flop(workload_registry.parse_workload_key(workload_key)[0],
                              f"{workload_key} gives a float-operation count no double holds: {flop}")
            return dag.layout(), None
        return dag.layout(), flop

    def expand_workload(self, op: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
        """(workload function, args) of a tuning-YAML op shorthand (``conv2d: {C:.., ...}``)."""
        from lorien.builtin_workloads import expand_workload

        return expand_workload(op, params)

    def extract_model_tasks(self, models: list[str], inputs: list[str], batch_size: int | None = None,
                            target: str | None = None, skip_untunable: bool = False) -> Any:
        """``lorien extract --dialect auto_scheduler``: the op shorthands of ``lorien extract``
        (ONNX files, torch modules) under ``dialect: auto_scheduler``, each checked to be tunable
        as the model computes it (:meth:`expand_model_task`: the NCHW conv with its bias/relu).
        A task that is not is a DialectError naming it, or, with ``skip_untunable``, left out
        with a summary line."""
        from lorien.errors import DialectError
        from lorien.models import extract_models
        from lorien.models.extract import ModelTasks

        extraction = extract_models(models, inputs, batch_size=batch_size)
        entries, skipped = [], []
        for task in extraction.tasks:
            entry = task.to_entry()
            try:
                self.expand_model_task(task.op, dict(entry[task.op]), dict(task.epilogues))
            except DialectError as exc:
                if not skip_untunable:
                    raise DialectError(f"task {task.name}: {exc}; or pass --skip-untunable to leave it out") from exc
                skipped.append(f"skipped {task.name}: {exc}")
                continue
            entries.append(entry)
        lines = [*extraction.summary().splitlines(), *skipped,
                 f"{len(entries)} tasks for the auto_scheduler dialect; {len(skipped)} skipped"]
        settings: dict[str, Any] = {"dialect": self.name}
        if target:
            settings["target"] = target
        return ModelTasks(entries=entries, settings=settings, files={}, summary_lines=lines,
                          report={**extraction.to_dict(), "skipped": len(skipped)})

    def expand_model_task(self, op: str, params: dict[str, Any], epilogue: Mapping[str, int]) -> tuple[str, list[Any]]:
        """A task found in models: the op in the model's layout with its epilogue fused, or
        DialectError naming what the built-in workloads cannot compute
        (:func:`lorien.builtin_workloads.expand_model_task`)."""
        from lorien.builtin_workloads import expand_model_task

        return expand_model_task(op, params, dict(epilogue), self.name)

    def compile_record(self, record: TuningRecord, target: str | None = None, store: Any = None):
        """A kernel built by replaying a stored record's steps."""
        from dialects.auto_scheduler.compile import compile_record

        return compile_record(record, target=target)

    def schedule_record(self, record: TuningRecord, store: Any = None):
        """The engine schedule of a record's steps replayed on its registered workload."""
        from dialects.auto_scheduler.compile import replay_record

        replay = replay_record(record)
        return replay.schedule, replay.args

    def compile_default(self, workload_key: str, target: str | None = None):
        """A kernel of a workload built with a default (untuned) schedule."""
        from dialects.auto_scheduler.compile import compile_default

        return compile_default(workload_key, target=target)

    def apply_log_line(self, path: str, line_no: int, **options: Any) -> AppliedConfig:
        """Replay, check and measure the steps of one Ansor log line here."""
        from dialects.auto_scheduler.apply import apply_log_line

        return apply_log_line(path, line_no, **options)

    def apply_config(self, workload_key: str, config: str, **options: Any) -> AppliedConfig:
        """Replay, check and measure a list of steps (JSON) of a workload here."""
        from dialects.auto_scheduler.apply import apply_steps

        return apply_steps(workload_key, config, **options)

    def tuning_context(self, job: TuneJob, store: Any) -> TuneContext:
        """The sketch space of the workload's DAG and the job's tuner (:mod:`dialects.auto_scheduler.tuning`)."""
        from dialects.auto_scheduler.tuning import tuning_context

        return tuning_context(job, store)
