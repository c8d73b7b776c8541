"""The Parquet store beyond the shared contract: files on disk, real concurrent processes,
writers killed mid-commit, compaction, and readers that know nothing of Lorien."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest
from test_store_contract import SKYLAKE, make_record, workload_records

from lorien.errors import StoreError, StoreUnreachableError
from lorien.warehouse import open_store
from lorien.warehouse.parquet import NULL_PARTITION

TESTS_DIR = Path(__file__).resolve().parent

# A writer process: commits BATCHES batches of SIZE distinct records (plus, when SHARED is set,
# the same shared batch every writer commits) and prints one line per finished commit.
WRITER = f"""
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
from lorien.warehouse import open_store
from test_store_contract import workload_records
uri, name, batches, size, shared = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
store = open_store(uri)
if shared:
    store.commit(workload_records("dense#shared", 20))
for batch in range(batches):
    store.commit(workload_records("dense#" + name, size, first_index=batch * size), nbest=5)
    print("committed", batch, flush=True)
"""


def start_writer(uri: str, name: str, batches: int, size: int, shared: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, uri, name, str(batches), str(size), "1" if shared else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def parquet_files(root: Path, sub: str = "records") -> list[Path]:
    return sorted((root / sub).rglob("*.parquet"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


@pytest.fixture
def store(root: Path):
    with open_store(f"parquet:{root}") as opened:
        yield opened


def test_records_are_hive_partitioned_by_target_key_and_layout(store, root):
    store.commit(workload_records("conv#a", 2, layout="NCHW") + workload_records("conv#a", 2, layout="NCHW8c"))
    directories = {path.parent.relative_to(root).as_posix() for path in parquet_files(root)}
    assert directories == {"records/target_key=llvm_cpu/layout=NCHW", "records/target_key=llvm_cpu/layout=NCHW8c"}


def test_an_empty_layout_goes_to_hives_default_partition(store, root):
    store.commit([make_record("dense#a", 1e-3, layout="")])
    assert parquet_files(root)[0].parent.name == f"layout={NULL_PARTITION}"
    assert store.best("dense#a", SKYLAKE)[0].layout == ""


def test_duckdb_reads_the_records_without_lorien(store, root):
    store.commit(workload_records("conv#a", 3, layout="NCHW") + workload_records("conv#b", 2, layout="NHWC"))
    rows = duckdb.sql(
        f"SELECT target_key, layout, count(*) AS n, min(cost_s) AS best FROM "
        f"read_parquet('{root}/records/**/*.parquet', hive_partitioning = true) GROUP BY ALL ORDER BY layout"
    ).fetchall()
    assert rows == [("llvm_cpu", "NCHW", 3, pytest.approx(1e-3)), ("llvm_cpu", "NHWC", 2, pytest.approx(1e-3))]


def test_pandas_reads_the_records_without_lorien(store, root):
    store.commit(workload_records("conv#a", 3, layout="NCHW") + workload_records("conv#b", 2, layout="NHWC"))
    frame = pd.read_parquet(root / "records")
    assert len(frame) == 5
    assert frame.groupby(frame["layout"].astype(str))["record_id"].count().to_dict() == {"NCHW": 3, "NHWC": 2}


def test_best_deeper_than_the_serving_view_is_answered_from_the_records(store):
    store.commit(workload_records("dense#a", 10)[::-1], nbest=2)
    best = store.best("dense#a", SKYLAKE, k=6)
    assert [record.cost_s for record in best] == pytest.approx([1e-3 * (1 + index) for index in range(6)])


def test_an_answer_deeper_than_the_serving_view_matches_targets_the_same_way(store):
    store.commit(workload_records("dense#a", 4, target="llvm -mcpu=znver4", base_s=1e-4) +
                 workload_records("dense#a", 4, target="llvm -mcpu=haswell"), nbest=2)
    best = store.best("dense#a", "llvm -mcpu=haswell -keys=cpu", k=4)
    assert [record.cost_s for record in best] == pytest.approx([1e-3 * (1 + index) for index in range(4)])
    assert len(store.best("dense#a", "llvm", k=8)) == 8


def test_serving_view_holds_at_most_nbest_rows_per_group(store, root):
    store.commit(workload_records("dense#a", 30) + workload_records("dense#b", 1), nbest=4)
    serving = pq.read_table(parquet_files(root, "best")[0])
    assert serving.num_rows == 5


def test_commit_rejects_a_nonpositive_nbest(store):
    with pytest.raises(StoreError, match="nbest"):
        store.commit(workload_records("dense#a", 1), nbest=0)


def test_an_aborted_transaction_publishes_nothing(store, root):
    with pytest.raises(RuntimeError, match="stop"), store.transaction() as commit:
        commit.add(workload_records("dense#a", 5))
        raise RuntimeError("stop")
    assert store.scan().num_rows == 0
    assert list((root / "_staging").iterdir()) == []


def test_a_file_that_fails_to_stage_aborts_the_commit_and_leaves_nothing(store, root, monkeypatch):
    """Files are staged by background threads; one failing write fails the commit, and every
    file its siblings staged is deleted: nothing is published, nothing is left in _staging."""
    files = store._files
    real_stage, calls = files.stage, []

    def stage(table, row_group_size):
        calls.append(table.num_rows)
        if len(calls) == 2:
            raise StoreError("disk full (injected)")
        return real_stage(table, row_group_size)

    monkeypatch.setattr(files, "stage", stage)
    records = workload_records("dense#a", 5) + workload_records("dense#b", 5, layout="NHWC")
    with pytest.raises(StoreError, match="disk full"):
        store.commit(records)
    assert len(calls) >= 3  # the other files were written before the failure was raised
    monkeypatch.undo()
    assert store.scan().num_rows == 0
    assert list((root / "_staging").iterdir()) == []
    assert [thread.name for thread in threading.enumerate() if thread.name.startswith("lorien-staging")] == []
    store.commit(records)  # the store is usable afterwards
    assert store.scan().num_rows == 10


def test_a_transaction_publishes_every_batch_at_finish(store):
    with store.transaction() as commit:
        commit.add(workload_records("dense#a", 3))
        commit.add(workload_records("dense#b", 3))
        assert open_store(store.uri).scan().num_rows == 0
    assert store.scan().num_rows == 6


def test_a_query_sees_records_another_process_committed(store):
    assert store.best("dense#w0", SKYLAKE) == []
    writer = start_writer(store.uri, "w0", batches=1, size=5)
    assert writer.wait(timeout=120) == 0, writer.stderr.read()
    assert len(store.best("dense#w0", SKYLAKE, k=5)) == 5


@pytest.mark.slow
def test_concurrent_writer_processes_lose_nothing_and_duplicate_nothing(store):
    writers = [start_writer(store.uri, f"w{number}", batches=5, size=40, shared=True) for number in range(4)]
    for writer in writers:
        assert writer.wait(timeout=300) == 0, writer.stderr.read()
    table = store.scan(columns=["record_id", "workload_key"])
    assert table.num_rows == 4 * 5 * 40 + 20
    assert len(set(table.column("record_id").to_pylist())) == table.num_rows
    for number in range(4):
        assert len(store.best(f"dense#w{number}", SKYLAKE, k=5)) == 5
    assert len(store.best("dense#shared", SKYLAKE, k=50)) == 20


def test_a_writer_killed_mid_commit_leaves_only_whole_files(store, root):
    size = 4000
    writer = start_writer(store.uri, "killed", batches=1000, size=size)
    assert writer.stdout.readline().startswith("committed")
    staging = root / "_staging"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(staging.iterdir()):
        pass  # wait until the writer is in the middle of writing a file
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    committed = 1 + sum(1 for line in writer.stdout if line.startswith("committed"))
    for path in parquet_files(root) + parquet_files(root, "best"):
        pq.read_table(path)  # every visible file is complete
    assert not [path for path in (root / "records").rglob("*") if path.is_file() and path.suffix != ".parquet"]
    stored = store.scan(columns=["record_id"]).num_rows
    assert stored % size == 0 and stored >= committed * size
    count = duckdb.sql(f"SELECT count(*) FROM read_parquet('{root}/records/**/*.parquet')").fetchall()[0][0]
    assert count == stored


def test_records_stored_twice_by_racing_writers_are_read_once_and_compacted_away(root):
    records = workload_records("dense#a", 10)
    first, second = open_store(f"parquet:{root}"), open_store(f"parquet:{root}")
    first._known_record_ids(), second._known_record_ids()  # both have seen the empty store
    with first.transaction() as commit_one, second.transaction() as commit_two:
        commit_one.add(records)
        commit_two.add(records)
    assert sum(pq.read_table(path).num_rows for path in parquet_files(root)) == 20
    assert first.scan().num_rows == 10
    assert len(first.best("dense#a", SKYLAKE, k=20)) == 10
    first.compact()
    assert sum(pq.read_table(path).num_rows for path in parquet_files(root)) == 10


def test_compaction_merges_each_partition_into_one_file(store, root):
    for index in range(5):
        store.commit(workload_records("conv#a", 4, first_index=4 * index, layout="NCHW") +
                     workload_records("conv#a", 4, first_index=4 * index, layout="NHWC"))
    assert len(parquet_files(root)) == 10
    summary = store.compact()
    assert len(parquet_files(root)) == 2
    assert len(parquet_files(root, "best")) == 1
    assert summary["record_files_merged"] == 10


def test_compaction_keeps_answers_deeper_than_the_old_serving_view(store):
    for index in range(3):
        store.commit(workload_records("dense#a", 5, first_index=5 * index), nbest=3)
    before = store.best("dense#a", SKYLAKE, k=8)
    store.compact()
    assert store.best("dense#a", SKYLAKE, k=8) == before


def test_a_store_path_that_is_a_file_is_unreachable(tmp_path):
    path = tmp_path / "not-a-directory"
    path.write_text("x")
    with pytest.raises(StoreUnreachableError, match="not a directory"):
        open_store(f"parquet:{path}").scan()


def test_an_unknown_s3_uri_option_is_refused():
    with pytest.raises(StoreError, match="endpoint"):
        open_store("parquet:s3://bucket/prefix?endpont_url=http://127.0.0.1:1")


def test_an_s3_store_writes_the_same_layout_as_a_local_one(moto_server, s3_bucket, s3_client):
    store = open_store(f"parquet:s3://{s3_bucket}/lorien?endpoint_url={moto_server}")
    store.commit(workload_records("conv#a", 2, layout="NCHW"))
    keys = [item["Key"] for item in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    records = [key for key in keys if key.startswith("lorien/records/")]
    assert len(records) == 1
    assert records[0].startswith("lorien/records/target_key=llvm_cpu/layout=NCHW/part-")
    assert not [key for key in keys if key.startswith("lorien/_staging/")]


def test_an_unreachable_s3_endpoint_raises_store_unreachable(aws_credentials):
    from servers import free_port

    store = open_store(f"parquet:s3://bucket/prefix?endpoint_url=http://127.0.0.1:{free_port()}")
    with pytest.raises(StoreUnreachableError, match="127.0.0.1"):
        store.scan()


def test_a_bare_path_opens_a_parquet_store(root):
    store = open_store(str(root))
    store.commit(workload_records("dense#a", 1))
    assert os.path.isdir(root / "records")


@pytest.mark.parametrize("query", [
    {"workload_key": "conv#a", "k": 3},
    {"workload_key": "conv#a", "k": 2, "layout": "NHWC"},
    {"workload_key": "conv#a", "k": 2, "per_layout": True},
    {"workload_key": "conv#", "k": 4, "prefix": True},
    {"workload_key": "conv#a", "k": 3, "by_alternate_key": True},
    {"workload_key": "conv#b", "k": 5, "prefix": True, "per_layout": True, "by_alternate_key": True},
])
def test_a_first_lookup_and_an_indexed_lookup_give_the_same_answer(root, query):
    from test_store_contract import ZNVER

    writer = open_store(f"parquet:{root}")
    for index in range(3):
        writer.commit(workload_records("conv#a", 4, layout="NCHW", first_index=4 * index) +
                      workload_records("conv#a", 4, layout="NHWC", base_s=1.5e-3, first_index=4 * index) +
                      workload_records("conv#b", 3, target=ZNVER, base_s=5e-4, first_index=3 * index) +
                      workload_records("conv#bb", 3, layout="NHWC", base_s=7e-4, first_index=3 * index), nbest=5)
    cold = open_store(f"parquet:{root}")
    first = cold.best(target=SKYLAKE, **query)
    assert not cold._indexes  # the first lookup did not build the index
    second = cold.best(target=SKYLAKE, **query)
    assert cold._indexes
    assert first == second
    assert first


def test_a_local_store_uri_takes_an_fsync_option(root):
    store = open_store(f"parquet:{root}?fsync=true")
    store.commit(workload_records("dense#a", 2))
    assert store._files.fsync
    assert len(parquet_files(root)) == 1


def test_an_unknown_local_store_option_is_refused(root):
    with pytest.raises(StoreError, match="fsnyc"):
        open_store(f"parquet:{root}?fsnyc=true")


@pytest.mark.slow
def test_concurrent_writer_processes_on_s3_lose_nothing(moto_server, s3_bucket):
    uri = f"parquet:s3://{s3_bucket}/lorien?endpoint_url={moto_server}"
    writers = [start_writer(uri, f"s{number}", batches=3, size=20, shared=True) for number in range(3)]
    for writer in writers:
        assert writer.wait(timeout=300) == 0, writer.stderr.read()
    store = open_store(uri)
    ids = store.scan(columns=["record_id"]).column("record_id").to_pylist()
    assert len(ids) == len(set(ids)) == 3 * 3 * 20 + 20
    assert len(store.best("dense#s1", SKYLAKE, k=5)) == 5


def test_many_small_commits_keep_the_serving_view_in_few_files(store, root):
    from lorien.warehouse.parquet import SERVING_MERGE_FILES

    for index in range(SERVING_MERGE_FILES + 5):
        store.commit(workload_records("dense#a", 2, first_index=2 * index)[::-1], nbest=3)
    assert len(parquet_files(root, "best")) <= SERVING_MERGE_FILES
    assert [record.cost_s for record in store.best("dense#a", SKYLAKE, k=3)] == pytest.approx([1e-3, 2e-3, 3e-3])
    assert len(store.best("dense#a", SKYLAKE, k=10)) == 10


def test_an_s3_store_in_a_missing_bucket_is_unreachable(moto_server):
    store = open_store(f"parquet:s3://no-such-bucket-here/lorien?endpoint_url={moto_server}")
    with pytest.raises(StoreUnreachableError, match="no-such-bucket-here"):
        store.best("dense#a", SKYLAKE)


def test_records_with_ids_of_any_length_are_deduplicated_on_read(root):
    records = [record.with_changes(record_id=f"custom-{index % 3}")
               for index, record in enumerate(workload_records("dense#a", 6))]
    first, second = open_store(f"parquet:{root}"), open_store(f"parquet:{root}")
    with first.transaction() as commit_one, second.transaction() as commit_two:
        commit_one.add(records[:3])
        commit_two.add(records[3:])  # the same three ids, from a writer that has not seen them
    assert sum(pq.read_table(path).num_rows for path in parquet_files(root)) == 6
    assert sorted(first.scan(columns=["record_id"]).column("record_id").to_pylist()) == [
        "custom-0", "custom-1", "custom-2"]


# ---- commits are all-or-nothing: writers stopped and killed between two publications ----------

# A writer whose one commit spans two layouts (two record files) and one target key (one
# serving file); PAUSE_ENV makes it stop at a named point of the publication until SIGUSR1.
CRASH_WRITER = f"""
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
from lorien.warehouse import open_store
from test_store_contract import workload_records
store = open_store(sys.argv[1])
records = (workload_records("conv#a", 6, layout="NCHW", base_s=5e-6, first_index=100) +
           workload_records("conv#a", 6, layout="NHWC", base_s=5e-6, first_index=100))
