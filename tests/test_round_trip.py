"""Export -> ingest into the same store is idempotent for every format: the ingest stores 0 new
records, and every record read back from the export equals the stored one field by field.

Fields allowed to differ, and why:
- ``source`` says where a record was read from (the exported file), not what was measured;
  the stored record keeps its own.
- ``extra`` of a MetaSchedule record tuned here carries its workload entry inline; read back
  from a database it names the same entry by content hash (checked below).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from lorien.cli import main
from lorien.formats import read_log
from lorien.formats.meta_schedule import entry_hash, entry_text
from lorien.record import TuningRecord
from lorien.warehouse import open_store

ALLOWED_TO_DIFFER = {"source"}


def stored_records(store_uri: str) -> dict[str, TuningRecord]:
    with open_store(store_uri) as store:
        return {row["record_id"]: TuningRecord.from_row(row) for row in store.scan().to_pylist()}


def same_workload_entry(stored_extra: str, read_extra: str) -> bool:
    """Whether an inline workload entry and a by-hash reference name the same entry."""
    stored, read = orjson.loads(stored_extra), orjson.loads(read_extra)
    return "workload" in stored and entry_hash(entry_text(stored["workload"])) == read.get("workload_hash")


def assert_round_trip(capsys: pytest.CaptureFixture, store_uri: str, log_format: str, output: Path,
                      *export_flags: str) -> list[TuningRecord]:
    """Export every record of the store, ingest the export into the same store, and check that
    nothing new is stored and every record reads back field by field; returns the records."""
    before = stored_records(store_uri)
    target = min(record.target for record in before.values())
    assert main(["export", "--all", "--target", target, "--alternate-key", "--format", log_format,
                 "-o", str(output), "--store", store_uri, *export_flags]) == 0
    capsys.readouterr()
    assert main(["ingest", str(output), "--store", store_uri]) == 0
    out = capsys.readouterr().out
    assert f"{len(before)} records, 0 stored, {len(before)} already stored, 0 bad lines" in out
    assert "FLOPs unknown" not in out or all(record.flop is None for record in before.values())
    assert stored_records(store_uri).keys() == before.keys()
    read_back = read_log(output, log_format)
    assert not read_back.errors and len(read_back.records) == len(before)
    for record in read_back.records:
        stored = before[record.record_id].to_row()
        differing = {name for name, value in record.to_row().items() if stored[name] != value}
        if "extra" in differing and same_workload_entry(stored["extra"], record.extra):
            differing.remove("extra")
        assert differing <= ALLOWED_TO_DIFFER, (record.record_id, differing)
    return list(before.values())


def test_an_exported_tophub_log_ingests_back_to_the_same_records(capsys, shared_data, store_uri, tmp_path):
    assert main(["ingest", str(shared_data / "tophub" / "llvm_v0.04.log"), "--store", store_uri]) == 0
    assert_round_trip(capsys, store_uri, "autotvm", tmp_path / "exported.log")


@pytest.mark.parametrize("name", ["conv2d.json", "matmul.json", "resnet-50-NHWC-B1-llvm.json"])
def test_an_exported_ansor_log_ingests_back_to_the_same_records(capsys, shared_data, store_uri, tmp_path, name):
    assert main(["ingest", str(shared_data / "ansor" / name), "--store", store_uri]) == 0
    assert_round_trip(capsys, store_uri, "ansor", tmp_path / "exported.json")


@pytest.mark.parametrize("name", ["conv_56_64", "matmul_128"])
def test_an_exported_tvm_meta_schedule_database_ingests_back_to_the_same_records(capsys, shared_data, store_uri,
                                                                                 tmp_path, name):
    assert main(["ingest", str(shared_data / "meta_schedule" / name), "--store", store_uri]) == 0
    assert_round_trip(capsys, store_uri, "meta_schedule", tmp_path / "db")
    assert not (tmp_path / "db" / "lorien_record_fields.json").exists()  # TVM's records need nothing beside


def test_an_exported_database_of_meta_schedule_tuning_ingests_back_to_the_same_records(capsys, store_uri,
                                                                                        tmp_path):
    config = {"dialect": "meta_schedule", "tuner": "random", "trials": 3, "batch_size": 3, "seed": 0,
              "measure": {"number": 1, "repeat": 1, "min_repeat_ms": 0},
              "workloads": [{"conv2d": {"C": 4, "H": 6, "W": 6, "K": 8, "kernel": 3, "padding": 1}},
                            {"conv2d": {"C": 4, "H": 6, "W": 6, "K": 8, "kernel": 3, "padding": 1,
                                        "layout": "NCHW"}}]}
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["tune", str(path), "--store", store_uri, "--no-progress"]) == 0
    records = assert_round_trip(capsys, store_uri, "meta_schedule", tmp_path / "db", "--lorien-workloads")
    assert {record.layout for record in records} == {"NHWC", "NCHW"}
    assert all(record.timestamp > 0 and record.flop for record in records)
