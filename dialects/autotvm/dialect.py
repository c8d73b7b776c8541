"""The autotvm Dialect object the core finds through the ``lorien.dialects`` entry point."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from lorien.dialect import AppliedConfig, Dialect, JobOption
from lorien.record import TuningRecord

if TYPE_CHECKING:
    from lorien.tune.job import TuneJob
    from lorien.tune.loop import TuneContext

#: Templates that build one schedule path and so have no ``path`` knob, by the name the other
#: dialects give that path: ``dense_gemv.x86`` factors the reduction over K (an rfactor), as
#: the auto_scheduler's GEMV sketch and the meta_schedule rfactor rule do.
TEMPLATE_PATHS = {"dense_gemv.x86": "rfactor"}


class AutoTVMDialect(Dialect):
    """AutoTVM: knob config spaces, templates by task name, AutoTVM JSON-line records."""

    name = "autotvm"
    job_options = {
        "transfer": JobOption(False, bool, "xgb tuner: learn first from the store's records of the template"),
        "warm_start_model": JobOption(None, str, "xgb tuner: a cost model directory (lorien train) to start from"),
        "warm_start_samples": JobOption(512, int, "configs the warm-start model scores"),
    }

    def record_formats(self) -> list[str]:
        return ["autotvm"]

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        from dialects.autotvm import features

        return features.featurize(record)

    def schedule_path(self, record: TuningRecord) -> str | None:
        """The template's ``path`` knob (e.g. batch_matmul.x86's ``panel``), else the one path of
        a template in :data:`TEMPLATE_PATHS`; None for a config without the knob of a template
        that has one (it replays on the template's first path)."""
        config = record.config_value()
        entities = config.get("entity", []) if isinstance(config, dict) else []
        knob = next((str(entity[2]) for entity in entities if entity[0] == "path"), None)
        return knob if knob is not None else TEMPLATE_PATHS.get(record.task_name)

    def workload_key(self, task_name: str, args: list[Any]) -> str:
        from lorien.workload import autotvm_workload_key

        return autotvm_workload_key(task_name, args)

    def describe_workload(self, workload_key: str) -> tuple[str, float | None]:
        from lorien.workload import compute_flop, infer_layout, parse_autotvm_workload_key

        task_name, args = parse_autotvm_workload_key(workload_key)
        return infer_layout(task_name, args), compute_flop(task_name, args)

    def claims_workload_key(self, workload_key: str) -> bool | None:
        """The fallback: a readable key ``task#arg#...`` has no form other dialects' keys lack."""
        return None

    def template_of(self, record: TuningRecord) -> str:
        return record.task_name

    def expand_workload(self, op: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
        """(task_name, args) of a tuning-YAML op shorthand (``dense: {M:.., N:.., K:..}``)."""
        from dialects.autotvm import workloads

        return workloads.expand_workload(op, params)

    def compile_record(self, record: TuningRecord, target: str | None = None, store: Any = None):
        """A kernel built with the config of a stored record."""
        from dialects.autotvm.compile import compile_record

        return compile_record(record, target=target)

    def schedule_record(self, record: TuningRecord, store: Any = None):
        """The engine schedule of a record's config, for its target's vector width."""
        from dialects.autotvm.compile import schedule_record

        return schedule_record(record)

    def compile_default(self, workload_key: str, target: str | None = None):
        """A kernel built with a default (untuned) config."""
        from dialects.autotvm.compile import compile_default

        return compile_default(workload_key, target=target)

    def apply_log_line(self, path: str, line_no: int, **options: Any) -> AppliedConfig:
        from dialects.autotvm.apply import apply_log_line

        return _generic(apply_log_line(path, line_no, **options))

    def apply_config(self, workload_key: str, config: str, **options: Any) -> AppliedConfig:
        from dialects.autotvm.apply import apply_config
        from lorien.workload import parse_autotvm_workload_key

        task_name, task_args = parse_autotvm_workload_key(workload_key)
        return _generic(apply_config(task_name, task_args, config, **options))

    def check_job(self, job: TuneJob) -> None:
        from dialects.autotvm.tuning import check_job

        check_job(job)

    def tuning_context(self, job: TuneJob, store: Any) -> TuneContext:
        """The template's config space and the job's tuner (:mod:`dialects.autotvm.tuning`)."""
        from dialects.autotvm.tuning import tuning_context

        return tuning_context(job, store)

    def proposal_space(self, workload_key: str) -> Any:
        from dialects.autotvm.proposals import KnobProposalSpace
        from lorien.workload import parse_autotvm_workload_key

        return KnobProposalSpace(*parse_autotvm_workload_key(workload_key))

    def featurize_batch(self, records: Any) -> tuple[list[tuple[list[int], dict[str, Any]]], list[tuple[int, str]]]:
        from dialects.autotvm import features

        return features.featurize_batch(records)


def _generic(applied: Any) -> AppliedConfig:
    """The core's view of an autotvm ``apply`` outcome: the config as an entity list and index."""
    config = f"{json.dumps(applied.config.to_json_entity())} (index {applied.config.index})"
    return AppliedConfig(record=applied.record, config_text=config, error_msg=applied.error_msg,
                         logged_cost_s=applied.logged_cost_s, logged_target=applied.logged_target)
