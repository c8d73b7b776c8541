"""The warehouse benchmark's MetaSchedule database (its TVM baseline) is a valid JSONDatabase."""

from __future__ import annotations

import statistics
from pathlib import Path

import orjson
import pytest
from conftest import load_benchmark

from lorien.formats import read_log


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("warehouse.py", "bench_warehouse")


@pytest.fixture
def database(bench, shared_data: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    directory = tmp_path / "db"
    return directory, bench.write_meta_schedule_database(directory, 150, data=shared_data)


def test_lorien_reads_every_record_of_the_benchmark_database_on_the_real_workloads(
        database, shared_data: Path) -> None:
    directory, shashes = database
    result = read_log(directory)
    real = {str(orjson.loads(path.read_bytes().splitlines()[0])[0])
            for path in (shared_data / "meta_schedule").glob("*/database_workload.json")}
    assert (len(result.records), result.errors) == (150, [])
    assert {record.workload_key for record in result.records} == set(shashes) == real
    assert len({record.record_id for record in result.records}) == 150


def test_tvm_loads_the_benchmark_database_with_the_best_records_lorien_reads(database) -> None:
    pytest.importorskip("tvm")
    from tvm.s_tir.meta_schedule.database import JSONDatabase, Workload

    directory, shashes = database
    tvm_db = JSONDatabase(path_workload=str(directory / "database_workload.json"),
                          path_tuning_record=str(directory / "database_tuning_record.json"), allow_missing=False)
    assert len(tvm_db) == 150
    lorien_best = {}
    for record in read_log(directory).records:
        if record.workload_key not in lorien_best or record.cost_s < lorien_best[record.workload_key]:
            lorien_best[record.workload_key] = record.cost_s
    for line in (directory / "database_workload.json").read_bytes().splitlines():
        entry = orjson.loads(line)
        top = tvm_db.get_top_k(tvm_db.commit_workload(Workload.from_json(entry).mod), 1)
        assert statistics.fmean(float(s) for s in top[0].run_secs) == pytest.approx(lorien_best[str(entry[0])],
                                                                                    rel=1e-6)
