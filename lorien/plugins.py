"""Finding the installed dialect plugins.

A dialect is a package that registers one object under the entry-point group
``lorien.dialects``. Only this module reads that group, so any layer -- a codec that asks the
auto_scheduler registry about a workload as well as the CLI -- can find a dialect without
importing the :class:`lorien.dialect.Dialect` interface (which sits above the codecs).
"""

from __future__ import annotations

import importlib
from functools import cache, lru_cache
from typing import Any

from lorien.errors import DialectError

ENTRY_POINT_GROUP = "lorien.dialects"

#: The dialects that ship with Lorien, as pyproject.toml registers them in the group above. They
#: load without reading every installed distribution's metadata: importing importlib.metadata and
#: scanning the entry points cost a cold ``lorien query`` ~50 ms, more than answering it
#: (tests check this table against the installed entry points).
BUILTIN_DIALECTS = {
    "autotvm": "dialects.autotvm:DIALECT",
    "auto_scheduler": "dialects.auto_scheduler:DIALECT",
    "meta_schedule": "dialects.meta_schedule:DIALECT",
}


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load_builtin(name: str) -> Any:
    """A built-in dialect's object, or None where its package is not importable (then the entry
    points decide, and say what is wrong)."""
    module_name, attribute = BUILTIN_DIALECTS[name].split(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except ImportError:
        return None


def available_dialects() -> list[str]:
    """Names of every dialect registered through the ``lorien.dialects`` entry points."""
    return sorted(_entry_points())


@cache
def get_dialect(name: str) -> Any:
    """Load the dialect registered under ``name`` (a :class:`lorien.dialect.Dialect`)."""
    dialect = _load_builtin(name) if name in BUILTIN_DIALECTS else None
    if dialect is not None:
        return dialect() if isinstance(dialect, type) else dialect
    eps = _entry_points()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none installed"
        raise DialectError(f"unknown dialect {name!r} (known: {known})")
    try:
        dialect = eps[name].load()
    except ImportError as exc:
        raise DialectError(f"dialect {name!r} failed to load from {eps[name].value}: {exc}") from exc
    if isinstance(dialect, type):
        dialect = dialect()
    return dialect
