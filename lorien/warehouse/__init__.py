"""The warehouse: one Store interface, several backends chosen by URI."""

from __future__ import annotations

from lorien.warehouse.base import (
    DEFAULT_STORE_URI,
    CommitResult,
    Store,
    default_store_uri,
    open_store,
    register_store,
    resolve_store_uri,
)


class Warehouse:
    """Entry point for Python users: ``Warehouse.open(uri)`` then ``best``/``scan``/``commit``."""

    def __init__(self, store: Store):
        self.store = store

    @classmethod
    def open(cls, uri: str | None = None) -> Warehouse:
        return cls(open_store(uri))

    @property
    def uri(self) -> str:
        return self.store.uri

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()


__all__ = [
    "DEFAULT_STORE_URI",
    "CommitResult",
    "Store",
    "Warehouse",
    "default_store_uri",
    "open_store",
    "register_store",
    "resolve_store_uri",
]
