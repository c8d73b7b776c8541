"""The MetaSchedule Database API with TVM's semantics, over memory, TVM's JSONDatabase files
and any Lorien store."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from dialects.meta_schedule.database import (
    JSONDatabase,
    MemoryDatabase,
    OrderedUnionDatabase,
    Record,
    StoreDatabase,
    UnionDatabase,
    Workload,
    create,
)
from lorien.cli import main
from lorien.errors import DialectError

TARGET = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2, "keys": ["cpu"]}


@pytest.fixture
def matmul(shared_data: Path) -> Path:
    return shared_data / "meta_schedule" / "matmul_128"


def _records(database: Path) -> list[list]:
    return [orjson.loads(line)[1] for line in (database / "database_tuning_record.json").read_text().splitlines()]


def _workload(database: Path) -> Workload:
    return Workload.from_json(orjson.loads((database / "database_workload.json").read_text().splitlines()[0]))


def _fill(db, database: Path, count: int = 32) -> Workload:
    workload = db.commit_workload(_workload(database))
    for fields in _records(database)[:count]:
        db.commit_tuning_record(Record.from_json(fields, workload))
    return workload


def test_json_database_reads_tvm_s_files_and_answers_top_k_fastest_first(matmul):
    db = JSONDatabase(work_dir=matmul, allow_missing=False)
    workload = _workload(matmul)
    assert len(db) == 32 and db.has_workload(workload)
    top = db.get_top_k(workload, 5)
    means = [r.mean_run_secs for r in top]
    assert means == sorted(means) and len(top) == 5
    best_logged = min(sum(f[1]) / len(f[1]) for f in _records(matmul))
    assert db.query_tuning_record(workload, TARGET).mean_run_secs == best_logged


def test_invalid_records_are_never_returned(matmul):
    db = MemoryDatabase()
    workload = _workload(matmul)
    fields = _records(matmul)[0]
    db.commit_tuning_record(Record.from_json([fields[0], [1e10], fields[2], fields[3]], workload))
    db.commit_tuning_record(Record.from_json([fields[0], None, fields[2], fields[3]], workload))
    assert len(db) == 2
    assert db.get_top_k(workload, 10) == [] and db.query_tuning_record(workload) is None


def test_a_workload_committed_twice_is_the_first_one(matmul):
    db = MemoryDatabase()
    first = db.commit_workload(_workload(matmul))
    again = db.commit_workload(Workload(first.shash, first.module))
    assert again is first and len(db.workloads) == 1


def test_json_database_appends_each_commit_as_tvm_does(matmul, tmp_path):
    db = create("json", work_dir=tmp_path / "db")
    _fill(db, matmul, 3)
    reopened = JSONDatabase(work_dir=tmp_path / "db")
    assert len(reopened) == 3 and len((tmp_path / "db" / "database_workload.json").read_text().splitlines()) == 1
    lines = (tmp_path / "db" / "database_tuning_record.json").read_text().splitlines()
    assert [orjson.loads(line)[1] for line in lines] == _records(matmul)[:3]


def test_a_missing_file_is_named_unless_allowed(tmp_path):
    with pytest.raises(DialectError, match="database_workload.json does not exist"):
        JSONDatabase(work_dir=tmp_path / "none", allow_missing=False)


def test_a_bad_line_is_reported_with_file_and_line(matmul, tmp_path):
    copy = tmp_path / "db"
    shutil.copytree(matmul, copy)
    with open(copy / "database_tuning_record.json", "a") as handle:
        handle.write("[7, []]\n")
    with pytest.raises(DialectError, match=r"database_tuning_record.json:33: workload index 7"):
        JSONDatabase(work_dir=copy)


def test_store_database_keeps_records_in_the_warehouse(matmul, store_uri, capsys):
    with StoreDatabase(store_uri) as db:
        workload = _fill(db, matmul, 6)
        assert len(db) == 6 and db.has_workload(workload)
        top = db.get_top_k(workload, 2)
    memory = MemoryDatabase()
    _fill(memory, matmul, 6)
    assert [r.trace for r in top] == [r.trace for r in memory.get_top_k(workload, 2)]
    assert main(["query", "--workload-key", workload.shash, "--target", "llvm", "--store", store_uri]) == 0
    assert "GetSBlock" in capsys.readouterr().out


def test_store_database_commits_in_batches_not_a_file_per_record(matmul, store_uri):
    with StoreDatabase(store_uri, batch_size=4) as db:
        _fill(db, matmul, 10)
        files_before_close = db.store.stats()["files"]
    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        assert store.scan().num_rows == 10
        assert files_before_close == 2 and store.stats()["files"] == 3  # batches of 4, 4 and 2


def test_records_a_killed_process_committed_are_kept_by_its_journal(matmul, store_uri, journal_dir):
    script = (
        "import os, sys, signal\n"
        "sys.path.insert(0, sys.argv[3])\n"
        "from pathlib import Path\n"
        "from test_meta_schedule_database import _fill\n"
        "from dialects.meta_schedule.database import StoreDatabase\n"
        "db = StoreDatabase(sys.argv[1], batch_size=64)\n"
        "_fill(db, Path(sys.argv[2]), 5)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    import os
    import subprocess
    import sys

    killed = subprocess.run([sys.executable, "-c", script, store_uri, str(matmul), str(Path(__file__).parent)],
                            env={**os.environ, "LORIEN_JOURNAL_DIR": str(journal_dir)}, capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert len(list(journal_dir.rglob("*.jsonl"))) == 1  # five commits returned; nothing reached the store
    with StoreDatabase(store_uri) as db:  # the next database on the store commits them
        assert len(db) == 5
    assert not list(journal_dir.rglob("*.jsonl"))


def test_a_store_database_for_one_target_leaves_other_hardware_out(matmul, store_uri):
    workload = _workload(matmul)
    fields = _records(matmul)[:4]
    with StoreDatabase(store_uri) as db:
        db.commit_workload(workload)
        for index, record in enumerate(fields):
            target = {**TARGET, "mcpu": "skylake-avx512" if index % 2 else "znver3"}
            db.commit_tuning_record(Record.from_json([record[0], record[1], target, record[3]], workload))
    with StoreDatabase(store_uri, target={"kind": "llvm", "mcpu": "znver3"}) as db:
        mine = db.get_top_k(workload, 4)
        assert len(mine) == 2 and all(r.target["mcpu"] == "znver3" for r in mine)
        assert db.query_tuning_record(workload).target["mcpu"] == "znver3"
        assert db.query_tuning_record(workload, {"kind": "llvm", "mcpu": "skylake-avx512"}).target["mcpu"] \
            == "skylake-avx512"
    with StoreDatabase(store_uri) as db:
        assert len(db.get_top_k(workload, 4)) == 4  # no target: every target's, as TVM's databases answer


def test_union_gives_the_best_and_ordered_union_the_first_answer(matmul):
    workload = _workload(matmul)
    records = sorted(_records(matmul), key=lambda f: sum(f[1]) / len(f[1]))
    fast, slow = MemoryDatabase(), MemoryDatabase()
    fast.commit_tuning_record(Record.from_json(records[0], workload))
    slow.commit_tuning_record(Record.from_json(records[-1], workload))
    assert UnionDatabase(slow, fast).query_tuning_record(workload).run_secs == records[0][1]
    assert OrderedUnionDatabase(slow, fast).query_tuning_record(workload).run_secs == records[-1][1]
    with pytest.raises(DialectError, match="does not take commits"):
        UnionDatabase(fast).commit_tuning_record(Record.from_json(records[0], workload))


def test_dump_pruned_keeps_the_best_record_of_each_workload(matmul, shared_data, tmp_path):
    db = MemoryDatabase()
    _fill(db, matmul)
    _fill(db, shared_data / "meta_schedule" / "conv_56_64")
    pruned = JSONDatabase(work_dir=tmp_path / "pruned")
    db.dump_pruned(pruned)
    assert len(pruned) == 2
    for workload in db.workloads:
        assert pruned.get_top_k(workload, 1)[0].trace == db.get_top_k(workload, 1)[0].trace


def test_query_schedule_replays_the_best_trace_on_the_engine(matmul):
    db = JSONDatabase(work_dir=matmul)
    schedule = db.query_schedule(_workload(matmul))
    assert {stage.name for stage in schedule.stages} >= {"C"}
