"""The record model: identity, derived values and the Arrow round trip."""

import math

from lorien.record import ARROW_SCHEMA, ErrorNo, TuningRecord, records_to_table, table_to_records


def make_record(**overrides) -> TuningRecord:
    values = dict(
        dialect="autotvm",
        target="llvm -keys=cpu -mcpu=znver3",
        target_key="llvm_cpu",
        workload_key="dense_nopack.x86#_TENSOR__64_64__float32_#_TENSOR__64_64__float32_#None#float32",
        task_name="dense_nopack.x86",
        args='[["TENSOR",[64,64],"float32"],["TENSOR",[64,64],"float32"],null,"float32"]',
        layout="NA",
        config='{"index":3,"code_hash":null,"entity":[["tile_y","sp",[8,8]]]}',
        costs=[2e-5, 4e-5],
        flop=2 * 64 * 64 * 64,
        timestamp=1700000000.0,
    )
    values.update(overrides)
    return TuningRecord(**values)


def test_equal_content_gives_equal_record_ids():
    assert make_record().record_id == make_record().record_id


def test_a_different_cost_gives_a_different_record_id():
    assert make_record().record_id != make_record(costs=[3e-5]).record_id


def test_cost_and_gflops_of_a_valid_record():
    record = make_record()
    assert math.isclose(record.cost_s, 3e-5)
    assert math.isclose(record.gflops, 2 * 64**3 / 3e-5 / 1e9)


def test_failed_record_has_no_cost_and_no_gflops():
    record = make_record(error_no=int(ErrorNo.WRONG_ANSWER), costs=[1e10])
    assert record.cost_s is None
    assert record.gflops is None
    assert not record.is_valid


def test_unknown_flop_gives_unknown_gflops():
    assert make_record(flop=None).gflops is None


def test_records_survive_the_arrow_round_trip():
    records = [make_record(), make_record(costs=[1e-3], error_no=int(ErrorNo.RUN_TIMEOUT))]
    table = records_to_table(records)
    assert table.schema.equals(ARROW_SCHEMA)
    assert table.column("cost_s").to_pylist() == [records[0].cost_s, None]
    assert table_to_records(table) == records


def test_with_changes_recomputes_the_record_id():
    record = make_record()
    changed = record.with_changes(costs=[1.0])
    assert changed.record_id != record.record_id
    assert changed.record_id == make_record(costs=[1.0]).record_id


def test_target_raw_defaults_to_target():
    assert make_record().target_raw == "llvm -keys=cpu -mcpu=znver3"
    assert make_record(target_raw="llvm -mcpu=znver3").target_raw == "llvm -mcpu=znver3"


def test_flop_and_cost_columns_are_nullable_in_the_schema():
    assert ARROW_SCHEMA.field("flop").nullable
    assert ARROW_SCHEMA.field("cost_s").nullable
    assert not ARROW_SCHEMA.field("record_id").nullable


def test_measured_target_is_the_target_on_the_threads_the_build_names():
    """A meta_schedule job times on TVM's runtime threads (its build says threads 1 on a 2-CPU
    x86-64 host): timing its config again means timing it on as many."""
    assert make_record(build='{"threads": 1, "measured_by": "lorien"}').measured_target == \
        "llvm -keys=cpu -mcpu=znver3 -num-cores=1"
    assert make_record(build='{"threads": 2}').measured_threads == 2
    assert make_record(build="").measured_target is None  # an ingested log line: nothing said
    assert make_record(build="not json").measured_target is None
    assert make_record(build='{"threads": true}').measured_threads is None
    assert make_record(build='{"threads": 1}', target="llvm -num-cores=4").measured_target is None  # the target says
