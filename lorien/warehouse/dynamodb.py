"""DynamoDB store: awslabs/lorien's table schema, holding the serving view (best configs).

URI: ``dynamodb:TABLE?endpoint_url=http://127.0.0.1:PORT&region=us-west-2``; optional
``create=1`` (create the table when missing) and ``archive=URI`` (archive every committed
record, failed ones included, as a full log in a local directory or ``s3://bucket/prefix``;
an S3 archive uses the table's endpoint override unless it names its own).

One item per (``Target``, ``PrimaryRangeKey`` = workload key), with the alternate target key in
``TargetIDKeys`` (global secondary index ``TargetIDKeysIndex``), task metadata (``OpName``,
``TaskName``, ``Args``) and ``BestConfigs``: at most 100 configs, each a map holding the native
log line (``config``), ``latency`` (mean seconds), ``framework_build_config`` and ``log_path``
exactly as the seed writes them, plus Lorien's full record (``lorien_record``). Configs of other
build configs are kept apart from the one being committed.

Commits merge with the stored item and write it back with a conditional put (on the item's
``LorienVersion``, or on its previous ``BestConfigs`` for items the seed wrote), re-reading and
re-merging when another committer got there first, so no concurrently committed config is lost.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import boto3
import orjson
import pyarrow as pa
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ReadTimeoutError,
)

from lorien.errors import RecordParseError, StoreError, StoreUnreachableError
from lorien.record import ARROW_SCHEMA, TuningRecord, records_to_table, table_to_records
from lorien.target import match_mode, match_tier, parse_target
from lorien.warehouse.base import CommitResult, Store, register_store

log = logging.getLogger(__name__)

HASH_KEY = "Target"
RANGE_KEY = "PrimaryRangeKey"
ALTERNATE_KEY = "TargetIDKeys"
ALTERNATE_INDEX = "TargetIDKeysIndex"
CONFIGS_ATTRIBUTE = "BestConfigs"
VERSION_ATTRIBUTE = "LorienVersion"
FAILED_ATTRIBUTE = "FailedRecordIds"
#: Hash key of the items holding workload entries that records refer to by content hash
#: (MetaSchedule IRModules); the range key is the hash, the entry is in ENTRY_ATTRIBUTE.
WORKLOADS_HASH_KEY = "lorien:workloads"
ENTRY_ATTRIBUTE = "WorkloadEntry"

#: The seed's cap on configs per item (``MAX_CONFIG_PER_ITEM``).
MAX_CONFIGS_PER_ITEM = 100
#: DynamoDB's item size limit, and the size commits trim items down to (a safety margin).
ITEM_SIZE_LIMIT_BYTES = 400 * 1024
ITEM_SIZE_TARGET_BYTES = 380 * 1024
DEFAULT_REGION = "us-west-2"
#: Items one commit writes at once (each item's read-merge-write stays sequential).
WRITE_THREADS = 8
#: Failed records are not served; up to this many of their ids per item are kept for counting.
MAX_FAILED_IDS_PER_ITEM = 1000

#: Dialect -> record format of lorien.formats, for the native ``config`` line.
NATIVE_FORMATS = {"autotvm": "autotvm", "auto_scheduler": "ansor"}

THROTTLING_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "Throttling", "TooManyRequestsException", "SlowDown",
})
CREDENTIAL_CODES = frozenset({
    "UnrecognizedClientException", "InvalidClientTokenId", "InvalidSignatureException",
    "SignatureDoesNotMatch", "InvalidAccessKeyId", "ExpiredToken", "ExpiredTokenException",
    "AccessDeniedException", "AccessDenied", "MissingAuthenticationToken",
    "MissingAuthenticationTokenException", "403",
})
_TRANSIENT_NETWORK_ERRORS = (ConnectionClosedError, ReadTimeoutError)


class MissingTableError(StoreError):
    """The DynamoDB table named in a URI does not exist."""


# ---- locations and clients -------------------------------------------------------------------


@dataclass(frozen=True)
class DynamoDBLocation:
    """Where a table lives: its name, endpoint override and region."""

    table: str
    endpoint_url: str | None = None
    region: str | None = None
    create: bool = False
    archive: str | None = None

    @property
    def where(self) -> str:
        """The endpoint for messages (never with credentials)."""
        endpoint = (self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
                    or os.environ.get("AWS_ENDPOINT_URL"))
        if endpoint:
            return redact_url(endpoint)
        return f"AWS DynamoDB ({self.region or 'default region'})"

    @property
    def uri(self) -> str:
        query = []
        if self.endpoint_url:
            query.append(f"endpoint_url={redact_url(self.endpoint_url)}")
        if self.region:
            query.append(f"region={self.region}")
        return f"dynamodb:{self.table}" + ("?" + "&".join(query) if query else "")


def redact_url(url: str) -> str:
    """``url`` without any ``user:password@`` part."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def parse_dynamodb_uri(rest: str) -> DynamoDBLocation:
    """Parse the part of a ``dynamodb:`` URI after the scheme: ``TABLE?endpoint_url=..&region=..``."""
    table, _, query = rest.partition("?")
    table = table.strip().lstrip("/")
    if not table:
        raise StoreError(f"dynamodb URI 'dynamodb:{rest}' names no table (dynamodb:TABLE?endpoint_url=..)")
    options = {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}
    known = {"endpoint_url", "region", "create", "archive"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise StoreError(
            f"unknown option(s) {', '.join(unknown)} in dynamodb URI for table {table!r} "
            f"(known: {', '.join(sorted(known))})"
        )
    return DynamoDBLocation(
        table=table,
        endpoint_url=options.get("endpoint_url") or None,
        region=options.get("region") or None,
        create=options.get("create", "").lower() in ("1", "true", "yes"),
        archive=options.get("archive") or None,
    )


def make_client(location: DynamoDBLocation) -> Any:
    """A DynamoDB client; credentials come from the standard AWS chain.

    botocore's own retries are off: :func:`call` retries throttling with jittered backoff.
    """
    session = boto3.session.Session()
    region = location.region or session.region_name or DEFAULT_REGION
    config = Config(
        retries={"total_max_attempts": 1},
        connect_timeout=5,
        read_timeout=60,
        max_pool_connections=32,
    )
    try:
        return session.client("dynamodb", endpoint_url=location.endpoint_url, region_name=region,
                              config=config)
    except (ValueError, NoRegionError) as exc:
        raise StoreError(f"cannot open a DynamoDB client for {location.where}: {exc}") from exc


def backoff_s(attempt: int, base_s: float = 0.05, cap_s: float = 2.0) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0.0, min(cap_s, base_s * (2 ** attempt)))


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _client_error_message(exc: ClientError) -> str:
    message = str(exc.response.get("Error", {}).get("Message", ""))
    if message.startswith("<?xml"):
        return ""
    return message


