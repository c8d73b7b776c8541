"""The persisted serving index of a local parquet store: a new process answers from it without
building one, never from a stale one, and a damaged one is rebuilt with a warning."""

from __future__ import annotations

import json
import platform
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from test_store_contract import SKYLAKE, ZNVER, workload_records

from lorien.serving_index import PersistedIndex
from lorien.warehouse import open_store
from lorien.warehouse.parquet.serving import ServingIndex
from lorien.warehouse.parquet.store import ServingIndexWarning

TESTS_DIR = Path(__file__).resolve().parent

QUERIES = [
    {"workload_key": "conv#a", "k": 1},
    {"workload_key": "conv#a", "k": 3},
    {"workload_key": "conv#a", "k": 2, "layout": "NHWC"},
    {"workload_key": "conv#a", "k": 2, "per_layout": True},
    {"workload_key": "conv#", "k": 4, "prefix": True},
    {"workload_key": "conv#b", "k": 5, "prefix": True, "per_layout": True, "by_alternate_key": True},
    {"workload_key": "conv#a", "k": 3, "by_alternate_key": True},
    {"workload_key": "conv#a", "k": 2, "exact": True},
    {"workload_key": "conv#zz", "k": 1},
]


#: rows of fill()'s serving files: each of 3 commits keeps 4 + 4 + 2 + 3 + 3 rows
SERVING_ROWS = 3 * (4 + 4 + 2 + 3 + 3)


def fill(uri: str) -> None:
    writer = open_store(uri)
    for index in range(3):
        writer.commit(workload_records("conv#a", 4, layout="NCHW", first_index=4 * index)
                      + workload_records("conv#a", 4, layout="NHWC", base_s=1.5e-3, first_index=4 * index)
                      + workload_records("conv#a", 2, target="llvm -mcpu=skylake-avx512 -num-cores=2",
                                         base_s=9e-4, first_index=4 * index)
                      + workload_records("conv#b", 3, target=ZNVER, base_s=5e-4, first_index=3 * index)
                      + workload_records("conv#bb", 3, layout="NHWC", base_s=7e-4, first_index=3 * index), nbest=5)
    writer.close()


def index_files(root: Path) -> list[Path]:
    return sorted((root / "_index").rglob("*.lsi"))


def in_memory_answers(uri: str) -> list:
    store = open_store(uri)
    store._files.is_local = False  # the in-memory index only, as an S3 store keeps it
    answers = [store.best(target=SKYLAKE, **query) for query in QUERIES for _ in range(2)][1::2]
    assert all(isinstance(index, ServingIndex) for index in store._indexes.values())
    return answers


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


def test_a_new_process_answers_from_the_persisted_index_as_the_in_memory_index_does(root):
    uri = f"parquet:{root}"
    fill(uri)
    assert open_store(uri).build_serving_indexes() == {"llvm_cpu": SERVING_ROWS}
    assert len(index_files(root)) == 1
    fresh = open_store(uri)
    answers = [fresh.best(target=SKYLAKE, **query) for query in QUERIES]
    assert isinstance(fresh._indexes["llvm_cpu"], PersistedIndex)  # found, not built
    assert answers == in_memory_answers(uri)
    assert answers[0][0].cost_s == pytest.approx(1e-3)  # the query's own target first
    assert answers[-1] == []


def test_the_first_warm_lookup_persists_the_index_and_compaction_rebuilds_it(root):
    uri = f"parquet:{root}"
    fill(uri)
    store = open_store(uri)
    store.best("conv#a", SKYLAKE)  # a first lookup reads the files
    assert not index_files(root)
    store.best("conv#a", SKYLAKE)
    assert len(index_files(root)) == 1
    before = index_files(root)
    result = store.compact()
    assert result["serving_index_rows"] == 5 * 5  # compaction keeps the best 5 of each group
    assert len(index_files(root)) == 1 and index_files(root) != before  # the old listing's file is gone
    assert [open_store(uri).best(target=SKYLAKE, **query) for query in QUERIES] == in_memory_answers(uri)


