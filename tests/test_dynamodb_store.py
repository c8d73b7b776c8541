"""The DynamoDB store against a real moto server process on 127.0.0.1 (no in-process mocks)."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path

import boto3
import orjson
import pytest
from botocore.exceptions import ClientError

from lorien.errors import StoreError, StoreUnreachableError
from lorien.record import TuningRecord
from lorien.warehouse import open_store
from lorien.warehouse.dynamodb import (
    ALTERNATE_INDEX,
    CONFIGS_ATTRIBUTE,
    ITEM_SIZE_LIMIT_BYTES,
    MAX_CONFIGS_PER_ITEM,
    DynamoDBStore,
    MissingTableError,
    create_table,
    from_attribute,
    item_size,
    parse_dynamodb_uri,
    write_items,
)

TARGET = "llvm -keys=cpu -mcpu=znver3"
WORKLOAD = "dense_nopack.x86#_TENSOR__64_64__float32_#_TENSOR__64_64__float32_#None#float32"


def make_record(index: int, cost_s: float, workload_key: str = WORKLOAD, layout: str = "NA",
                build: str = '{"engine": "0.1.0"}', error_no: int = 0, target: str = TARGET,
                config_padding: int = 0) -> TuningRecord:
    """A record of a dialect without a native line format (its config is stored as is)."""
    config = {"trace": [["SamplePerfectTile", [index, 64 // (index % 8 + 1)]]], "pad": "x" * config_padding}
    return TuningRecord(
        dialect="meta_schedule", target=target, target_key="llvm_cpu", workload_key=workload_key,
        task_name="dense", args='[[64, 64], [64, 64]]', layout=layout,
        config=orjson.dumps(config).decode(), costs=[cost_s], error_no=error_no,
        timestamp=1_700_000_000.0 + index, build=build,
    )


def store_uri(endpoint: str, table: str, **options: str) -> str:
    query = "&".join([f"endpoint_url={endpoint}", "region=us-west-2"]
                     + [f"{name}={value}" for name, value in options.items()])
    return f"dynamodb:{table}?{query}"


@pytest.fixture
def table_uri(moto_server: str) -> str:
    """URI of a fresh table with Lorien's schema on the moto server."""
    uri = store_uri(moto_server, f"lorien-{uuid.uuid4().hex[:10]}")
    create_table(parse_dynamodb_uri(uri.removeprefix("dynamodb:")))
    return uri


@pytest.fixture
def store(table_uri: str) -> DynamoDBStore:
    with open_store(table_uri) as opened:
        yield opened


@pytest.fixture
def client(moto_server: str):
    return boto3.client("dynamodb", endpoint_url=moto_server, region_name="us-west-2")


def stored_item(client, store: DynamoDBStore, target: str = TARGET, workload_key: str = WORKLOAD) -> dict:
    return client.get_item(TableName=store.location.table, ConsistentRead=True, Key={
        "Target": {"S": target}, "PrimaryRangeKey": {"S": workload_key}})["Item"]


# ---- schema ------------------------------------------------------------------------------------


def test_created_table_has_the_seed_keys_and_alternate_key_index(store, client):
    table = client.describe_table(TableName=store.location.table)["Table"]
    assert {(key["AttributeName"], key["KeyType"]) for key in table["KeySchema"]} == {
        ("Target", "HASH"), ("PrimaryRangeKey", "RANGE")}
    (index,) = table["GlobalSecondaryIndexes"]
    assert index["IndexName"] == ALTERNATE_INDEX
    assert [key["AttributeName"] for key in index["KeySchema"]] == ["TargetIDKeys", "PrimaryRangeKey"]


def test_committed_item_carries_keys_task_metadata_and_best_configs(store, client):
    store.commit([make_record(1, 2e-3), make_record(2, 1e-3)])
    item = stored_item(client, store)
    assert item["TargetIDKeys"] == {"S": "llvm_cpu"}
    assert item["TaskName"] == {"S": "dense"}
    assert from_attribute(item["Args"]) == [[64, 64], [64, 64]]
    configs = from_attribute(item[CONFIGS_ATTRIBUTE])
    assert [config["latency"] for config in configs] == [1e-3, 2e-3]
    assert configs[0]["framework_build_config"] == {"engine": "0.1.0"}
    assert configs[0]["log_path"] == " "


# ---- best, scan, workloads, stats --------------------------------------------------------------