def translate_error(exc: Exception, location: DynamoDBLocation, operation: str) -> StoreError:
    """A :class:`StoreError` that says what went wrong and what to do, never naming secrets."""
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, *_TRANSIENT_NETWORK_ERRORS)):
        return StoreUnreachableError(
            f"DynamoDB endpoint {location.where} is unreachable ({type(exc).__name__} during "
            f"{operation} on table {location.table!r}); check endpoint_url/region"
        )
    if isinstance(exc, NoCredentialsError):
        return StoreError(
            f"no AWS credentials found for DynamoDB at {location.where}; set them through the "
            "standard chain (AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws, a role)"
        )
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "ResourceNotFoundException":
            return MissingTableError(
                f"DynamoDB table {location.table!r} does not exist at {location.where}; create it "
                f"with `lorien warehouse dynamodb create {location.table}"
                + (f" --endpoint-url {location.where}" if location.endpoint_url else "")
                + (f" --region {location.region}" if location.region else "") + "`"
            )
        if code in CREDENTIAL_CODES or status in (401, 403):
            return StoreError(
                f"AWS credentials were rejected by DynamoDB at {location.where} ({code or status} "
                f"during {operation}); check the standard credential chain (AWS_PROFILE, "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws/credentials)"
            )
        detail = _client_error_message(exc)
        return StoreError(
            f"DynamoDB {operation} on table {location.table!r} at {location.where} failed: "
            f"{code}{': ' + detail if detail else ''}"
        )
    return StoreError(f"DynamoDB {operation} on table {location.table!r} at {location.where} "
                      f"failed: {type(exc).__name__}")