COMMIT_FASTER = f"""
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
from lorien.warehouse import open_store
from test_store_contract import make_record
store = open_store(sys.argv[1])
store.commit([make_record("conv#a", 1e-5, config_index=99)])
"""


def test_an_index_is_never_used_after_another_process_commits(root):
    uri = f"parquet:{root}"
    fill(uri)
    reader = open_store(uri)
    reader.build_serving_indexes()
    old_index = index_files(root)
    assert reader.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)
    assert isinstance(reader._indexes["llvm_cpu"], PersistedIndex)
    subprocess.run([sys.executable, "-c", COMMIT_FASTER, uri], check=True)
    assert old_index[0].exists()  # still on disk, for the listing it names
    # this process, its index open, and a new process both see the new record
    assert reader.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-5)
    assert reader.best("conv#a", SKYLAKE, k=2)[0].cost_s == pytest.approx(1e-5)
    fresh = open_store(uri)
    assert fresh.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-5)
    assert fresh.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-5)
    assert index_files(root) != old_index and len(index_files(root)) == 1
    assert reader.best("conv#a", SKYLAKE, k=3) == in_memory_answers(uri)[1]


def damage_rows(path: Path) -> None:
    """Change one config in the rows (a digit of an index, so the Arrow layout stays valid)."""
    data = bytearray(path.read_bytes())
    at = data.index(b'{"index": 0,')
    data[at + 10] = ord("7")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "rows", "arrays", "offsets", "data"])
def test_a_damaged_index_is_rebuilt_with_a_warning_never_believed(root, damage):
    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    (path,) = index_files(root)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"x" * len(data))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "rows":
        damage_rows(path)
    else:  # a byte in every 64 of a section: the groups' rows, where rows start, the rows
        header_len = struct.unpack_from("<Q", data, len(data) - 24)[0]
        header = json.loads(data[len(data) - 24 - header_len:len(data) - 24])
        section = {"arrays": "group.spans", "offsets": "rows.offsets", "data": "rows.data"}[damage]
        at, length = header["sections"][section]
        data = bytearray(data)
        for offset in range(at + 8, at + length, 64):
            data[offset] ^= 0x5A
        path.write_bytes(bytes(data))
    store = open_store(uri)
    with pytest.warns(ServingIndexWarning, match="damaged"):
        answers = [store.best(target=SKYLAKE, **query) for query in QUERIES]
    assert answers == in_memory_answers(uri)
    (rebuilt,) = index_files(root)
    assert PersistedIndex(str(rebuilt), "llvm_cpu").rows == SERVING_ROWS


def test_records_with_ids_of_their_own_are_answered_from_the_index_without_a_warning(root, recwarn):
    uri = f"parquet:{root}"
    writer = open_store(uri)
    writer.commit([record.with_changes(record_id=f"mine-{number}")
                   for number, record in enumerate(workload_records("conv#a", 4))])
    writer.build_serving_indexes()
    store = open_store(uri)
    for _ in range(3):
        best = store.best("conv#a", SKYLAKE, k=2)
        assert [record.record_id for record in best] == ["mine-0", "mine-1"]
    assert isinstance(store._indexes["llvm_cpu"], PersistedIndex)
    assert not [warning for warning in recwarn if issubclass(warning.category, ServingIndexWarning)]
    assert len(index_files(root)) == 1


def test_a_store_where_the_index_cannot_be_written_keeps_it_in_memory(root):
    uri = f"parquet:{root}"
    fill(uri)
    (root / "_index").write_text("not a directory")  # (a read-only store fails the same way)
    store = open_store(uri)
    store.best("conv#a", SKYLAKE)
    assert store.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)
    assert isinstance(store._indexes["llvm_cpu"], ServingIndex)
    assert not list((root / "_staging").glob("*.lsi.tmp"))


QUERY_CHILD = """
import json, sys
from lorien.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "pyarrow": "pyarrow" in sys.modules, "numpy": "numpy" in sys.modules}))
"""


