"""Build kernels of AutoTVM workloads: from a stored record, or with a default config."""

from __future__ import annotations

from typing import Any

import orjson

from dialects.autotvm.features import config_entity
from dialects.autotvm.space import ConfigEntity, SplitSpace
from dialects.autotvm.templates import Task
from dialects.autotvm.tuning import cached_task


def build_config(task: Task, config: ConfigEntity, target: str | None = None):
    """Compile one config of a task for ``target`` (default this host); the kernel knows its
    task and config."""
    from lorien.engine.build import build
    from lorien.engine.cpu import building_for

    with building_for(target):
        schedule, tensors = task.instantiate(config)
    kernel = build(schedule, tensors, target=target)
    kernel.task, kernel.config, kernel.tensors = task, config, tensors
    return kernel


def compile_record(record: Any, target: str | None = None):
    """The kernel of an AutoTVM record's config."""
    task = cached_task(record.task_name, record.args)
    config = task.space.from_json_entity(config_entity(record.config))
    return build_config(task, config, target=target)


def schedule_record(record: Any) -> tuple[Any, list[Any]]:
    """(schedule, tensors) of an AutoTVM record's config, instantiated for its target; a config
    that is no point of the template's space is a DialectError naming the record."""
    from lorien.engine.cpu import building_for
    from lorien.errors import DialectError, LorienError

    try:
        task = cached_task(record.task_name, record.args)
        config = task.space.from_json_entity(config_entity(record.config))
        with building_for(record.target):
            return task.instantiate(config)
    except (LorienError, KeyError, TypeError, ValueError) as exc:
        raise DialectError(f"record {record.record_id} ({record.task_name}): cannot instantiate its config: {exc}") \
            from exc


def default_config(task: Task, vector_lanes: int = 8) -> ConfigEntity:
    """A reasonable untuned config: innermost split factors as close to ``vector_lanes`` as
    the extent allows, middle factors 1, every other knob its first candidate."""
    positions = []
    for space in task.space.space_map.values():
        if isinstance(space, SplitSpace):
            def score(entity, space=space) -> tuple[int, int]:
                inner = entity.size[-1]
                middle = max(entity.size[1:-1], default=1)
                return (abs(inner - vector_lanes) if inner <= vector_lanes else 2 * (inner - vector_lanes), middle)

            positions.append(min(range(len(space)), key=lambda i, space=space, score=score: score(space[i])))
        else:
            positions.append(0)
    return task.space.get(task.space.index_of_knobs(positions))


def compile_default(workload_key: str, target: str | None = None):
    """The kernel of a workload key built with :func:`default_config`."""
    from lorien.workload import parse_autotvm_workload_key

    task_name, args = parse_autotvm_workload_key(workload_key)
    task = cached_task(task_name, orjson.dumps(args).decode())
    return build_config(task, default_config(task), target=target)
