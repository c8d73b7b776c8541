"""Compile from the warehouse: the best stored config of a workload, built into a kernel.

``lorien.compile(workload_key, target)`` answers a query with something runnable. When the
warehouse has no valid record, the kernel is built with a default schedule, a warning says
so, and ``kernel.from_warehouse`` is False.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from lorien.record import TuningRecord
from lorien.warehouse import Store, open_store

logger = logging.getLogger(__name__)


class FallbackScheduleWarning(UserWarning):
    """A kernel was built with a default schedule because the warehouse had no record."""


def best_record(workload_key: str, target: str, store: Store | str | None = None,
                exact: bool = False, by_alternate_key: bool = False) -> TuningRecord | None:
    """The best valid record of ``workload_key`` on the stored targets matching ``target``
    (the rule of ``Store.best``), or None."""
    owned = not isinstance(store, Store)
    opened = open_store(store) if owned else store
    try:
        records = opened.best(workload_key, target, k=1, exact=exact, by_alternate_key=by_alternate_key)
        return records[0] if records else None
    finally:
        if owned:
            opened.close()


def compile_from_warehouse(workload_key: str, target: str, store: Store | str | None = None,
                           dialect: str | None = None, exact: bool = False, by_alternate_key: bool = False,
                           **options: Any):
    """A callable kernel of ``workload_key`` built with the best stored config on the stored
    targets matching ``target`` (``exact`` and ``by_alternate_key`` as in ``Store.best``).

    The kernel carries ``from_warehouse`` (bool), ``record`` (the TuningRecord used, or None),
    ``config`` (the dialect config applied) and ``fallback_reason`` (why a default schedule
    was used, or ""). Without a record, ``dialect`` builds the default schedule (by default the
    auto_scheduler for a JSON key ``["func", ...]``, else autotvm).
    """
    from lorien.dialect import dialect_of_workload_key, get_dialect

    owned = not isinstance(store, Store)
    opened = open_store(store) if owned else store
    try:
        record = best_record(workload_key, target, opened, exact=exact, by_alternate_key=by_alternate_key)
        name = record.dialect if record is not None else dialect or dialect_of_workload_key(workload_key)
        if record is not None:
            kernel = get_dialect(name).compile_record(record, target=target, store=opened)
            kernel.from_warehouse, kernel.record, kernel.fallback_reason = True, record, ""
            return kernel
    finally:
        if owned:
            opened.close()
    reason = f"no valid record of {workload_key!r} for target {target!r} in the warehouse; built a default schedule"
    warnings.warn(reason, FallbackScheduleWarning, stacklevel=2)
    logger.warning(reason)
    kernel = get_dialect(name).compile_default(workload_key, target=target)
    kernel.from_warehouse, kernel.record, kernel.fallback_reason = False, None, reason
    return kernel
