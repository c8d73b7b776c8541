"""The meta_schedule Dialect object the core finds through the ``lorien.dialects`` entry point."""

from __future__ import annotations

from typing import Any

from dialects.meta_schedule import features
from lorien.dialect import Dialect
from lorien.record import TuningRecord


class MetaScheduleDialect(Dialect):
    """MetaSchedule: schedules as traces of instructions with sampling decisions."""

    name = "meta_schedule"

    def record_formats(self) -> list[str]:
        return ["meta_schedule"]

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        return features.featurize(record)
