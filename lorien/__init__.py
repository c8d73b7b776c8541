"""Lorien: a tuning-record warehouse and cost-model pipeline for tensor compilers."""

from __future__ import annotations

__version__ = "0.1.0"

# Imported on first use (PEP 562), so that `lorien query` answering from a persisted serving
# index imports neither pyarrow nor numpy.
_LAZY = {"ErrorNo": "lorien.record", "TuningRecord": "lorien.record", "Target": "lorien.target",
         "parse_target": "lorien.target", "Warehouse": "lorien.warehouse"}


def __getattr__(name: str):
    import importlib

    module = _LAZY.get(name)
    if module is None:  # a submodule that the package once imported itself (lorien.record, ...)
        try:
            return importlib.import_module(f"lorien.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module 'lorien' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def compile(workload_key: str, target: str, store: str | None = None, **options):  # noqa: A001
    """A callable kernel built with the best stored config of a workload (see lorien.build)."""
    from lorien.build import compile_from_warehouse

    return compile_from_warehouse(workload_key, target, store=store, **options)


__all__ = ["ErrorNo", "Target", "TuningRecord", "Warehouse", "compile", "parse_target", "__version__"]