def test_best_returns_the_k_fastest_valid_records_fastest_first(store):
    store.commit([make_record(i, cost) for i, cost in enumerate([5e-3, 1e-3, 3e-3, 2e-3])]
                 + [make_record(9, 1e-4, error_no=4)])
    assert [record.cost_s for record in store.best(WORKLOAD, TARGET, k=3)] == [1e-3, 2e-3, 3e-3]


def test_best_accepts_any_spelling_of_the_target(store):
    store.commit([make_record(1, 1e-3)])
    assert len(store.best(WORKLOAD, "llvm -mcpu=znver3")) == 1


def test_best_by_prefix_matches_every_workload_key_beginning_with_it(store):
    store.commit([make_record(1, 3e-3, workload_key="dense#a"), make_record(2, 1e-3, workload_key="dense#b"),
                  make_record(3, 2e-3, workload_key="conv2d#a")])
    best = store.best("dense#", TARGET, k=10, prefix=True)
    assert [record.workload_key for record in best] == ["dense#b", "dense#a"]


def test_best_by_alternate_key_finds_records_of_other_targets_of_the_same_family(store):
    store.commit([make_record(1, 2e-3, target="llvm -keys=cpu -mcpu=skylake-avx512"),
                  make_record(2, 1e-3, target=TARGET)])
    best = store.best(WORKLOAD, "llvm -mcpu=core-avx2", k=5, by_alternate_key=True)
    assert [record.target for record in best] == [TARGET, "llvm -keys=cpu -mcpu=skylake-avx512"]
    assert store.best(WORKLOAD, "llvm -mcpu=core-avx2", k=5) == []


def test_queries_read_every_page(store):
    store.page_size = 2
    store.commit([make_record(i, (i + 1) * 1e-3, workload_key=f"dense#{i}") for i in range(7)])
    assert len(store.best("dense#", TARGET, k=100, prefix=True)) == 7
    assert len(store.best("dense#", TARGET, k=100, prefix=True, by_alternate_key=True)) == 7
    assert store.scan().num_rows == 7


def test_best_per_layout_returns_the_best_of_each_layout(store):
    store.commit([make_record(1, 1e-3, layout="NCHW"), make_record(2, 2e-3, layout="NCHW"),
                  make_record(3, 3e-3, layout="NHWC")])
    best = store.best(WORKLOAD, TARGET, k=1, per_layout=True)
    assert sorted((record.layout, record.cost_s) for record in best) == [("NCHW", 1e-3), ("NHWC", 3e-3)]


def test_scan_returns_the_records_the_table_holds_with_filters(store):
    records = [make_record(i, (i + 1) * 1e-3, workload_key=f"w{i % 2}") for i in range(6)]
    store.commit(records)
    table = store.scan()
    assert sorted(table.column("record_id").to_pylist()) == sorted(r.record_id for r in records)
    assert store.scan({"workload_key": "w1"}, columns=["workload_key"]).column("workload_key").to_pylist() == ["w1"] * 3


def test_scan_filters_by_any_spelling_of_the_targets(store):
    store.commit([make_record(1, 1e-3), make_record(2, 1e-3, target="llvm -keys=cpu -mcpu=skylake")])
    assert store.scan({"target": "llvm -mcpu=skylake"}).num_rows == 1
    assert store.scan({"target": ["llvm -mcpu=skylake", "llvm -mcpu=znver3"]}).num_rows == 2


def test_workloads_and_stats_count_what_is_stored(store):
    store.commit([make_record(1, 1e-3, workload_key="a"), make_record(2, 1e-3, workload_key="b"),
                  make_record(3, 1e-3, workload_key="b", target="llvm -keys=cpu -mcpu=skylake")])
    assert store.workloads() == ["a", "b"]
    assert store.workloads("llvm -mcpu=skylake") == ["b"]
    stats = store.stats()
    assert (stats["items"], stats["records"], stats["workloads"], stats["targets"]) == (3, 3, 2, 2)


# ---- commit semantics --------------------------------------------------------------------------


def test_committing_the_same_records_twice_stores_them_once(store, client):
    records = [make_record(i, (i + 1) * 1e-3) for i in range(4)]
    first = store.commit(records)
    second = store.commit(records)
    assert (first.stored, first.duplicates) == (4, 0)
    assert (second.stored, second.duplicates) == (0, 4)
    assert len(stored_item(client, store)[CONFIGS_ATTRIBUTE]["L"]) == 4