def run_query(uri: str, *options: str) -> tuple[dict, list]:
    child = subprocess.run([sys.executable, "-c", QUERY_CHILD, "query", "--store", uri, "--format", "json",
                            *options], capture_output=True, text=True, check=True)
    *answer, summary = child.stdout.strip().splitlines()
    return json.loads(summary), json.loads("\n".join(answer))


def test_a_one_shot_query_answers_from_the_index_without_pyarrow_or_numpy(root):
    from lorien.quick_query import quick_best

    uri = f"parquet:{root}"
    fill(uri)
    options = ["--workload-key", "conv#a", "--target", SKYLAKE, "--nbest", "3"]
    before, slow_answer = run_query(uri, *options)  # no index yet: the store answers
    assert before["code"] == 0 and before["pyarrow"]
    open_store(uri).build_serving_indexes()
    after, quick_answer = run_query(uri, *options)
    assert after == {"code": 0, "pyarrow": False, "numpy": False}
    assert quick_answer == slow_answer and len(quick_answer) == 3
    # the same answers as the store's, query by query
    store = open_store(uri)
    for query in QUERIES:
        expected = store.best(target=SKYLAKE, **query)
        assert quick_best(uri, target=SKYLAKE, **query) == (expected or None)
    # deeper than the serving view, or after another commit: left to the store
    assert quick_best(uri, "conv#a", SKYLAKE, k=6) is None
    subprocess.run([sys.executable, "-c", COMMIT_FASTER, uri], check=True)
    assert quick_best(uri, "conv#a", SKYLAKE) is None
    newer, answer = run_query(uri, *options)
    assert newer["code"] == 0 and answer[0]["cost_us"] == pytest.approx(10.0)


@pytest.mark.parametrize("slice_rows", [4096, 3, 1])
def test_an_index_built_range_by_range_answers_as_one_built_at_once(root, monkeypatch, slice_rows):
    """Ranges of 5 rows, laid out ``slice_rows`` at a time: a group's rows after its first sit in
    other ranges and slices than its first row (whose strings they share)."""
    import lorien.serving_index as serving_index
    import lorien.warehouse.parquet.store as parquet_store

    monkeypatch.setattr(serving_index, "WRITE_SLICE_ROWS", slice_rows)

    uri = f"parquet:{root}"
    writer = open_store(uri)
    keys = [f"dense#{name}" for name in "abcdefghij"]
    for commit in range(4):  # every commit touches every key: the files overlap in key ranges
        records = [record for number, key in enumerate(keys)
                   for record in workload_records(key, 3, base_s=1e-3 * (1 + number), first_index=3 * commit)]
        records += workload_records("dense#c", 2, layout="NHWC", first_index=10 * commit)
        writer.commit(records, nbest=2)
    first, second = open_store(uri), open_store(uri)  # racing writers store the same records twice
    with first.transaction() as one, second.transaction() as two:
        one.add(workload_records("dense#k", 2))
        two.add(workload_records("dense#k", 2))
    monkeypatch.setattr(parquet_store, "INDEX_BUILD_ROWS", 5)
    built = open_store(uri).build_serving_indexes()
    assert built == {"llvm_cpu": 4 * (10 * 2 + 2) + 2}  # the records stored twice are indexed once
    (path,) = index_files(root)
    laid_out = path.read_bytes()
    path.unlink()
    monkeypatch.setattr(serving_index, "WRITE_SLICE_ROWS", 4096)
    open_store(uri).build_serving_indexes()
    assert path.read_bytes() == laid_out  # the same file, however it was sliced
    fresh = open_store(uri)
    queries = [{"workload_key": key, "k": 2} for key in [*keys, "dense#k"]] + [
        {"workload_key": "dense#c", "k": 2, "per_layout": True}, {"workload_key": "dense#", "k": 5, "prefix": True}]
    answers = [fresh.best(target=SKYLAKE, **query) for query in queries]
    assert isinstance(fresh._indexes["llvm_cpu"], PersistedIndex)
    memory = open_store(uri)
    memory._files.is_local = False
    assert answers == [memory.best(target=SKYLAKE, **query) for query in queries for _ in range(2)][1::2]
    assert [len(answer) for answer in answers] == [2] * 11 + [4, 5]


