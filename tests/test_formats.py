"""The log codecs: detection, lossless round trips of every shared log, columnar reading, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pytest

from lorien.errors import RecordParseError, UnknownFormatError
from lorien.formats import (
    decode_line,
    detect_format,
    encode_record,
    iter_log_tables,
    read_log,
    write_log,
)
from lorien.formats.synthetic import make_autotvm_log
from lorien.record import ARROW_SCHEMA, TuningRecord, compute_record_id, table_to_records

TOPHUB = ["cuda_v0.10.log", "llvm_v0.04.log", "rocm_v0.05.log", "vta_v0.10.log"]
ANSOR = ["conv2d.json", "matmul.json", "resnet-50-NHWC-B1-llvm.json"]
META = ["conv_56_64", "matmul_128"]
SHARED_LOGS = [("tophub", name, "autotvm") for name in TOPHUB] + \
              [("ansor", name, "ansor") for name in ANSOR] + \
              [("meta_schedule", name, "meta_schedule") for name in META]

TOPHUB_LINE = ('{"input": ["llvm -mcpu=skylake-avx512", "conv2d_NCHWc.x86", [["TENSOR", [1, 3, 224, 224], "float32"], '
               '["TENSOR", [64, 3, 7, 7], "float32"], [2, 2], [3, 3, 3, 3], [1, 1], "NCHW", "NCHW", "float32"], {}], '
               '"config": {"index": 193, "code_hash": null, "entity": [["tile_ic", "sp", [1, 3]], ["tile_oc", "sp", [2, 32]], '
               '["tile_ow", "sp", [14, 8]], ["unroll_kw", "ot", false]]}, "result": [[9.593498664366054e-05], 0, '
               '1.757516860961914, 1539972731.352305], "version": 0.2, "tvm_version": "0.7.dev0"}')


def json_lines(path: Path) -> list[object]:
    return [json.loads(line) for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# ---------------------------------------------------------------- detection

@pytest.mark.parametrize(("folder", "name", "fmt"), SHARED_LOGS)
def test_detect_format_recognises_every_shared_log(shared_data, folder, name, fmt):
    assert detect_format(shared_data / folder / name) == fmt


def test_either_file_of_a_metaschedule_pair_names_the_database(shared_data):
    database = shared_data / "meta_schedule" / "matmul_128"
    assert detect_format(database / "database_tuning_record.json") == "meta_schedule"
    assert len(read_log(database / "database_workload.json").records) == 32


def test_detect_format_refuses_a_text_file_naming_it(tmp_path):
    path = write_lines(tmp_path / "notes.log", ["hello", '{"some": "json"}'])
    with pytest.raises(UnknownFormatError, match="notes.log"):
        detect_format(path)


def test_detect_format_refuses_an_empty_or_comment_only_file(tmp_path):
    path = write_lines(tmp_path / "empty.log", ["# nothing here"])
    with pytest.raises(UnknownFormatError, match="empty.log"):
        read_log(path)


def test_detect_format_refuses_a_missing_path(tmp_path):
    with pytest.raises(UnknownFormatError, match="missing.log"):
        detect_format(tmp_path / "missing.log")


def test_a_directory_without_the_database_pair_is_refused(tmp_path):
    (tmp_path / "database_tuning_record.json").write_text("")
    with pytest.raises(UnknownFormatError, match="needs database_workload.json"):
        detect_format(tmp_path)


def test_an_unknown_format_name_is_refused(shared_data):
    with pytest.raises(UnknownFormatError, match="'tflite'"):
        read_log(shared_data / "tophub" / "llvm_v0.04.log", format="tflite")


# ---------------------------------------------------------------- lossless round trips

@pytest.mark.parametrize(("folder", "name", "fmt"), SHARED_LOGS)
def test_read_then_write_gives_json_equal_lines(shared_data, tmp_path, folder, name, fmt):
    source = shared_data / folder / name
    result = read_log(source)
    assert result.errors == [] and result.format == fmt
    if fmt == "meta_schedule":
        write_log(result.records, fmt, tmp_path / "db")
        for file_name in ("database_workload.json", "database_tuning_record.json"):
            assert json_lines(tmp_path / "db" / file_name) == json_lines(source / file_name)
    else:
        assert write_log(result.records, fmt, tmp_path / name) == len(result.records)
        assert json_lines(tmp_path / name) == json_lines(source)


@pytest.mark.parametrize("name", TOPHUB)
def test_tophub_lines_are_written_back_byte_for_byte(shared_data, name):
    source = shared_data / "tophub" / name
    lines = [line for line in source.read_text().splitlines() if not line.startswith("#")]
    assert [encode_record(record, "autotvm") for record in read_log(source).records] == lines


def test_rocm_log_of_exactly_128_kib_ends_in_a_complete_line(shared_data):
    source = shared_data / "tophub" / "rocm_v0.05.log"
    assert source.stat().st_size == 131072 and source.read_bytes().endswith(b"}\n")
    result = read_log(source)
    assert (len(result.records), result.errors) == (217, [])


def test_autotvm_records_carry_readable_key_layout_flop_and_canonical_target(shared_data):
    record = read_log(shared_data / "tophub" / "llvm_v0.04.log").records[0]
    assert record.dialect == "autotvm"
    assert record.workload_key.startswith("conv2d_NCHWc.x86#_TENSOR__1_3_224_224__float32_#")
    assert (record.layout, record.flop) == ("NCHW", 2.0 * 64 * 112 * 112 * 3 * 49)
    assert record.target_raw == "llvm -mcpu=skylake-avx512"
    assert record.target == "llvm -keys=cpu -mcpu=skylake-avx512" and record.target_key == "llvm_cpu"
    assert orjson.loads(record.config)["entity"][0] == ["tile_ic", "sp", [1, 3]]
    assert orjson.loads(record.extra) == {"input_kwargs": {}, "version": 0.2, "tvm_version": "0.7.dev0"}


def test_auto_scheduler_records_keep_the_workload_key_and_task_fields(shared_data):
    record = read_log(shared_data / "ansor" / "resnet-50-NHWC-B1-llvm.json").records[0]
    assert record.dialect == "auto_scheduler"
    assert record.workload_key == '["d7b65649a4dd54becea0a52aabbc5af5", 1, 1000, 1, 1000]'
    assert record.task_name == "d7b65649a4dd54becea0a52aabbc5af5" and record.flop is None
    assert orjson.loads(record.extra) == {"v": "v0.5", "hardware_params": [8, 64, 64, 0, 0, 0, 0, 0],
                                          "target_host": "", "layout_rewrite_option": 2}
    matmul = read_log(shared_data / "ansor" / "matmul.json").records[0]
    assert matmul.flop == 2.0 * 1024**3 + 1024**2 and matmul.gflops is not None


def test_metaschedule_records_take_flop_and_task_from_the_workload_module(shared_data):
    records = read_log(shared_data / "meta_schedule" / "conv_56_64").records
    assert {r.workload_key for r in records} == {"7945140434223946842"}
    assert records[0].task_name == "conv" and records[0].flop == 2.0 * 56 * 56 * 64 * 64 * 9
    assert records[0].target == "llvm -keys=cpu -mcpu=znver3 -num-cores=2"
    matmul = read_log(shared_data / "meta_schedule" / "matmul_128").records[0]
    assert (matmul.task_name, matmul.flop) == ("C", 2.0 * 128**3)


def test_metaschedule_long_float_strings_compare_equal_after_round_trip(shared_data, tmp_path):
    source = shared_data / "meta_schedule" / "matmul_128"
    assert "0.00030941172222222223555" in (source / "database_tuning_record.json").read_text()
    records = read_log(source).records
    assert records[0].costs == [0.00030941172222222223555]
    write_log(records, "meta_schedule", tmp_path)
    assert json.loads((tmp_path / "database_tuning_record.json").read_text().splitlines()[0])[1][1] == \
        [0.00030941172222222223555]


def test_autotvm_v01_lines_are_read_and_written_back(tmp_path):
    line = {"i": ["llvm -mcpu=core-avx2", "topi_nn_dense", [["TENSOR", [1, 512], "float32"], ["TENSOR", [1000, 512], "float32"],
                  None, "float32"], {}, ["dense", [1, 512], [1000, 512]],
                  {"i": 7, "t": "direct", "c": None, "e": [["tile_x", "sp", [8, 125]]]}],
            "r": [[0.0001], 0, 0.5, 1540000000.0], "v": 0.1}
    path = write_lines(tmp_path / "old.log", [json.dumps(line)])
    result = read_log(path)
    assert result.format == "autotvm" and result.errors == []
    assert orjson.loads(result.records[0].config) == {"index": 7, "code_hash": None, "entity": [["tile_x", "sp", [8, 125]]]}
    write_log(result.records, "autotvm", tmp_path / "back.log")
    assert json_lines(tmp_path / "back.log") == [line]


def test_key_order_and_spacing_do_not_change_the_record():
    compact = orjson.dumps(dict(reversed(list(json.loads(TOPHUB_LINE).items())))).decode()
    reordered, original = decode_line(compact, "autotvm"), decode_line(TOPHUB_LINE, "autotvm")
    assert orjson.loads(reordered.extra) == orjson.loads(original.extra)
    assert reordered.with_changes(extra=original.extra) == original


def test_records_made_outside_a_log_are_written_as_version_0_2():
    source = decode_line(TOPHUB_LINE, "autotvm")
    record = TuningRecord(dialect="autotvm", target=source.target, target_key=source.target_key,
                          workload_key=source.workload_key, task_name=source.task_name, args=source.args,
                          layout=source.layout, config=source.config, costs=[1e-4], timestamp=5.0)
    line = json.loads(encode_record(record, "autotvm"))
    assert line["version"] == 0.2 and line["input"][1] == "conv2d_NCHWc.x86"
    assert line["result"] == [[1e-4], 0, 0.0, 5.0]


# ---------------------------------------------------------------- columnar reading

@pytest.mark.parametrize(("folder", "name", "fmt"), SHARED_LOGS)
def test_tables_hold_exactly_the_records_read_log_gives(shared_data, folder, name, fmt):
    source = shared_data / folder / name
    tables = list(iter_log_tables(source, batch_size=100))
    assert all(table.schema == ARROW_SCHEMA for table, _ in tables)
    assert [r for table, _ in tables for r in table_to_records(table)] == read_log(source).records


def test_table_record_ids_are_content_hashes(shared_data):
    table, _ = next(iter_log_tables(shared_data / "tophub" / "vta_v0.10.log"))
    for row in table.to_pylist():
        assert row["record_id"] == compute_record_id(row["dialect"], row["target"], row["workload_key"], row["layout"],
                                                     row["config"], row["costs"], row["error_no"], row["timestamp"])


def test_table_cost_column_is_the_mean_of_valid_records_only(tmp_path):
    failed = json.loads(TOPHUB_LINE)
    failed["result"] = [[1e9], 4, 3.0, 1.0]
    several = json.loads(TOPHUB_LINE)
    several["result"][0] = [0.1, 0.2, 0.4]
    path = write_lines(tmp_path / "mixed.log", [TOPHUB_LINE, json.dumps(failed), json.dumps(several)])
    table, _ = next(iter_log_tables(path))
    assert table.column("cost_s").to_pylist() == [9.593498664366054e-05, None, (0.1 + 0.2 + 0.4) / 3]


def test_batch_size_bounds_each_table(shared_data):
    sizes = [table.num_rows for table, _ in iter_log_tables(shared_data / "tophub" / "cuda_v0.10.log", batch_size=300)]
    assert sizes == [300, 300, 225]


def test_synthetic_log_varies_workloads_and_measurements(shared_data, tmp_path):
    path = tmp_path / "synthetic.log"
    make_autotvm_log(sorted((shared_data / "tophub").glob("*.log")), path, 3000, batch_sizes=(1, 2))
    records = read_log(path).records
    assert len(records) == 3000 and len({r.record_id for r in records}) == 3000
    assert {orjson.loads(r.args)[0][1][0] for r in records} == {1, 2}


# ---------------------------------------------------------------- bad input

def test_bad_json_line_is_reported_with_file_and_line_and_skipped(tmp_path):
    path = write_lines(tmp_path / "bad.log", ["# header", TOPHUB_LINE, "{not json", TOPHUB_LINE])
    result = read_log(path)
    assert len(result.records) == 2 and len(result.errors) == 1
    assert (result.errors[0].path, result.errors[0].line) == (str(path), 3)
    assert str(result.errors[0]).startswith(f"{path}:3: malformed or truncated JSON")


def test_truncated_last_line_is_reported_and_nothing_of_it_is_kept(shared_data, tmp_path):
    data = (shared_data / "tophub" / "rocm_v0.05.log").read_bytes()
    path = tmp_path / "rocm_truncated.log"
    path.write_bytes(data[: len(data) - 40])
    result = read_log(path)
    assert len(result.records) == 216
    assert [(e.line, "truncated" in str(e)) for e in result.errors] == [(217, True)]
    tables = list(iter_log_tables(path))
    assert sum(t.num_rows for t, _ in tables) == 216 and [e.line for _, errs in tables for e in errs] == [217]


def test_unknown_target_in_a_record_is_a_parse_error(tmp_path):
    line = TOPHUB_LINE.replace("llvm -mcpu=skylake-avx512", "quantum -qubits=5")
    path = write_lines(tmp_path / "target.log", [TOPHUB_LINE, line])
    for errors in (read_log(path).errors, [e for _, errs in iter_log_tables(path) for e in errs]):
        assert len(errors) == 1 and errors[0].line == 2 and "quantum" in str(errors[0])


@pytest.mark.parametrize("result", ['[["slow"], 0, 1.0, 2.0]', "[[0.1], 0, 1.0]", '[[0.1], "0", 1.0, 2.0]'])
def test_malformed_result_is_a_parse_error(tmp_path, result):
    line = TOPHUB_LINE.replace('[[9.593498664366054e-05], 0, 1.757516860961914, 1539972731.352305]', result)
    path = write_lines(tmp_path / "result.log", [TOPHUB_LINE, line])
    assert [e.line for e in read_log(path).errors] == [2]
    assert [e.line for _, errs in iter_log_tables(path) for e in errs] == [2]


def test_strict_mode_raises_the_first_bad_line(tmp_path):
    path = write_lines(tmp_path / "strict.log", [TOPHUB_LINE, "{broken", "[1, 2"])
    with pytest.raises(RecordParseError, match=r"strict\.log:2:"):
        read_log(path, strict=True)
    with pytest.raises(RecordParseError, match=r"strict\.log:2:"):
        list(iter_log_tables(path, strict=True))


def test_strict_mode_refuses_bad_auto_scheduler_lines(shared_data, tmp_path):
    lines = (shared_data / "ansor" / "matmul.json").read_text().splitlines()
    path = write_lines(tmp_path / "ansor.json", [*lines, lines[-1][:60]])
    assert [e.line for e in read_log(path).errors] == [3]
    with pytest.raises(RecordParseError, match=r"ansor\.json:3:"):
        read_log(path, strict=True)


def test_metaschedule_record_with_unknown_workload_index_is_reported(shared_data, tmp_path):
    database = tmp_path / "db"
    shutil.copytree(shared_data / "meta_schedule" / "matmul_128", database)
    record_file = database / "database_tuning_record.json"
    lines = record_file.read_text().splitlines()
    lines[1] = "[5" + lines[1][2:]
    record_file.write_text("\n".join(lines) + "\n")
    result = read_log(database)
    assert len(result.records) == 31
    assert [(e.path, e.line) for e in result.errors] == [(str(record_file), 2)] and "index 5" in str(result.errors[0])
    with pytest.raises(RecordParseError, match="database_tuning_record.json:2:"):
        read_log(database, strict=True)


def test_metaschedule_line_decodes_only_with_its_database(shared_data):
    database = shared_data / "meta_schedule" / "matmul_128"
    line = (database / "database_tuning_record.json").read_text().splitlines()[0]
    assert decode_line(line, "meta_schedule", path=database) == read_log(database).records[0]
    with pytest.raises(RecordParseError, match="needs the database path"):
        decode_line(line, "meta_schedule")


def test_decode_line_names_file_and_line_in_its_error():
    with pytest.raises(RecordParseError, match=r"^x\.log:9: "):
        decode_line('{"input": [1]}', "autotvm", path="x.log", lineno=9)


# ---------------------------------------------------------------- parallel decoding

def mixed_log(shared_data: Path, tmp_path: Path) -> Path:
    lines = (shared_data / "tophub" / "cuda_v0.10.log").read_text().splitlines()
    lines[100] = lines[100][:50]
    lines[700] = "# a comment in the middle"
    lines[701] = "{not json"
    return write_lines(tmp_path / "mixed.log", lines)


def test_worker_processes_give_the_same_tables_and_errors_in_file_order(shared_data, tmp_path):
    from lorien.formats.autotvm import _iter_tables_parallel

    path = mixed_log(shared_data, tmp_path)
    serial = list(iter_log_tables(path, batch_size=200, workers=1))
    parallel = list(_iter_tables_parallel(path, False, 200, 2, 16384))
    assert [t.num_rows for t, _ in parallel] == [200, 200, 200, 200, 22]
    assert [r for t, _ in parallel for r in table_to_records(t)] == [r for t, _ in serial for r in table_to_records(t)]
    assert [(e.path, e.line) for _, errs in parallel for e in errs] == [(str(path), 101), (str(path), 702)]
    assert [str(e) for _, errs in parallel for e in errs] == [str(e) for _, errs in serial for e in errs]


def test_worker_processes_in_strict_mode_raise_the_first_bad_line(shared_data, tmp_path):
    from lorien.formats.autotvm import _iter_tables_parallel

    path = mixed_log(shared_data, tmp_path)
    with pytest.raises(RecordParseError, match=r"mixed\.log:101: "):
        list(_iter_tables_parallel(path, True, 200, 2, 16384))


def test_an_explicit_format_on_a_missing_path_is_refused(tmp_path):
    with pytest.raises(UnknownFormatError, match="gone.log"):
        read_log(tmp_path / "gone.log", format="autotvm")
    with pytest.raises(UnknownFormatError, match="gone.log"):
        list(iter_log_tables(tmp_path / "gone.log", format="autotvm"))


def test_a_record_is_written_only_in_its_own_dialect_format(shared_data, tmp_path):
    from lorien.errors import DialectError

    record = read_log(shared_data / "ansor" / "matmul.json").records[0]
    with pytest.raises(DialectError, match="'auto_scheduler' cannot be written as 'autotvm'"):
        encode_record(record, "autotvm")
    with pytest.raises(DialectError, match="cannot be written as 'meta_schedule'"):
        write_log([record], "meta_schedule", tmp_path / "db")


# ---------------------------------------------------------------- MetaSchedule workload entries

def test_meta_schedule_records_name_their_workload_by_hash_not_by_module(shared_data):
    from lorien.formats import meta_schedule

    database = shared_data / "meta_schedule" / "conv_56_64"
    records = read_log(database).records
    entries = meta_schedule.workload_texts(database)
    extras = [json.loads(record.extra) for record in records]
    assert all("workload" not in extra and extra["workload_hash"] in entries for extra in extras)
    assert max(len(record.extra) for record in records) < 200  # the module (tens of KB) is kept once
    assert meta_schedule.referenced_hashes(records) == set(entries)


def test_a_meta_schedule_record_whose_entry_is_not_at_hand_is_refused_before_writing(shared_data, tmp_path,
                                                                                       monkeypatch):
    from lorien.formats import meta_schedule

    database = shared_data / "meta_schedule" / "matmul_128"
    records = read_log(database).records
    entries = meta_schedule.workload_texts(database)
    monkeypatch.setattr(meta_schedule, "_KNOWN", {})  # a process that never read the database
    digest = next(iter(entries))
    with pytest.raises(RecordParseError, match=f"workload {digest}.*not at hand"):
        write_log(records, "meta_schedule", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert write_log(records, "meta_schedule", tmp_path / "out", workloads=entries) == len(records)
    assert [json.loads(line) for line in (tmp_path / "out" / "database_workload.json").read_text().splitlines()] == \
        [json.loads(line) for line in (database / "database_workload.json").read_text().splitlines()]


def test_meta_schedule_records_of_older_versions_carry_their_module_and_still_write(shared_data, tmp_path,
                                                                                     monkeypatch):
    from lorien.formats import meta_schedule

    database = shared_data / "meta_schedule" / "matmul_128"
    records = read_log(database).records
    entries = meta_schedule.workload_texts(database)
    monkeypatch.setattr(meta_schedule, "_KNOWN", {})
    old = []
    for record in records:
        extra = json.loads(record.extra)
        extra["workload"] = json.loads(entries[extra.pop("workload_hash")])
        old.append(record.with_changes(extra=json.dumps(extra), record_id=record.record_id))
    write_log(old, "meta_schedule", tmp_path / "old")
    assert [json.loads(line) for line in (tmp_path / "old" / "database_tuning_record.json").read_text().splitlines()] == \
        [json.loads(line) for line in (database / "database_tuning_record.json").read_text().splitlines()]
