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

Modules, one concern each: ``client`` (locations, the client, errors, retried calls), ``table``
(key schema, index, table administration), ``codec`` (attribute values, item attributes,
``BestConfigs`` entries), ``merge`` (merging configs, the conditional
write), ``store`` (DynamoDBStore), ``dump`` (item summaries, dumps, bulk loads).
"""

from lorien.warehouse.dynamodb.client import (
    CREDENTIAL_CODES,
    DEFAULT_REGION,
    THROTTLING_CODES,
    DynamoDBLocation,
    MissingTableError,
    backoff_s,
    call,
    error_code,
    make_client,
    paginate,
    parse_dynamodb_uri,
    redact_url,
    translate_error,
)
from lorien.warehouse.dynamodb.codec import (
    CONFIGS_ATTRIBUTE,
    ENTRY_ATTRIBUTE,
    FAILED_ATTRIBUTE,
    ITEM_SIZE_LIMIT_BYTES,
    VERSION_ATTRIBUTE,
    WORKLOADS_HASH_KEY,
    attribute_size,
    build_group,
    config_entry,
    entry_record,
    from_attribute,
    item_key,
    item_size,
    native_line,
    seed_alternate_key,
    seed_build_config,
    seed_target_spelling,
    to_attribute,
)
from lorien.warehouse.dynamodb.dump import (
    item_summary,
    read_item_dump,
    write_items,
)
from lorien.warehouse.dynamodb.merge import (
    ITEM_SIZE_TARGET_BYTES,
    MAX_CONFIGS_PER_ITEM,
    MAX_FAILED_IDS_PER_ITEM,
    MergeOutcome,
    merge_configs,
    merged_item,
)
from lorien.warehouse.dynamodb.store import (
    WRITE_THREADS,
    DynamoDBStore,
    archive_uri,
    open_dynamodb_store,
)
from lorien.warehouse.dynamodb.table import (
    ALTERNATE_INDEX,
    ALTERNATE_KEY,
    HASH_KEY,
    RANGE_KEY,
    check_table_schema,
    create_table,
    delete_table,
    describe_table,
    list_tables,
    table_definition,
    table_summary,
)

__all__ = [
    "ALTERNATE_INDEX", "ALTERNATE_KEY", "CONFIGS_ATTRIBUTE", "CREDENTIAL_CODES", "DEFAULT_REGION",
    "ENTRY_ATTRIBUTE", "FAILED_ATTRIBUTE", "HASH_KEY", "ITEM_SIZE_LIMIT_BYTES", "ITEM_SIZE_TARGET_BYTES",
    "MAX_CONFIGS_PER_ITEM", "MAX_FAILED_IDS_PER_ITEM", "RANGE_KEY", "THROTTLING_CODES",
    "VERSION_ATTRIBUTE", "WORKLOADS_HASH_KEY", "WRITE_THREADS", "DynamoDBLocation", "DynamoDBStore",
    "MergeOutcome", "MissingTableError", "archive_uri", "attribute_size", "backoff_s", "build_group", "call",
    "check_table_schema", "config_entry", "create_table", "delete_table", "describe_table", "entry_record",
    "error_code", "from_attribute", "item_key", "item_size", "item_summary", "list_tables", "make_client",
    "merge_configs", "merged_item", "native_line", "open_dynamodb_store", "paginate", "parse_dynamodb_uri",
    "read_item_dump", "redact_url", "seed_alternate_key", "seed_build_config", "seed_target_spelling",
    "table_definition", "table_summary", "to_attribute", "translate_error", "write_items",
]
