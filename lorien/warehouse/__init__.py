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