def test_the_index_build_holds_one_serving_file_open_at_a_time(root, monkeypatch):
    """The build keeps each row group's workload-key range, not every serving file's footer
    (statistics of every column of every row group: they grew with the store, 55 MiB for 101
    files): a file is opened when a range reads it and closed before the next is opened."""
    import weakref

    import pyarrow.parquet as pq

    uri = f"parquet:{root}"
    writer = open_store(uri)
    keys = [f"dense#{name}" for name in "abcdefgh"]
    for commit in range(5):  # every commit touches every key: each range reads every file
        writer.commit([record for number, key in enumerate(keys)
                       for record in workload_records(key, 2, base_s=1e-3 * (1 + number), first_index=2 * commit)],
                      nbest=2)
    files, _depth = open_store(uri)._serving_files("llvm_cpu")
    assert len(files) >= 4
    live: set[int] = set()
    most = [0]
    opened = [0]

    class Counted(pq.ParquetFile):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            live.add(id(self))
            opened[0] += 1
            most[0] = max(most[0], len(live))
            weakref.finalize(self, live.discard, id(self))

        def close(self, *args, **kwargs):
            live.discard(id(self))
            return super().close(*args, **kwargs)

    import lorien.warehouse.parquet.store as parquet_store

    monkeypatch.setattr(pq, "ParquetFile", Counted)
    monkeypatch.setattr(parquet_store, "INDEX_BUILD_ROWS", 6)  # several ranges
    built = open_store(uri).build_serving_indexes()
    monkeypatch.undo()
    assert built == {"llvm_cpu": 5 * len(keys) * 2}
    assert opened[0] > len(files)  # ranges reopened the files they read
    assert most[0] == 1  # never two open at once (all of them at once before)
    fresh, memory = open_store(uri), open_store(uri)
    memory._files.is_local = False
    queries = [{"workload_key": key, "k": 2} for key in keys] + [{"workload_key": "dense#", "k": 3, "prefix": True}]
    answers = [fresh.best(target=SKYLAKE, **query) for query in queries]
    assert isinstance(fresh._indexes["llvm_cpu"], PersistedIndex)
    assert answers == [memory.best(target=SKYLAKE, **query) for query in queries]
    assert [len(answer) for answer in answers] == [2] * len(keys) + [3]


def age_serving_dirs(root: Path, seconds: float) -> None:
    """Date the serving directories' modification times ``seconds`` back."""
    import os
    import time

    for directory in (root / "best").iterdir():
        os.utime(directory, ns=(time.time_ns() - int(seconds * 1e9),) * 2)


def test_a_settled_listing_is_kept_until_its_directory_changes(root, monkeypatch):
    uri = f"parquet:{root}"
    fill(uri)
    age_serving_dirs(root, 10)
    reader = open_store(uri)
    assert reader.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)
    listings = []
    names = reader._files.names
    monkeypatch.setattr(reader._files, "names", lambda sub: listings.append(sub) or names(sub))
    for _ in range(3):
        assert reader.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)
    assert listings == []  # the directory's mtime said nothing changed
    subprocess.run([sys.executable, "-c", COMMIT_FASTER, uri], check=True)
    assert reader.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-5)
    assert listings  # the commit changed the directory: listed again


def test_a_listing_taken_just_after_a_change_is_not_kept(root, monkeypatch):
    """A file system stamps with a coarse clock: a second change in the same tick may leave the
    directory's mtime as it was, so a listing that recent is taken again on the next lookup."""
    import os

    from lorien.warehouse.parquet import store as parquet_store

    monkeypatch.setattr(parquet_store, "LISTING_SETTLE_NS", 3600 * 10**9)  # every listing is recent
    uri = f"parquet:{root}"
    fill(uri)
    reader = open_store(uri)
    assert reader.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)
    directory = next((root / "best").iterdir())
    before = os.stat(directory).st_mtime_ns
    subprocess.run([sys.executable, "-c", COMMIT_FASTER, uri], check=True)
    for changed in (root / "best").iterdir():
        os.utime(changed, ns=(before, before))  # the commit's change, unseen in the mtime
    assert reader.best("conv#a", SKYLAKE)[0].cost_s == pytest.approx(1e-5)


