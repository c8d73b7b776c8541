"""The Store interface every warehouse backend implements, and the URI registry.

A store is chosen by URI: ``parquet:./lorien-warehouse``, ``parquet:s3://bucket/prefix``,
``dynamodb:TABLE?endpoint_url=...&region=...``. Backends register a factory per scheme with
:func:`register_store`; :func:`open_store` resolves a URI. One contract test suite
(``tests/test_store_contract.py``) runs against every backend.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lorien.errors import StoreError
from lorien.record import TuningRecord

DEFAULT_STORE_URI = "parquet:./lorien-warehouse"
STORE_ENV = "LORIEN_STORE"


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


def default_store_uri() -> str:
    """``$LORIEN_STORE``, else ``parquet:./lorien-warehouse`` (not yet resolved; see
    :func:`resolve_store_uri`)."""
    return os.environ.get(STORE_ENV) or DEFAULT_STORE_URI


def resolve_store_uri(explicit: str | None = None, configured: str | None = None) -> str:
    """The store a command uses: ``explicit`` (``--store``), else ``configured`` (a config
    file's ``store:``), else ``$LORIEN_STORE``, else ``./lorien-warehouse``.

    Every command and library entry point resolves its store here, so they all agree. A local
    parquet store comes back as ``parquet:<absolute path>``, so worker processes that start in
    another directory (a process pool, a Dask worker) commit to the same place.
    """
    uri = explicit or configured or default_store_uri()
    scheme, sep, rest = uri.partition(":")
    if sep and scheme == "parquet":
        location = rest
    elif not sep or scheme in ("s3", "file") or len(scheme) == 1:
        location = uri  # a bare path or s3:// URI means the parquet backend
    else:
        return uri
    if location.startswith("s3://"):
        return f"parquet:{location}"
    path, mark, options = location.removeprefix("file:").removeprefix("//").partition("?")
    if not path:
        raise StoreError(f"store URI {uri!r} names no directory")
    return f"parquet:{os.path.abspath(os.path.expanduser(path))}{mark}{options}"


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