def call(client: Any, location: DynamoDBLocation, operation: str, max_attempts: int = 10,
         **kwargs: Any) -> dict[str, Any]:
    """Call ``client.<operation>(**kwargs)``; back off with jitter on throttling.

    ``ConditionalCheckFailedException`` is re-raised as is (the caller merges and retries);
    every other failure becomes a :class:`StoreError` naming the table and endpoint.
    """
    method = getattr(client, operation)
    for attempt in range(max_attempts):
        try:
            return method(**kwargs)
        except ClientError as exc:
            code = error_code(exc)
            if code == "ConditionalCheckFailedException":
                raise
            if code in THROTTLING_CODES and attempt + 1 < max_attempts:
                delay = backoff_s(attempt)
                log.info("DynamoDB %s throttled (%s); retrying in %.3f s", operation, code, delay)
                time.sleep(delay)
                continue
            raise translate_error(exc, location, operation) from None
        except _TRANSIENT_NETWORK_ERRORS as exc:
            if attempt + 1 < min(max_attempts, 3):
                time.sleep(backoff_s(attempt))
                continue
            raise translate_error(exc, location, operation) from None
        except (BotoCoreError, NoCredentialsError) as exc:
            raise translate_error(exc, location, operation) from None
    raise AssertionError("unreachable")  # pragma: no cover - the loop always returns or raises