def test_a_string_repeated_down_a_group_is_stored_once(root):
    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    (path,) = index_files(root)
    data = path.read_bytes()
    header_len = struct.unpack_from("<Q", data, len(data) - 24)[0]
    header = json.loads(data[len(data) - 24 - header_len:len(data) - 24])
    at, length = header["sections"]["rows.data"]
    rows = data[at:at + length]
    index = PersistedIndex(str(path), "llvm_cpu")
    groups = [index.workload_key(start) for start in index.row_starts]
    assert groups.count("conv#bb") == 1 and index.rows == SERVING_ROWS
    assert rows.count(b'"conv#bb"') == 0 and rows.count(b"conv#bb") == 1  # 5 rows, one group
    assert store_answers(uri, "conv#bb") == in_memory_store_answers(uri, "conv#bb")


def store_answers(uri: str, workload_key: str) -> list:
    return open_store(uri).best(workload_key, SKYLAKE, k=5)


def in_memory_store_answers(uri: str, workload_key: str) -> list:
    store = open_store(uri)
    store._files.is_local = False
    return [store.best(workload_key, SKYLAKE, k=5) for _ in range(2)][1]


def test_an_index_of_another_format_version_is_rebuilt_without_a_warning(root, recwarn):
    from lorien.serving_index import TAIL, VERSION

    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    (path,) = index_files(root)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, len(data) - TAIL.size + 12, VERSION - 1)  # as an older Lorien wrote it
    path.write_bytes(bytes(data))
    store = open_store(uri)
    answers = [store.best(target=SKYLAKE, **query) for query in QUERIES for _ in range(2)][1::2]
    assert answers == in_memory_answers(uri)
    assert not [warning for warning in recwarn if issubclass(warning.category, ServingIndexWarning)]
    (rebuilt,) = index_files(root)
    assert struct.unpack_from("<I", rebuilt.read_bytes(), rebuilt.stat().st_size - TAIL.size + 12)[0] == VERSION


def test_the_group_arrays_are_read_at_open_and_lookups_do_not_touch_them_in_the_file(root):
    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    (path,) = index_files(root)
    store = open_store(uri)
    expected = [store.best(target=SKYLAKE, **query) for query in QUERIES]
    assert isinstance(store._indexes["llvm_cpu"], PersistedIndex)
    data = path.read_bytes()
    header_len = struct.unpack_from("<Q", data, len(data) - 24)[0]
    header = json.loads(data[len(data) - 24 - header_len:len(data) - 24])
    with open(path, "r+b") as handle:  # in place: the open map sees it, a copy does not
        for name in ("group.hashes", "group.spans", "group.row_starts"):
            at, length = header["sections"][name]
            handle.seek(at)
            handle.write(b"\0" * length)
    assert [store.best(target=SKYLAKE, **query) for query in QUERIES] == expected


def test_a_store_opened_with_preload_asks_for_its_index_pages_at_once(root):
    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    preloading = open_store(f"{uri}?preload=true")
    answers = [preloading.best(target=SKYLAKE, **query) for query in QUERIES]
    how = preloading._indexes["llvm_cpu"].preloaded
    assert how in ("populated", "advised")
    release = tuple(int(part) for part in re.findall(r"\d+", platform.release())[:2])
    if sys.platform.startswith("linux") and release >= (5, 14):  # MADV_POPULATE_READ: read and mapped at open
        assert how == "populated"
    plain = open_store(uri)
    assert [plain.best(target=SKYLAKE, **query) for query in QUERIES] == answers
    assert not plain._indexes["llvm_cpu"].preloaded