if sys.argv[2:] == ["transaction"]:  # two batches, two target keys: two serving files
    with store.transaction() as commit:
        commit.add(records)
        commit.add(workload_records("conv#a", 3, target="cuda -model=titanx", base_s=5e-6))
    result = commit.result
else:
    result = store.commit(records)
print("committed", result.stored, flush=True)
"""
CRASH_POINTS = ["serving:1", "record:1"]


def crash_records() -> list:
    return (workload_records("conv#a", 6, layout="NCHW", base_s=5e-6, first_index=100) +
            workload_records("conv#a", 6, layout="NHWC", base_s=5e-6, first_index=100))


def paused_writer(uri: str, point: str, *mode: str) -> subprocess.Popen:
    """A writer process stopped at ``point`` of its commit's publication (started, and waited for)."""
    from lorien.warehouse.parquet import PAUSE_ENV

    writer = subprocess.Popen([sys.executable, "-c", CRASH_WRITER, uri, *mode], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, PAUSE_ENV: point})
    line = writer.stderr.readline()
    if line.strip() != f"lorien: paused at {point}":
        writer.kill()
        raise AssertionError(f"writer did not stop at {point}: {line}{writer.stderr.read()}")
    return writer


def kill(writer: subprocess.Popen) -> None:
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)


def answers(uri: str) -> tuple:
    """What a fresh reader sees: every record id, the best of each layout, stats, workloads."""
    reader = open_store(uri)
    ids = reader.scan(columns=["record_id"]).column("record_id").to_pylist()
    best = [(record.record_id, record.cost_s) for record in reader.best("conv#a", SKYLAKE, k=20, per_layout=True)]
    stats = reader.stats()
    return (sorted(ids), len(ids), best, stats["records"], stats["files"], stats["serving_files"],
            reader.workloads())