def test_commit_keeps_the_best_nbest_per_layout(store):
    store.commit([make_record(i, (i + 1) * 1e-3, layout="NCHW") for i in range(6)]
                 + [make_record(10 + i, (i + 1) * 1e-3, layout="NHWC") for i in range(6)], nbest=2)
    assert sorted((r.layout, r.cost_s) for r in store.best(WORKLOAD, TARGET, k=100)) == [
        ("NCHW", 1e-3), ("NCHW", 2e-3), ("NHWC", 1e-3), ("NHWC", 2e-3)]


def test_an_item_never_holds_more_than_100_configs(store, client):
    store.commit([make_record(i, (i + 1) * 1e-5, layout=f"L{i % 3}") for i in range(150)], nbest=500)
    assert len(stored_item(client, store)[CONFIGS_ATTRIBUTE]["L"]) == MAX_CONFIGS_PER_ITEM


def test_configs_of_other_build_configs_are_kept_apart(store):
    old_build, new_build = '{"engine": "0.1.0"}', '{"engine": "0.2.0"}'
    store.commit([make_record(i, (i + 1) * 1e-3, build=old_build) for i in range(3)], nbest=3)
    store.commit([make_record(10 + i, (i + 1) * 1e-4, build=new_build) for i in range(5)], nbest=2)
    kept = store.best(WORKLOAD, TARGET, k=100)
    assert sorted(r.cost_s for r in kept if r.build == old_build) == [1e-3, 2e-3, 3e-3]
    assert sorted(r.cost_s for r in kept if r.build == new_build) == [1e-4, 2e-4]


def test_an_item_near_the_400_kb_limit_is_trimmed_to_its_best_configs(store, client):
    records = [make_record(i, (i + 1) * 1e-4, config_padding=20_000) for i in range(40)]
    result = store.commit(records)
    item = stored_item(client, store)
    kept = store.best(WORKLOAD, TARGET, k=100)
    assert item_size(item) < ITEM_SIZE_LIMIT_BYTES
    assert 0 < len(kept) < 40 and result.stored == len(kept)
    assert [r.cost_s for r in kept] == [(i + 1) * 1e-4 for i in range(len(kept))]


def test_failed_records_are_counted_once_but_never_served(store):
    failed = make_record(1, 1e-3, error_no=2)
    assert store.commit([failed]).stored == 1
    assert store.commit([failed]).duplicates == 1
    assert store.best(WORKLOAD, TARGET) == []
    assert (store.stats()["records"], store.stats()["valid_records"]) == (1, 0)


def test_archive_option_writes_the_full_log_and_links_it_from_each_config(moto_server, tmp_path, client):
    table = f"lorien-{uuid.uuid4().hex[:10]}"
    archive = tmp_path / "logs"
    with open_store(store_uri(moto_server, table, create="1", archive=str(archive))) as store:
        result = store.commit([make_record(1, 1e-3), make_record(2, 1e-3, error_no=4)])
        (log_file,) = result.files
        assert len(Path(log_file).read_text().splitlines()) == 2
        config = from_attribute(stored_item(client, store)[CONFIGS_ATTRIBUTE])[0]
        assert config["log_path"] == log_file


def test_an_s3_archive_uses_the_table_endpoint(moto_server, s3_bucket):
    from lorien.warehouse.archive import read_text_uri

    uri = store_uri(moto_server, f"lorien-{uuid.uuid4().hex[:10]}", create="1", archive=f"s3://{s3_bucket}/logs")
    with open_store(uri) as store:
        (log_uri,) = store.commit([make_record(1, 1e-3), make_record(2, 1e-3, error_no=4)]).files
        assert log_uri.startswith(f"s3://{s3_bucket}/logs/")
        assert len(read_text_uri(log_uri).splitlines()) == 2


# ---- compatibility with tables the seed (awslabs/lorien) writes and reads -----------------------


def _seed_value(value):
    """A value encoded the way the seed's convert_to_db_list / convert_to_db_dict do."""
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, (int, float)):
        return {"N": str(value)}
    if isinstance(value, (list, tuple)):
        return {"L": [_seed_value(item) for item in value]}
    if isinstance(value, dict):
        return {"M": {name: _seed_value(item) for name, item in value.items()}}
    return {"S": "None"}


