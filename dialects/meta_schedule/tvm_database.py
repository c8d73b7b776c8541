"""Real TVM MetaSchedule tunes straight into the warehouse: a ``PyDatabase`` backed by a Lorien
store (needs the ``tvm`` extra; Lorien never needs TVM otherwise).

::

    import tvm.s_tir.meta_schedule as ms
    from dialects.meta_schedule.tvm_database import warehouse_database

    database = warehouse_database("parquet:./lorien-warehouse")
    ms.tune_tir(mod, target, work_dir, max_trials_global=64, database=database)
    schedule = ms.tir_integration.compile_tir(database, mod, target)   # TVM compiles from the store

TVM's workloads and records cross the boundary in their JSON form (``Workload.as_json``,
``TuningRecord.as_json``), the same form a JSONDatabase file holds, so what TVM commits is
what ``lorien ingest`` would have read from its files: ``lorien query --workload-key <shash>``
finds it, ``lorien export --format meta_schedule`` writes it back.
"""

from __future__ import annotations

from typing import Any

import orjson

from dialects.meta_schedule.database import Record, StoreDatabase, Workload
from lorien.errors import DialectError


def _tvm() -> tuple[Any, Any]:
    try:
        import tvm.s_tir.meta_schedule as ms
        from tvm.ir.utils import derived_object
    except ImportError as exc:
        raise DialectError(f"the TVM adapter needs apache-tvm (pip install 'lorien[tvm]'): {exc}") from exc
    return ms, derived_object


def warehouse_database(store: Any = None) -> Any:
    """A ``tvm.s_tir.meta_schedule.database.PyDatabase`` over a Lorien store (URI or Store;
    None: the default store)."""
    ms, derived_object = _tvm()

    @derived_object
    class WarehouseDatabase(ms.database.PyDatabase):
        """TVM's Database interface answered by :class:`StoreDatabase`."""

        def __init__(self, lorien_store: Any):
            super().__init__()
            self.lorien = StoreDatabase(lorien_store, source="tvm meta_schedule")
            self.tvm_workloads: dict[str, Any] = {}

        def _workload(self, mod: Any) -> tuple[Any, Workload]:
            tvm_workload = ms.database.Workload(mod)
            workload = Workload.from_json(tvm_workload.as_json())
            return self.tvm_workloads.setdefault(workload.shash, tvm_workload), workload

        def _tvm_record(self, record: Record) -> Any:
            tvm_workload = self.tvm_workloads.get(record.workload.shash)
            if tvm_workload is None:
                tvm_workload = ms.database.Workload.from_json(record.workload.as_json())
                self.tvm_workloads[record.workload.shash] = tvm_workload
            return ms.database.TuningRecord.from_json(record.as_json(), tvm_workload)

        def has_workload(self, mod: Any) -> bool:
            return self.lorien.has_workload(self._workload(mod)[1])

        def commit_workload(self, mod: Any) -> Any:
            tvm_workload, workload = self._workload(mod)
            self.lorien.commit_workload(workload)
            return tvm_workload

        def commit_tuning_record(self, record: Any) -> None:
            workload = Workload.from_json(record.workload.as_json())
            self.tvm_workloads.setdefault(workload.shash, record.workload)
            self.lorien.commit_tuning_record(Record.from_json(record.as_json(), self.lorien.commit_workload(workload)))

        def get_top_k(self, workload: Any, top_k: int) -> list[Any]:
            found = self.lorien.get_top_k(Workload.from_json(workload.as_json()), int(top_k))
            return [self._tvm_record(record) for record in found]

        def get_all_tuning_records(self) -> list[Any]:
            return [self._tvm_record(record) for record in self.lorien.get_all_tuning_records()]

        def query_tuning_record(self, mod: Any, target: Any, workload_name: str | None = None) -> Any:
            _, workload = self._workload(mod)
            best = self.lorien.query_tuning_record(workload, None if target is None else orjson.loads(str(target)))
            return None if best is None else self._tvm_record(best)

        def __len__(self) -> int:
            return len(self.lorien)

    return WarehouseDatabase(store)
