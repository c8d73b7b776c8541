"""The merge protocol: how committed records merge into an item's ``BestConfigs`` (the best
``nbest`` per build config and layout, at most 100 configs, trimmed to fit an item) and the
conditional write that makes concurrent committers lose nothing.

An item is written whole with ``PutItem`` under a condition on what the committer read: no item
yet, its ``LorienVersion``, or (for items the seed wrote) its previous ``BestConfigs``. When the
condition fails another committer got there first; the failed write returns the item that beat
it, and the records are merged into that one and written again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from lorien.dialect import native_log_format
from lorien.errors import StoreError
from lorien.record import TuningRecord
from lorien.warehouse.dynamodb.client import (
    DynamoDBLocation,
    backoff_s,
    call,
    error_code,
    translate_error,
)
from lorien.warehouse.dynamodb.codec import (
    CONFIGS_ATTRIBUTE,
    FAILED_ATTRIBUTE,
    ITEM_SIZE_LIMIT_BYTES,
    VERSION_ATTRIBUTE,
    attribute_size,
    config_entry,
    entry_group,
    entry_latency,
    entry_layout,
    item_key,
    item_size,
    task_metadata,
)
from lorien.warehouse.dynamodb.table import ALTERNATE_KEY, RANGE_KEY

log = logging.getLogger(__name__)

#: The seed's cap on configs per item (``MAX_CONFIG_PER_ITEM``).
MAX_CONFIGS_PER_ITEM = 100
#: The size commits trim items down to (a safety margin under ITEM_SIZE_LIMIT_BYTES).
ITEM_SIZE_TARGET_BYTES = 380 * 1024
#: Failed records are not served; up to this many of their ids per item are kept for counting.
MAX_FAILED_IDS_PER_ITEM = 1000


@dataclass
class MergeOutcome:
    """A merged ``BestConfigs`` list and what the merge did."""

    entries: list[dict[str, Any]]
    added: int
    duplicates: int
    trimmed_for_size: int


def merge_configs(existing: list[dict[str, Any]], records: list[TuningRecord], nbest: int,
                  log_path: str | None, size_budget: int) -> MergeOutcome:
    """Merge new records into an item's stored configs.

    Duplicates (same record id, or same native line) are skipped. The best ``nbest`` per
    (build config, layout) group are kept; other build configs' configs are kept apart and
    untouched. Beyond 100 configs, or beyond ``size_budget`` bytes, the worst ranked configs go
    first (rank within its group, then latency), so each group keeps its best configs longest.
    """
    known_ids = {entry["M"]["record_id"]["S"] for entry in existing if "record_id" in entry["M"]}
    known_lines = {entry["M"]["config"]["S"] for entry in existing if "config" in entry["M"]}
    new_entries: list[dict[str, Any]] = []
    duplicates = 0
    for record in records:
        if record.record_id in known_ids:
            duplicates += 1
            continue
        entry = config_entry(record, log_path)
        line = entry["M"]["config"]["S"]
        if line in known_lines and native_log_format(record.dialect) is not None:
            duplicates += 1
            continue
        known_ids.add(record.record_id)
        known_lines.add(line)
        new_entries.append(entry)
    new_ids = {id(entry) for entry in new_entries}
    committed_groups = {entry_group(entry) for entry in new_entries}

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for entry in existing + new_entries:
        group = entry_group(entry)
        layout = entry_layout(entry) if group in committed_groups else None
        groups.setdefault((group, layout), []).append(entry)
    ranked: list[tuple[int, float, int, dict[str, Any]]] = []
    order = 0
    for (group, _layout), entries in groups.items():
        entries.sort(key=entry_latency)
        if group in committed_groups:
            entries = entries[:nbest]
        for rank, entry in enumerate(entries):
            ranked.append((rank, entry_latency(entry), order, entry))
            order += 1
    ranked.sort(key=lambda item: item[:3])
    kept = [entry for *_, entry in ranked[:MAX_CONFIGS_PER_ITEM]]
    size = sum(attribute_size(entry) + 1 for entry in kept)
    trimmed = 0
    while kept and size > size_budget:
        size -= attribute_size(kept.pop()) + 1
        trimmed += 1
    kept.sort(key=entry_latency)
    added = sum(1 for entry in kept if id(entry) in new_ids)
    return MergeOutcome(kept, added, duplicates, trimmed)


def merged_item(key: tuple[str, str], records: list[TuningRecord], nbest: int,
                log_path: str | None, item: dict[str, Any] | None
                ) -> tuple[dict[str, Any], str, dict[str, Any], MergeOutcome]:
    """The item after merging ``records`` into ``item`` (None: not stored yet), and the
    condition (with its values) under which writing it loses nothing."""
    first = records[0]
    new_item: dict[str, Any] = dict(item) if item else {}
    new_item.update(item_key(key))
    new_item.setdefault(ALTERNATE_KEY, {"S": first.target_key})
    for name, value in task_metadata(first).items():
        new_item.setdefault(name, value)
    existing = item[CONFIGS_ATTRIBUTE]["L"] if item and CONFIGS_ATTRIBUTE in item else []
    new_item.pop(CONFIGS_ATTRIBUTE, None)
    version = int(item[VERSION_ATTRIBUTE]["N"]) if item and VERSION_ATTRIBUTE in item else 0
    new_item[VERSION_ATTRIBUTE] = {"N": str(version + 1)}
    valid = [record for record in records if record.is_valid]
    failed_ids = set(item[FAILED_ATTRIBUTE]["SS"]) if item and FAILED_ATTRIBUTE in item else set()
    new_failed = list(dict.fromkeys(r.record_id for r in records if not r.is_valid))
    failed_duplicates = sum(1 for record_id in new_failed if record_id in failed_ids)
    room = max(0, MAX_FAILED_IDS_PER_ITEM - len(failed_ids))
    added_failed = [record_id for record_id in new_failed if record_id not in failed_ids][:room]
    if added_failed:
        new_item[FAILED_ATTRIBUTE] = {"SS": sorted(failed_ids.union(added_failed))}
    budget = ITEM_SIZE_TARGET_BYTES - item_size(new_item) - len(CONFIGS_ATTRIBUTE) - 3
    outcome = merge_configs(existing, valid, nbest, log_path, budget)
    outcome.added += len(added_failed)
    outcome.duplicates += failed_duplicates + len(records) - len(valid) - len(new_failed)
    if outcome.trimmed_for_size:
        log.info("item %s on %s trimmed by %d config(s) to stay under %d bytes",
                 key[1], key[0], outcome.trimmed_for_size, ITEM_SIZE_LIMIT_BYTES)
    new_item[CONFIGS_ATTRIBUTE] = {"L": outcome.entries}
    values: dict[str, Any] = {}
    if item is None:
        condition = f"attribute_not_exists({RANGE_KEY})"
    elif VERSION_ATTRIBUTE in item:
        condition = f"{VERSION_ATTRIBUTE} = :version"
        values[":version"] = item[VERSION_ATTRIBUTE]
    elif CONFIGS_ATTRIBUTE in item:
        condition = f"attribute_not_exists({VERSION_ATTRIBUTE}) AND {CONFIGS_ATTRIBUTE} = :previous"
        values[":previous"] = item[CONFIGS_ATTRIBUTE]
    else:
        condition = (f"attribute_not_exists({VERSION_ATTRIBUTE}) AND "
                     f"attribute_not_exists({CONFIGS_ATTRIBUTE})")
    return new_item, condition, values, outcome


def read_item(client: Any, location: DynamoDBLocation, key: tuple[str, str]) -> dict[str, Any] | None:
    """The current item of (target, workload key) (a consistent read), or None."""
    response = call(client, location, "get_item", TableName=location.table,
                    Key=item_key(key), ConsistentRead=True)
    return response.get("Item")


def merge_into_item(client: Any, location: DynamoDBLocation, key: tuple[str, str],
                    records: list[TuningRecord], nbest: int, log_path: str | None,
                    item: dict[str, Any] | None, timeout_s: float,
                    on_conflict: Callable[[], None]) -> tuple[int, int]:
    """Merge-conditional-write one item (``item``: as last read) until no other committer
    interferes; ``on_conflict`` hears every lost race. Returns (configs added, duplicates)."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        new_item, condition, values, outcome = merged_item(key, records, nbest, log_path, item)
        if outcome.added == 0 and item is not None and CONFIGS_ATTRIBUTE in item \
                and len(outcome.entries) == len(item[CONFIGS_ATTRIBUTE]["L"]):
            return 0, outcome.duplicates
        if item is None and not outcome.entries and not outcome.added:
            return 0, outcome.duplicates
        try:
            call(client, location, "put_item", TableName=location.table,
                 Item=new_item, ConditionExpression=condition,
                 ReturnValuesOnConditionCheckFailure="ALL_OLD",
                 **({"ExpressionAttributeValues": values} if values else {}))
            return outcome.added, outcome.duplicates
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise translate_error(exc, location, "put_item") from None
            current = exc.response.get("Item")
        on_conflict()
        if time.monotonic() > deadline:
            raise StoreError(
                f"gave up committing {key[1]!r} on {key[0]!r} to table {location.table!r}: "
                f"the item kept changing for {timeout_s:.0f} s")
        time.sleep(backoff_s(attempt, base_s=0.005, cap_s=0.2))
        attempt = min(attempt + 1, 8)
        # The failed write returns the item that beat it; re-read only when it does not.
        item = current if current is not None else read_item(client, location, key)
