"""The Store interface every warehouse backend implements, and the URI registry.

A store is chosen by URI: ``parquet:./lorien-warehouse``, ``parquet:s3://bucket/prefix``,
``dynamodb:TABLE?endpoint_url=...&region=...``. Backends register a factory per scheme with
:func:`register_store`; :func:`open_store` resolves a URI. One contract test suite
(``tests/test_store_contract.py``) runs against every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lorien.errors import StoreError
from lorien.record import TuningRecord
from lorien.storeuri import DEFAULT_STORE_URI, STORE_ENV, default_store_uri, resolve_store_uri  # noqa: F401


@dataclass
class CommitResult:
    """What a commit did: records received, newly stored, and already present (skipped)."""

    received: int = 0
    stored: int = 0
    duplicates: int = 0
    files: list[str] = field(default_factory=list)
    #: Newly stored records of each part of the batch, when the caller named its parts (the
    #: logs a batch of an ingest came from); empty otherwise.
    stored_per_part: list[int] = field(default_factory=list)


class Store(ABC):
    """A warehouse backend."""

    uri: str

    @abstractmethod
    def commit(self, records: Iterable[TuningRecord] | pa.Table, nbest: int | None = None) -> CommitResult:
        """Append records; keep the best ``nbest`` per (target, workload_key, layout) for serving.

        Idempotent: a record already stored (same ``record_id``) is not stored again.
        """

    @abstractmethod
    def best(self, workload_key: str, target: str, k: int = 1, layout: str | None = None,
             by_alternate_key: bool = False, prefix: bool = False,
             per_layout: bool = False, exact: bool = False) -> list[TuningRecord]:
        """The ``k`` best valid records of a workload on the stored targets matching ``target``.

        A stored target matches when it agrees on every option the query names (``llvm``
        finds records tuned on ``llvm -keys=cpu -mcpu=znver4``); records of the most specific
        match come first (the query's own target, then the others), each group fastest first.
        ``exact`` takes the query's own target only; ``by_alternate_key`` every target of the
        family (``llvm_cpu``), fastest first. ``prefix`` treats ``workload_key`` as
        a prefix; ``per_layout`` returns the best ``k`` of each layout. Each record's
        ``target`` says which stored target it came from.
        """

    @abstractmethod
    def scan(self, filters: dict[str, Any] | None = None, columns: list[str] | None = None) -> pa.Table:
        """Every stored record matching ``filters`` (column -> value or list of values)."""

    @abstractmethod
    def workloads(self, target: str | None = None) -> list[str]:
        """Distinct workload keys, optionally of one target."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counts: records, valid records, workloads, targets, files, bytes."""

    def compact(self) -> dict[str, Any]:
        """Merge small files without changing any query answer. A no-op where meaningless."""
        return {}

    def put_workloads(self, entries: Mapping[str, str]) -> int:
        """Keep workload entries (content hash -> text) that records refer to by hash, e.g. the
        IRModules of MetaSchedule records, once each; returns how many were new."""
        raise StoreError(f"{self.uri}: this store cannot keep workload entries")

    def get_workloads(self, hashes: Iterable[str]) -> dict[str, str]:
        """The workload entries (hash -> text) of ``hashes`` that the store keeps."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook: most stores hold nothing to release
        """Release connections."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_REGISTRY: dict[str, Callable[[str], Store]] = {}


def register_store(scheme: str, factory: Callable[[str], Store]) -> None:
    """Register ``factory(rest_of_uri)`` for URIs that start with ``scheme:``."""
    _REGISTRY[scheme] = factory


_BACKENDS_LOADED = False


def _load_backends(scheme: str | None = None) -> None:
    """Import the built-in backends so they register their URI schemes; only ``scheme``'s
    when it names a built-in one (opening a parquet store never imports boto3)."""
    global _BACKENDS_LOADED
    if _BACKENDS_LOADED:
        return
    import importlib

    modules = ("lorien.warehouse.parquet", "lorien.warehouse.dynamodb")
    wanted = f"lorien.warehouse.{scheme}"
    for module in (wanted,) if wanted in modules else modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    _BACKENDS_LOADED = wanted not in modules


def open_store(uri: str | None = None) -> Store:
    """Open the store named by ``uri`` (None: the default store of :func:`resolve_store_uri`)."""
    uri = resolve_store_uri(uri)
    scheme, _, rest = uri.partition(":")
    _load_backends(scheme)
    if scheme not in _REGISTRY:
        known = ", ".join(f"{name}:" for name in sorted(_REGISTRY))
        raise StoreError(f"unknown store URI {uri!r} (known schemes: {known})")
    return _REGISTRY[scheme](rest)


def build_serving_indexes_of(store: Store) -> dict[str, int]:
    """Build the persisted serving indexes of an open ``store`` once records were committed to it
    (``lorien ingest``, ``lorien tune`` and the tuning masters call this after their commits), so
    that the first warm query of a new process reads them instead of writing them; returns the
    rows of each index. A store without such indexes (DynamoDB, S3), one this process may only
    read, or one whose serving files were replaced meanwhile returns {}: the index is a speed-up,
    and the records are committed whatever happens here (the next query builds it)."""
    build = getattr(store, "build_serving_indexes", None)
    if build is None:
        return {}
    try:
        return build()
    except (StoreError, OSError):
        return {}


def build_serving_indexes(uri: str) -> dict[str, int]:
    """:func:`build_serving_indexes_of` the store at ``uri`` (opened and closed here); {} when it
    cannot be opened."""
    try:
        store = open_store(uri)
    except (StoreError, OSError):
        return {}
    try:
        return build_serving_indexes_of(store)
    finally:
        store.close()
