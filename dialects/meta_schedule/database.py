"""The MetaSchedule Database API, backed by any Lorien store or by TVM's JSONDatabase files.

The model is ``tvm.s_tir.meta_schedule.database``: a :class:`Workload` is a module with its
structural hash; a :class:`Record` is a trace measured on one (run_secs, target, args_info).
Every database answers ``commit_workload``, ``commit_tuning_record``, ``get_top_k``,
``get_all_tuning_records``, ``has_workload``, ``query_tuning_record``, ``query_schedule``,
``__len__`` and ``dump_pruned``, with TVM's semantics:

- workloads are matched by structural hash (and the module, when two hashes collide):
  committing a workload twice gives back the first;
- a record is *valid* when some run_secs entry is a real measurement (TVM writes 1e10 for a
  failed one; a record without run_secs is invalid); ``get_top_k`` gives the valid records of
  a workload by mean run_secs, fastest first; ``query_tuning_record`` the best one;
- ``dump_pruned(dest)`` commits the best valid record of every workload into ``dest``.

Implementations: :class:`MemoryDatabase`; :class:`JSONDatabase`, TVM's file pair (lines
appended on every commit, as TVM does); :class:`StoreDatabase`, a Lorien store (parquet,
DynamoDB, ...: records as the warehouse's MetaSchedule records, workload entries kept beside
them); :class:`UnionDatabase` (the best answer of all) and :class:`OrderedUnionDatabase`
(the first database that answers). :func:`create` maps a short name to one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from lorien.errors import DialectError, StoreError
from lorien.record import FAILED_COST_S, TuningRecord


@dataclass(frozen=True)
class Workload:
    """A workload: its structural hash and its module (a base64 TIR module as TVM stores it,
    or ``{"lorien_dag": ...}`` for a computation defined with Lorien's compute DSL)."""

    shash: str
    module: Any = field(compare=False, hash=False)

    @classmethod
    def from_json(cls, entry: Sequence[Any]) -> Workload:
        """A workload from its JSONDatabase line ``[shash, module]``."""
        if not isinstance(entry, (list, tuple)) or len(entry) < 2 or not isinstance(entry[0], (str, int)):
            raise DialectError(f"a workload is [shash, module], got {str(entry)[:80]!r}")
        return cls(str(entry[0]), entry[1])

    @classmethod
    def from_dag(cls, dag: Any) -> Workload:
        """The workload of a compute DAG defined with Lorien's compute DSL."""
        from dialects.meta_schedule.compile import lorien_entry

        return cls.from_json(lorien_entry(dag))

    def as_json(self) -> list[Any]:
        return [self.shash, self.module]

    def same_as(self, other: Workload) -> bool:
        return self.shash == other.shash and orjson.dumps(self.module) == orjson.dumps(other.module)

    def dag(self) -> Any:
        """The compute DAG of the workload (see :mod:`dialects.meta_schedule.workload`)."""
        from dialects.meta_schedule.compile import _module_dag

        return _module_dag(orjson.dumps(self.as_json()).decode())


@dataclass
class Record:
    """One measured trace of a workload, as TVM's ``TuningRecord``."""

    trace: Any
    workload: Workload
    run_secs: list[float] | None = None
    target: Any = None
    args_info: Any = None

    @property
    def is_valid(self) -> bool:
        """Some run_secs entry is a real measurement (not TVM's 1e10 failure stub)."""
        return bool(self.run_secs) and any(s is not None and s < FAILED_COST_S for s in self.run_secs)

    @property
    def mean_run_secs(self) -> float:
        """Mean of run_secs; 1e10 for a record without them (TVM's sort key)."""
        if not self.run_secs:
            return FAILED_COST_S
        return sum(FAILED_COST_S if s is None else s for s in self.run_secs) / len(self.run_secs)

    def as_json(self) -> list[Any]:
        """``[trace, run_secs, target, args_info]`` as a tuning-record line holds it."""
        return [self.trace, self.run_secs, self.target, self.args_info]

    @classmethod
    def from_json(cls, value: Sequence[Any], workload: Workload) -> Record:
        if not isinstance(value, (list, tuple)) or len(value) < 1:
            raise DialectError(f"a tuning record is [trace, run_secs, target, args_info], got {str(value)[:80]!r}")
        fields = [*value, None, None, None][:4]
        return cls(fields[0], workload, None if fields[1] is None else [float(s) for s in fields[1]], fields[2],
                   fields[3])


def _top_k(records: Sequence[Record], workload: Workload, k: int) -> list[Record]:
    if k < 0:
        raise DialectError(f"get_top_k: k must be >= 0, got {k}")
    valid = [r for r in records if r.workload.shash == workload.shash and r.is_valid]
    return sorted(valid, key=lambda r: r.mean_run_secs)[:k]


class Database(ABC):
    """The interface of every MetaSchedule database."""

    @abstractmethod
    def has_workload(self, workload: Workload) -> bool:
        """Whether the workload (by structural hash) was committed."""

    @abstractmethod
    def commit_workload(self, workload: Workload) -> Workload:
        """Commit a workload, or give back the one committed with the same structure."""

    @abstractmethod
    def commit_tuning_record(self, record: Record) -> None:
        """Commit one measured trace (its workload is committed with it)."""

    @abstractmethod
    def get_all_tuning_records(self) -> list[Record]:
        """Every record, in commit order."""

    def get_top_k(self, workload: Workload, k: int) -> list[Record]:
        """The ``k`` fastest valid records of a workload, fastest first."""
        return _top_k(self.get_all_tuning_records(), workload, k)

    def query_tuning_record(self, workload: Workload, target: Any = None, workload_name: str = "main") -> Record | None:
        """The best valid record of a workload, or None; with ``target``, among the records of
        stored targets that agree with it (TVM's own databases ignore the target)."""
        records = self.get_top_k(workload, len(self))
        if target is not None:
            records = [r for r in records if _same_target(r.target, target)]
        return records[0] if records else None

    def query_schedule(self, workload: Workload, target: Any = None, workload_name: str = "main") -> Any:
        """The engine schedule of the best record (its trace replayed), or None."""
        from dialects.meta_schedule.trace import replay_trace

        record = self.query_tuning_record(workload, target, workload_name)
        return None if record is None else replay_trace(workload.dag(), record.trace).schedule

    def __len__(self) -> int:
        return len(self.get_all_tuning_records())

    def dump_pruned(self, destination: Database) -> None:
        """Commit the best valid record of every workload into ``destination``."""
        seen: dict[str, Workload] = {}
        for record in self.get_all_tuning_records():
            seen.setdefault(record.workload.shash, record.workload)
        for workload in seen.values():
            best = self.get_top_k(workload, 1)
            if best:
                destination.commit_workload(workload)
                destination.commit_tuning_record(best[0])


def _same_target(stored: Any, wanted: Any) -> bool:
    """Whether a stored target answers a query for ``wanted`` (Lorien's rule: the same family,
    the same value for every option the query names)."""
    from lorien.target import match_tier, parse_target, parse_target_dict

    def canonical(value: Any) -> str:
        return (parse_target_dict(value) if isinstance(value, dict) else parse_target(str(value))).canonical

    return match_tier(canonical(wanted), canonical(stored)) is not None


class MemoryDatabase(Database):
    """Workloads and records in memory (TVM's ``MemoryDatabase``)."""

    def __init__(self) -> None:
        self.workloads: list[Workload] = []
        self.records: list[Record] = []

    def _find(self, workload: Workload) -> Workload | None:
        return next((w for w in self.workloads if w.shash == workload.shash), None)

    def has_workload(self, workload: Workload) -> bool:
        return self._find(workload) is not None

    def commit_workload(self, workload: Workload) -> Workload:
        found = self._find(workload)
        if found is None:
            self.workloads.append(workload)
            found = workload
        return found

    def commit_tuning_record(self, record: Record) -> None:
        record.workload = self.commit_workload(record.workload)
        self.records.append(record)

    def get_all_tuning_records(self) -> list[Record]:
        return list(self.records)


class JSONDatabase(MemoryDatabase):
    """TVM's file pair: read on open, one line appended per commit (``allow_missing`` creates
    the files; otherwise a missing file is an error naming it)."""

    def __init__(self, path_workload: str | Path | None = None, path_tuning_record: str | Path | None = None,
                 work_dir: str | Path | None = None, allow_missing: bool = True):
        from lorien.formats.meta_schedule import RECORD_FILE, WORKLOAD_FILE

        super().__init__()
        if work_dir is not None:
            path_workload = path_workload or Path(work_dir) / WORKLOAD_FILE
            path_tuning_record = path_tuning_record or Path(work_dir) / RECORD_FILE
        if path_workload is None or path_tuning_record is None:
            raise DialectError("JSONDatabase needs work_dir, or path_workload and path_tuning_record")
        self.path_workload, self.path_tuning_record = Path(path_workload), Path(path_tuning_record)
        for path in (self.path_workload, self.path_tuning_record):
            if not path.exists():
                if not allow_missing:
                    raise DialectError(f"JSONDatabase file {path} does not exist")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
        self._load()

    def _load(self) -> None:
        for number, line in enumerate(self.path_workload.read_text().splitlines(), 1):
            if line.strip():
                try:
                    self.workloads.append(Workload.from_json(orjson.loads(line)))
                except (orjson.JSONDecodeError, DialectError) as exc:
                    raise DialectError(f"{self.path_workload}:{number}: {exc}") from exc
        for number, line in enumerate(self.path_tuning_record.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                index, fields = orjson.loads(line)
                if not isinstance(index, int) or not 0 <= index < len(self.workloads):
                    raise DialectError(f"workload index {index!r} is not one of the {len(self.workloads)} workloads")
                self.records.append(Record.from_json(fields, self.workloads[index]))
            except (orjson.JSONDecodeError, DialectError, ValueError, TypeError) as exc:
                raise DialectError(f"{self.path_tuning_record}:{number}: {exc}") from exc

    def commit_workload(self, workload: Workload) -> Workload:
        found = self._find(workload)
        if found is not None:
            return found
        self.workloads.append(workload)
        with open(self.path_workload, "ab") as handle:
            handle.write(orjson.dumps(workload.as_json()) + b"\n")
        return workload

    def commit_tuning_record(self, record: Record) -> None:
        record.workload = self.commit_workload(record.workload)
        index = next(i for i, w in enumerate(self.workloads) if w.shash == record.workload.shash)
        self.records.append(record)
        with open(self.path_tuning_record, "ab") as handle:
            handle.write(orjson.dumps([index, record.as_json()]) + b"\n")


class CommitJournal:
    """Records a :class:`StoreDatabase` accepted but has not committed to its store yet, one
    JSON line each, in a file of this process's own on local disk (``$LORIEN_JOURNAL_DIR``, by
    default ``~/.cache/lorien/journal``, a folder per store). A process that dies between a
    commit and the flush of its batch leaves them there; the next database opened on the same
    store commits them (commits are idempotent, so nothing is stored twice)."""

    def __init__(self, store_uri: str, directory: str | Path | None = None):
        import hashlib
        import os
        import uuid

        root = Path(directory or os.environ.get("LORIEN_JOURNAL_DIR") or Path.home() / ".cache" / "lorien" / "journal")
        self.folder = root / hashlib.blake2b(store_uri.encode(), digest_size=8).hexdigest()
        self.path = self.folder / f"{os.getpid()}-{uuid.uuid4().hex[:10]}.jsonl"
        self._handle: Any = None

    def append(self, record: TuningRecord) -> None:
        """Keep one record until :meth:`clear` (written through to the file before returning)."""
        if self._handle is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "ab")  # noqa: SIM115 - closed by clear()
        self._handle.write(orjson.dumps(record.to_row()) + b"\n")
        self._handle.flush()

    def clear(self) -> None:
        """The kept records are committed: forget them."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self.path.unlink(missing_ok=True)

    def orphans(self) -> list[Path]:
        """Journals of this store left by processes that are gone."""
        import os

        found = []
        for path in sorted(self.folder.glob("*.jsonl")) if self.folder.is_dir() else []:
            pid = int(path.name.split("-", 1)[0]) if path.name.split("-", 1)[0].isdigit() else 0
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                found.append(path)
            except PermissionError:
                continue
        return found

    @staticmethod
    def read(path: Path) -> list[TuningRecord]:
        """The records of a journal (a line cut short by the death of its writer is skipped)."""
        records = []
        for line in path.read_bytes().splitlines():
            try:
                records.append(TuningRecord.from_row(orjson.loads(line)))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
        return records


class StoreDatabase(Database):
    """A Lorien store (any backend) as a MetaSchedule database: records are the warehouse's
    MetaSchedule records (``lorien query`` finds them by the workload's structural hash),
    workload entries are kept beside them (``Store.put_workloads``) or, for a store that
    keeps none, inside each record.

    Commits are batched: a record is kept in a :class:`CommitJournal` when
    ``commit_tuning_record`` returns, and ``batch_size`` of them go to the store as one commit
    (one file of a parquet store, not one a record) -- also before any read, at :meth:`close`
    and when the process exits. ``target`` (a target string or TVM's dict) makes the database
    answer for that hardware only: ``get_top_k`` and ``query_tuning_record`` leave out records
    of targets that do not match it (TVM's own databases ignore the target, so a merged
    database hands out records tuned for another CPU); None answers with every target's.
    """

    def __init__(self, store: Any = None, source: str = "meta_schedule database", target: Any = None,
                 batch_size: int = 64, journal_dir: str | Path | None = None):
        import atexit

        from lorien.warehouse import Store, open_store

        if batch_size < 1:
            raise DialectError(f"batch_size must be at least 1, got {batch_size}")
        self.owned = not isinstance(store, Store)
        self.store = open_store(store) if self.owned else store
        self.source, self.target, self.batch_size = source, target, batch_size
        self._workloads: dict[str, Workload] = {}
        self._entries_kept: set[str] = set()
        self._pending: list[TuningRecord] = []
        self.journal = CommitJournal(self.store.uri, journal_dir)
        for orphan in self.journal.orphans():
            self.store.commit(CommitJournal.read(orphan))
            orphan.unlink(missing_ok=True)
        atexit.register(self.flush)

    def flush(self) -> None:
        """Commit the records accepted so far to the store."""
        if self._pending:
            self.store.commit(self._pending)
            self._pending = []
        self.journal.clear()

    def close(self) -> None:
        import atexit

        self.flush()
        atexit.unregister(self.flush)
        if self.owned:
            self.store.close()

    def __enter__(self) -> StoreDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, workload: Workload | None = None) -> list[TuningRecord]:
        self.flush()
        filters: dict[str, Any] = {"dialect": "meta_schedule"}
        if workload is not None:
            filters["workload_key"] = workload.shash
        return [TuningRecord.from_row(row) for row in self.store.scan(filters=filters).to_pylist()]

    def has_workload(self, workload: Workload) -> bool:
        return workload.shash in self._workloads or bool(self._rows(workload))

    def commit_workload(self, workload: Workload) -> Workload:
        return self._workloads.setdefault(workload.shash, workload)

    def commit_tuning_record(self, record: Record) -> None:
        from lorien.formats.meta_schedule import WorkloadEntry, decode_value, entry_hash, entry_text
        from lorien.formats.tir import safe_summarize

        workload = self.commit_workload(record.workload)
        text = entry_text(workload.as_json())
        entry = WorkloadEntry(workload.as_json(), safe_summarize(workload.module), text, entry_hash(text))
        stored = decode_value([0, record.as_json()], {0: entry}, self.source)
        if entry.digest not in self._entries_kept:
            try:
                self.store.put_workloads({entry.digest: text})
                self._entries_kept.add(entry.digest)
            except StoreError:
                pass
        if entry.digest not in self._entries_kept:
            stored = stored.with_changes(extra=orjson.dumps({"workload_index": 0, "workload": workload.as_json()}).decode())
        if workload.module and isinstance(workload.module, dict) and stored.flop is None:
            stored = stored.with_changes(flop=workload.dag().flop())
        self.journal.append(stored)
        self._pending.append(stored)
        if len(self._pending) >= self.batch_size:
            self.flush()

    def _record(self, stored: TuningRecord) -> Record:
        from lorien.formats.meta_schedule import encode_record

        extra = orjson.loads(stored.extra) if stored.extra else {}
        if "workload" in extra:
            workload = Workload.from_json(extra["workload"])
        else:
            digest = extra.get("workload_hash")
            text = self.store.get_workloads([digest]).get(digest) if digest else None
            if text is None:
                raise DialectError(f"record {stored.record_id}: its workload entry {digest} is not in {self.store.uri}")
            workload = Workload.from_json(orjson.loads(text))
        workload = self._workloads.setdefault(workload.shash, workload)
        return Record.from_json(orjson.loads(encode_record(stored))[1], workload)

    def get_all_tuning_records(self) -> list[Record]:
        return [self._record(stored) for stored in sorted(self._rows(), key=lambda r: r.timestamp)]

    def _top_k_on(self, workload: Workload, k: int, target: Any) -> list[Record]:
        stored = self._rows(workload)
        if target is not None:
            stored = [record for record in stored if _same_target(record.target, target)]
        return _top_k([self._record(record) for record in stored], workload, k)

    def get_top_k(self, workload: Workload, k: int) -> list[Record]:
        return self._top_k_on(workload, k, self.target)

    def query_tuning_record(self, workload: Workload, target: Any = None, workload_name: str = "main") -> Record | None:
        """The best valid record of a workload on ``target`` (default: the database's own)."""
        found = self._top_k_on(workload, 1, self.target if target is None else target)
        return found[0] if found else None

    def __len__(self) -> int:
        return len(self._rows())


class UnionDatabase(Database):
    """Several databases answering as one: the fastest valid record of any of them. Commits
    are refused (TVM's semantics: commit to one of the members)."""

    def __init__(self, *databases: Database):
        self.databases = list(databases)

    def has_workload(self, workload: Workload) -> bool:
        return any(db.has_workload(workload) for db in self.databases)

    def commit_workload(self, workload: Workload) -> Workload:
        raise DialectError(f"{type(self).__name__} does not take commits; commit to one of its databases")

    def commit_tuning_record(self, record: Record) -> None:
        raise DialectError(f"{type(self).__name__} does not take commits; commit to one of its databases")

    def get_all_tuning_records(self) -> list[Record]:
        return [record for db in self.databases for record in db.get_all_tuning_records()]

    def get_top_k(self, workload: Workload, k: int) -> list[Record]:
        return _top_k([r for db in self.databases for r in db.get_top_k(workload, k)], workload, k)


class OrderedUnionDatabase(UnionDatabase):
    """Several databases in order of preference: the answer of the first that has one."""

    def get_top_k(self, workload: Workload, k: int) -> list[Record]:
        for db in self.databases:
            found = db.get_top_k(workload, k)
            if found:
                return found
        return []

    def query_tuning_record(self, workload: Workload, target: Any = None, workload_name: str = "main") -> Record | None:
        for db in self.databases:
            found = db.query_tuning_record(workload, target, workload_name)
            if found is not None:
                return found
        return None


_KINDS = {"memory": MemoryDatabase, "json": JSONDatabase, "store": StoreDatabase,
          "union": UnionDatabase, "ordered_union": OrderedUnionDatabase}


def create(kind: str = "json", *args: Any, **kwargs: Any) -> Database:
    """A database by short name: ``memory``, ``json`` (work_dir=...), ``store`` (a store URI),
    ``union`` / ``ordered_union`` (databases)."""
    if kind not in _KINDS:
        raise DialectError(f"unknown database kind {kind!r} (known: {', '.join(sorted(_KINDS))})")
    return _KINDS[kind](*args, **kwargs)

