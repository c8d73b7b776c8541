"""Dump I/O: the one-line summary of an item (``lorien warehouse dynamodb scan``), reading a
dump of typed items (``scan --json``) and loading items into a table with ``BatchWriteItem``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from lorien.errors import RecordParseError, StoreError
from lorien.warehouse.dynamodb.client import DynamoDBLocation, backoff_s, call
from lorien.warehouse.dynamodb.codec import CONFIGS_ATTRIBUTE, entry_latency
from lorien.warehouse.dynamodb.table import HASH_KEY, RANGE_KEY


def item_summary(item: dict[str, Any]) -> dict[str, Any]:
    """Target, workload key, number of configs and best latency of one item."""
    entries = item.get(CONFIGS_ATTRIBUTE, {}).get("L", [])
    latencies = [entry_latency(entry) for entry in entries]
    best = min(latencies, default=float("inf"))
    return {
        "target": item[HASH_KEY]["S"],
        "workload_key": item[RANGE_KEY]["S"],
        "configs": len(entries),
        "best_latency_s": f"{best:.6g}" if best != float("inf") else "-",
    }


def write_items(client: Any, location: DynamoDBLocation, items: Iterable[dict[str, Any]],
                sleep: Callable[[float], None] = time.sleep, max_rounds: int = 50) -> int:
    """Write raw items with ``BatchWriteItem`` (25 a request), retrying ``UnprocessedItems``.

    Unconditional: for loading a dump into an empty table, not for concurrent commits.
    """
    written = 0
    batch: list[dict[str, Any]] = []

    def flush(requests: list[dict[str, Any]]) -> None:
        for round_number in range(max_rounds):
            response = call(client, location, "batch_write_item",
                            RequestItems={location.table: requests})
            requests = response.get("UnprocessedItems", {}).get(location.table, [])
            if not requests:
                return
            sleep(backoff_s(round_number))
        raise StoreError(f"{len(requests)} item(s) stayed unprocessed writing to table "
                         f"{location.table!r} at {location.where} after {max_rounds} rounds")

    for item in items:
        batch.append({"PutRequest": {"Item": item}})
        if len(batch) == 25:
            flush(batch)
            written += len(batch)
            batch = []
    if batch:
        flush(batch)
        written += len(batch)
    return written


def read_item_dump(path: str | Path) -> Iterator[dict[str, Any]]:
    """Items of a ``lorien warehouse dynamodb scan --json`` dump (one typed item a line)."""
    with open(path, "rb") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                item = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise RecordParseError(f"not a JSON item: {exc}", str(path), lineno) from None
            if not isinstance(item, dict) or HASH_KEY not in item or RANGE_KEY not in item:
                raise RecordParseError(f"not a DynamoDB item with {HASH_KEY} and {RANGE_KEY}",
                                       str(path), lineno)
            yield item
