"""Table administration: the seed's key schema and index (``Target``, ``PrimaryRangeKey``, GSI
``TargetIDKeysIndex`` on ``TargetIDKeys``), creating, describing, listing and deleting tables."""

from __future__ import annotations

import logging
import time
from typing import Any

from lorien.errors import StoreError
from lorien.warehouse.dynamodb.client import DynamoDBLocation, MissingTableError, call, make_client

log = logging.getLogger(__name__)

HASH_KEY = "Target"
RANGE_KEY = "PrimaryRangeKey"
ALTERNATE_KEY = "TargetIDKeys"
ALTERNATE_INDEX = "TargetIDKeysIndex"


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


def check_table_schema(location: DynamoDBLocation, table: dict[str, Any]) -> None:
    """Raise when a table's keys are not Lorien's (hash Target, range PrimaryRangeKey)."""
    keys = {key["KeyType"]: key["AttributeName"] for key in table.get("KeySchema", [])}
    if keys != {"HASH": HASH_KEY, "RANGE": RANGE_KEY}:
        raise StoreError(
            f"DynamoDB table {location.table!r} at {location.where} has keys {keys}, not Lorien's "
            f"(HASH {HASH_KEY}, RANGE {RANGE_KEY})"
        )
