"""Which store a command uses (``--store``, a config's ``store:``, ``$LORIEN_STORE``, the
default), importable without pyarrow; :mod:`lorien.warehouse` exports the same names."""

from __future__ import annotations

import os

from lorien.errors import StoreError

DEFAULT_STORE_URI = "parquet:./lorien-warehouse"
STORE_ENV = "LORIEN_STORE"


def uri_flag(options: dict[str, str], name: str, uri: str) -> bool:
    """A store URI's yes/no option ``name`` (absent or empty: no); a value that is neither yes
    (1, true, yes) nor no (0, false, no) is a StoreError naming it."""
    value = options.get(name, "").lower()
    if value not in ("", "1", "true", "yes", "0", "false", "no"):
        raise StoreError(f"store URI {uri!r}: {name}={options[name]!r} is not a yes/no value (use true or false)")
    return value in ("1", "true", "yes")


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
