"""The meta_schedule dialect: MetaSchedule JSONDatabase records (traces with sampling decisions)."""

from dialects.meta_schedule.dialect import MetaScheduleDialect

DIALECT = MetaScheduleDialect()

__all__ = ["DIALECT", "MetaScheduleDialect"]
