"""``lorien extract``: the tunable tasks of ONNX files and torch modules, as a tuning YAML.

Each model is read by its frontend (:mod:`lorien.models.onnx_frontend`,
:mod:`lorien.models.torch_frontend`), which reports every tunable operator it finds (with
the elementwise epilogue it can see after it) to a :class:`TaskCollector` and every other
operator as unsupported. Tasks of all models are merged: identical tasks add their weights.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lorien.models.frontend import (
    ExtractError,
    InputSpec,
    ModelReport,
    TaskCollector,
    format_counts,
    parse_input_spec,
)
from lorien.models.tasks import Task, merge_tasks


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


@dataclass
class ModelTasks:
    """Tasks of models as a dialect's tuning system sees them (``lorien extract --dialect``):
    workload entries naming each task by the dialect's key, top-level settings, and the files
    that define the workloads, written beside the YAML (name -> text)."""

    entries: list[dict[str, Any]]
    settings: dict[str, Any]
    files: dict[str, str]
    summary_lines: list[str]
    report: dict[str, Any]

    def summary(self) -> str:
        return "\n".join(self.summary_lines)

    def to_yaml(self, command: str | None = None) -> str:
        header = [f"lorien extract: {len(self.entries)} tasks for dialect {self.settings.get('dialect')}."]
        if command:
            header.append(f"Made by: {command}")
        return tasks_yaml(self.entries, header + [f"  {line}" for line in self.summary_lines], self.settings)


def tasks_yaml(entries: Sequence[dict[str, Any]], header: Sequence[str] = (),
               settings: dict[str, Any] | None = None) -> str:
    """A ``lorien tune`` YAML: comment header, top-level settings, one workload per line."""
    lines = [f"# {line}".rstrip() for line in header]
    for key, value in (settings or {}).items():  # one key a line: nested values in flow style
        flow = None if isinstance(value, (dict, list)) else False
        lines.append(yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=flow, width=100).rstrip())
    lines.append("workloads:")
    for entry in entries:
        text = yaml.safe_dump(entry, sort_keys=False, default_flow_style=True, width=math.inf).strip()
        lines.append(f"  - {text}")
    return "\n".join(lines) + "\n"


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a file whole or not at all (a temporary file beside it, then renamed); its
    directory is made if missing (``-o tasks/model.yaml`` in a fresh checkout)."""
    import os
    import tempfile

    path = Path(path)
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
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
