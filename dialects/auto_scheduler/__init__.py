"""The auto_scheduler dialect: Ansor records (workload keys ``[func_name, args...]``, steps)."""

from dialects.auto_scheduler.dialect import AutoSchedulerDialect

DIALECT = AutoSchedulerDialect()

__all__ = ["DIALECT", "AutoSchedulerDialect"]
