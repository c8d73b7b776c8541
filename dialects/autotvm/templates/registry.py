"""The registry of AutoTVM templates: each template module registers its schedule functions
by task name with :func:`register_template`; :mod:`dialects.autotvm.templates` looks them up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lorien.errors import DialectError

TemplateFn = Callable[..., tuple[Any, list[Any]]]


@dataclass(frozen=True)
class TemplateDef:
    """A registered template: its schedule function and a NumPy reference of its kernel."""

    name: str
    fn: TemplateFn
    reference: Callable[..., list[np.ndarray]]


#: Registered templates by task name.
TEMPLATES: dict[str, TemplateDef] = {}


def register_template(name: str, reference: Callable[..., list[np.ndarray]]) -> Callable[[TemplateFn], TemplateFn]:
    """Register ``fn(cfg, *args)`` under task name ``name``; ``reference(cfg, args, *inputs)``
    returns the expected outputs of the kernel built for ``cfg``."""

    def wrap(fn: TemplateFn) -> TemplateFn:
        if name in TEMPLATES:
            raise DialectError(f"template {name!r} is registered twice")
        TEMPLATES[name] = TemplateDef(name, fn, reference)
        return fn

    return wrap
