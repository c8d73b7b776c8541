"""``lorien extract``: the tunable tasks of ONNX files and torch modules, as a tuning YAML.

Each model is read by its frontend (:mod:`lorien.models.onnx_frontend`,
:mod:`lorien.models.torch_frontend`), which reports every tunable operator it finds (with
the elementwise epilogue it can see after it) to a :class:`TaskCollector` and every other
operator as unsupported. Tasks of all models are merged: identical tasks add their weights.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lorien.errors import LorienError
from lorien.models.tasks import Task, merge_tasks


class ExtractError(LorienError, ValueError):
    """A model that cannot be read or whose tasks cannot be determined; names the model."""


@dataclass(frozen=True)
class InputSpec:
    """``--input NAME:1x3x224x224[:DTYPE]``, or ``1x3x224x224`` for a model's only input."""

    name: str | None
    shape: tuple[int, ...]
    dtype: str | None = None

    def __str__(self) -> str:
        text = "x".join(str(d) for d in self.shape)
        return ":".join(part for part in (self.name, text, self.dtype) if part)


_SHAPE = re.compile(r"^\d+(x\d+)*$")


def parse_input_spec(text: str) -> InputSpec:
    """Read ``NAME:SHAPE[:DTYPE]`` or ``SHAPE``; SHAPE is dims joined by 'x' (``1x3x224x224``)."""
    parts = text.split(":")
    shape_at = next((i for i, part in enumerate(parts) if _SHAPE.match(part)), None)
    if shape_at is None or shape_at > 1 or len(parts) > shape_at + 2:
        raise ExtractError(f"--input {text!r}: expected NAME:SHAPE[:DTYPE] or SHAPE, e.g. input:1x3x224x224")
    shape = tuple(int(d) for d in parts[shape_at].split("x"))
    if min(shape) < 1:
        raise ExtractError(f"--input {text!r}: dimensions must be positive")
    name = parts[0] if shape_at == 1 else None
    dtype = parts[shape_at + 1] if len(parts) > shape_at + 1 else None
    if dtype is not None:
        import numpy as np

        try:
            dtype = np.dtype(dtype).name
        except TypeError as exc:
            raise ExtractError(f"--input {text!r}: unknown dtype {dtype!r} (e.g. float32, int64)") from exc
    return InputSpec(name, shape, dtype)


@dataclass
class DeclaredInput:
    """An input a model declares: its name, its shape (None or a string for a dynamic
    dimension; None as a whole when the rank is unknown) and its dtype."""

    name: str
    shape: list[int | str | None] | None
    dtype: str = "float32"


def resolve_inputs(model: str, declared: Sequence[DeclaredInput], specs: Sequence[InputSpec],
                   batch_size: int | None, used: set[int]) -> dict[str, tuple[list[int], str]]:
    """Concrete (shape, dtype) of each declared input: ``--input`` overrides the declared shape,
    ``batch_size`` sets dimension 0; a dimension left dynamic is an error naming the input.
    Indices of the specs used go into ``used``."""
    resolved: dict[str, tuple[list[int], str]] = {}
    unnamed = [i for i, spec in enumerate(specs) if spec.name is None]
    for item in declared:
        index = next((i for i, spec in enumerate(specs) if spec.name == item.name), None)
        if index is None and unnamed and len(declared) == 1:
            index = unnamed[0]
        shape, dtype = item.shape, item.dtype
        if index is not None:
            used.add(index)
            spec = specs[index]
            if shape is not None and len(spec.shape) != len(shape):
                raise ExtractError(f"{model}: --input {spec} has rank {len(spec.shape)} but input "
                                   f"{item.name!r} has shape {_show(shape)}")
            shape, dtype = list(spec.shape), spec.dtype or dtype
        if shape is None:
            raise ExtractError(f"{model}: input {item.name!r} needs a shape: give --input {item.name}:1x3x224x224")
        if batch_size is not None and shape:
            shape = [batch_size, *shape[1:]]
        dynamic = [f"{d or '?'} (dimension {i})" for i, d in enumerate(shape) if not isinstance(d, int) or d < 1]
        if dynamic:
            raise ExtractError(f"{model}: input {item.name!r} has dynamic dimensions {', '.join(dynamic)} in shape "
                               f"{_show(shape)}; give their values with --input {item.name}:"
                               + "x".join(str(d) if isinstance(d, int) and d > 0 else "N" for d in shape))
        resolved[item.name] = ([int(d) for d in shape], dtype)
    if unnamed and len(declared) != 1 and unnamed[0] not in used:
        names = ", ".join(item.name for item in declared)
        raise ExtractError(f"{model}: --input {specs[unnamed[0]]} has no name but the model has "
                           f"{len(declared)} inputs ({names}); write NAME:SHAPE")
    return resolved


