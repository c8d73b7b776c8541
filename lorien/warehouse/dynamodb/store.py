"""DynamoDBStore: the Store interface over one table — commits (merged into items with
conditional writes), best(), scans, workload entries and stats."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from lorien.errors import StoreError
from lorien.record import ARROW_SCHEMA, TuningRecord, records_to_table, table_to_records
from lorien.target import match_mode, match_tier, parse_target
from lorien.warehouse.base import CommitResult, Store, register_store
from lorien.warehouse.dynamodb.client import (
    DynamoDBLocation,
    backoff_s,
    call,
    make_client,
    paginate,
    parse_dynamodb_uri,
)
from lorien.warehouse.dynamodb.codec import (
    CONFIGS_ATTRIBUTE,
    ENTRY_ATTRIBUTE,
    FAILED_ATTRIBUTE,
    ITEM_SIZE_LIMIT_BYTES,
    WORKLOADS_HASH_KEY,
    entry_latency,
    entry_record,
    item_key,
    item_size,
    seed_alternate_key,
    seed_target_spelling,
)
from lorien.warehouse.dynamodb.merge import MAX_CONFIGS_PER_ITEM, merge_into_item, read_item
from lorien.warehouse.dynamodb.table import (
    ALTERNATE_INDEX,
    ALTERNATE_KEY,
    HASH_KEY,
    RANGE_KEY,
    check_table_schema,
    create_table,
)

#: Items one commit writes at once (each item's read-merge-write stays sequential).
WRITE_THREADS = 8


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _matches(record: TuningRecord, filters: dict[str, Any]) -> bool:
    for column, wanted in filters.items():
        if column not in ARROW_SCHEMA.names:
            raise StoreError(f"unknown filter column {column!r} (columns: {', '.join(ARROW_SCHEMA.names)})")
        value = record.cost_s if column == "cost_s" else getattr(record, column)
        if isinstance(wanted, (list, tuple, set, frozenset)):
            if value not in wanted:
                return False
        elif value != wanted:
            return False
    return True


def archive_uri(location: DynamoDBLocation) -> str | None:
    """The archive of a location; an S3 archive without its own endpoint uses the table's."""
    archive = location.archive
    if archive and archive.startswith("s3://") and location.endpoint_url and "endpoint_url=" not in archive:
        options = [f"endpoint_url={location.endpoint_url}"]
        if location.region and "region=" not in archive:
            options.append(f"region={location.region}")
        archive += ("&" if "?" in archive else "?") + "&".join(options)
    return archive


