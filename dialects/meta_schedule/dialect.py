"""The meta_schedule Dialect object the core finds through the ``lorien.dialects`` entry point."""

from __future__ import annotations

from typing import Any

from dialects.meta_schedule import features
from lorien.dialect import AppliedConfig, Dialect
from lorien.errors import DialectError
from lorien.record import TuningRecord


class MetaScheduleDialect(Dialect):
    """MetaSchedule: schedules as traces of instructions with sampling decisions."""

    name = "meta_schedule"
    #: Records name their workload by hash; compiling reads the workload entry from the store.
    compile_reads_store = True

    def record_formats(self) -> list[str]:
        return ["meta_schedule"]

    def featurize(self, record: TuningRecord) -> dict[str, Any]:
        return features.featurize(record)

    def compile_record(self, record: TuningRecord, target: str | None = None, store: Any = None):
        """A kernel built by replaying a stored record's trace on its workload."""
        from dialects.meta_schedule.compile import compile_record

        return compile_record(record, target=target, store=store)

    def compile_default(self, workload_key: str, target: str | None = None):
        raise DialectError(f"MetaSchedule workload {workload_key}: a structural hash names no computation Lorien "
                           f"can rebuild without a record; tune it or ingest its database first")

    def apply_log_line(self, path: str, line_no: int, **options: Any) -> AppliedConfig:
        """Replay, check and measure the trace of one JSONDatabase record here."""
        from dialects.meta_schedule.apply import apply_log_line

        return apply_log_line(path, line_no, **options)