def paginate(client: Any, location: DynamoDBLocation, operation: str,
             **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Items of a query or scan, page after page (``LastEvaluatedKey``)."""
    start_key = None
    while True:
        if start_key is not None:
            kwargs["ExclusiveStartKey"] = start_key
        page = call(client, location, operation, **kwargs)
        yield from page.get("Items", [])
        start_key = page.get("LastEvaluatedKey")
        if not start_key:
            return


# ---- table management -------------------------------------------------------------------------


def table_definition(table: str) -> dict[str, Any]:
    """``create_table`` arguments: the seed's keys, GSI and provisioned throughput."""
    return {
        "TableName": table,
        "AttributeDefinitions": [
            {"AttributeName": HASH_KEY, "AttributeType": "S"},
            {"AttributeName": RANGE_KEY, "AttributeType": "S"},
            {"AttributeName": ALTERNATE_KEY, "AttributeType": "S"},
        ],
        "KeySchema": [
            {"AttributeName": HASH_KEY, "KeyType": "HASH"},
            {"AttributeName": RANGE_KEY, "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [{
            "IndexName": ALTERNATE_INDEX,
            "KeySchema": [
                {"AttributeName": ALTERNATE_KEY, "KeyType": "HASH"},
                {"AttributeName": RANGE_KEY, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
            "ProvisionedThroughput": {"ReadCapacityUnits": 100, "WriteCapacityUnits": 10},
        }],
        "ProvisionedThroughput": {"ReadCapacityUnits": 100, "WriteCapacityUnits": 10},
    }


def create_table(location: DynamoDBLocation, wait: bool = True) -> dict[str, Any]:
    """Create the table if it does not exist; return its description."""
    client = make_client(location)
    try:
        return call(client, location, "describe_table", TableName=location.table)["Table"]
    except MissingTableError:
        pass
    try:
        description = call(client, location, "create_table", **table_definition(location.table))
    except StoreError as exc:
        if "ResourceInUseException" not in str(exc):
            raise
    else:
        log.info("created DynamoDB table %s at %s", location.table, location.where)
        if not wait:
            return description["TableDescription"]
    if wait:
        for attempt in range(60):
            table = call(client, location, "describe_table", TableName=location.table)["Table"]
            if table.get("TableStatus") == "ACTIVE":
                return table
            time.sleep(min(1.0, 0.1 * (attempt + 1)))
        raise StoreError(f"DynamoDB table {location.table!r} at {location.where} did not become ACTIVE")
    return call(client, location, "describe_table", TableName=location.table)["Table"]


def describe_table(location: DynamoDBLocation) -> dict[str, Any]:
    client = make_client(location)
    return call(client, location, "describe_table", TableName=location.table)["Table"]


def delete_table(location: DynamoDBLocation) -> None:
    client = make_client(location)
    call(client, location, "delete_table", TableName=location.table)


def list_tables(location: DynamoDBLocation) -> list[str]:
    """Every table name at the endpoint, sorted."""
    client = make_client(location)
    names: list[str] = []
    start = None
    while True:
        kwargs = {"ExclusiveStartTableName": start} if start else {}
        page = call(client, location, "list_tables", **kwargs)
        names.extend(page.get("TableNames", []))
        start = page.get("LastEvaluatedTableName")
        if not start:
            return sorted(names)


def table_summary(table: dict[str, Any]) -> dict[str, Any]:
    """The parts of a ``describe_table`` answer a person wants to see."""
    keys = {key["KeyType"].lower(): key["AttributeName"] for key in table.get("KeySchema", [])}
    indexes = [f"{index['IndexName']} ({', '.join(k['AttributeName'] for k in index['KeySchema'])})"
               for index in table.get("GlobalSecondaryIndexes", [])]
    return {
        "table": table.get("TableName"),
        "status": table.get("TableStatus"),
        "hash key": keys.get("hash"),
        "range key": keys.get("range"),
        "indexes": ", ".join(indexes) or "-",
        "items": table.get("ItemCount", 0),
        "bytes": table.get("TableSizeBytes", 0),
        "arn": table.get("TableArn", ""),
    }


def item_summary(item: dict[str, Any]) -> dict[str, Any]:
    """Target, workload key, number of configs and best latency of one item."""
    entries = item.get(CONFIGS_ATTRIBUTE, {}).get("L", [])
    latencies = [_entry_latency(entry) for entry in entries]
    best = min(latencies, default=float("inf"))
    return {
        "target": item[HASH_KEY]["S"],
        "workload_key": item[RANGE_KEY]["S"],
        "configs": len(entries),
        "best_latency_s": f"{best:.6g}" if best != float("inf") else "-",
    }


def check_table_schema(location: DynamoDBLocation, table: dict[str, Any]) -> None:
    """Raise when a table's keys are not Lorien's (hash Target, range PrimaryRangeKey)."""
    keys = {key["KeyType"]: key["AttributeName"] for key in table.get("KeySchema", [])}
    if keys != {"HASH": HASH_KEY, "RANGE": RANGE_KEY}:
        raise StoreError(
            f"DynamoDB table {location.table!r} at {location.where} has keys {keys}, not Lorien's "
            f"(HASH {HASH_KEY}, RANGE {RANGE_KEY})"
        )


# ---- DynamoDB attribute values, encoded the way the seed encodes them -------------------------


def to_attribute(value: Any) -> dict[str, Any]:
    """A DynamoDB attribute value as the seed encodes one: None becomes the string "None",
    booleans become numbers (the seed's reader knows only S, N, L and M)."""
    if isinstance(value, bool):
        return {"N": "1" if value else "0"}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, (int, float)):
        return {"N": repr(value) if isinstance(value, float) else str(value)}
    if isinstance(value, (list, tuple)):
        return {"L": [to_attribute(item) for item in value]}
    if isinstance(value, dict):
        return {"M": {str(name): to_attribute(item) for name, item in value.items()}}
    if value is None:
        return {"S": "None"}
    raise StoreError(f"cannot store {value!r} ({type(value).__name__}) in DynamoDB")


def from_attribute(attribute: dict[str, Any]) -> Any:
    """The Python value of a DynamoDB attribute value (the string "None" becomes None)."""
    (kind, value), = attribute.items()
    if kind == "S":
        return None if value == "None" else value
    if kind == "N":
        text = str(value)
        if any(char in text for char in ".eEnN"):
            return float(text)
        return int(text)
    if kind == "L":
        return [from_attribute(item) for item in value]
    if kind == "M":
        return {name: from_attribute(item) for name, item in value.items()}
    if kind in ("SS", "NS"):
        return sorted(from_attribute({kind[0]: element}) for element in value)
    if kind == "BOOL":
        return bool(value)
    if kind == "NULL":
        return None
    raise StoreError(f"unsupported DynamoDB attribute type {kind!r}")


def attribute_size(attribute: dict[str, Any]) -> int:
    """DynamoDB's size of an attribute value in bytes (an upper-bound estimate)."""
    (kind, value), = attribute.items()
    if kind == "S":
        return len(value.encode("utf-8"))
    if kind == "N":
        return (len(str(value)) + 1) // 2 + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(attribute_size(item) + 1 for item in value)
    if kind == "M":
        return 3 + sum(len(name.encode("utf-8")) + attribute_size(item) + 1
                       for name, item in value.items())
    return len(orjson.dumps(value))


def item_size(item: dict[str, Any]) -> int:
    return sum(len(name.encode("utf-8")) + attribute_size(value) for name, value in item.items())


# ---- configs: one map per record in BestConfigs -----------------------------------------------


def seed_build_config(build: str) -> Any:
    """A record's ``build`` JSON as the seed's ``framework_build_config`` ("unknown" when empty)."""
    value = orjson.loads(build or "{}")
    return value if value else "unknown"


def build_group(framework_build_config: Any) -> tuple:
    """The seed's grouping of build configs: sorted (name, value) pairs, or the bare value."""
    if isinstance(framework_build_config, dict):
        return tuple(sorted((str(name), str(value)) for name, value in framework_build_config.items()))
    return (str(framework_build_config),)


def native_line(record: TuningRecord) -> str:
    """The record as the seed stores it in ``config``: its native TVM log line."""
    record_format = NATIVE_FORMATS.get(record.dialect)
    if record_format is None:
        return record.config
    from lorien.formats import encode_record

    return encode_record(record, record_format).strip()


def config_entry(record: TuningRecord, log_path: str | None) -> dict[str, Any]:
    """The ``BestConfigs`` map of one record: the seed's fields plus Lorien's full record."""
    row = record.to_row()
    row.pop("cost_s", None)
    return {"M": {
        "config": {"S": native_line(record)},
        "latency": to_attribute(float(record.cost_s or 0.0)),
        "framework_build_config": to_attribute(seed_build_config(record.build)),
        "log_path": {"S": log_path or " "},
        "record_id": {"S": record.record_id},
        "lorien_record": {"S": orjson.dumps(row).decode()},
    }}


def _entry_latency(entry: dict[str, Any]) -> float:
    latency = entry["M"].get("latency")
    if latency is None:
        return float("inf")
    value = from_attribute(latency)
    return float(value) if isinstance(value, (int, float)) and value > 0 else float("inf")


def _entry_layout(entry: dict[str, Any]) -> str:
    stored = entry["M"].get("lorien_record")
    if stored is None:
        return ""
    return str(orjson.loads(stored["S"]).get("layout", ""))


def _entry_group(entry: dict[str, Any]) -> tuple:
    value = entry["M"].get("framework_build_config")
    return build_group(from_attribute(value) if value is not None else "unknown")


def _guess_line_format(line: str) -> str:
    """The lorien.formats name of a native line the seed stored (AutoTVM or auto-scheduler)."""
    data = orjson.loads(line)
    if isinstance(data, dict) and "input" in data:
        return "autotvm"
    inputs = data.get("i") if isinstance(data, dict) else None
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], list):
        return "ansor"
    return "autotvm"


