"""Every log reader survives any input: mutated real logs of all three formats give records and
per-line errors (file and line named), never another exception; the readers agree; ingest stores
exactly the good lines and a strict ingest stores nothing (the harness: tests/fuzzing.py).

``LORIEN_FUZZ_CASES=20000`` runs that many cases per property instead of the quick default
(``benchmarks/fuzz.py`` is the long run that counts crashes instead of stopping at the first).
Below the properties, one regression test per bug the fuzz suite found.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")

from fuzzing import Corpus, LogCase, check_log, mutated_case  # noqa: E402  (tests/fuzzing.py)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lorien.cli import main  # noqa: E402
from lorien.formats import decode_line, encode_record, iter_log_tables, read_log  # noqa: E402
from lorien.warehouse import open_store  # noqa: E402

#: Cases per property: quick by default, ``LORIEN_FUZZ_CASES`` for a long run.
LONG_RUN = "LORIEN_FUZZ_CASES" in os.environ
READER_CASES = int(os.environ.get("LORIEN_FUZZ_CASES", 500))
STORE_CASES = int(os.environ.get("LORIEN_FUZZ_CASES", 80))

FUZZ_SETTINGS = {
    "deadline": None,
    "database": None,
    "derandomize": not LONG_RUN,  # the quick run checks the same cases every time
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@pytest.fixture(scope="module")
def corpus(shared_data) -> Corpus:
    return Corpus.load(shared_data)


def assert_survives(case: LogCase, store: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="lorien-fuzz-") as temp:
        findings = check_log(case, Path(temp), store=store)
    assert not findings, f"{case.describe()}:\n" + "\n".join(map(str, findings))


# ---------------------------------------------------------------- the properties

@settings(max_examples=READER_CASES, **FUZZ_SETTINGS)
@given(rng=st.randoms(use_true_random=False))
def test_every_reader_gives_records_and_line_errors_and_they_agree(corpus, rng):
    assert_survives(mutated_case(rng, corpus), store=False)


@settings(max_examples=STORE_CASES, **FUZZ_SETTINGS)
@given(rng=st.randoms(use_true_random=False))
def test_ingest_stores_exactly_the_good_lines_and_strict_ingest_nothing(corpus, rng):
    assert_survives(mutated_case(rng, corpus), store=True)


def test_the_mutations_make_good_and_bad_lines_of_every_format(corpus):
    """The fuzz suite is no stronger than its cases: they must hit every format and both."""
    import random

    seen: dict[str, set[str]] = {}
    for number in range(150):
        case = mutated_case(random.Random(number), corpus)
        with tempfile.TemporaryDirectory() as temp:
            result = read_log(case.write(Path(temp)), case.format)
        kinds = seen.setdefault(case.format, set())
        kinds |= {"good"} if result.records else set()
        kinds |= {"bad"} if result.errors else set()
    assert seen == {fmt: {"good", "bad"} for fmt in ("autotvm", "ansor", "meta_schedule")}


def test_a_native_reader_that_breaks_a_property_is_reported_not_hidden(corpus, monkeypatch):
    """check_log finds a reader's disagreement: here the native path made to drop its last row."""
    from lorien.formats import autotvm, native

    if native.library() is None:
        pytest.skip("no C compiler: the native scanner is off")
    real = autotvm._native_table

    def drops_a_row(decoder, data, wire=False):
        found = real(decoder, data, wire)
        return None if found is None else (found[0].slice(0, found[0].num_rows - 1), found[1])

    monkeypatch.setattr(autotvm, "_native_table", drops_a_row)
    case = LogCase("autotvm", {"log.log": corpus.autotvm[1][:3]})
    with tempfile.TemporaryDirectory() as temp:
        findings = check_log(case, Path(temp), store=False)
    assert [finding.where for finding in findings] == ["iter_log_tables(native=True)"]


# ---------------------------------------------------------------- what the fuzz suite found

def ansor_line(shared_data: Path) -> dict:
    for line in (shared_data / "ansor" / "matmul.json").read_text().splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError("no record in the shared matmul log")


def tophub_line(shared_data: Path, task: str = "conv2d_NCHWc.x86") -> dict:
    for line in (shared_data / "tophub" / "llvm_v0.04.log").read_text().splitlines():
        if line.startswith("{") and task in line:
            return json.loads(line)
    raise AssertionError(f"no {task} record in the shared llvm log")


def write_lines(path: Path, values: list[dict]) -> Path:
    path.write_text("".join(json.dumps(value) + "\n" for value in values))
    return path


