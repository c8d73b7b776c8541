"""AutoTVM templates: registered by task name, instantiated from ``(task_name, args)``.

A template function ``fn(cfg, *args) -> (schedule, tensors)`` both defines the knobs (when
``cfg`` is a :class:`ConfigSpace`) and applies them (when ``cfg`` is a :class:`ConfigEntity`),
as in AutoTVM. ``args`` are exactly the task arguments of AutoTVM/TopHub logs, tensors written
``["TENSOR", shape, dtype]``. ``tensors`` lists the kernel's inputs then its output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dialects.autotvm.space import ConfigEntity, ConfigSpace
from dialects.autotvm.templates.registry import TEMPLATES, TemplateDef, register_template
from lorien.errors import DialectError, WorkloadError


def template_names() -> list[str]:
    _load()
    return sorted(TEMPLATES)


def get_template(task_name: str) -> TemplateDef:
    _load()
    try:
        return TEMPLATES[task_name]
    except KeyError:
        raise DialectError(f"no autotvm template {task_name!r} (known: {', '.join(sorted(TEMPLATES))})") from None


class Task:
    """A template bound to concrete arguments: its config space and config instantiation."""

    def __init__(self, template: TemplateDef, args: Sequence[Any]):
        self.template = template
        self.name = template.name
        self.args = list(args)
        self.space = ConfigSpace()
        try:
            template.fn(self.space, *self.args)
        except (TypeError, IndexError, ValueError) as exc:
            raise WorkloadError(f"template {self.name!r} cannot take args {self.args!r}: {exc}") from exc

    def config(self, index: int) -> ConfigEntity:
        return self.space.get(index)

    def instantiate(self, config: ConfigEntity) -> tuple[Any, list[Any]]:
        """The schedule and tensors (inputs then output) for one config."""
        return self.template.fn(config, *self.args)

    def reference(self, config: ConfigEntity, *inputs: np.ndarray) -> list[np.ndarray]:
        """Expected outputs of the kernel built for ``config`` on the given inputs."""
        return self.template.reference(config, self.args, *inputs)

    def __repr__(self) -> str:
        return f"Task({self.name}, {self.args}, {self.space!r})"


def instantiate(task_name: str, args: Sequence[Any]) -> Task:
    """The task of ``task_name`` on ``args`` (as in an AutoTVM log)."""
    return Task(get_template(task_name), args)


_LOADED = False


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        from dialects.autotvm.templates import batch_matmul, conv2d, dense, depthwise  # noqa: F401


__all__ = ["Task", "TemplateDef", "get_template", "instantiate", "register_template", "template_names"]
