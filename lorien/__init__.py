"""Lorien: a tuning-record warehouse and cost-model pipeline for tensor compilers."""

from __future__ import annotations

__version__ = "0.1.0"

from lorien.record import ErrorNo, TuningRecord
from lorien.target import Target, parse_target
from lorien.warehouse import Warehouse


def compile(workload_key: str, target: str, store: str | None = None, **options):  # noqa: A001
    """A callable kernel built with the best stored config of a workload (see lorien.build)."""
    from lorien.build import compile_from_warehouse

    return compile_from_warehouse(workload_key, target, store=store, **options)


__all__ = ["ErrorNo", "Target", "TuningRecord", "Warehouse", "compile", "parse_target", "__version__"]
