"""A commit: record and serving files staged by background threads, published together."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from lorien.errors import StoreError
from lorien.record import TuningRecord
from lorien.warehouse.base import CommitResult
from lorien.warehouse.parquet.files import LocalFiles, S3Files
from lorien.warehouse.parquet.ids import RecordIds
from lorien.warehouse.parquet.layout import (
    DEFAULT_NBEST,
    PARTITION_COLUMNS,
    RECORD_FILE_SCHEMA,
    SERVING_FILE_SCHEMA,
    SERVING_ROW_GROUP,
    partition_of,
    records_dir,
    serving_dir,
)
from lorien.warehouse.parquet.tables import conform, dedupe, split_by, top_per_group


@dataclass
class PendingFile:
    """A file of a commit not yet published: its directory, its serving depth (None for a record
    file), and either its staged copy (being written while ``writing`` is set) or, where one
    PUT publishes it (S3), the table itself."""

    directory: str
    depth: int | None
    staged: str | None = None
    table: pa.Table | None = None
    row_group_size: int | None = None
    writing: Future | None = None


#: A column numbering the rows of a batch whose parts are counted apart (never written).
_ROW = "__row"

#: Threads that write a batch's staged files while the committing thread prepares its other
#: files (Arrow encodes and compresses without the GIL); they end with the batch.
STAGING_THREADS = 2


class CommitHost(Protocol):
    """What a commit needs of the store it publishes into (a :class:`ParquetStore`)."""

    _files: LocalFiles | S3Files
    _known_ids: RecordIds

    def _known_record_ids(self, remove_abandoned: bool = False) -> RecordIds: ...

    def _publish_commit(self, serving: list[PendingFile], records: list[PendingFile]) -> list[str]: ...

    def _invalidate(self) -> None: ...

    def _merge_serving(self, target_key: str, merge_rows: int | None = None) -> None: ...


class ParquetCommit:
    """One commit, possibly of many batches: files are staged and published at :meth:`finish`.

    With ``publish_each_batch`` (the default for :meth:`ParquetStore.commit`) each batch is
    published as soon as it is written, as a commit of its own, which keeps memory bounded for
    long ingests. Either way, what is published together becomes visible together. A serving
    merge that follows a batch reads at most ``merge_rows`` rows (default
    :data:`SERVING_MERGE_ROWS`), so that it costs no more memory than the batches do.
    """

    def __init__(self, store: CommitHost, nbest: int | None, publish_each_batch: bool,
                 merge_rows: int | None = None):
        if nbest is not None and nbest < 1:
            raise StoreError(f"nbest must be a positive number of records, got {nbest!r}")
        self.store = store
        self.nbest = DEFAULT_NBEST if nbest is None else nbest
        self.publish_each_batch = publish_each_batch
        self.merge_rows = merge_rows
        self.result = CommitResult()
        self._pending_records: list[PendingFile] = []
        self._pending_serving: list[PendingFile] = []
        self._unpublished_ids = RecordIds()
        self._known = store._known_record_ids(remove_abandoned=True)
        # On S3 a single PUT already publishes atomically: no staging copy when publishing at once.
        self._direct = publish_each_batch and not store._files.is_local
        self._writers: ThreadPoolExecutor | None = None

    def add(self, records: Iterable[TuningRecord] | pa.Table, parts: list[int] | None = None) -> CommitResult:
        """Write one batch; returns the counts of this batch. ``parts`` (row counts that add up
        to the batch: the logs it came from) asks for the stored count of each part as well."""
        table = conform(records)
        batch = CommitResult(received=table.num_rows)
        if parts is not None:
            table = table.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
        table = dedupe(table)
        ids = table.column("record_id")
        fresh = self._known.fresh(ids) & self._unpublished_ids.fresh(ids)
        if not fresh.all():
            table = table.filter(pa.array(fresh))
        if parts is not None:
            kept_rows = table.column(_ROW).to_numpy()
            part_of_row = np.searchsorted(np.cumsum(parts), kept_rows, side="right")
            batch.stored_per_part = np.bincount(part_of_row, minlength=len(parts)).tolist()
            table = table.drop_columns([_ROW])
        self._unpublished_ids.update(table.column("record_id"))
        batch.stored = table.num_rows
        batch.duplicates = batch.received - batch.stored
        if table.num_rows:
            self._write(table)
        try:
            if self.publish_each_batch:
                batch.files = self._publish()
            else:
                self._wait_for_staging()
        finally:
            # no thread outlives a batch: the caller may fork (a log's decoding workers) between batches
            self._stop_writers()
        self.result.received += batch.received
        self.result.stored += batch.stored
        self.result.duplicates += batch.duplicates
        self.result.files.extend(batch.files)
        return batch

    def _write(self, table: pa.Table) -> None:
        for (target_key, layout), part in split_by(table, PARTITION_COLUMNS):
            self._put(part.select(RECORD_FILE_SCHEMA.names), records_dir(target_key, layout), None, None,
                      self._pending_records)
        serving = top_per_group(table, self.nbest)
        if serving.num_rows:
            for (target_key,), part in split_by(serving, ("target_key",)):
                self._put(part.select(SERVING_FILE_SCHEMA.names), serving_dir(target_key), self.nbest,
                          SERVING_ROW_GROUP, self._pending_serving)

    def _put(self, table: pa.Table, directory: str, depth: int | None, row_group_size: int | None,
             pending: list[PendingFile]) -> None:
        if self._direct:
            pending.append(PendingFile(directory, depth, table=table, row_group_size=row_group_size))
            return
        if self._writers is None:
            self._writers = ThreadPoolExecutor(STAGING_THREADS, thread_name_prefix="lorien-staging")
        pending.append(PendingFile(directory, depth, writing=self._writers.submit(
            self.store._files.stage, table, row_group_size)))

    def _wait_for_staging(self) -> None:
        """Wait until every pending file is staged; raises the first staging error (after all
        the writes have ended, so that :meth:`abort` can delete what was staged)."""
        error: BaseException | None = None
        for pending in self._pending_records + self._pending_serving:
            if pending.writing is not None:
                try:
                    pending.staged = pending.writing.result()
                except BaseException as exc:  # noqa: BLE001 - re-raised below, once all writes ended
                    error = error or exc
                pending.writing = None
        if error is not None:
            raise error

    def _stop_writers(self) -> None:
        if self._writers is not None:
            self._writers.shutdown(wait=True)
            self._writers = None

    def _publish(self) -> list[str]:
        """Publish what is pending as one commit; returns its record files."""
        if not self._pending_records:
            return []
        self._wait_for_staging()
        published = self.store._publish_commit(self._pending_serving, self._pending_records)
        touched = {partition_of(pending.directory + "/")["target_key"] for pending in self._pending_serving}
        self._pending_records.clear()
        self._pending_serving.clear()
        self.store._known_ids.update(self._unpublished_ids)
        self._unpublished_ids.clear()
        self.store._invalidate()
        for target_key in sorted(touched):
            self.store._merge_serving(target_key, self.merge_rows)
        return published

    def finish(self) -> CommitResult:
        try:
            self.result.files.extend(self._publish())
        finally:
            self._stop_writers()
        return self.result

    def abort(self) -> None:
        try:
            self._wait_for_staging()
        except BaseException:  # noqa: BLE001 - aborting anyway: delete whatever was staged
            pass
        self._stop_writers()
        for pending in self._pending_records + self._pending_serving:
            if pending.staged is not None:
                self.store._files.delete(pending.staged)
        self._pending_records.clear()
        self._pending_serving.clear()

    def __enter__(self) -> ParquetCommit:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()
