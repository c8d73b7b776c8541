"""Streaming ingest: records committed batch by batch whatever the logs, a killed ingest run
again stores nothing twice, a tree of small logs (TenSet's layout) is batched across files, and
the compact set of record ids a commit checks against answers as a set would."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lorien.formats import read_log
from lorien.ingest import ingest_paths
from lorien.warehouse import open_store
from lorien.warehouse.parquet.ids import RecordIds
from lorien.warehouse.parquet.layout import commit_of

TOPHUB_LOG = Path("tophub") / "rocm_v0.05.log"  # under the shared data (the shared_data fixture)
ANSOR_LOG = Path("ansor") / "resnet-50-NHWC-B1-llvm.json"

# An ingest that dies (SIGKILL) while publishing its third commit: after that commit's first
# serving file is in place, before its record files are.
KILLED_INGEST = """
import os, signal, sys
import lorien.warehouse.parquet.ids as ids_module
import lorien.warehouse.parquet.store as store_module
from lorien.ingest import ingest_paths
ids_module.MEMORY_IDS = int(sys.argv[4])
commits = []
def die_in_third_commit(point):
    if point == "serving:1":
        commits.append(point)
        if len(commits) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
store_module.pause_point = die_in_third_commit
ingest_paths([sys.argv[1]], store_uri=sys.argv[2], batch_size=int(sys.argv[3]))
"""


def stored_ids(uri: str) -> list[str]:
    return open_store(uri).scan(columns=["record_id"]).column("record_id").to_pylist()


# 1 << 21: every id in memory; 50: the record ids a commit checks against go to disk past 50 of them
@pytest.mark.parametrize("memory_ids", [1 << 21, 50])
def test_an_ingest_killed_mid_log_and_run_again_stores_every_record_once(tmp_path, shared_data, monkeypatch,
                                                                          memory_ids):
    import lorien.warehouse.parquet.ids as ids_module

    log = shared_data / TOPHUB_LOG
    uri = f"parquet:{tmp_path / 'warehouse'}"
    expected = {record.record_id for record in read_log(log).records}
    killed = subprocess.run([sys.executable, "-c", KILLED_INGEST, str(log), uri, "40", str(memory_ids)],
                            capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    before = stored_ids(uri)
    assert 0 < len(before) < len(expected)  # two whole commits visible, the third not at all
    assert len(set(before)) == len(before)

    monkeypatch.setattr(ids_module, "MEMORY_IDS", memory_ids)
    report = ingest_paths([log], store_uri=uri, batch_size=40)

    after = stored_ids(uri)
    assert sorted(after) == sorted(expected)
    assert report.stored == len(expected) - len(before)
    assert report.duplicates == report.records - report.stored


def write_tree(root: Path, files: int, ansor_log: Path) -> list[Path]:
    """Auto-scheduler logs laid out as TenSet's: nested per platform, one per task, each with
    its own DAG hash in the workload key."""
    lines = [json.loads(line) for line in ansor_log.read_text().splitlines() if line.startswith("{")]
    written = []
    for number in range(files):
        line = lines[number % len(lines)]
        key = json.loads(line["i"][0][0])
        key[0] = secrets.token_hex(16)
        directory = root / ("cuda" if number % 2 else "llvm") / f"platform{number % 3}"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"([{','.join(map(str, key))}],llvm).json"
        with open(path, "w") as out:
            for index in range(3):
                out.write(json.dumps(dict(line, i=[[json.dumps(key), *line["i"][0][1:]], line["i"][1]],
                                          r=[line["r"][0], 0, line["r"][2], line["r"][3] + index])) + "\n")
        written.append(path)
    return written


def test_a_tree_of_small_logs_is_committed_in_batches_not_one_commit_per_file(tmp_path, shared_data):
    written = write_tree(tmp_path / "measure_records", files=30, ansor_log=shared_data / ANSOR_LOG)
    uri = f"parquet:{tmp_path / 'warehouse'}"

    report = ingest_paths([tmp_path / "measure_records"], store_uri=uri, batch_size=1000)

    assert sorted(Path(file.path) for file in report.files) == sorted(written)
    assert [(file.records, file.stored, file.duplicates) for file in report.files] == [(3, 3, 0)] * 30
    record_files = (tmp_path / "warehouse" / "records").rglob("*.parquet")
    assert len({commit_of(path.name)[0] for path in record_files}) == 1
    again = ingest_paths([tmp_path / "measure_records"], store_uri=uri, batch_size=7)
    assert [(file.records, file.stored, file.duplicates) for file in again.files] == [(3, 0, 3)] * 30


# None: every id in memory; 200: at most 200 in memory, the others on disk (merged there again and again)
@pytest.mark.parametrize("memory_ids", [None, 200])
def test_the_compact_record_id_set_answers_as_a_python_set_would(memory_ids):
    rng = np.random.default_rng(0)
    pool = ([secrets.token_hex(16) for _ in range(3000)] + ["custom-1", "custom-2", "ABCDEF" * 5 + "00"]
            + ["0123456789abcdef" + secrets.token_hex(8) for _ in range(40)])  # the same high half
    ids, reference = RecordIds(memory_ids), set()
    for _ in range(40):
        batch = list(dict.fromkeys(rng.choice(pool, 300).tolist()))
        column = pa.array(batch, pa.string())
        fresh = ids.fresh(column)
        assert fresh.tolist() == [rid not in reference for rid in batch]
        ids.update(column.filter(pa.array(fresh)))  # as a commit does: only the ids it stores
        reference.update(batch)
        assert len(ids) == len(reference)
        if memory_ids is not None:
            assert ids.nbytes <= 16 * memory_ids
    assert (ids.spilled > 0) == (memory_ids is not None)
    # a set merged into another, its ids on disk included, is found there
    merged = RecordIds(memory_ids)
    merged.update(ids)
    assert len(merged) == len(ids)
    assert not merged.fresh(pa.array([rid for rid in reference if rid.startswith("0123")], pa.string())).any()
    ids.clear()
    assert len(ids) == 0 and ids.spilled == 0
    assert ids.fresh(pa.array(sorted(reference)[:50], pa.string())).all()


def test_record_ids_beyond_the_memory_bound_are_on_disk_not_in_memory():
    ids = RecordIds(memory_ids=1000)
    for _ in range(10):
        ids.update(pa.array([secrets.token_hex(16) for _ in range(700)], pa.string()))
    assert len(ids) == 7000
    assert ids.spilled >= 6000 and ids.nbytes <= 16 * 1000
    unseen = [secrets.token_hex(16) for _ in range(500)]
    assert ids.fresh(pa.array(unseen, pa.string())).all()


@pytest.mark.parametrize("spelling", ["hex", "upper", "same_high_half", "other"])
def test_dedupe_keeps_the_first_row_of_each_id_whatever_its_spelling(spelling):
    from lorien.warehouse.parquet.tables import dedupe

    make = {"hex": lambda: secrets.token_hex(16), "upper": lambda: secrets.token_hex(16).upper(),
            "same_high_half": lambda: "0123456789abcdef" + secrets.token_hex(8),
            "other": lambda: "custom-" + secrets.token_hex(4)}[spelling]
    pool = [make() for _ in range(50)]
    rng = np.random.default_rng(1)
    ids = rng.choice(pool, 200).tolist()
    table = pa.table({"record_id": pa.array(ids, pa.string()), "row": pa.array(range(200), pa.int64())})
    kept = dedupe(table)
    firsts = {}
    for row, rid in enumerate(ids):
        firsts.setdefault(rid, row)
    assert kept.column("row").to_pylist() == sorted(firsts.values())
    distinct = table.take(sorted(firsts.values()))
    assert dedupe(distinct).num_rows == distinct.num_rows


@pytest.mark.parametrize("batch_size", [0, -5])
def test_a_batch_size_below_one_is_refused_naming_the_value(tmp_path, batch_size):
    from lorien.errors import LorienError

    with pytest.raises(LorienError, match=str(batch_size)):
        ingest_paths([Path("never-read.log")], store_uri=f"parquet:{tmp_path / 'warehouse'}", batch_size=batch_size)


def test_record_ids_are_kept_in_partitions_so_a_merge_holds_only_a_partitions_ids():
    from lorien.warehouse.parquet.ids import PARTITION_BITS

    ids = RecordIds()
    for _ in range(8):
        ids.update(pa.array([secrets.token_hex(16) for _ in range(4000)], pa.string()))
    assert len(ids) == 32000
    largest = max(len(high) for high, _ in ids._runs)
    assert largest < 4 * 32000 / 2**PARTITION_BITS  # about 125 per partition, never all 32,000 in one run
    # every id is found, none twice
    again = pa.array([secrets.token_hex(16) for _ in range(1000)], pa.string())
    assert ids.fresh(again).all()


def test_the_ingest_allocator_options_are_set_only_where_the_user_left_them_unset():
    from lorien.allocator import INGEST_ALLOCATOR_ENV, set_ingest_allocator_env

    environ = {"MIMALLOC_PURGE_DELAY": "250", "PATH": "/bin"}
    chosen = set_ingest_allocator_env(environ)

    assert environ["MIMALLOC_PURGE_DELAY"] == "250"
    assert "MIMALLOC_PURGE_DELAY" not in chosen
    assert chosen == {name: value for name, value in INGEST_ALLOCATOR_ENV.items() if name != "MIMALLOC_PURGE_DELAY"}
    assert all(environ[name] == value for name, value in chosen.items())


# mimalloc prints the options it runs with (MIMALLOC_VERBOSE=1) when pyarrow loads it; the decoding
# workers are forked from the ingest's process, allocator and options included
@pytest.mark.parametrize("user_purge_delay", [None, "250"])
def test_lorien_ingest_loads_arrows_allocator_with_the_ingest_options_unless_the_user_set_them(
        tmp_path, shared_data, user_purge_delay):
    import os

    from lorien.allocator import INGEST_ALLOCATOR_ENV

    if pa.default_memory_pool().backend_name != "mimalloc":
        pytest.skip(f"Arrow's default pool here is {pa.default_memory_pool().backend_name}, not mimalloc")
    environ = {name: value for name, value in os.environ.items() if not name.startswith("MIMALLOC_")}
    environ["MIMALLOC_VERBOSE"] = "1"
    if user_purge_delay is not None:
        environ["MIMALLOC_PURGE_DELAY"] = user_purge_delay
    ingest = subprocess.run([sys.executable, "-m", "lorien.cli", "ingest", str(shared_data / TOPHUB_LOG), "--store",
                             f"parquet:{tmp_path / 'warehouse'}", "--no-progress", "--no-serving-index"],
                            capture_output=True, text=True, env=environ)

    assert ingest.returncode == 0, ingest.stderr
    purge_delay = user_purge_delay or INGEST_ALLOCATOR_ENV["MIMALLOC_PURGE_DELAY"]
    assert f"option 'purge_delay': {purge_delay}" in ingest.stderr
    assert f"option 'allow_thp': {INGEST_ALLOCATOR_ENV['MIMALLOC_ALLOW_THP']}" in ingest.stderr


def test_an_ingest_gives_freed_memory_back_before_it_builds_the_serving_index(tmp_path, shared_data, monkeypatch):
    import lorien.ingest as ingest_module

    calls = []
    monkeypatch.setattr(ingest_module, "release_freed_memory", lambda: calls.append("release"))
    real_build = ingest_module.build_serving_indexes_of
    monkeypatch.setattr(ingest_module, "build_serving_indexes_of",
                        lambda store: calls.append("build") or real_build(store))

    ingest_paths([shared_data / TOPHUB_LOG], store_uri=f"parquet:{tmp_path / 'warehouse'}")

    assert calls == ["release", "build"]




def test_a_serving_merge_reads_its_files_without_arrows_thread_pool(tmp_path, shared_data, monkeypatch):
    # Arrow's pool threads keep the memory they allocated: from the first merge on, an ingest's
    # memory stayed ~20-30 MiB higher (docs/warehouse.md, "Large logs and TenSet trees")
    import pyarrow.parquet as pq

    from lorien.warehouse.parquet import SERVING_MERGE_FILES
    from lorien.warehouse.parquet.store import ParquetStore

    merging, merge_reads = [], []
    read, merge_files = pq.ParquetFile.read, ParquetStore._merge_serving_files

    def read_watched(self, *args, **kwargs):
        if merging:
            merge_reads.append(kwargs.get("use_threads", True))
        return read(self, *args, **kwargs)

    def merge_files_watched(self, *args, **kwargs):
        merging.append(True)
        try:
            return merge_files(self, *args, **kwargs)
        finally:
            merging.pop()

    monkeypatch.setattr(pq.ParquetFile, "read", read_watched)
    monkeypatch.setattr(ParquetStore, "_merge_serving_files", merge_files_watched)
    log = shared_data / TOPHUB_LOG
    lines = sum(1 for _ in open(log))
    batch_size = max(1, lines // (2 * SERVING_MERGE_FILES))  # more serving files than a merge waits for
    uri = f"parquet:{tmp_path / 'warehouse'}"

    report = ingest_paths([log], store_uri=uri, batch_size=batch_size)

    assert merge_reads and not any(merge_reads)
    assert report.stored == len(set(stored_ids(uri))) == lines
