"""Finding the installed dialect plugins.

A dialect is a package that registers one object under the entry-point group
``lorien.dialects``. Only this module reads that group, so any layer -- a codec that asks the
auto_scheduler registry about a workload as well as the CLI -- can find a dialect without
importing the :class:`lorien.dialect.Dialect` interface (which sits above the codecs).
"""

from __future__ import annotations

from functools import cache, lru_cache
from importlib.metadata import entry_points
from typing import Any

from lorien.errors import DialectError

ENTRY_POINT_GROUP = "lorien.dialects"


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_dialects() -> list[str]:
    """Names of every dialect registered through the ``lorien.dialects`` entry points."""
    return sorted(_entry_points())


@cache
def get_dialect(name: str) -> Any:
    """Load the dialect registered under ``name`` (a :class:`lorien.dialect.Dialect`)."""
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
