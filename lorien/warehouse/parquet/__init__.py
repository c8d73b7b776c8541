"""The embedded warehouse: Parquet files in a local directory or under an S3 prefix.

Layout under the root (Hive partitioning, readable by pandas, DuckDB or Spark)::

    records/target_key=<k>/layout=<l>/part-<commit>-<i>of<n>.parquet   every record (append-only)
    best/target_key=<k>/part-n<nbest>-<commit>-of<n>.parquet            serving view: best nbest valid
                                                             records per (target, workload, layout)
    workloads/<hash>.parquet                                 a workload entry records refer to by
                                                             content hash (a MetaSchedule IRModule)
    _staging/                                                files being written (never read)

Publication. Every file is published atomically: written under ``_staging/`` and renamed into
place on a local disk (fsync'd first with ``?fsync=true``); on S3 one PUT of the whole file (or
a copy of a staged object) is the publication. A commit publishes several files, one at a
time, so a commit is made all-or-nothing by the names: each of its ``n`` record files is named
``part-<commit>-<i>of<n>`` and each of its serving files ``part-n<depth>-<commit>-of<n>``. A
commit is *complete* when all ``n`` of its record files are listed, and readers (``scan``,
``best``, ``stats``, ``workloads``, compaction, a commit's duplicate check) see only the files
of complete commits. A commit publishes its serving files first and its record files last,
so its serving rows appear exactly when its records do; a writer killed anywhere in between
leaves an incomplete commit that no reader sees. A serving file named ``-of0`` (written by a
serving merge or compaction) stands alone, as does a file without a commit in its name.

An incomplete commit whose newest file is older than :data:`ABANDONED_COMMIT_S` is the
leftover of a killed writer: the next commit or compaction deletes its files. Deleting any
file of a commit makes it incomplete for good, so a stalled writer that wakes up after that
can never make it visible. Compaction publishes its merged files before it deletes the ones
they replace; each merged record file is its own one-file commit.

Commits never rewrite a file, so concurrent writers cannot lose each other's records. A
commit skips records whose ``record_id`` it already sees in the store; two writers racing on
the same record may both store it, and every read removes such duplicates by ``record_id``
(compaction removes them for good). The serving view is the union of each commit's own best
``nbest`` per group, which always contains the true best ``nbest`` of every group; a commit
that finds more than :data:`SERVING_MERGE_FILES` serving files for a target key folds them
into one.

``best()`` answers from an in-memory index of the serving view, built once per process
and target key and rebuilt when the list of serving files changes.

Modules, one concern each: ``layout`` (directories, file names, which commits are complete),
``files`` (a local directory or an S3 prefix), ``tables`` (Arrow helpers: conform, dedupe,
split, rank), ``serving`` (the in-memory index), ``commit`` (staging and publishing a commit),
``store`` (ParquetStore: reads, best(), workload entries, compaction).
"""

from lorien.warehouse.parquet.commit import ParquetCommit
from lorien.warehouse.parquet.layout import (
    ABANDONED_COMMIT_S,
    NULL_PARTITION,
    PAUSE_ENV,
    RECORDS_DIR,
    SERVING_DIR,
    SERVING_MERGE_FILES,
)
from lorien.warehouse.parquet.store import ParquetStore
from lorien.warehouse.parquet.tables import group_starts, top_per_group

__all__ = ["ABANDONED_COMMIT_S", "NULL_PARTITION", "PAUSE_ENV", "RECORDS_DIR", "SERVING_DIR", "SERVING_MERGE_FILES",
           "ParquetCommit", "ParquetStore", "group_starts", "top_per_group"]
