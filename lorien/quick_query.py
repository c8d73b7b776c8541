"""A one-shot ``lorien query`` answered from a local store's persisted serving index with the
standard library only: most of a cold query's time was importing pyarrow and numpy.

:func:`quick_best` answers exactly as ``ParquetStore.best`` does when the store's serving files
have an index of their current listing (which ``lorien ingest``, ``compact`` and the first warm
lookup of any process write); in every other case (an S3 or DynamoDB store, no index, a query
deeper than the serving view, a damaged index, no answer) it returns None and the caller opens
the store as usual, which answers, warns or reports as always.
"""

from __future__ import annotations

import os

from lorien.record import TuningRecord


def quick_best(store: str | None, workload_key: str, target: str, k: int = 1, layout: str | None = None,
               by_alternate_key: bool = False, prefix: bool = False, per_layout: bool = False,
               exact: bool = False) -> list[TuningRecord] | None:
    from lorien.errors import LorienError
    from lorien.partitions import serving_dir
    from lorien.serving_index import PersistedIndex, index_rel
    from lorien.storeuri import resolve_store_uri
    from lorien.target import match_mode, parse_target

    if k < 1:
        return None
    try:
        uri = resolve_store_uri(store)
        parsed = parse_target(target)
    except LorienError:
        return None  # the usual path says what is wrong
    location = uri.removeprefix("parquet:")
    if not uri.startswith("parquet:") or "://" in location or "?" in location:
        return None
    directory = serving_dir(parsed.alternate_key)
    try:
        names = os.listdir(os.path.join(location, *directory.split("/")))
    except OSError:
        return None
    listed = sorted(f"{directory}/{name}" for name in names
                    if name.endswith(".parquet") and not name.startswith((".", "_")))
    if not listed:
        return None
    try:
        index = PersistedIndex(os.path.join(location, *index_rel(directory, listed).split("/")),
                               parsed.alternate_key)
        if index.listed != tuple(listed) or (index.depth is not None and k > index.depth):
            return None
        records = index.best(workload_key, parsed.canonical, k, layout, match_mode(exact, by_alternate_key),
                             prefix, per_layout)
    except Exception:  # noqa: BLE001 - no index, or one to distrust: the store decides, and warns
        return None
    return records or None
