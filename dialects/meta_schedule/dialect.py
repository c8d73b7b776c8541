"""The meta_schedule Dialect object the core finds through the ``lorien.dialects`` entry point."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorien.dialect import AppliedConfig, Dialect, JobOption
from lorien.errors import DialectError
from lorien.record import TuningRecord
from lorien.workload import LAYOUT_NA, warn_unknown_flop

if TYPE_CHECKING:
    from lorien.tune.job import TuneJob
    from lorien.tune.loop import TuneContext


class MetaScheduleDialect(Dialect):
    """MetaSchedule: schedules as traces of instructions with sampling decisions."""

    name = "meta_schedule"
    job_options = {
        "workload_file": JobOption(None, str, "a JSONDatabase workload file holding the job's workload_key (TVM's "
                                   "module of the task; written by lorien extract --dialect meta_schedule)", path=True),
        "transfer": JobOption(False, bool, "xgb tuner: seed with the best trace of each of the store's other "
                                           "workloads of the same function, adapted to this one (the closest shapes "
                                           "first; each plan measures up to two, with a cost_model the "
                                           "first plan only)"),
        "measure_with": JobOption("lorien", str, "who builds and times the candidates: 'lorien' (Lorien's engine, "
                                                 "no TVM needed) or 'tvm' (apache-tvm's builder and evaluator: "
                                                 "TVM-true latencies, records whose build says measured_by tvm)"),
        "remeasure_with_tvm": JobOption(0, int, "after tuning on Lorien's engine, build and time the job's N fastest "
                                                "traces with apache-tvm and commit them as TVM-measured records "
                                                "(0: none; needs apache-tvm and a CPU target)"),
    }

    def record_formats(self) -> list[str]:
        return ["meta_schedule"]

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        from dialects.meta_schedule import features

        return features.featurize(record)

    def schedule_path(self, record: TuningRecord) -> str | None:
        """The rule of each tiled block, in trace order: ``rfactor`` (an RFactor instruction, the
        GEMV rule) or ``multi_level_tiling`` (a ``meta_schedule.tiling_structure`` annotation
        such as SSRSRS), joined by ``+`` where blocks took different rules; None for neither."""
        instructions = record.config_value()[0]
        rules: list[str] = []
        for kind, inputs, attrs, _ in instructions:
            if kind == "RFactor":
                rules.append("rfactor")
            elif kind == "Annotate" and attrs == ["meta_schedule.tiling_structure"] and inputs[1] != '"rfactor"':
                rules.append("multi_level_tiling")
        return "+".join(dict.fromkeys(rules)) or None

    def __init__(self) -> None:
        self._described: dict[str, tuple[str, float | None]] = {}

    def workload_key(self, task_name: str, args: list[Any]) -> str:
        """The structural hash of the compute DAG of a registered workload function's args."""
        from dialects.meta_schedule.tuning import job_dag
        from dialects.meta_schedule.workload import workload_key_of
        from lorien import workload_registry

        dag = job_dag(workload_registry.make_workload_key(task_name, args))
        key = workload_key_of(dag)
        self._described[key] = (dag.layout(), dag.flop())
        return key

    def claims_workload_key(self, workload_key: str) -> bool | None:
        """A structural hash: a decimal number."""
        return workload_key.isdigit()

    def describe_workload(self, workload_key: str) -> tuple[str, float | None]:
        """Layout and FLOPs of a workload keyed in this process; a hash from elsewhere is unknown."""
        if workload_key in self._described:
            return self._described[workload_key]
        warn_unknown_flop(workload_key, "a MetaSchedule structural hash names no workload Lorien has built")
        return LAYOUT_NA, None

    def expand_workload(self, op: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
        """(workload function, args) of a tuning-YAML op shorthand (:mod:`lorien.builtin_workloads`)."""
        from lorien.builtin_workloads import expand_workload

        return expand_workload(op, params)

    def expand_model_task(self, op: str, params: dict[str, Any], epilogue: Mapping[str, int]) -> tuple[str, list[Any]]:
        """A task found in models: the op in the model's layout with its epilogue fused, or
        DialectError naming what the built-in workloads cannot compute
        (:func:`lorien.builtin_workloads.expand_model_task`)."""
        from lorien.builtin_workloads import expand_model_task

        return expand_model_task(op, params, dict(epilogue), self.name)

    def check_job(self, job: TuneJob) -> None:
        """A job with a ``workload_file`` names a workload of that file by its structural hash;
        ``measure_with`` is ``lorien`` or ``tvm`` (``tvm`` needs apache-tvm and a CPU target), and so
        does ``remeasure_with_tvm`` above 0."""
        from dialects.meta_schedule.tvm_measure import check_measure_with

        check_measure_with(job.option("measure_with"), job.target)
        remeasure = job.option("remeasure_with_tvm")
        if isinstance(remeasure, bool) or remeasure < 0:
            raise DialectError(f"'remeasure_with_tvm' is how many of the best traces TVM re-measures (0 or more), "
                               f"got {remeasure!r}")
        if remeasure:
            from dialects.meta_schedule.tvm_measure import require_tvm, tvm_target_dict

            require_tvm(f"'remeasure_with_tvm: {remeasure}' (the best traces built and timed by TVM)")
            tvm_target_dict(job.target)
        if job.option("workload_file") is not None:
            from dialects.meta_schedule.relax_tasks import workload_of_file

            if not job.workload_key:
                raise DialectError(f"workload_file {job.option('workload_file')}: name the task by its structural "
                                   f"hash with workload_key")
            workload_of_file(job.option("workload_file"), job.workload_key)

    def extract_model_tasks(self, models: list[str], inputs: list[str], batch_size: int | None = None,
                            target: str | None = None, skip_untunable: bool = False) -> Any:
        """TVM's own relax tasks of ONNX models, verbatim (:mod:`dialects.meta_schedule.relax_tasks`)."""
        from dialects.meta_schedule.relax_tasks import extract_model_tasks

        return extract_model_tasks(models, inputs, batch_size, target, skip_untunable)

    def tuning_context(self, job: TuneJob, store: Any) -> TuneContext:
        """The design space of the workload's DAG and the job's tuner (:mod:`dialects.meta_schedule.tuning`)."""
        from dialects.meta_schedule.tuning import tuning_context

        return tuning_context(job, store)

    def compile_record(self, record: TuningRecord, target: str | None = None, store: Any = None):
        """A kernel built by replaying a stored record's trace on its workload."""
        from dialects.meta_schedule.compile import compile_record

        return compile_record(record, target=target, store=store)

    def schedule_record(self, record: TuningRecord, store: Any = None):
        """The engine schedule of a record's trace replayed on its workload."""
        import orjson

        from dialects.meta_schedule.compile import workload_dag
        from dialects.meta_schedule.trace import replay_trace

        replay = replay_trace(workload_dag(record, store), orjson.loads(record.config))
        return replay.schedule, replay.args

    def compile_default(self, workload_key: str, target: str | None = None):
        raise DialectError(f"MetaSchedule workload {workload_key}: a structural hash names no computation Lorien "
                           f"can rebuild without a record; tune it or ingest its database first")

    def write_log(self, records: list[TuningRecord], log_format: str, path: str | Path,
                  workloads: Mapping[str, str] | None = None, **options: Any) -> int:
        """A JSONDatabase directory TVM loads: workloads tuned here become TVM modules (needs
        apache-tvm), or stay Lorien compute DAGs with ``lorien_workloads``; ``measure_with_tvm``
        writes TVM's latencies of the records Lorien's engine measured (needs apache-tvm)."""
        from dialects.meta_schedule.tvm_database import export_database

        if options.get("measure_with_tvm"):
            from dialects.meta_schedule.tvm_measure import remeasure_engine_records

            records = remeasure_engine_records(records, dict(workloads or {}))
        return export_database(records, path, workloads, lorien_workloads=bool(options.get("lorien_workloads")))

    def apply_log_line(self, path: str, line_no: int, **options: Any) -> AppliedConfig:
        """Replay, check and measure the trace of one JSONDatabase record here."""
        from dialects.meta_schedule.apply import apply_log_line

        return apply_log_line(path, line_no, **options)
