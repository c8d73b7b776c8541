"""The auto_scheduler Dialect object the core finds through the ``lorien.dialects`` entry point."""

from __future__ import annotations

from typing import Any

from dialects.auto_scheduler import features
from lorien.dialect import Dialect
from lorien.record import TuningRecord


class AutoSchedulerDialect(Dialect):
    """Auto-scheduler (Ansor): template-free schedules as transform steps, JSON-line records."""

    name = "auto_scheduler"

    def record_formats(self) -> list[str]:
        return ["ansor"]

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        return features.featurize(record)