def test_an_auto_scheduler_error_no_past_int32_is_a_bad_line_and_ingest_goes_on(shared_data, tmp_path, capsys):
    good = ansor_line(shared_data)
    bad = json.loads(json.dumps(good))
    bad["r"][1] = 99999999999
    log = write_lines(tmp_path / "mutated.json", [bad, good])
    assert main(["ingest", str(log), "--store", str(tmp_path / "warehouse"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"skipped {log}:1: " in out and "error_no 99999999999 is out of the int32 range" in out
    with open_store(f"parquet:{tmp_path / 'warehouse'}") as store:
        assert store.scan(columns=["record_id"]).num_rows == 1


def test_an_auto_scheduler_error_no_past_int64_is_a_bad_line(shared_data, tmp_path):
    line = ansor_line(shared_data)
    line["r"][1] = 2**63
    result = read_log(write_lines(tmp_path / "big.json", [line]), "ansor")
    assert (result.records, [error.line for error in result.errors]) == ([], [1])


def test_a_negative_zero_timestamp_is_written_back_as_the_same_record(shared_data):
    line = ansor_line(shared_data)
    line["r"][3] = -0.0
    record = decode_line(json.dumps(line), "ansor")
    assert decode_line(encode_record(record, "ansor"), "ansor").record_id == record.record_id


def test_auto_scheduler_sizes_no_double_holds_leave_the_flop_unknown(shared_data, tmp_path):
    line = ansor_line(shared_data)
    line["i"][0][0] = '["matmul_add", 1e308, 1e308, 1e308, "float32"]'
    assert read_log(write_lines(tmp_path / "a.json", [line]), "ansor").records[0].flop is None


@pytest.mark.parametrize("workload", ['["matmul_add", -1024, 1024, 1024, "float32"]',
                                      '["conv2d_layer", 1, 7, 7, 512, 512, 3, 3, [0, 1], [1, 1]]'],
                         ids=["negative size", "zero stride"])
def test_auto_scheduler_workloads_that_cannot_be_built_leave_the_flop_unknown(shared_data, tmp_path, workload):
    line = ansor_line(shared_data)
    line["i"][0][0] = workload
    assert read_log(write_lines(tmp_path / "a.json", [line]), "ansor").records[0].flop is None


@pytest.mark.parametrize("native", ["0", "1"])
def test_a_tensor_with_a_negative_dimension_is_a_bad_line(shared_data, tmp_path, monkeypatch, native):
    monkeypatch.setenv("LORIEN_NATIVE", native)
    good = tophub_line(shared_data)
    bad = json.loads(json.dumps(good))
    bad["input"][2][1][1][0] = -64
    log = write_lines(tmp_path / "negative.log", [good, bad, good])
    tables = list(iter_log_tables(log, "autotvm", workers=1))
    errors = [error for _, batch_errors in tables for error in batch_errors]
    assert sum(table.num_rows for table, _ in tables) == 2
    assert [error.line for error in errors] == [2]
    assert "has a negative dimension" in str(errors[0])


def test_a_meta_schedule_tensor_with_a_negative_dimension_is_a_bad_line(shared_data, tmp_path):
    source = shared_data / "meta_schedule" / "matmul_128"
    (tmp_path / "database_workload.json").write_bytes((source / "database_workload.json").read_bytes())
    lines = (source / "database_tuning_record.json").read_text().splitlines()[:2]
    bad = json.loads(lines[1])
    bad[1][3][0][2] = [128, -128]
    (tmp_path / "database_tuning_record.json").write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    result = read_log(tmp_path, "meta_schedule")
    assert len(result.records) == 1
    assert [error.line for error in result.errors] == [2] and "negative dimension" in str(result.errors[0])


def damaged_database(shared_data: Path, directory: Path, damage) -> Path:
    """The matmul database with its workload module's graph changed by ``damage(graph)``."""
    source = shared_data / "meta_schedule" / "matmul_128"
    entry = json.loads((source / "database_workload.json").read_text())
    raw = base64.b64decode(entry[1])
    graph = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    damage(graph)
    text = json.dumps(graph).encode()
    entry[1] = base64.b64encode(len(text).to_bytes(8, "little") + text).decode()
    directory.mkdir()
    (directory / "database_workload.json").write_text(json.dumps(entry) + "\n")
    (directory / "database_tuning_record.json").write_bytes((source / "database_tuning_record.json").read_bytes())
    return directory


def _node_not_an_object(graph: dict) -> None:
    graph["nodes"][5] = "text"


def _expression_cycle(graph: dict) -> None:
    for index, node in enumerate(graph["nodes"]):
        if node.get("type", "").endswith("Mul"):
            node["data"]["a"] = index  # the product is its own operand


def _negative_extent(graph: dict) -> None:
    for node in graph["nodes"]:
        if node.get("type", "").endswith("IntImm"):
            value = graph["nodes"][node["data"]["value"]]
            if str(value.get("data")) == "128":
                value["data"] = -128


@pytest.mark.parametrize("damage", [_node_not_an_object, _expression_cycle, _negative_extent])
def test_a_damaged_meta_schedule_module_leaves_the_flop_unknown(shared_data, tmp_path, damage):
    intact = read_log(damaged_database(shared_data, tmp_path / "intact", lambda graph: None), "meta_schedule")
    damaged = read_log(damaged_database(shared_data, tmp_path / "damaged", damage), "meta_schedule")
    assert {record.flop for record in intact.records} == {2 * 128**3}
    assert (len(damaged.records), damaged.errors) == (32, [])
    assert {record.flop for record in damaged.records} == {None}


def test_target_keys_too_long_to_name_a_directory_are_a_bad_line(shared_data, tmp_path):
    line = tophub_line(shared_data)
    line["input"][0] = "llvm -keys=" + "k" * 300
    log = write_lines(tmp_path / "keys.log", [line, tophub_line(shared_data)])
    assert main(["ingest", str(log), "--store", str(tmp_path / "warehouse"), "--no-progress"]) == 0
    result = read_log(log, "autotvm")
    assert [error.line for error in result.errors] == [1]
    assert "family key of 305 characters (at most 80)" in str(result.errors[0])


@pytest.mark.parametrize("layout", ["x" * 3000, "../up", "NCHW c"])
def test_a_layout_argument_that_names_no_layout_is_not_taken_as_one(shared_data, tmp_path, layout):
    line = tophub_line(shared_data)
    assert line["input"][2][5] == "NCHW"
    line["input"][2][5] = layout
    assert read_log(write_lines(tmp_path / "layout.log", [line]), "autotvm").records[0].layout == "NCHW"