def test_a_row_is_checked_against_its_record_id_the_first_time_it_is_returned_only(root, monkeypatch):
    import lorien.serving_index as serving_index

    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    checked = []
    check = serving_index.content_matches
    monkeypatch.setattr(serving_index, "content_matches", lambda row: checked.append(row["record_id"]) or check(row))
    store = open_store(uri)
    first = [store.best("conv#a", SKYLAKE, k=2) for _ in range(3)]
    assert first[0] == first[1] == first[2] and len(checked) == 2  # two rows, each hashed once
    assert store.best("conv#b", ZNVER) and len(checked) == 3  # a row not returned before is hashed


def test_a_lookup_decodes_whole_only_the_rows_it_returns(root, monkeypatch):
    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    store = open_store(uri)
    expected = store.best("conv#a", SKYLAKE)  # its groups: two layouts on SKYLAKE, one on another target
    decoded = []
    row = PersistedIndex.row
    monkeypatch.setattr(PersistedIndex, "row", lambda index, *args: decoded.append(args) or row(index, *args))
    assert store.best("conv#a", SKYLAKE) == expected
    assert len(decoded) == 1


def test_rows_with_strings_beyond_ascii_read_back_as_written(root):
    uri = f"parquet:{root}"
    records = [record.with_changes(source=f"réglage №{index} 調整", extra='{"note": "µs"}')
               for index, record in enumerate(workload_records("conv#é", 3, base_s=5e-4) + workload_records("conv#a", 2))]
    writer = open_store(uri)
    writer.commit(records)
    writer.build_serving_indexes()
    store = open_store(uri)
    for workload_key in ("conv#é", "conv#a"):
        answers = store.best(workload_key, SKYLAKE, k=3)
        assert isinstance(store._indexes["llvm_cpu"], PersistedIndex)
        assert answers == sorted((r for r in records if r.workload_key == workload_key), key=lambda r: r.cost_s)[:3]
    assert store.best("conv#", SKYLAKE, k=1, prefix=True, per_layout=True)[0].source == "réglage №0 調整"


def test_a_lookup_leaves_no_cyclic_garbage_for_the_collector(root):
    import gc

    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    store = open_store(uri)
    answers = [store.best(target=SKYLAKE, **query) for query in QUERIES]
    assert isinstance(store._indexes["llvm_cpu"], PersistedIndex)
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            assert [store.best(target=SKYLAKE, **query) for query in QUERIES] == answers
        assert gc.collect() == 0  # every object a lookup made was freed by its reference count
    finally:
        gc.enable()


def test_a_string_length_past_its_row_is_damage_even_where_only_keys_are_read(root):
    uri = f"parquet:{root}"
    fill(uri)
    open_store(uri).build_serving_indexes()
    (path,) = index_files(root)
    index = PersistedIndex(str(path), "llvm_cpu")
    record_id_length_at = struct.calcsize("<ddddqBI") + 4 * index.strings.index("record_id")
    data = bytearray(path.read_bytes())
    header_len = struct.unpack_from("<Q", data, len(data) - 24)[0]
    header = json.loads(data[len(data) - 24 - header_len:len(data) - 24])
    rows_at = header["sections"]["rows.data"][0]
    offsets_at = header["sections"]["rows.offsets"][0]
    for row in range(index.rows):  # every row's record_id now runs past the row
        start = struct.unpack_from("<q", data, offsets_at + 8 * row)[0]
        struct.pack_into("<I", data, rows_at + start + record_id_length_at, 1 << 20)
    index.close()
    path.write_bytes(bytes(data))
    store = open_store(uri)
    with pytest.warns(ServingIndexWarning, match="damaged"):
        answers = [store.best(target=SKYLAKE, **query) for query in QUERIES]
    assert answers == in_memory_answers(uri)


def test_a_store_uri_option_that_is_not_yes_or_no_is_an_error_naming_it(root):
    from lorien.errors import StoreError

    for option in ("preload=maybe", "fsync=2"):
        with pytest.raises(StoreError, match=re.escape(option.replace("=", "='") + "' is not a yes/no value")):
            open_store(f"parquet:{root}?{option}")
    for option in ("preload=true", "preload=0", "fsync=no", "fsync=YES"):
        open_store(f"parquet:{root}?{option}").close()