def _show(shape: Sequence[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class TaskCollector:
    """The tasks and unsupported operators of one model, as its frontend reports them."""

    def __init__(self, model: str):
        self.model = model
        self.tasks: dict[tuple[Any, ...], Task] = {}
        self.unsupported: Counter[str] = Counter()
        self.tunable_ops = 0

    def add(self, op: str, params: dict[str, Any], epilogue: Sequence[str] = (), name: str = "") -> None:
        """One occurrence of a tunable operator and the epilogue parts fused after it."""
        task = Task(op, params, weight=1, name=f"{self.model}/{name}" if name else self.model, models=[self.model],
                    epilogues=Counter(["+".join(epilogue)] if epilogue else []))
        self.tunable_ops += 1
        if task.key in self.tasks:
            self.tasks[task.key].merge(task)
        else:
            self.tasks[task.key] = task

    def skip(self, op_type: str) -> None:
        """An operator that is not tuned (pooling, reshapes, normalization, ...)."""
        self.unsupported[op_type] += 1


@dataclass
class ModelReport:
    """What was read from one model."""

    name: str
    source: str
    inputs: dict[str, list[int]]
    tunable_ops: int
    tasks: list[Task]
    unsupported: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        shapes = ", ".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in self.inputs.items())
        line = f"{self.name} ({self.source}; {shapes}): {self.tunable_ops} tunable ops -> {len(self.tasks)} tasks"
        return line + "; not tuned: " + format_counts(self.unsupported)


def format_counts(counts: Counter[str]) -> str:
    """``MaxPool x1, Reshape x2`` (most frequent first), or ``none``."""
    if not counts:
        return "none"
    return ", ".join(f"{name} x{count}" for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class Extraction:
    """The merged tasks of several models and a report per model."""

    models: list[ModelReport]
    tasks: list[Task]

    @property
    def unsupported(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for report in self.models:
            total.update(report.unsupported)
        return total

    def summary(self) -> str:
        lines = [report.summary() for report in self.models]
        weight = sum(task.weight for task in self.tasks)
        lines.append(f"total: {len(self.tasks)} tasks (weight {weight:g}) from {len(self.models)} model(s); "
                     f"unsupported operators: {sum(self.unsupported.values())} ({format_counts(self.unsupported)})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain data (``--json``)."""
        return {"models": [{"name": r.name, "source": r.source, "inputs": r.inputs, "tunable_ops": r.tunable_ops,
                            "tasks": len(r.tasks), "unsupported": dict(r.unsupported.most_common())}
                           for r in self.models],
                "tasks": len(self.tasks), "weight": sum(task.weight for task in self.tasks),
                "unsupported": dict(self.unsupported.most_common())}

    def to_yaml(self, command: str | None = None) -> str:
        header = [f"lorien extract: {len(self.tasks)} tasks from {len(self.models)} model(s)."]
        if command:
            header.append(f"Made by: {command}")
        header += [f"  {report.summary()}" for report in self.models]
        return tasks_yaml([task.to_entry() for task in self.tasks], header)


def tasks_yaml(entries: Sequence[dict[str, Any]], header: Sequence[str] = (),
               settings: dict[str, Any] | None = None) -> str:
    """A ``lorien tune`` YAML: comment header, top-level settings, one workload per line."""
    lines = [f"# {line}".rstrip() for line in header]
    if settings:
        lines.append(yaml.safe_dump(settings, sort_keys=False, default_flow_style=None, width=100).rstrip())
    lines.append("workloads:")
    for entry in entries:
        text = yaml.safe_dump(entry, sort_keys=False, default_flow_style=True, width=math.inf).strip()
        lines.append(f"  - {text}")
    return "\n".join(lines) + "\n"


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a file whole or not at all (a temporary file beside it, then renamed)."""
    import os
    import tempfile

    path = Path(path)
    tmp_name = None
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            tmp_name = tmp.name
            tmp.write(text)
        os.replace(tmp_name, path)
    except OSError as exc:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
        raise ExtractError(f"cannot write {path}: {exc}") from exc


def is_onnx_path(spec: str) -> bool:
    """An existing file, or a name ending in .onnx, is read as ONNX; else a torch factory."""
    return spec.lower().endswith(".onnx") or Path(spec).is_file()


def extract_models(specs: Sequence[str], inputs: Sequence[str | InputSpec] = (),
                   batch_size: int | None = None) -> Extraction:
    """Tasks of every model (ONNX path or torch factory ``module:attr``), merged across models."""
    if not specs:
        raise ExtractError("no model given: name ONNX files or torch factories such as torchvision.models:resnet18")
    if batch_size is not None and batch_size < 1:
        raise ExtractError(f"--batch-size must be positive, got {batch_size}")
    input_specs = [spec if isinstance(spec, InputSpec) else parse_input_spec(spec) for spec in inputs]
    used: set[int] = set()
    reports: list[ModelReport] = []
    names: Counter[str] = Counter()
    for spec in specs:
        if is_onnx_path(spec):
            from lorien.models.onnx_frontend import read_onnx

            reader, name = read_onnx, Path(spec).stem
        elif ":" in spec:
            from lorien.models.torch_frontend import read_torch

            reader, name = read_torch, spec.partition(":")[2].split("(")[0].rsplit(".", 1)[-1]
        else:
            raise ExtractError(f"{spec!r} is neither an ONNX file nor a torch factory (module:function)")
        names[name] += 1
        if names[name] > 1:
            name = f"{name}#{names[name]}"
        reports.append(reader(spec, TaskCollector(name), input_specs, batch_size, used))
    unused = [str(spec) for i, spec in enumerate(input_specs) if i not in used]
    if unused:
        raise ExtractError(f"--input {', '.join(unused)}: no model has such an input")
    return Extraction(reports, merge_tasks(task for report in reports for task in report.tasks))