def raw_rows(root: Path) -> int:
    """Rows in every record file on disk, as a reader that knows nothing of commits counts them."""
    return sum(pq.read_metadata(path).num_rows for path in parquet_files(root))


def commit_earlier(store) -> None:
    store.commit(workload_records("conv#a", 4, layout="NCHW") + workload_records("dense#b", 3))


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_writer_killed_between_two_publications_leaves_nothing_of_its_commit_visible(store, root, point):
    commit_earlier(store)
    before = answers(store.uri)
    files_before = len(parquet_files(root)) + len(parquet_files(root, "best"))
    writer = paused_writer(store.uri, point)
    try:
        on_disk = len(parquet_files(root)) + len(parquet_files(root, "best"))
        assert on_disk > files_before  # part of the commit is in place ...
        assert answers(store.uri) == before  # ... and no reader sees it
        assert store.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)  # a warm reader neither
    finally:
        kill(writer)
    assert answers(store.uri) == before
    assert len(set(before[0])) == before[1] == 7
    assert store.stats()["incomplete_commit_files"] == (1 if point == "serving:1" else 2)


@pytest.mark.parametrize("point", ["serving:1", "serving:2", "record:1", "record:2"])
def test_a_transaction_over_two_target_keys_killed_mid_publication_shows_nothing(store, root, point):
    from test_store_contract import CUDA

    commit_earlier(store)
    before, cuda_before = answers(store.uri), store.best("conv#a", CUDA)
    writer = paused_writer(store.uri, point, "transaction")
    try:
        assert answers(store.uri) == before
    finally:
        kill(writer)
    assert answers(store.uri) == before
    assert open_store(store.uri).best("conv#a", CUDA) == cuda_before == []
    # the earlier commit's serving file, and those the killed one had put in place
    assert len(parquet_files(root, "best")) == 1 + (1 if point == "serving:1" else 2)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_later_commit_stores_the_records_of_a_killed_commit_once(store, root, point):
    commit_earlier(store)
    kill(paused_writer(store.uri, point))
    retry = open_store(store.uri).commit(crash_records())
    assert retry.stored == 12  # the killed commit's records do not count as stored
    ids = store.scan(columns=["record_id"]).column("record_id").to_pylist()
    assert len(ids) == len(set(ids)) == 7 + 12
    best = store.best("conv#a", SKYLAKE, k=2, per_layout=True)
    # both layouts' fastest rows cost the same, so which layout comes first is up to record_id
    assert sorted((record.layout, record.cost_s) for record in best) == [
        ("NCHW", pytest.approx(5e-6 * 101)), ("NCHW", pytest.approx(5e-6 * 102)),
        ("NHWC", pytest.approx(5e-6 * 101)), ("NHWC", pytest.approx(5e-6 * 102))]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_compaction_deletes_an_abandoned_commit_and_keeps_every_answer(store, root, point, monkeypatch):
    from lorien.warehouse import parquet

    commit_earlier(store)
    kill(paused_writer(store.uri, point))
    before = answers(store.uri)
    store.compact()  # the leftover is younger than the grace period: kept, still invisible
    assert raw_rows(root) > before[1] or point == "serving:1"
    assert answers(store.uri)[:4] == before[:4]
    monkeypatch.setattr(parquet.store, "ABANDONED_COMMIT_S", 0.0)
    summary = store.compact()
    assert summary["abandoned_files_removed"] >= 1
    assert answers(store.uri)[:4] == before[:4]
    assert raw_rows(root) == before[1]  # nothing on disk but the visible records
    assert store.stats()["incomplete_commit_files"] == 0
    assert [path.name for path in parquet_files(root, "best")] == [
        path.name for path in parquet_files(root, "best") if path.name.endswith("-of0.parquet")]