class DynamoDBStore(Store):
    """Serving view of the warehouse in a DynamoDB table with awslabs/lorien's schema."""

    def __init__(self, location: DynamoDBLocation | str, client: Any = None,
                 conflict_timeout_s: float = 300.0):
        if isinstance(location, str):
            location = parse_dynamodb_uri(location)
        self.location = location
        self.uri = location.uri
        self.conflict_timeout_s = conflict_timeout_s
        self.conflicts = 0
        self.page_size: int | None = None
        self.archive = archive_uri(location)
        self.client = client if client is not None else make_client(location)
        if location.create:
            create_table(location)
        table = call(self.client, location, "describe_table", TableName=location.table)["Table"]
        check_table_schema(location, table)

    # -- commit --

    def commit(self, records: Iterable[TuningRecord] | pa.Table, nbest: int | None = None,
               log_path: str | None = None) -> CommitResult:
        """Merge records into their items' ``BestConfigs`` with conditional writes.

        ``nbest`` (default and cap: 100, the item's capacity) is kept per build config and layout.

        Failed records are not served: their ids are kept (up to 1000 an item) so that they are
        counted once, and they go to the archive. ``log_path`` (or the archive file written when
        the URI names ``archive=``) is stored with each config.
        """
        if isinstance(records, pa.Table):
            records = table_to_records(records)
        records = list(records)
        nbest = MAX_CONFIGS_PER_ITEM if nbest is None else min(nbest, MAX_CONFIGS_PER_ITEM)
        if nbest < 1:
            raise StoreError(f"nbest={nbest} keeps no record; give 1..{MAX_CONFIGS_PER_ITEM}")
        result = CommitResult(received=len(records))
        if self.archive and records:
            from lorien.warehouse.archive import archive_records

            archived = archive_records(records, self.archive)
            result.files.extend(archived)
            log_path = log_path or (archived[0] if archived else None)
        by_key: dict[tuple[str, str], list[TuningRecord]] = {}
        for record in records:
            by_key.setdefault((record.target, record.workload_key), []).append(record)
        stored = self._read_items(list(by_key))

        def merge(key: tuple[str, str]) -> tuple[int, int]:
            return merge_into_item(self.client, self.location, key, by_key[key], nbest, log_path,
                                   stored.get(key), self.conflict_timeout_s, self._lost_race)

        if len(by_key) == 1:
            outcomes = [merge(key) for key in by_key]
        else:
            with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(by_key))) as pool:
                outcomes = list(pool.map(merge, by_key))
        for added, duplicates in outcomes:
            result.stored += added
            result.duplicates += duplicates
        return result

    def _page_limit(self) -> dict[str, int]:
        """``Limit`` for queries and scans when ``page_size`` is set (default: 1 MB pages)."""
        return {"Limit": self.page_size} if self.page_size else {}

    def _lost_race(self) -> None:
        """Count a conditional write that another committer beat."""
        self.conflicts += 1

    def _read_items(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        """Current items by key (consistent batch reads; unprocessed keys are retried)."""
        items: dict[tuple[str, str], dict[str, Any]] = {}
        for start in range(0, len(keys), 100):
            pending = [item_key(key) for key in keys[start:start + 100]]
            attempt = 0
            while pending:
                response = call(self.client, self.location, "batch_get_item", RequestItems={
                    self.location.table: {"Keys": pending, "ConsistentRead": True}})
                for item in response.get("Responses", {}).get(self.location.table, []):
                    items[(item[HASH_KEY]["S"], item[RANGE_KEY]["S"])] = item
                pending = response.get("UnprocessedKeys", {}).get(self.location.table, {}).get("Keys", [])
                if pending:
                    time.sleep(backoff_s(attempt))
                    attempt += 1
        return items

    def get_item(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The current item of (target, workload key) (a consistent read), or None."""
        return read_item(self.client, self.location, key)

    # -- reads --

    def items(self, workload_key: str | None, target: str, by_alternate_key: bool = False,
              prefix: bool = False, own_target: bool = False) -> Iterator[dict[str, Any]]:
        """Raw items of a target (or of its alternate key), by workload key or prefix, paginated.

        With ``by_alternate_key`` and ``own_target`` the target's own items are read from the
        table first (strongly consistent) and the family's from the alternate-key index."""
        own = [(spelling, HASH_KEY, {}) for spelling in
               _unique([parse_target(target).canonical, seed_target_spelling(target)])]
        family = [(spelling, ALTERNATE_KEY, {"IndexName": ALTERNATE_INDEX}) for spelling in
                  _unique([parse_target(target).alternate_key, seed_alternate_key(target)])]
        if not by_alternate_key:
            lookups = own
        else:
            lookups = own + family if own_target else family
        seen: set[tuple[str, str]] = set()
        for spelling, hash_name, index in lookups:
            condition = f"{hash_name} = :hash"
            values = {":hash": {"S": spelling}}
            if workload_key is not None:
                condition += f" AND begins_with({RANGE_KEY}, :key)" if prefix else f" AND {RANGE_KEY} = :key"
                values[":key"] = {"S": workload_key}
            for item in paginate(self.client, self.location, "query", TableName=self.location.table,
                                 KeyConditionExpression=condition, ExpressionAttributeValues=values,
                                 **index, **self._page_limit()):
                key = (item[HASH_KEY]["S"], item[RANGE_KEY]["S"])
                if key not in seen:
                    seen.add(key)
                    yield item

    def best(self, workload_key: str, target: str, k: int = 1, layout: str | None = None,
             by_alternate_key: bool = False, prefix: bool = False,
             per_layout: bool = False, exact: bool = False) -> list[TuningRecord]:
        mode = match_mode(exact, by_alternate_key)
        canonical = parse_target(target).canonical
        ranked = []
        for item in self.items(workload_key, target, by_alternate_key=mode != "exact", prefix=prefix,
                               own_target=mode == "options"):
            tier = match_tier(canonical, item[HASH_KEY]["S"], mode)
            if tier is None:
                continue
            ranked.extend((tier, record) for record in self._item_records(item)
                          if record.is_valid and (layout is None or record.layout == layout))
        ranked.sort(key=lambda pair: (pair[0], pair[1].cost_s, pair[1].timestamp))
        records = [record for _, record in ranked]
        if not per_layout:
            return records[:k]
        taken: dict[str, int] = {}
        chosen = []
        for record in records:
            if taken.get(record.layout, 0) < k:
                taken[record.layout] = taken.get(record.layout, 0) + 1
                chosen.append(record)
        return chosen

    def _item_records(self, item: dict[str, Any]) -> list[TuningRecord]:
        entries = item.get(CONFIGS_ATTRIBUTE, {}).get("L", [])
        records: dict[str, TuningRecord] = {}
        for entry in entries:
            record = entry_record(entry, item)
            records.setdefault(record.record_id, record)
        return list(records.values())

    def scan_items(self, target: str | None = None, include_workloads: bool = False) -> Iterator[dict[str, Any]]:
        """Every raw item of the table (or of one target), paginated; the items holding workload
        entries only with ``include_workloads`` (a whole-table dump)."""
        if target is not None:
            yield from self.items(None, target)
            return
        for item in paginate(self.client, self.location, "scan", TableName=self.location.table,
                             **self._page_limit()):
            if include_workloads or item[HASH_KEY]["S"] != WORKLOADS_HASH_KEY:
                yield item

    # -- workload entries --

    def put_workloads(self, entries: Mapping[str, str]) -> int:
        """Keep entries as items of hash key :data:`WORKLOADS_HASH_KEY` (range key: the hash);
        entries already kept are not written again."""
        kept = self._read_items([(WORKLOADS_HASH_KEY, digest) for digest in entries])
        new = 0
        for digest, text in sorted(entries.items()):
            if (WORKLOADS_HASH_KEY, digest) in kept:
                continue
            item = {HASH_KEY: {"S": WORKLOADS_HASH_KEY}, RANGE_KEY: {"S": digest}, ENTRY_ATTRIBUTE: {"S": text}}
            if item_size(item) > ITEM_SIZE_LIMIT_BYTES:
                raise StoreError(f"{self.uri}: workload entry {digest} is {item_size(item)} bytes, more than a "
                                 f"DynamoDB item holds ({ITEM_SIZE_LIMIT_BYTES}); keep it in a parquet store")
            call(self.client, self.location, "put_item", TableName=self.location.table, Item=item)
            new += 1
        return new

    def get_workloads(self, hashes: Iterable[str]) -> dict[str, str]:
        items = self._read_items([(WORKLOADS_HASH_KEY, digest) for digest in set(hashes)])
        return {key[1]: item[ENTRY_ATTRIBUTE]["S"] for key, item in items.items() if ENTRY_ATTRIBUTE in item}

    def scan(self, filters: dict[str, Any] | None = None, columns: list[str] | None = None) -> pa.Table:
        """The records the table holds (its best configs) matching ``filters``."""
        filters = dict(filters or {})
        wanted_target = filters.get("target")
        target = None
        if isinstance(wanted_target, str):
            target = filters["target"] = parse_target(wanted_target).canonical
        elif isinstance(wanted_target, (list, tuple, set, frozenset)):
            filters["target"] = [parse_target(text).canonical for text in wanted_target]
        records = [
            record
            for item in self.scan_items(target)
            for record in self._item_records(item)
            if _matches(record, filters)
        ]
        table = records_to_table(records)
        if columns:
            missing = [name for name in columns if name not in table.column_names]
            if missing:
                raise StoreError(f"unknown column(s) {', '.join(missing)} "
                                 f"(columns: {', '.join(table.column_names)})")
            table = table.select(columns)
        return table

    def workloads(self, target: str | None = None) -> list[str]:
        projection = {"ProjectionExpression": "#k", "ExpressionAttributeNames": {"#k": RANGE_KEY}}
        if target is None:
            projection["ProjectionExpression"] = "#k, #h"
            projection["ExpressionAttributeNames"]["#h"] = HASH_KEY
            items: Iterable[dict[str, Any]] = paginate(
                self.client, self.location, "scan", TableName=self.location.table, **projection)
        else:
            items = self.items(None, target)
        return sorted({item[RANGE_KEY]["S"] for item in items if item.get(HASH_KEY, {}).get("S") != WORKLOADS_HASH_KEY})

    def stats(self) -> dict[str, Any]:
        items = records = valid = 0
        workloads: set[str] = set()
        targets: set[str] = set()
        size_bytes = 0
        for item in self.scan_items():
            items += 1
            size_bytes += item_size(item)
            workloads.add(item[RANGE_KEY]["S"])
            targets.add(item[HASH_KEY]["S"])
            for entry in item.get(CONFIGS_ATTRIBUTE, {}).get("L", []):
                records += 1
                valid += entry_latency(entry) != float("inf")
            records += len(item.get(FAILED_ATTRIBUTE, {}).get("SS", []))
        return {"backend": "dynamodb", "table": self.location.table, "items": items,
                "records": records, "valid_records": valid, "workloads": len(workloads),
                "targets": len(targets), "files": 0, "bytes": size_bytes}

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if callable(close):
            close()


def open_dynamodb_store(rest: str) -> DynamoDBStore:
    """The store a ``dynamodb:`` URI names (``rest``: the part after the scheme)."""
    return DynamoDBStore(parse_dynamodb_uri(rest))


register_store("dynamodb", open_dynamodb_store)
