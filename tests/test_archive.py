"""The log archive and text reads from local paths and S3 (a real moto server process)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from lorien.errors import StoreError, StoreUnreachableError
from lorien.record import TuningRecord
from lorien.warehouse.archive import (
    archive_log,
    archive_records,
    list_uri,
    parse_s3_uri,
    read_text_uri,
    write_text_uri,
)


def make_record(index: int, dialect: str = "meta_schedule", error_no: int = 0) -> TuningRecord:
    return TuningRecord(
        dialect=dialect, target="llvm -keys=cpu -mcpu=znver3", target_key="llvm_cpu",
        workload_key="dense#64", task_name="dense", args="[[64, 64]]", layout="NA",
        config=orjson.dumps({"trace": index}).decode(), costs=[1e-3 * (index + 1)], error_no=error_no,
        timestamp=1_700_000_000.0 + index,
    )


def s3_uri(endpoint: str, bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}?endpoint_url={endpoint}&region=us-east-1"


def test_s3_uri_options_name_the_endpoint_and_region():
    location = parse_s3_uri("s3://bucket/a/b.log?endpoint_url=http://127.0.0.1:5000&region=us-west-2")
    assert (location.bucket, location.key, location.endpoint_url, location.region) == (
        "bucket", "a/b.log", "http://127.0.0.1:5000", "us-west-2")


def test_text_written_to_s3_reads_back(moto_server, s3_bucket):
    uri = write_text_uri(s3_uri(moto_server, s3_bucket, "jobs/job-1.json"), '{"trials": 8}')
    assert read_text_uri(uri) == '{"trials": 8}'


def test_the_s3_endpoint_can_come_from_the_environment(moto_server, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_server)
    write_text_uri(f"s3://{s3_bucket}/spec.yaml", "trials: 4\n")
    assert read_text_uri(f"s3://{s3_bucket}/spec.yaml") == "trials: 4\n"


def test_local_text_reads_back(tmp_path):
    path = write_text_uri(tmp_path / "deep" / "job.json", "{}")
    assert read_text_uri(path) == "{}" and read_text_uri(f"file://{path}") == "{}"


def test_records_archived_to_s3_keep_failed_ones(moto_server, s3_bucket):
    dest = s3_uri(moto_server, s3_bucket, "logs")
    (uri,) = archive_records([make_record(0), make_record(1, error_no=4)], dest, name="run1")
    assert parse_s3_uri(uri).key == "logs/run1-meta_schedule.lorien.jsonl"
    rows = [orjson.loads(line) for line in read_text_uri(uri).splitlines()]
    assert [row["error_no"] for row in rows] == [0, 4]
    assert TuningRecord.from_row(rows[1]) == make_record(1, error_no=4)


def test_autotvm_records_are_archived_as_a_native_log(tmp_path, shared_data):
    from lorien.formats import read_log

    records = read_log(shared_data / "tophub" / "llvm_v0.04.log").records[:20]
    (path,) = archive_records(records, str(tmp_path / "archive"))
    assert path.endswith("-autotvm.log")
    assert [r.with_changes(source="") for r in read_log(path).records] == [
        r.with_changes(source="") for r in records]


def test_each_archive_call_writes_a_new_file(tmp_path):
    first = archive_records([make_record(0)], str(tmp_path))
    second = archive_records([make_record(0)], str(tmp_path))
    assert first != second
    assert len(list_uri(tmp_path)) == 2


def test_a_log_file_is_archived_to_s3_and_listed(moto_server, s3_bucket, tmp_path):
    log = tmp_path / "tune.log"
    log.write_text("line 1\nline 2\n")
    dest = s3_uri(moto_server, s3_bucket, "runs/7")
    uri = archive_log(log, dest)
    assert read_text_uri(uri) == "line 1\nline 2\n"
    assert list_uri(dest) == [uri]


def test_a_missing_bucket_is_named(moto_server):
    with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist"):
        read_text_uri(s3_uri(moto_server, "no-such-bucket", "a.json"))


def test_a_missing_object_is_named(moto_server, s3_bucket):
    with pytest.raises(StoreError, match=f"s3://{s3_bucket}/missing.json"):
        read_text_uri(s3_uri(moto_server, s3_bucket, "missing.json"))


def test_a_missing_local_file_is_named(tmp_path):
    with pytest.raises(StoreError, match="nothing.json"):
        read_text_uri(tmp_path / "nothing.json")


def test_an_unreachable_s3_endpoint_is_named():
    with pytest.raises(StoreUnreachableError, match=r"http://127\.0\.0\.1:9"):
        read_text_uri("s3://bucket/key?endpoint_url=http://127.0.0.1:9&region=us-east-1")


def test_archiving_a_missing_log_file_names_it(tmp_path):
    with pytest.raises(StoreError, match="absent.log"):
        archive_log(Path(tmp_path / "absent.log"), str(tmp_path / "dest"))


def test_meta_schedule_records_are_archived_with_the_workload_entries_they_name(shared_data, tmp_path):
    from lorien.formats import meta_schedule, read_log

    database = shared_data / "meta_schedule" / "matmul_128"
    records = read_log(database).records
    written = archive_records(records, str(tmp_path / "logs"), name="run2")
    assert [Path(uri).name for uri in written] == ["run2-meta_schedule.lorien.jsonl",
                                                    "run2-meta_schedule.workloads.jsonl"]
    lines = [orjson.loads(line) for line in Path(written[1]).read_text().splitlines()]
    assert {line["workload_hash"]: meta_schedule.entry_text(line["entry"]) for line in lines} == \
        meta_schedule.workload_texts(database)