def test_a_later_commit_deletes_abandoned_commits_only_after_the_grace_period(store, root, monkeypatch):
    from lorien.warehouse import parquet

    commit_earlier(store)
    kill(paused_writer(store.uri, "record:1"))
    leftovers = raw_rows(root) - 7
    assert leftovers > 0
    store.commit(workload_records("dense#c", 1))
    assert raw_rows(root) == 7 + 1 + leftovers  # too young to be called abandoned
    monkeypatch.setattr(parquet.store, "ABANDONED_COMMIT_S", 0.0)
    store.commit(workload_records("dense#c", 1, first_index=1))
    assert raw_rows(root) == 7 + 2
    assert len(parquet_files(root, "best")) == 3


def test_a_stalled_writer_resumed_after_its_commit_was_removed_never_makes_it_visible(store, root, monkeypatch):
    from lorien.warehouse import parquet

    commit_earlier(store)
    before = answers(store.uri)
    writer = paused_writer(store.uri, "record:1")
    monkeypatch.setattr(parquet.store, "ABANDONED_COMMIT_S", 0.0)
    assert store.compact()["abandoned_files_removed"] == 2  # its serving file and first record file
    writer.send_signal(signal.SIGUSR1)
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert out.startswith("committed 12")  # the writer believes it committed ...
    assert raw_rows(root) == 7 + 6  # ... and its last record file is on disk ...
    assert answers(store.uri)[:4] == before[:4]  # ... but no reader sees it


