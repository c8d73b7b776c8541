"""The AutoTVM ingest fast path (config skeletons, batch-built numbers and record ids) gives the
same records and errors as decoding each line on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorien.errors import RecordParseError
from lorien.formats import autotvm, decode_line, iter_log_tables
from lorien.record import compute_record_id


def real_line(shared_data: Path) -> dict:
    """The first record of a shared TopHub log, as a dict."""
    for line in (shared_data / "tophub" / "llvm_v0.04.log").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            return json.loads(line)
    raise AssertionError("no record in the shared llvm log")


def with_config(record: dict, raw_config: str, result: str | None = None) -> str:
    """A line laid out as TVM writes it, with the config (and result) text given verbatim."""
    text = json.dumps(record)
    head = text[:text.index(', "config": ') + len(', "config": ')]
    tail = text[text.index(', "result": '):]
    if result is not None:
        tail = ', "result": ' + result + tail[tail.index(', "version": '):]
    return head + raw_config + tail


def tables_and_errors(path: Path, **options) -> tuple[list[dict], list[RecordParseError]]:
    rows, errors = [], []
    for table, batch_errors in iter_log_tables(path, format="autotvm", **options):
        rows.extend(table.to_pylist())
        errors.extend(batch_errors)
    return rows, errors


def one_by_one(path: Path) -> tuple[list[dict], list[str]]:
    """Rows and error messages of decoding every line separately with decode_line."""
    rows, errors = [], []
    for lineno, line in enumerate(path.read_bytes().split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = decode_line(line, "autotvm", path, lineno)
        except RecordParseError as exc:
            errors.append(str(exc))
        else:
            rows.append(record.to_row())
    return rows, errors


CONFIGS_OF_ONE_SHAPE = [
    '{"index": 12, "code_hash": null, "entity": [["tile_x", "sp", [4, 16]], ["tile_k", "sp", [-1, 8]]]}',
    '{"index": 13, "code_hash": null, "entity": [["tile_x", "sp", [8, 32]], ["tile_k", "sp", [-1, 4]]]}',
    '{"index": 14, "code_hash": null, "entity": [["tile_x", "sp", [2, 64]], ["tile_k", "sp", [1, 99]]]}',
    '{"index": 15, "code_hash": null, "entity": [["tile_x", "sp", [2, 06]], ["tile_k", "sp", [1, 99]]]}',
    '{"index": 16, "code_hash": null, "entity": [["tile_x", "sp", [2, 64]], ["tile_k", "sp", [-0, 9]]]}',
    '{"index": 17, "code_hash": null, "entity": [["tile_x", "sp", [2, 64]], ["tile_k", "sp", [3, 9]]]}',
    '{"a1": 1, "a2": 2}', '{"a1": 3, "a1": 4}',
    '{"a": 1, "a": 2}', '{"a": 3, "a": 4}',
    '{"a": "x y", "b": 1}', '{"a": "x y", "b": 2}',
    '{"a": "\\u0041", "b": 1}', '{"a": "\\u0041", "b": 2}',
    '{"a": 1.5}', '{"a": 2.50}', '{"a": 1e5}',
    '{"a": 123456789012345678901}', '{"a": 923456789012345678901}',
    '{"a": [1, 2,]}', '[1, 2]',
]


def test_configs_that_differ_only_in_digits_read_as_if_parsed_one_by_one(shared_data, tmp_path):
    record = real_line(shared_data)
    path = tmp_path / "shapes.log"
    path.write_text("".join(with_config(record, config) + "\n" for config in CONFIGS_OF_ONE_SHAPE * 2))
    rows, errors = tables_and_errors(path, batch_size=7)
    expected_rows, expected_errors = one_by_one(path)
    assert [row["config"] for row in rows] == [row["config"] for row in expected_rows]
    assert [row["record_id"] for row in rows] == [row["record_id"] for row in expected_rows]
    assert [str(error) for error in errors] == expected_errors
    bad_lines = {error.line for error in errors}
    assert {4, 20, 21}.issubset(bad_lines)  # a leading zero, a trailing comma, a list config


@pytest.mark.parametrize(("result", "costs"), [
    ("[[1], 0, 2, 3]", [1.0]),
    ("[[true, 0.5], 0, 2.5, 3]", [1.0, 0.5]),
    ("[[], 0, 2.5, 3]", []),
    ("[[0.1, 0.2, 0.3], 4, 2.5, 3.5]", [0.1, 0.2, 0.3]),
])
def test_results_of_any_plain_form_give_the_numbers_of_decode_line(shared_data, tmp_path, result, costs):
    record = real_line(shared_data)
    config = json.dumps(record["config"])
    path = tmp_path / "results.log"
    path.write_text(with_config(record, config) + "\n" + with_config(record, config, result) + "\n")
    rows, errors = tables_and_errors(path)
    expected, _ = one_by_one(path)
    assert not errors
    assert rows[1]["costs"] == costs
    for row, want in zip(rows, expected, strict=True):
        for name in ("costs", "error_no", "all_cost", "timestamp", "cost_s", "record_id"):
            assert row[name] == want[name]


def test_record_ids_are_content_hashes_whatever_form_the_numbers_take(shared_data, tmp_path):
    record = real_line(shared_data)
    config = json.dumps(record["config"])
    path = tmp_path / "forms.log"
    path.write_text(with_config(record, config, "[[2], 0, 1, 7]") + "\n"
                    + with_config(record, config, "[[2.0], 0, 1.0, 7.0]") + "\n")
    rows, _ = tables_and_errors(path)
    assert rows[0]["record_id"] == rows[1]["record_id"]
    row = rows[0]
    assert row["record_id"] == compute_record_id(row["dialect"], row["target"], row["workload_key"], row["layout"],
                                                 row["config"], row["costs"], row["error_no"], row["timestamp"])


def test_a_bad_result_is_reported_at_its_line_among_good_ones(shared_data, tmp_path):
    record = real_line(shared_data)
    config = json.dumps(record["config"])
    lines = [with_config(record, config)] * 3 + [with_config(record, config, '[["fast"], 0, 1.5, 2]')] \
        + [with_config(record, config)] * 2
    path = tmp_path / "bad_result.log"
    path.write_text("".join(line + "\n" for line in lines))
    rows, errors = tables_and_errors(path)
    assert len(rows) == 5
    assert [(error.path, error.line) for error in errors] == [(str(path), 4)]
    assert "non-number cost" in str(errors[0])


def test_strict_reading_stops_at_the_first_bad_line_even_when_a_later_one_fails_sooner(shared_data, tmp_path):
    record = real_line(shared_data)
    config = json.dumps(record["config"])
    lines = [with_config(record, config), with_config(record, config, '[["fast"], 0, 1.5, 2]'),
             with_config(record, config), "not json at all", with_config(record, config)]
    path = tmp_path / "strict.log"
    path.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(RecordParseError) as caught:
        tables_and_errors(path, strict=True)
    assert caught.value.line == 2


def test_a_log_without_a_final_newline_keeps_its_last_record(shared_data, tmp_path):
    record = real_line(shared_data)
    path = tmp_path / "no_newline.log"
    path.write_text(json.dumps(record) + "\n" + json.dumps(dict(record, result=[[0.5], 0, 1.0, 9.0])))
    rows, errors = tables_and_errors(path)
    assert not errors
    assert [row["costs"] for row in rows] == [record["result"][0], [0.5]]


def test_worker_processes_read_the_same_table_as_one_process(shared_data, tmp_path):
    record = real_line(shared_data)
    lines = [with_config(record, json.dumps(dict(record["config"], index=index)),
                         f"[[{index + 1}e-05], 0, 1.5, {index}]") for index in range(3000)]
    lines[1234] = lines[1234][:-30]
    path = tmp_path / "parallel.log"
    path.write_text("".join(line + "\n" for line in lines))
    serial = list(autotvm.iter_tables(path, workers=1))
    parallel = list(autotvm._iter_tables_parallel(path, False, 65536, 2, 64 << 10))
    assert sum(table.num_rows for table, _ in parallel) == 2999
    assert [table.to_pylist() for table, _ in parallel] == [table.to_pylist() for table, _ in serial]
    assert [(error.line, str(error)) for _, errors in parallel for error in errors] == \
        [(error.line, str(error)) for _, errors in serial for error in errors] == [(1235, str(serial[0][1][0]))]


def test_an_error_no_beyond_int32_is_a_bad_line_not_a_wrapped_number(shared_data, tmp_path):
    record = real_line(shared_data)
    path = tmp_path / "error_no.log"
    path.write_text("".join(json.dumps(dict(record, result=[[0.1], error_no, 1.0, 2.0])) + "\n"
                            for error_no in (0, 2**31, -2**31 - 1, 2**63 + 5, 4)))
    rows, errors = tables_and_errors(path)
    assert [row["error_no"] for row in rows] == [0, 4]
    assert [error.line for error in errors] == [2, 3, 4]
    assert all("int32" in str(error) for error in errors)


def test_a_blank_line_before_the_first_run_of_a_workload_is_skipped_not_an_error(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("LORIEN_NATIVE", "0")  # the Python decoder (the native scanner has its own tests)
    record = real_line(shared_data)
    path = tmp_path / "blank.log"
    path.write_text("\n" + json.dumps(record) + "\n\n" + json.dumps(dict(record, result=[[0.5], 0, 1.0, 9.0])) + "\n")
    rows, errors = tables_and_errors(path)
    assert not errors
    assert [row["costs"] for row in rows] == [record["result"][0], [0.5]]


def test_a_decoder_that_starts_over_between_blocks_gives_the_same_tables(shared_data, tmp_path, monkeypatch):
    """A decoder forgets its workloads once it holds MAX_DECODER_WORKLOADS (so a log of many
    workloads decodes in bounded memory); the blocks decoded after that are unchanged."""
    log = tmp_path / "many-workloads.log"
    log.write_bytes(b"".join(path.read_bytes() for path in sorted((shared_data / "tophub").glob("*.log"))))
    expected = [table for tables, _ in autotvm._decode_in_process(log, 16 << 10) for table in tables]
    monkeypatch.setattr(autotvm, "MAX_DECODER_WORKLOADS", 8)
    started_over = []
    decoder_class = autotvm.Decoder
    monkeypatch.setattr(autotvm, "Decoder", lambda source: started_over.append(source) or decoder_class(source))
    in_process = [table for tables, _ in autotvm._decode_in_process(log, 16 << 10) for table in tables]
    in_workers = [table for tables, _ in autotvm._decode_in_workers(str(log), 2, 16 << 10) for table in tables]
    assert len(started_over) > 2  # the blocks hold far more than 8 workloads
    as_rows = [row for table in expected for row in table.to_pylist()]
    assert [row for table in in_process for row in table.to_pylist()] == as_rows
    assert [row for table in in_workers for row in table.to_pylist()] == as_rows


class _InlineExecutor:
    """A ProcessPoolExecutor stand-in that decodes each block as it is submitted and counts the
    blocks decoded but not yet taken by the consumer (what the committing process holds)."""

    held_at_most = 0

    def __init__(self, workers, mp_context=None):
        self.done = 0

    def submit(self, function, *args):
        from concurrent.futures import Future

        future, taken = Future(), self
        future.set_result(function(*args))
        future.result = lambda original=future.result: taken.took() or original()
        self.done += 1
        _InlineExecutor.held_at_most = max(_InlineExecutor.held_at_most, self.done)
        return future

    def took(self):
        self.done -= 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_blocks_decoded_ahead_of_the_consumer_are_bounded_by_bytes_not_by_workers(shared_data, monkeypatch):
    """However fast the workers decode, the committing process holds at most DECODE_AHEAD_BYTES
    of log decoded ahead (and one block a worker, plus one), and every record still comes out."""
    log = shared_data / "tophub" / "rocm_v0.05.log"
    expected = [row for tables, _ in autotvm._decode_in_process(log, 16 << 10) for table in tables
                for row in table.to_pylist()]
    monkeypatch.setattr(autotvm, "ProcessPoolExecutor", _InlineExecutor)
    monkeypatch.setattr(autotvm, "DECODE_AHEAD_BYTES", 4 * (16 << 10))
    for workers, bound in ((4, 5), (2, 4)):  # the log is 8 blocks of 16 KiB
        _InlineExecutor.held_at_most = 0
        rows = [row for tables, _ in autotvm._decode_in_workers(str(log), workers, 16 << 10) for table in tables
                for row in table.to_pylist()]
        assert rows == expected
        assert _InlineExecutor.held_at_most == bound
