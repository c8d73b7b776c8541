"""What a model frontend (:mod:`lorien.models.onnx_frontend`, :mod:`lorien.models.torch_frontend`)
works with: the ``--input`` specs it resolves the model's inputs against, the
:class:`TaskCollector` it reports operators to, and the :class:`ModelReport` it returns.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lorien.errors import LorienError
from lorien.models.tasks import Task


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
