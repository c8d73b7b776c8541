"""MetaSchedule traces on Lorien's engine: real TVM 0.27 records replayed, checked against NumPy,
compiled from the warehouse; instructions that cannot be applied are named."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

import lorien
from dialects.meta_schedule.compile import (
    check_kernel,
    compile_record,
    replay_database,
    workload_dag,
)
from dialects.meta_schedule.trace import TraceError, replay_trace
from dialects.meta_schedule.workload import dag_of_module
from lorien.cli import main
from lorien.dialect import dialect_of_workload_key
from lorien.engine.build import build
from lorien.formats import meta_schedule as known_entries
from lorien.formats.tir import summarize
from lorien.warehouse import open_store

TARGET = '{"kind": "llvm", "mcpu": "znver3", "num-cores": 2}'


def _database(shared_data: Path, name: str) -> Path:
    return shared_data / "meta_schedule" / name


def _first_entry(database: Path) -> list:
    return orjson.loads((database / "database_workload.json").read_text().splitlines()[0])


def _traces(database: Path) -> list:
    return [orjson.loads(line)[1][0] for line in (database / "database_tuning_record.json").read_text().splitlines()]


def _copy_with_trace(database: Path, tmp_path: Path, trace: list) -> Path:
    copy = tmp_path / database.name
    copy.mkdir()
    shutil.copy(database / "database_workload.json", copy)
    line = orjson.loads((database / "database_tuning_record.json").read_text().splitlines()[0])
    line[1][0] = trace
    (copy / "database_tuning_record.json").write_text(orjson.dumps(line).decode() + "\n")
    return copy


def test_a_tir_workload_becomes_a_compute_dag_named_by_its_blocks(shared_data):
    entry = _first_entry(_database(shared_data, "conv_56_64"))
    dag = dag_of_module(entry[1])
    assert [t.name for t in dag.io_tensors] == ["X", "W", "conv"]
    assert [t.name for t in dag.ops] == ["X", "pad", "W", "conv"]
    assert dag.ops[1].shape == (1, 58, 58, 64)
    assert [iv.name for iv in dag.ops[3].op.reduce_axis] == ["rh", "rw", "rc"]
    assert dag.flop() == summarize(entry[1]).flop


@pytest.mark.parametrize("name", ["matmul_128", "conv_56_64"])
def test_every_shared_trace_replays_into_a_kernel_that_matches_numpy(shared_data, name):
    outcomes = replay_database(_database(shared_data, name))
    assert len(outcomes) == 32
    assert [o.summary() for o in outcomes if o.status != "ok"] == []
    assert max(o.max_error for o in outcomes) < 1e-3


def test_cache_write_and_reverse_compute_at_run_the_copy_around_the_tile(shared_data):
    database = _database(shared_data, "matmul_128")
    dag = dag_of_module(_first_entry(database)[1])
    replay = replay_trace(dag, _traces(database)[0])
    stages = {stage.name: stage for stage in replay.schedule.stages}
    assert stages["C.global"].attach[0] == "C"
    assert "parallel" in stages["C"].annotations.values()


def test_an_unsupported_instruction_is_named_with_its_index(shared_data, tmp_path):
    database = _database(shared_data, "matmul_128")
    instructions, decisions = _traces(database)[0]
    instructions = list(instructions)
    instructions.insert(4, ["Blockize", ["l2"], [], ["b99"]])
    copy = _copy_with_trace(database, tmp_path, [instructions, decisions])
    (outcome,) = replay_database(copy)
    assert outcome.status == "failed"
    assert "instruction 4 Blockize: is not supported" in outcome.message


def test_a_tile_decision_that_does_not_fit_the_loop_is_reported(shared_data):
    database = _database(shared_data, "matmul_128")
    dag = dag_of_module(_first_entry(database)[1])
    instructions, decisions = _traces(database)[0]
    bad = [[4, [2, 2, 2, 2]] if index == 4 else [index, value] for index, value in decisions]
    with pytest.raises(TraceError, match=r"instruction 4 SamplePerfectTile: tile sizes \[2, 2, 2, 2\] do not "
                                         r"multiply to the loop's extent 128"):
        replay_trace(dag, [instructions, bad])


def test_a_trace_for_another_workload_is_reported(shared_data):
    conv = dag_of_module(_first_entry(_database(shared_data, "conv_56_64"))[1])
    with pytest.raises(TraceError, match=r"instruction 0 GetSBlock: the workload has no block 'C'"):
        replay_trace(conv, _traces(_database(shared_data, "matmul_128"))[0])


def test_a_record_compiles_with_its_workload_from_the_database(shared_data):
    database = _database(shared_data, "matmul_128")
    from lorien.formats.meta_schedule import iter_records

    record = next(iter(iter_records(database)))
    kernel = compile_record(record)
    assert check_kernel(kernel, workload_dag(record)) < 1e-3
    a = np.ones((128, 128), np.float32)
    c = np.zeros((128, 128), np.float32)
    kernel(a, a, c)
    assert np.allclose(c, 128.0)


def test_lorien_compile_and_query_build_use_the_store_s_workload_entry(shared_data, store_uri, capsys, monkeypatch):
    database = _database(shared_data, "conv_56_64")
    assert main(["ingest", str(database), "--store", store_uri, "--no-progress"]) == 0
    monkeypatch.setattr(known_entries, "_KNOWN", {})  # what this process read: the entry must come from the store
    key = str(_first_entry(database)[0])
    assert dialect_of_workload_key(key) == "meta_schedule"
    kernel = lorien.compile(key, TARGET, store=store_uri)
    assert kernel.from_warehouse and kernel.record.dialect == "meta_schedule"
    with open_store(store_uri) as store:
        assert check_kernel(kernel, workload_dag(kernel.record, store=store)) < 1e-3
    assert main(["query", "--workload-key", key, "--target", TARGET, "--build", "--store", store_uri]) == 0
    assert "built kernel" in capsys.readouterr().out


def test_apply_measures_one_database_line_here(shared_data, capsys):
    database = _database(shared_data, "matmul_128")
    assert main(["apply", "--log", str(database), "--line", "2", "--measure", '{"repeat": 1, "number": 1}']) == 0
    out = capsys.readouterr().out
    assert "latency" in out and "logged" in out


def test_kernel_output_differs_is_caught(shared_data):
    database = _database(shared_data, "matmul_128")
    dag = dag_of_module(_first_entry(database)[1])
    replay = replay_trace(dag, _traces(database)[0])
    kernel = build(replay.schedule, replay.args)
    wrong = [np.zeros((128, 128), np.float32)]
    with pytest.raises(lorien.errors.WorkloadError, match="differs from the NumPy reference"):
        check_kernel(kernel, dag, expected=wrong)