def _seed_read(attribute):
    """A value decoded the way the seed's convert_to_list / convert_to_dict do (refusing types it cannot)."""
    (kind, value), = attribute.items()
    if kind == "S":
        return None if value == "None" else value
    if kind == "N":
        return float(value)
    if kind == "L":
        return [_seed_read(item) for item in value]
    if kind == "M":
        return {name: _seed_read(item) for name, item in value.items()}
    raise AssertionError(f"the seed cannot read attribute type {kind}")


def _tophub_lines(shared_data: Path, count: int) -> list[str]:
    lines = []
    with open(shared_data / "tophub" / "llvm_v0.04.log") as handle:
        for line in handle:
            if line.strip() and not line.startswith("#"):
                lines.append(line.strip())
            if len(lines) == count:
                return lines
    return lines


def test_an_item_written_the_seed_way_is_read_back(store, client, shared_data):
    lines = _tophub_lines(shared_data, 3)
    first = orjson.loads(lines[0])
    task_name, args = first["input"][1], first["input"][2]
    build = {"commit": "abc123", "commit_time": "2021-01-01 00:00:00 +0000", "llvm_version": "10.0.0",
             "cuda_version": None}
    configs = [{"config": line, "log_path": "s3://bucket/log.json", "framework_build_config": build,
                "latency": sum(orjson.loads(line)["result"][0]) / len(orjson.loads(line)["result"][0])}
               for line in lines if orjson.loads(line)["input"][1] == task_name]
    workload_key = "seed#key"
    client.put_item(TableName=store.location.table, Item={
        "Target": {"S": "llvm -keys=cpu"}, "TargetIDKeys": {"S": "llvm_cpu"},
        "PrimaryRangeKey": {"S": workload_key}, "OpName": {"S": task_name}, "TaskName": {"S": task_name},
        "Args": _seed_value(args), "BestConfigs": _seed_value(configs)})
    best = store.best(workload_key, "llvm", k=10)
    assert len(best) == len(configs)
    assert best[0].cost_s == pytest.approx(min(config["latency"] for config in configs))
    assert best[0].dialect == "autotvm" and best[0].task_name == task_name
    assert orjson.loads(best[0].build) == build
    assert best[0].source == "s3://bucket/log.json"


def test_a_seed_reader_reads_our_items(store, client, shared_data):
    from lorien.formats import read_log

    result = read_log(shared_data / "tophub" / "llvm_v0.04.log")
    records = [r for r in result.records if r.is_valid][:5]
    store.commit(records)
    record = records[0]
    response = client.query(
        TableName=store.location.table, ProjectionExpression="BestConfigs",
        KeyConditionExpression="Target = :target AND begins_with(PrimaryRangeKey, :key)",
        ExpressionAttributeValues={":target": {"S": record.target}, ":key": {"S": record.workload_key}})
    configs = _seed_read(response["Items"][0]["BestConfigs"])
    assert configs, "the seed finds BestConfigs"
    for config in configs:
        line = orjson.loads(config["config"])
        assert "input" in line or "i" in line  # an AutoTVM log line the seed's decoder takes
        assert isinstance(config["latency"], float)
        assert config["framework_build_config"] is not None


def test_auto_scheduler_records_round_trip_with_their_native_ansor_line(store, client, shared_data):
    from lorien.formats import read_log

    records = [r for r in read_log(shared_data / "ansor" / "matmul.json").records if r.is_valid][:5]
    store.commit(records)
    best = store.best(records[0].workload_key, records[0].target, k=10)
    assert sorted(r.record_id for r in best) == sorted(r.record_id for r in records)
    item = stored_item(client, store, records[0].target, records[0].workload_key)
    line = orjson.loads(_seed_read(item["BestConfigs"])[0]["config"])
    assert set(line) >= {"i", "r", "v"}


def test_a_config_that_is_no_log_line_is_reported_with_its_item(store, client):
    client.put_item(TableName=store.location.table, Item={
        "Target": {"S": TARGET}, "TargetIDKeys": {"S": "llvm_cpu"}, "PrimaryRangeKey": {"S": "broken#1"},
        "BestConfigs": _seed_value([{"config": "not json", "latency": 1e-3}])})
    with pytest.raises(StoreError, match="'broken#1'.*does not decode"):
        store.best("broken#1", TARGET)


