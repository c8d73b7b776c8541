"""The config space of one AutoTVM workload as zero-shot proposal uses it: sample by index,
featurize candidate configs as featurization does, measure the chosen ones into records
(:meth:`lorien.dialect.Dialect.proposal_space`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dialects.autotvm.features import entity_of, knob_features, workload_features
from dialects.autotvm.space import ConfigEntity
from dialects.autotvm.templates import instantiate
from lorien.record import TuningRecord


def _entity(config: Any) -> list[Any]:
    """The entity list of a config given as a ConfigEntity, a config dict or an entity list."""
    return config.to_json_entity() if isinstance(config, ConfigEntity) else entity_of(config)


class KnobProposalSpace:
    """The knob space of a template bound to a workload's args; configs travel as entity lists."""

    def __init__(self, task_name: str, args: Sequence[Any]):
        self.task_name = task_name
        self.args = list(args)
        self.task = instantiate(task_name, self.args)

    def __len__(self) -> int:
        return len(self.task.space)

    def config(self, index: int) -> list[Any]:
        """The entity list of config ``index``."""
        return self.task.space.get(index).to_json_entity()

    def features(self, configs: Sequence[Any]) -> list[dict[str, Any]]:
        """Workload and knob features of configs, as :func:`dialects.autotvm.features.featurize` names them."""
        workload = workload_features(self.args)
        return [{**workload, **knob_features(_entity(config))} for config in configs]

    def measure(self, configs: Sequence[Any], target: str, measure: dict[str, Any] | None = None,
                source: str = "lorien tune") -> list[TuningRecord]:
        """Build and measure configs on the engine for ``target``; one record each."""
        from dialects.autotvm.records import make_record
        from dialects.autotvm.tuning import measure_configs

        entities = [self.task.space.from_json_entity(_entity(config)) for config in configs]
        results = measure_configs(self.task_name, self.args, entities, measure, target)
        return [make_record(target, self.task_name, self.args, config, list(result.costs), int(result.error_no),
                            float(result.all_cost), float(result.timestamp), source=source)
                for config, result in zip(entities, results, strict=True)]
