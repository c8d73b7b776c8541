"""The native AutoTVM scanner gives exactly the tables and errors of the Python decoder, and
leaves to Python every line it cannot reproduce."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lorien.formats import autotvm, native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the native scanner is off")


def decode(path: Path, monkeypatch: pytest.MonkeyPatch, native_on: bool, **options) -> tuple[list, list]:
    monkeypatch.setenv("LORIEN_NATIVE", "1" if native_on else "0")
    rows, errors = [], []
    for table, batch_errors in autotvm.iter_tables(path, workers=1, **options):
        rows.extend(table.to_pylist())
        errors.extend((error.line, str(error)) for error in batch_errors)
    return rows, errors


def assert_same(path: Path, monkeypatch: pytest.MonkeyPatch, **options) -> tuple[list, list]:
    python = decode(path, monkeypatch, False, **options)
    assert decode(path, monkeypatch, True, **options) == python
    return python


def real_record(shared_data: Path) -> dict:
    for line in (shared_data / "tophub" / "llvm_v0.04.log").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            return json.loads(line)
    raise AssertionError("no record in the shared llvm log")


def tvm_line(record: dict, config: str | None = None, result: str | None = None) -> str:
    """A line laid out as TVM writes it, with the config and result text given verbatim."""
    text = json.dumps(record)
    head = text[:text.index(', "config": ') + len(', "config": ')]
    middle = text[len(head):text.index(', "result": ')]
    tail = text[text.index(', "version": '):]
    if result is None:
        result = text[text.index(', "result": ') + len(', "result": '):text.index(', "version": ')]
    return head + (middle if config is None else config) + ', "result": ' + result + tail


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("log", ["cuda_v0.10.log", "llvm_v0.04.log", "rocm_v0.05.log", "vta_v0.10.log"])
def test_every_tophub_log_is_taken_by_the_scanner_and_gives_the_python_tables(shared_data, monkeypatch, log):
    path = shared_data / "tophub" / log
    scan = native.scan_autotvm(path.read_bytes())
    assert not isinstance(scan, int), f"the scanner refused line {scan}"
    assert scan.rows > 0 and scan.lines == len(path.read_bytes().splitlines())
    rows, errors = assert_same(path, monkeypatch)
    assert len(rows) == scan.rows and not errors


# (config text, result text, whether the scanner takes the line)
CASES = [
    ('{"index": 3, "code_hash": null, "entity": [["tile_k", "sp", [-1, 8]]]}', None, True),
    ('{ "index" :\t3 ,"code_hash":null,"entity":[ ["a","ot", true], ["b", "ot", false] ] }', None, True),
    ('{"index": 3, "deep": [[[[[[[[[[[[1]]]]]]]]]]]]}', None, True),
    ('{}', None, True),
    ('{"index": 1.50}', None, False),  # a fraction: orjson writes it back its own way
    ('{"index": 1e3}', None, False),
    ('{"index": -0}', None, False),  # reads back as 0
    ('{"index": 1234567890123456789}', None, False),  # 19 digits
    ('{"index": 01}', None, False),  # not JSON: a bad line
    ('{"name": "a\\"b"}', None, False),  # an escape
    ('{"name": "\u00e9t\u00e9"}', None, False),  # not ASCII
    ('{"index": 1, "index": 2}', None, False),  # a duplicate key
    ('[1, 2]', None, False),  # not an object: a bad line
    ('{"index": 1} x', None, False),  # trailing bytes: a bad line
    ('{"index": tru}', None, False),
    (None, '[[1, 2], 0, 3, 4]', True),  # integer costs read as floats
    (None, '[[], 0, 1.5, 1600000000.25]', True),
    (None, '[ [ 0.5 ,0.25 ] , 4 ,1e-3, 2E+9 ]', True),
    (None, '[[-0.0], 0, 1, 2]', False),  # negative zero
    (None, '[[0.5], 0.0, 1, 2]', False),  # error_no not an integer: a bad line
    (None, '[[0.5], 2147483648, 1, 2]', False),  # error_no beyond int32: a bad line
    (None, '[[0.5], -2147483648, 1, 2]', True),
    (None, '[[1e400], 0, 1, 2]', False),  # not finite
    (None, '[[0.5], 0, 1]', False),  # three parts: a bad line
    (None, '[[0.5], 0, 1, 2, 3]', False),
    (None, '[["0.5"], 0, 1, 2]', False),
    (None, '[[.5], 0, 1, 2]', False),
    (None, '[[0.5], 0, 1, 2] 7', False),
]


@pytest.mark.parametrize("config, result, taken", CASES)
def test_each_form_is_taken_or_left_to_python_and_the_tables_agree(shared_data, tmp_path, monkeypatch,
                                                                      config, result, taken):
    record = real_record(shared_data)
    line = tvm_line(record, config, result)
    path = write(tmp_path, "case.log", [tvm_line(record), line, tvm_line(record)])
    scan = native.scan_autotvm(path.read_bytes())
    assert (not isinstance(scan, int)) == taken, scan
    if not taken:
        assert scan == 2
    assert_same(path, monkeypatch)


def test_comments_blank_lines_crlf_and_a_missing_final_newline(shared_data, tmp_path, monkeypatch):
    record = real_record(shared_data)
    lines = ["# tuned on a laptop", tvm_line(record), "", "   ", tvm_line(record, result="[[2.5], 0, 1, 2]") + "\r",
             "\t# another comment", tvm_line(record, result="[[3.5], 1, 1, 2]")]
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(lines))  # no newline after the last line
    scan = native.scan_autotvm(path.read_bytes())
    assert not isinstance(scan, int) and scan.rows == 3 and scan.lines == 7
    assert scan.group_start.tolist() == [True, True, True]  # the CR and the final line change the tail
    rows, errors = assert_same(path, monkeypatch)
    assert [row["costs"] for row in rows] == [record["result"][0], [2.5], [3.5]] and not errors


def test_lines_of_one_workload_form_one_group_and_a_new_input_starts_another(shared_data, tmp_path, monkeypatch):
    record = real_record(shared_data)
    other = json.loads(json.dumps(record))
    other["input"][2][0][1][0] = 7  # another batch size: another workload
    lines = [tvm_line(record, result=f"[[{i + 1}e-4], 0, 1, {i}]") for i in range(3)]
    lines += [tvm_line(other, result=f"[[{i + 1}e-4], 0, 1, {i}]") for i in range(2)]
    path = write(tmp_path, "groups.log", lines)
    scan = native.scan_autotvm(path.read_bytes())
    assert scan.group_start.tolist() == [True, False, False, True, False]
    rows, _ = assert_same(path, monkeypatch)
    assert len({row["workload_key"] for row in rows}) == 2


def test_a_bad_line_in_a_later_block_keeps_its_line_number(shared_data, tmp_path, monkeypatch):
    record = real_record(shared_data)
    lines = [tvm_line(record, result=f"[[{i + 1}e-5], 0, 1.5, {i}]") for i in range(400)]
    lines[333] = lines[333][:-20]
    path = write(tmp_path, "blocks.log", lines)
    monkeypatch.setattr(autotvm, "CHUNK_BYTES", 4096)  # many blocks; all but one go native
    rows, errors = assert_same(path, monkeypatch, batch_size=64)
    assert len(rows) == 399 and [line for line, _ in errors] == [334]
    assert errors[0][1].startswith(f"{path}:334: ")


def test_the_shortest_lines_fit_the_capacity_the_scanner_is_given(tmp_path, monkeypatch):
    shortest = '{"input": , "config": {}, "result": [[],0,0,0], "version": '
    assert len(shortest) == native.MIN_LINE
    data = (shortest + "\n") * 1000
    scan = native.scan_autotvm(data.encode())
    assert not isinstance(scan, int) and scan.rows == 1000 and scan.group_start.sum() == 1
    path = write(tmp_path, "short.log", [shortest] * 5)
    rows, errors = assert_same(path, monkeypatch)  # Python finds no input: five bad lines
    assert not rows and [line for line, _ in errors] == [1, 2, 3, 4, 5]


def test_record_ids_without_libcrypto_are_the_same(shared_data, monkeypatch):
    path = shared_data / "tophub" / "cuda_v0.10.log"
    with_libcrypto = list(autotvm.iter_tables(path, workers=1))
    monkeypatch.setitem(native._STATE, "sha", None)
    assert native.sha256_functions() is None
    without = list(autotvm.iter_tables(path, workers=1))
    assert [t.column("record_id").to_pylist() for t, _ in with_libcrypto] == \
        [t.column("record_id").to_pylist() for t, _ in without]


def test_the_scanner_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("LORIEN_NATIVE", "0")
    assert native.library() is None
    with pytest.raises(RuntimeError, match="not available"):
        native.scan_autotvm(b"")


def test_mutated_lines_give_the_same_records_and_errors_either_way(shared_data, tmp_path, monkeypatch):
    """Random edits of real lines (digits, punctuation, spaces, quotes, letters) never make the
    scanner and the Python decoder disagree."""
    rng = random.Random(7)
    base = [line for line in (shared_data / "tophub" / "cuda_v0.10.log").read_text().splitlines()
            if line.startswith("{")][:40]
    alphabet = '0123456789-.eE+ ,:[]{}"\\nulltruefalse\tx'
    lines = []
    for _ in range(600):
        line = rng.choice(base)
        cut = line.index(', "config": ')
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(cut, len(line))  # edit the config, result or tail, not the input
            action = rng.random()
            if action < 0.4:
                line = line[:at] + rng.choice(alphabet) + line[at + 1:]
            elif action < 0.7:
                line = line[:at] + rng.choice(alphabet) + line[at:]
            else:
                line = line[:at] + line[at + 1:]
        lines.append(line)
    path = write(tmp_path, "mutated.log", lines)
    monkeypatch.setattr(autotvm, "CHUNK_BYTES", 2048)  # small blocks: some native, some not
    rows, errors = assert_same(path, monkeypatch, batch_size=50)
    assert rows and errors  # the mutations made both good and bad lines
    blocks = [native.scan_autotvm(b"".join(chunk)) for chunk in np.array_split(
        np.array([(line + "\n").encode() for line in lines], dtype=object), 120)]
    assert any(not isinstance(scan, int) for scan in blocks) and any(isinstance(scan, int) for scan in blocks)


def test_worker_processes_send_shared_columns_dictionary_encoded_and_lose_nothing(shared_data, tmp_path):
    """Every TopHub log in one file (unknown FLOPs and several targets included), decoded by two
    workers in small blocks: the same tables as one process."""
    lines = []
    for log in sorted((shared_data / "tophub").glob("*.log")):
        lines.extend(line for line in log.read_text().splitlines() if line.startswith("{"))
    record = real_record(shared_data)
    lines.append(json.dumps(dict(record, input=["llvm", "no_such_op", [7], {}])))  # FLOPs unknown: null
    path = write(tmp_path, "all.log", lines)
    serial = list(autotvm.iter_tables(path, workers=1, batch_size=300))
    parallel = list(autotvm._iter_tables_parallel(path, False, 300, 2, 32 << 10))
    assert [t.num_rows for t, _ in parallel] == [t.num_rows for t, _ in serial]
    assert all(t.schema.equals(s.schema) for (t, _), (s, _) in zip(parallel, serial, strict=True))
    assert [t.to_pylist() for t, _ in parallel] == [t.to_pylist() for t, _ in serial]
    assert parallel[-1][0].column("flop").to_pylist()[-1] is None
    wire = autotvm._to_wire(serial[0][0])
    assert all(pa.types.is_dictionary(wire.schema.field(name).type) for name in autotvm.SHARED_VALUE_COLUMNS)
    assert autotvm._from_wire(wire).equals(serial[0][0])


def test_without_a_c_compiler_the_python_decoder_reads_the_log(shared_data, tmp_path, monkeypatch, caplog):
    path = shared_data / "tophub" / "llvm_v0.04.log"
    expected = [t.to_pylist() for t, _ in autotvm.iter_tables(path, workers=1)]
    monkeypatch.setattr(native, "_STATE", {})  # forget the library this process loaded
    monkeypatch.setenv("LORIEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert native.library() is None
    assert "scanner is unavailable" in caplog.text and "no-such-compiler" in caplog.text
    assert [t.to_pylist() for t, _ in autotvm.iter_tables(path, workers=1)] == expected