def test_a_seed_committed_item_merges_without_losing_its_configs(store, client):
    seed_config = {"config": orjson.dumps({"trace": "seed"}).decode(), "log_path": " ",
                   "framework_build_config": "unknown", "latency": 5e-3}
    client.put_item(TableName=store.location.table, Item={
        "Target": {"S": TARGET}, "TargetIDKeys": {"S": "llvm_cpu"}, "PrimaryRangeKey": {"S": WORKLOAD},
        "BestConfigs": _seed_value([seed_config])})
    store.commit([make_record(1, 1e-3)])
    latencies = [config["latency"] for config in from_attribute(stored_item(client, store)[CONFIGS_ATTRIBUTE])]
    assert latencies == [1e-3, 5e-3]


# ---- concurrency: real processes ----------------------------------------------------------------

#: moto's server in one thread. Its default threaded server checks a write's condition and then
#: writes without a lock, so two conditional writes can both pass (real DynamoDB is atomic per
#: item); serving one request at a time restores DynamoDB's per-item atomicity.
SERIAL_MOTO = (
    "import sys; from werkzeug.serving import run_simple; "
    "from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app; "
    "run_simple('127.0.0.1', int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), threaded=False)"
)


@pytest.fixture(scope="module")
def serial_moto_server(aws_credentials):
    """A moto server process that serves one request at a time (atomic conditional writes)."""
    from servers import running_server

    with running_server(lambda port: [sys.executable, "-c", SERIAL_MOTO, str(port)], timeout_s=60) as url:
        yield url


@pytest.fixture
def serial_store(serial_moto_server):
    uri = store_uri(serial_moto_server, f"lorien-{uuid.uuid4().hex[:10]}", create="1")
    with open_store(uri) as opened:
        yield opened


@pytest.fixture
def serial_client(serial_moto_server):
    return boto3.client("dynamodb", endpoint_url=serial_moto_server, region_name="us-west-2")


def _conditional_committer(uri: str, worker: int, count: int) -> None:
    with open_store(uri) as store:
        for index in range(count):
            store.commit([make_record(worker * 1000 + index, (worker * count + index + 1) * 1e-6)])


def _naive_committer(endpoint: str, table: str, worker: int, count: int) -> None:
    """The seed's unconditional read-modify-write: query BestConfigs, append, SET BestConfigs."""
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-west-2")
    key = {"Target": {"S": TARGET}, "PrimaryRangeKey": {"S": WORKLOAD}}
    for index in range(count):
        item = client.get_item(TableName=table, Key=key).get("Item", {})
        configs = item.get("BestConfigs", {"L": []})["L"]
        configs.append({"M": {"config": {"S": f"{worker}-{index}"}, "latency": {"N": "0.001"}}})
        time.sleep(0.01)  # the seed decodes, sorts and encodes records between its read and write
        client.update_item(TableName=table, Key=key, UpdateExpression="SET BestConfigs = :c",
                           ExpressionAttributeValues={":c": {"L": configs}})


def _run_processes(target, argument_lists) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=arguments) for arguments in argument_lists]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=240)
        assert process.exitcode == 0


@pytest.mark.slow
def test_concurrent_committer_processes_lose_no_config(serial_store, serial_client):
    workers, count = 6, 8
    _run_processes(_conditional_committer, [(serial_store.uri, worker, count) for worker in range(workers)])
    configs = stored_item(serial_client, serial_store)[CONFIGS_ATTRIBUTE]["L"]
    assert len(configs) == workers * count
    assert len({config["M"]["record_id"]["S"] for config in configs}) == workers * count


@pytest.mark.slow
def test_the_seed_read_modify_write_pattern_loses_configs_under_concurrency(
        serial_store, serial_client, serial_moto_server):
    workers, count = 6, 8
    _run_processes(_naive_committer, [(serial_moto_server, serial_store.location.table, w, count)
                                      for w in range(workers)])
    configs = stored_item(serial_client, serial_store)[CONFIGS_ATTRIBUTE]["L"]
    assert len(configs) < workers * count


# ---- retries: unprocessed batch items and throttling ------------------------------------------