def test_a_reader_that_saw_a_commit_half_published_sees_all_of_it_once_it_is_published(store):
    commit_earlier(store)
    writer = paused_writer(store.uri, "serving:1")
    assert store.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)
    assert store.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)  # indexed, still not visible
    writer.send_signal(signal.SIGUSR1)
    assert writer.wait(timeout=60) == 0, writer.stderr.read()
    assert store.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(5e-6 * 101)
    assert store.scan().num_rows == 7 + 12


def test_a_writer_killed_mid_commit_on_s3_leaves_nothing_of_its_commit_visible(
        moto_server, s3_bucket, s3_client, monkeypatch):
    from lorien.warehouse import parquet

    uri = f"parquet:s3://{s3_bucket}/lorien?endpoint_url={moto_server}"
    commit_earlier(open_store(uri))
    before = answers(uri)
    kill(paused_writer(uri, "record:1"))

    def keys(prefix: str) -> list[str]:
        listing = s3_client.list_objects_v2(Bucket=s3_bucket, Prefix=prefix)
        return [item["Key"] for item in listing.get("Contents", []) if item["Key"].endswith(".parquet")]

    records = keys("lorien/records/")
    assert len(records) == 2 and any(key.endswith("-1of2.parquet") for key in records)  # earlier, killed
    assert answers(uri) == before
    assert open_store(uri).commit(crash_records()).stored == 12
    assert answers(uri)[1] == 7 + 12
    monkeypatch.setattr(parquet.store, "ABANDONED_COMMIT_S", 0.0)
    assert open_store(uri).compact()["abandoned_files_removed"] == 2  # the killed commit's files
    assert answers(uri)[1] == 7 + 12
    assert all(key.endswith("-1of1.parquet") for key in keys("lorien/records/"))


