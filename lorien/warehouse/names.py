"""Readable names of stored workloads (``lorien warehouse workloads``): the task name and
tensor shapes the records carry, whatever the dialect. A MetaSchedule key is a bare
structural hash; its records' task name (the main block of TVM's module, or the workload
function of a Lorien tuning run) and ``args_info`` shapes say what it computes.
"""

from __future__ import annotations

from typing import Any

import orjson

from lorien.warehouse.base import Store


def _shape(arg: Any) -> list[int] | None:
    """The shape of a tensor argument: AutoTVM's ``["TENSOR", shape, dtype]`` or
    MetaSchedule's ``["TENSOR", dtype, shape]``; None for any other argument."""
    if isinstance(arg, list) and len(arg) == 3 and arg[0] == "TENSOR":
        shape = arg[1] if isinstance(arg[1], list) else arg[2]
        return shape if isinstance(shape, list) else None
    return None


def workload_name(task_name: str, args: str) -> str:
    """``task shape shape ...`` (tensor arguments, e.g. ``conv 1x56x56x64 3x3x64x64``), or the
    task and its arguments when none is a tensor (an auto-scheduler key's ``dense_layer 64,64,64``)."""
    value = orjson.loads(args) if args else []
    values = value if isinstance(value, list) else [value]
    shapes = [shape for shape in map(_shape, values) if shape is not None]
    if shapes:
        described = " ".join("x".join(str(extent) for extent in shape) for shape in shapes)
    else:
        described = ",".join(orjson.dumps(item).decode() for item in values)
    return f"{task_name or '?'} {described}".strip()


def workload_names(store: Store, target: str | None = None) -> list[tuple[str, str]]:
    """(workload key, readable name) of every workload stored (of ``target``), sorted by key;
    the name is that of the key's first record."""
    filters = {"target": target} if target is not None else None
    table = store.scan(filters, columns=["workload_key", "task_name", "args"])
    named: dict[str, str] = {}
    columns = (table.column(name).to_pylist() for name in ("workload_key", "task_name", "args"))
    for key, task_name, args in zip(*columns, strict=True):
        if key not in named:
            named[key] = workload_name(task_name, args)
    return sorted(named.items())