class _DroppingClient:
    """A real client whose first batch writes leave half their items unprocessed, as DynamoDB may."""

    def __init__(self, client, drops: int):
        self.client, self.drops, self.calls = client, drops, 0

    def batch_write_item(self, RequestItems):  # noqa: N803 - boto3's argument name
        self.calls += 1
        (table, requests), = RequestItems.items()
        if self.drops:
            self.drops -= 1
            kept, dropped = requests[: len(requests) // 2], requests[len(requests) // 2:]
            self.client.batch_write_item(RequestItems={table: kept})
            return {"UnprocessedItems": {table: dropped}}
        return self.client.batch_write_item(RequestItems=RequestItems)


class _ThrottlingClient:
    """A real client that answers the first calls of one operation with a throttling error."""

    def __init__(self, client, operation: str, failures: int, code: str):
        self.client, self.operation, self.failures, self.code = client, operation, failures, code

    def __getattr__(self, name):
        method = getattr(self.client, name)
        if name != self.operation:
            return method

        def throttled(**kwargs):
            if self.failures:
                self.failures -= 1
                raise ClientError({"Error": {"Code": self.code, "Message": "slow down"}}, name)
            return method(**kwargs)

        return throttled


def test_unprocessed_batch_items_are_retried_until_written(store, client):
    items = [{"Target": {"S": TARGET}, "TargetIDKeys": {"S": "llvm_cpu"}, "PrimaryRangeKey": {"S": f"k{i}"},
              "BestConfigs": {"L": []}} for i in range(30)]
    dropping = _DroppingClient(client, drops=3)
    assert write_items(dropping, store.location, items, sleep=lambda _s: None) == 30
    assert dropping.calls > 2
    assert store.workloads() == sorted(f"k{i}" for i in range(30))


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ThrottlingException"])
def test_throttled_commits_back_off_and_succeed(table_uri, client, code):
    throttling = _ThrottlingClient(client, "put_item", failures=3, code=code)
    store = DynamoDBStore(table_uri.removeprefix("dynamodb:"), client=throttling)
    assert store.commit([make_record(1, 1e-3)]).stored == 1
    assert throttling.failures == 0


# ---- bad input -----------------------------------------------------------------------------------


def test_an_unreachable_endpoint_is_named_in_the_error():
    with pytest.raises(StoreUnreachableError, match=r"http://127\.0\.0\.1:9"):
        open_store("dynamodb:anything?endpoint_url=http://127.0.0.1:9&region=us-west-2")


def test_a_missing_table_is_named_with_the_command_that_creates_it(moto_server):
    with pytest.raises(MissingTableError, match="'no-such-table'.*lorien warehouse dynamodb create no-such-table"):
        open_store(store_uri(moto_server, "no-such-table"))


def test_an_unknown_uri_option_is_refused():
    with pytest.raises(StoreError, match="endpoint"):
        open_store("dynamodb:t?endpont_url=http://127.0.0.1:9")


def test_a_create_value_that_is_neither_yes_nor_no_is_refused():
    """create=maybe named as an error, as the parquet store's fsync / preload (it read as no)."""
    with pytest.raises(StoreError, match=r"create='maybe' is not a yes/no value"):
        parse_dynamodb_uri("t?create=maybe")
    assert parse_dynamodb_uri("t?create=yes").create and parse_dynamodb_uri("t?create=1").create
    assert not parse_dynamodb_uri("t?create=").create and not parse_dynamodb_uri("t").create


@pytest.fixture(scope="module")
def authenticating_server(aws_credentials):
    """A second moto server that checks credentials (IAM auth on from the first request)."""
    from servers import _moto_command, running_server

    with running_server(_moto_command, {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}, timeout_s=60) as url:
        yield url


def test_rejected_credentials_are_reported_without_the_secret(authenticating_server, monkeypatch, caplog):
    secret = "Sup3rSecretValueThatMustNotLeak"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGKEY0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    caplog.set_level("DEBUG", logger="lorien")
    with pytest.raises(StoreError, match="credentials were rejected") as error:
        open_store(store_uri(authenticating_server, "any-table"))
    assert secret not in str(error.value)
    assert "AKIAWRONGKEY0000" not in str(error.value)
    assert secret not in caplog.text


def test_put_item_errors_other_than_conflicts_are_not_retried_forever(store):
    class _Refusing:
        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            if name != "put_item":
                return getattr(self.client, name)

            def refuse(**_kwargs):
                raise ClientError({"Error": {"Code": "ValidationException", "Message": "bad item"}}, name)

            return refuse

    refusing = DynamoDBStore(store.uri.removeprefix("dynamodb:"), client=_Refusing(store.client))
    with pytest.raises(StoreError, match="ValidationException: bad item"):
        refusing.commit([make_record(1, 1e-3)])


def test_a_url_with_user_info_never_shows_it():
    with pytest.raises(StoreUnreachableError) as error:
        open_store("dynamodb:t?endpoint_url=http://user:hunter2@127.0.0.1:9&region=us-west-2")
    assert "hunter2" not in str(error.value)