def entry_record(entry: dict[str, Any], item: dict[str, Any]) -> TuningRecord:
    """The record held by one config map, whichever project wrote it."""
    fields = entry["M"]
    target_text = item[HASH_KEY]["S"]
    workload_key = item[RANGE_KEY]["S"]
    stored = fields.get("lorien_record")
    if stored is not None:
        return TuningRecord.from_row(orjson.loads(stored["S"]))
    from lorien.formats import decode_line

    line = fields["config"]["S"]
    try:
        record = decode_line(line, _guess_line_format(line))
    except (RecordParseError, orjson.JSONDecodeError) as exc:
        raise StoreError(f"item ({target_text!r}, {workload_key!r}) holds a config that does not "
                         f"decode as a TVM log line: {exc}") from exc
    build = from_attribute(fields["framework_build_config"]) if "framework_build_config" in fields else None
    target = parse_target(target_text)
    log_path = from_attribute(fields["log_path"]) if "log_path" in fields else None
    return record.with_changes(
        target=target.canonical,
        target_key=target.alternate_key,
        workload_key=workload_key,
        build=orjson.dumps(build if isinstance(build, dict) else {}).decode(),
        source=(log_path or "").strip() or record.source,
    )


def seed_target_spelling(target: str) -> str:
    """The seed's canonical target string: kind, ``-keys=`` in order, other options sorted, no libs."""
    parsed = parse_target(target)
    parts = [parsed.kind]
    if parsed.keys:
        parts.append("-keys=" + ",".join(parsed.keys))
    for name in sorted(parsed.options):
        if name in ("keys", "libs"):
            continue
        value = parsed.options[name]
        if isinstance(value, (list, tuple)):
            text = ",".join(sorted(str(item) for item in value))
        elif isinstance(value, bool):
            text = "1" if value else "0"
        else:
            text = str(value)
        parts.append(f"-{name}={text}")
    return " ".join(parts)


