"""The contract every warehouse backend keeps, run against each backend.

A backend joins by adding a factory to ``BACKENDS``: a function of the pytest ``request``
that returns a fresh, empty store URI.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from lorien.errors import TargetError
from lorien.record import ARROW_SCHEMA, TuningRecord, records_to_table
from lorien.target import parse_target
from lorien.warehouse import open_store

SKYLAKE = "llvm -mcpu=skylake-avx512"
ZNVER = "llvm -mcpu=znver3"
CUDA = "cuda -model=titanx"


def make_record(workload_key: str, cost_s: float, target: str = SKYLAKE, layout: str = "NCHW",
                error_no: int = 0, config_index: int = 0) -> TuningRecord:
    """A small AutoTVM-like record; ``config_index`` makes otherwise equal records distinct."""
    parsed = parse_target(target)
    task_name = workload_key.split("#", 1)[0]
    return TuningRecord(
        dialect="autotvm", target=parsed.canonical, target_key=parsed.alternate_key, target_raw=target,
        workload_key=workload_key, task_name=task_name, args='[["TENSOR", [1, 64], "float32"]]',
        layout=layout, config=f'{{"index": {config_index}, "entity": []}}',
        costs=[cost_s, cost_s], error_no=error_no, all_cost=1.5, timestamp=1.6e9 + config_index,
        flop=1e6, build='{"engine": "test"}', extra='{"version": 0.2}', source="contract",
    )


def workload_records(workload_key: str, count: int, target: str = SKYLAKE, layout: str = "NCHW",
                     base_s: float = 1e-3, first_index: int = 0) -> list[TuningRecord]:
    """``count`` records whose cost rises with the config index (index 0 is the fastest)."""
    return [make_record(workload_key, base_s * (1 + index), target, layout, config_index=index)
            for index in range(first_index, first_index + count)]


def _local_uri(request: pytest.FixtureRequest) -> str:
    tmp_path = request.getfixturevalue("tmp_path")
    return f"parquet:{tmp_path / 'warehouse'}"


def _s3_uri(request: pytest.FixtureRequest) -> str:
    endpoint = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    return f"parquet:s3://{bucket}/warehouse?endpoint_url={endpoint}&region=us-east-1"


def _dynamodb_uri(request: pytest.FixtureRequest) -> str:
    import uuid

    endpoint = request.getfixturevalue("moto_server")
    return f"dynamodb:lorien-{uuid.uuid4().hex[:12]}?endpoint_url={endpoint}&region=us-west-2&create=1"


BACKENDS = {
    "parquet-local": _local_uri,
    "parquet-s3": _s3_uri,
    "dynamodb": _dynamodb_uri,
}


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest):
    with open_store(BACKENDS[request.param](request)) as opened:
        yield opened


def test_best_returns_fastest_valid_records_first(store):
    store.commit(workload_records("dense#a", 6)[::-1])
    best = store.best("dense#a", SKYLAKE, k=3)
    assert [record.cost_s for record in best] == pytest.approx([1e-3, 2e-3, 3e-3])


def test_best_skips_failed_records(store):
    failed = make_record("dense#a", 1e-6, error_no=4, config_index=99)
    store.commit([failed, *workload_records("dense#a", 2)])
    best = store.best("dense#a", SKYLAKE, k=5)
    assert [record.error_no for record in best] == [0, 0]
    assert failed.record_id not in {record.record_id for record in best}


def test_best_returns_records_equal_to_the_committed_ones(store):
    records = workload_records("dense#a", 3)
    store.commit(records)
    assert store.best("dense#a", SKYLAKE, k=1) == [records[0]]


def test_best_accepts_any_spelling_of_the_target(store):
    store.commit(workload_records("dense#a", 2))
    assert len(store.best("dense#a", "llvm -keys=cpu -mcpu=skylake-avx512", k=2)) == 2
    assert len(store.best("dense#a", '{"kind": "llvm", "mcpu": "skylake-avx512"}', k=2)) == 2


def test_best_of_an_unknown_workload_is_empty(store):
    store.commit(workload_records("dense#a", 2))
    assert store.best("dense#missing", SKYLAKE) == []
    assert store.best("dense#a", ZNVER) == []


def test_best_of_an_empty_store_is_empty(store):
    assert store.best("dense#a", SKYLAKE) == []


def test_best_with_an_unparseable_target_raises_target_error(store):
    with pytest.raises(TargetError, match="nosuchkind"):
        store.best("dense#a", "nosuchkind -mcpu=x")


def test_committing_the_same_records_twice_stores_them_once(store):
    records = workload_records("dense#a", 4)
    first = store.commit(records)
    second = store.commit(records)
    assert (first.stored, first.duplicates) == (4, 0)
    assert (second.stored, second.duplicates) == (0, 4)
    assert store.scan().num_rows == 4
    assert len(store.best("dense#a", SKYLAKE, k=10)) == 4


def test_duplicates_inside_one_commit_are_stored_once(store):
    records = workload_records("dense#a", 2)
    result = store.commit(records + records)
    assert (result.received, result.stored, result.duplicates) == (4, 2, 2)
    assert store.scan().num_rows == 2


def test_commit_accepts_an_arrow_table(store):
    store.commit(records_to_table(workload_records("dense#a", 3)))
    assert store.best("dense#a", SKYLAKE)[0].cost_s == pytest.approx(1e-3)


def test_serving_view_keeps_the_true_best_nbest_across_commits(store):
    store.commit(workload_records("dense#a", 10, first_index=5), nbest=3)
    store.commit(workload_records("dense#a", 5, first_index=0), nbest=3)
    best = store.best("dense#a", SKYLAKE, k=3)
    assert [record.cost_s for record in best] == pytest.approx([1e-3, 2e-3, 3e-3])


def test_layout_restricts_best_to_one_layout(store):
    store.commit(workload_records("conv#a", 3, layout="NCHW") +
                 workload_records("conv#a", 3, layout="NHWC", base_s=1e-4))
    best = store.best("conv#a", SKYLAKE, k=2, layout="NCHW")
    assert {record.layout for record in best} == {"NCHW"}
    assert best[0].cost_s == pytest.approx(1e-3)


def test_best_without_layout_ranks_all_layouts_together(store):
    store.commit(workload_records("conv#a", 3, layout="NCHW") +
                 workload_records("conv#a", 3, layout="NHWC", base_s=1.5e-3))
    best = store.best("conv#a", SKYLAKE, k=3)
    assert [record.layout for record in best] == ["NCHW", "NHWC", "NCHW"]


def test_per_layout_returns_the_best_k_of_each_layout(store):
    store.commit(workload_records("conv#a", 4, layout="NCHW") +
                 workload_records("conv#a", 4, layout="NCHW8c", base_s=1e-4))
    best = store.best("conv#a", SKYLAKE, k=2, per_layout=True)
    assert [(record.layout, record.cost_s) for record in best] == [
        ("NCHW8c", pytest.approx(1e-4)), ("NCHW8c", pytest.approx(2e-4)),
        ("NCHW", pytest.approx(1e-3)), ("NCHW", pytest.approx(2e-3))]


def test_by_alternate_key_matches_every_target_of_the_family(store):
    store.commit(workload_records("dense#a", 2, target=SKYLAKE) +
                 workload_records("dense#a", 2, target=ZNVER, base_s=1e-4) +
                 workload_records("dense#a", 2, target=CUDA, base_s=1e-6))
    exact = store.best("dense#a", SKYLAKE, k=10)
    family = store.best("dense#a", SKYLAKE, k=10, by_alternate_key=True)
    assert {record.target for record in exact} == {parse_target(SKYLAKE).canonical}
    assert {record.target for record in family} == {parse_target(SKYLAKE).canonical,
                                                     parse_target(ZNVER).canonical}
    assert family[0].cost_s == pytest.approx(1e-4)


HOST = "llvm -keys=cpu -mcpu=znver4"
HOST_2CORES = "llvm -keys=cpu -mcpu=znver4 -num-cores=2"


def test_a_bare_kind_finds_records_tuned_on_a_specific_cpu(store):
    store.commit(workload_records("dense#a", 2, target=HOST))
    best = store.best("dense#a", "llvm", k=5)
    assert [record.target for record in best] == [parse_target(HOST).canonical] * 2


def test_a_query_naming_an_option_needs_stored_targets_with_that_value(store):
    store.commit(workload_records("dense#a", 2, target=HOST) + workload_records("dense#a", 2, target=SKYLAKE))
    assert {record.target for record in store.best("dense#a", "llvm -mcpu=znver4", k=10)} == {
        parse_target(HOST).canonical}
    assert store.best("dense#a", "llvm -mcpu=haswell", k=10) == []
    assert store.best("dense#a", "cuda", k=10) == []


def test_the_query_s_own_target_comes_before_other_matches_then_cost_decides(store):
    store.commit(workload_records("dense#a", 2, target=HOST_2CORES, base_s=1e-5) +
                 workload_records("dense#a", 2, target=HOST, base_s=1e-3) +
                 workload_records("dense#a", 2, target="llvm -mcpu=znver4 -num-cores=4", base_s=1e-4))
    best = store.best("dense#a", HOST, k=6)
    assert [(parse_target(record.target).get("num-cores"), record.cost_s) for record in best] == [
        (None, pytest.approx(1e-3)), (None, pytest.approx(2e-3)),
        (2, pytest.approx(1e-5)), (2, pytest.approx(2e-5)),
        (4, pytest.approx(1e-4)), (4, pytest.approx(2e-4))]


def test_exact_takes_only_the_query_s_own_target(store):
    store.commit(workload_records("dense#a", 2, target=HOST_2CORES))
    assert store.best("dense#a", HOST, k=5, exact=True) == []
    assert len(store.best("dense#a", HOST_2CORES, k=5, exact=True)) == 2
    with pytest.raises(TargetError):
        store.best("dense#a", HOST, exact=True, by_alternate_key=True)


def test_per_layout_answers_follow_the_target_match_too(store):
    store.commit(workload_records("conv#a", 2, target=HOST, layout="NCHW") +
                 workload_records("conv#a", 2, target=SKYLAKE, layout="NCHW8c", base_s=1e-5))
    best = store.best("conv#a", "llvm", k=1, per_layout=True)
    assert [(record.layout, record.cost_s) for record in best] == [
        ("NCHW8c", pytest.approx(1e-5)), ("NCHW", pytest.approx(1e-3))]


def test_prefix_matches_every_workload_starting_with_the_key(store):
    store.commit(workload_records("dense.x86#a", 2) + workload_records("dense.x86#b", 2, base_s=1e-4) +
                 workload_records("conv2d.x86#a", 2, base_s=1e-6))
    best = store.best("dense.x86#", SKYLAKE, k=3, prefix=True)
    assert [record.workload_key for record in best] == ["dense.x86#b", "dense.x86#b", "dense.x86#a"]


def test_scan_returns_an_arrow_table_in_the_record_schema(store):
    store.commit(workload_records("dense#a", 3))
    table = store.scan()
    assert isinstance(table, pa.Table)
    assert table.schema.names == ARROW_SCHEMA.names
    assert table.num_rows == 3


def test_scan_filters_by_column_values(store):
    store.commit(workload_records("dense#a", 3) + workload_records("dense#b", 2) +
                 workload_records("dense#a", 4, target=CUDA))
    assert store.scan({"workload_key": "dense#a"}).num_rows == 7
    assert store.scan({"workload_key": "dense#a", "target": SKYLAKE}).num_rows == 3
    assert store.scan({"workload_key": ["dense#a", "dense#b"], "target_key": "llvm_cpu"}).num_rows == 5


def test_scan_projects_columns(store):
    store.commit(workload_records("dense#a", 3))
    table = store.scan(columns=["workload_key", "cost_s"])
    assert table.column_names == ["workload_key", "cost_s"]


def test_workloads_lists_distinct_keys_of_a_target(store):
    store.commit(workload_records("dense#a", 2) + workload_records("dense#b", 2) +
                 workload_records("conv#c", 1, target=CUDA))
    assert store.workloads(SKYLAKE) == ["dense#a", "dense#b"]
    assert store.workloads() == ["conv#c", "dense#a", "dense#b"]


def test_stats_counts_records_valid_records_workloads_and_targets(store):
    store.commit(workload_records("dense#a", 3) + [make_record("dense#b", 1.0, error_no=2)] +
                 workload_records("dense#a", 1, target=CUDA))
    stats = store.stats()
    assert (stats["records"], stats["valid_records"], stats["workloads"], stats["targets"]) == (5, 4, 2, 2)


def test_two_handles_on_one_store_see_each_others_commits(store):
    with open_store(store.uri) as other:
        assert other.best("dense#a", SKYLAKE) == []
        store.commit(workload_records("dense#a", 2, base_s=2e-3))
        other.commit(workload_records("dense#a", 2, first_index=10, base_s=1e-4))
        assert other.best("dense#a", SKYLAKE, k=4) == store.best("dense#a", SKYLAKE, k=4)
        assert len(store.best("dense#a", SKYLAKE, k=4)) == 4


def test_compaction_keeps_every_answer(store):
    for index in range(4):
        store.commit(workload_records("dense#a", 3, first_index=3 * index) +
                     workload_records("conv#b", 2, layout="NHWC", first_index=2 * index), nbest=4)
    before = (store.best("dense#a", SKYLAKE, k=4), store.best("conv#b", SKYLAKE, k=2, per_layout=True),
              sorted(store.scan().column("record_id").to_pylist()), store.workloads(SKYLAKE))
    store.compact()
    after = (store.best("dense#a", SKYLAKE, k=4), store.best("conv#b", SKYLAKE, k=2, per_layout=True),
             sorted(store.scan().column("record_id").to_pylist()), store.workloads(SKYLAKE))
    assert after == before


def test_workload_entries_are_kept_once_and_read_back_by_hash(store):
    entries = {"0" * 31 + "1": '["123", {"module": "a"}]', "f" * 32: '["456", {"module": "' + "b" * 30000 + '"}]'}
    assert store.get_workloads(entries) == {}
    assert store.put_workloads(entries) == 2
    assert store.put_workloads(entries) == 0  # content-addressed: nothing new
    assert store.get_workloads(["f" * 32, "0" * 31 + "1", "e" * 32]) == entries
    store.commit(workload_records("dense#a", 2))
    assert store.workloads() == ["dense#a"]  # entries are not records
    assert store.scan().num_rows == 2
    assert store.stats()["workloads"] == 1