def test_compaction_rewrites_a_file_left_alone_in_its_partition_by_a_many_file_commit(store, root):
    store.commit(workload_records("conv#a", 3, layout="NCHW") + workload_records("conv#a", 3, layout="NHWC"))
    store.commit(workload_records("conv#a", 3, layout="NCHW", first_index=3))
    before = answers(store.uri)
    store.compact()
    assert answers(store.uri)[:4] == before[:4]
    assert len(parquet_files(root)) == 2
    assert all(path.name.endswith("-1of1.parquet") for path in parquet_files(root))


def test_a_commit_with_a_record_file_missing_shows_none_of_its_records(store, root):
    store.commit(workload_records("conv#a", 3, layout="NCHW") + workload_records("conv#a", 3, layout="NHWC"))
    parquet_files(root)[0].unlink()
    assert open_store(store.uri).scan().num_rows == 0
    assert open_store(store.uri).best("conv#a", SKYLAKE) == []


def test_tables_with_dictionary_encoded_columns_are_stored_as_plain_columns(shared_data, tmp_path):
    """Ingest hands the store what the decoding workers send: shared columns dictionary-encoded,
    each chunk with its own dictionary. The files and every answer are those of plain tables."""
    import pyarrow as pa

    from lorien.formats import autotvm

    path = shared_data / "tophub" / "cuda_v0.10.log"
    plain = [table for table, _ in autotvm.iter_tables(path, workers=1, batch_size=200)]
    encoded = [table for table, _ in autotvm._iter_tables_parallel(path, False, 200, 2, 32 << 10, dictionary=True)]
    assert any(pa.types.is_dictionary(field.type) for field in encoded[0].schema)
    assert any(table.column("args").num_chunks > 1 for table in encoded)  # dictionaries differ between chunks
    plain_store, encoded_store = open_store(f"parquet:{tmp_path / 'plain'}"), open_store(f"parquet:{tmp_path / 'dict'}")
    for table in plain:
        plain_store.commit(table, nbest=3)
    for table in encoded:
        encoded_store.commit(table, nbest=3)
    for file in (tmp_path / "dict").rglob("*.parquet"):
        assert not any(pa.types.is_dictionary(field.type) for field in pq.read_schema(file)), file
    rows = lambda store: sorted(store.scan().to_pylist(), key=lambda row: row["record_id"])  # noqa: E731
    assert rows(encoded_store) == rows(plain_store)
    for workload_key, target in {(r["workload_key"], r["target"]) for r in rows(plain_store)}:
        assert encoded_store.best(workload_key, target, k=3) == plain_store.best(workload_key, target, k=3)


def test_close_frees_the_record_ids_and_a_later_commit_reads_them_again(tmp_path):
    store = open_store(f"parquet:{tmp_path / 'warehouse'}")
    records = workload_records("conv#a", 6)
    assert store.commit(records).stored == 6
    assert len(store._known_ids) == 6
    store.close()
    assert len(store._known_ids) == 0  # what an ingest frees before building the serving index
    result = store.commit(records)
    assert (result.stored, result.duplicates) == (0, 6)
    assert store.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)