def seed_alternate_key(target: str) -> str:
    """The seed's ``TargetIDKeys``: kind, underscore, device keys joined by dashes (``cuda_cuda-gpu``)."""
    parsed = parse_target(target)
    return f"{parsed.kind}_{'-'.join(parsed.keys)}"


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


# ---- merging --------------------------------------------------------------------------------


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
        if line in known_lines and record.dialect in NATIVE_FORMATS:
            duplicates += 1
            continue
        known_ids.add(record.record_id)
        known_lines.add(line)
        new_entries.append(entry)
    new_ids = {id(entry) for entry in new_entries}
    committed_groups = {_entry_group(entry) for entry in new_entries}

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for entry in existing + new_entries:
        group = _entry_group(entry)
        layout = _entry_layout(entry) if group in committed_groups else None
        groups.setdefault((group, layout), []).append(entry)
    ranked: list[tuple[int, float, int, dict[str, Any]]] = []
    order = 0
    for (group, _layout), entries in groups.items():
        entries.sort(key=_entry_latency)
        if group in committed_groups:
            entries = entries[:nbest]
        for rank, entry in enumerate(entries):
            ranked.append((rank, _entry_latency(entry), order, entry))
            order += 1
    ranked.sort(key=lambda item: item[:3])
    kept = [entry for *_, entry in ranked[:MAX_CONFIGS_PER_ITEM]]
    size = sum(attribute_size(entry) + 1 for entry in kept)
    trimmed = 0
    while kept and size > size_budget:
        size -= attribute_size(kept.pop()) + 1
        trimmed += 1
    kept.sort(key=_entry_latency)
    added = sum(1 for entry in kept if id(entry) in new_ids)
    return MergeOutcome(kept, added, duplicates, trimmed)


# ---- the store ------------------------------------------------------------------------------


def _task_metadata(record: TuningRecord) -> dict[str, Any]:
    """``OpName``, ``TaskName`` and ``Args`` as the seed puts them on an AutoTVM item."""
    metadata: dict[str, Any] = {"Dialect": {"S": record.dialect}}
    if record.task_name:
        metadata["OpName"] = {"S": record.task_name}
        metadata["TaskName"] = {"S": record.task_name}
    try:
        args = orjson.loads(record.args) if record.args else None
    except orjson.JSONDecodeError:
        args = None
    if isinstance(args, list):
        metadata["Args"] = to_attribute(args)
    return metadata


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
            return self._merge_into_item(key, by_key[key], nbest, log_path, stored.get(key))

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

    def item_key(self, key: tuple[str, str]) -> dict[str, Any]:
        """The DynamoDB key of (target, workload key)."""
        return {HASH_KEY: {"S": key[0]}, RANGE_KEY: {"S": key[1]}}

    def _read_items(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        """Current items by key (consistent batch reads; unprocessed keys are retried)."""
        items: dict[tuple[str, str], dict[str, Any]] = {}
        for start in range(0, len(keys), 100):
            pending = [self.item_key(key) for key in keys[start:start + 100]]
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
        response = call(self.client, self.location, "get_item", TableName=self.location.table,
                        Key=self.item_key(key), ConsistentRead=True)
        return response.get("Item")

    def _merge_into_item(self, key: tuple[str, str], records: list[TuningRecord], nbest: int,
                         log_path: str | None, item: dict[str, Any] | None) -> tuple[int, int]:
        """Read-merge-conditional-write one item until no other committer interferes."""
        deadline = time.monotonic() + self.conflict_timeout_s
        attempt = 0
        while True:
            new_item, condition, values, outcome = self.merged_item(key, records, nbest, log_path, item)
            if outcome.added == 0 and item is not None and CONFIGS_ATTRIBUTE in item \
                    and len(outcome.entries) == len(item[CONFIGS_ATTRIBUTE]["L"]):
                return 0, outcome.duplicates
            if item is None and not outcome.entries and not outcome.added:
                return 0, outcome.duplicates
            try:
                call(self.client, self.location, "put_item", TableName=self.location.table,
                     Item=new_item, ConditionExpression=condition,
                     ReturnValuesOnConditionCheckFailure="ALL_OLD",
                     **({"ExpressionAttributeValues": values} if values else {}))
                return outcome.added, outcome.duplicates
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise translate_error(exc, self.location, "put_item") from None
                current = exc.response.get("Item")
            self.conflicts += 1
            if time.monotonic() > deadline:
                raise StoreError(
                    f"gave up committing {key[1]!r} on {key[0]!r} to table {self.location.table!r}: "
                    f"the item kept changing for {self.conflict_timeout_s:.0f} s")
            time.sleep(backoff_s(attempt, base_s=0.005, cap_s=0.2))
            attempt = min(attempt + 1, 8)
            # The failed write returns the item that beat it; re-read only when it does not.
            item = current if current is not None else self.get_item(key)

    def merged_item(self, key: tuple[str, str], records: list[TuningRecord], nbest: int,
                    log_path: str | None, item: dict[str, Any] | None
                    ) -> tuple[dict[str, Any], str, dict[str, Any], MergeOutcome]:
        """The item after merging ``records`` into ``item`` (None: not stored yet), and the
        condition (with its values) under which writing it loses nothing."""
        first = records[0]
        new_item: dict[str, Any] = dict(item) if item else {}
        new_item.update(self.item_key(key))
        new_item.setdefault(ALTERNATE_KEY, {"S": first.target_key})
        for name, value in _task_metadata(first).items():
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
                valid += _entry_latency(entry) != float("inf")
            records += len(item.get(FAILED_ATTRIBUTE, {}).get("SS", []))
        return {"backend": "dynamodb", "table": self.location.table, "items": items,
                "records": records, "valid_records": valid, "workloads": len(workloads),
                "targets": len(targets), "files": 0, "bytes": size_bytes}

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if callable(close):
            close()


# ---- bulk writes ------------------------------------------------------------------------------


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


def open_dynamodb_store(rest: str) -> DynamoDBStore:
    return DynamoDBStore(parse_dynamodb_uri(rest))


register_store("dynamodb", open_dynamodb_store)
