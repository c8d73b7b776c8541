"""Mutations of real tuning logs, and the properties every reader keeps on any input.

A test helper, not part of the library: ``tests/test_formats_fuzz.py`` imports it as
``fuzzing`` (pytest puts ``tests/`` on the path) and ``benchmarks/fuzz.py``, the long run,
puts ``tests/`` on the path first. The fuzz suite takes a few lines of a real log -- a TopHub AutoTVM log as record layout 0.2 or converted to
0.1, an auto-scheduler log, or a MetaSchedule database pair -- applies a few random
:data:`MUTATIONS` (truncation, flipped and non-UTF-8 bytes, wrong JSON types, missing or
renamed keys, out-of-range numbers, negative shapes, unknown names, a workload file that
disagrees with its record file, ...), and :func:`check_log` checks that:

- every reader (``read_log``; ``iter_log_tables`` through the Python batch decoder, the
  native scanner and, now and then, worker processes) gives records and per-line errors, each
  naming its file and line, and raises nothing else; every record line is a record or an error;
- the readers agree on the records and on the errors;
- every record fits an Arrow table and is written back as a line that reads as the same record;
- ingest stores exactly the distinct good records and the store stays readable; a strict
  ingest of a log with a bad line stores nothing.

The mutator draws from anything with ``random.Random``'s methods, so Hypothesis can drive it
(and shrink a failing case) as well as a seeded ``random.Random`` in the long run.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import random
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorien.errors import RecordParseError, UnknownFormatError
from lorien.formats.base import is_skipped

#: JSON number texts past what the readers take: ints past int32, int64 and uint64, floats
#: that overflow or underflow a double, negative zero, and the non-JSON words Python writes.
EXTREME_NUMBERS = (
    "99999999999", "2147483648", "-2147483649", "9223372036854775808", "-9223372036854775809",
    "18446744073709551615", "18446744073709551616", "1" + "0" * 30, "1e999", "-1e999", "1e-400",
    "-0", "-0.0", "0", "-1", "5e-324", "1.7976931348623157e308", "NaN", "Infinity", "-Infinity",
)
#: Strings no reader knows: unknown step, instruction, knob or target names, odd characters.
UNKNOWN_NAMES = (
    "NoSuchStep", "ZZ", "", "SP ", "sp", "NoSuchInstruction", "été", 'a\\b"c', "\x00", "\u2028",
    "nosuchtarget -a=b", "llvm -mcpu=", "cuda -libs=", "llvm -keys=", "TENSOR", "NCHW8c", "x" * 3000,
    "../x", "a/b", "k=v", "__HIVE_DEFAULT_PARTITION__", "llvm -keys=" + "k" * 300, "llvm -keys=../..,a/b",
    '{"kind": "llvm"', "llvm -mcpu='unterminated", "cuda -keys=cuda,gpu -max_num_threads=-1",
)
#: Byte strings spliced into lines: invalid UTF-8, lone surrogates, escapes, structure, controls.
BYTE_SNIPPETS = (
    b"\xff", b"\xfe\xff", b"\xc3", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00", b"\\",
    b'"', b"\\u0000", b"\\ud800", b"{", b"}", b"[", b"]", b",", b":", b" ", b"\t", b"\r", b"\x0b",
    b"\xe2\x80\xa8", b"\xef\xbb\xbf", b"-", b"0", b"e", b".",
)
_MARK = "@@lorien-fuzz-{}@@"


@dataclass
class LogCase:
    """A log to read: its format and its files (one, or the MetaSchedule pair) as lines."""

    format: str
    files: dict[str, list[bytes]]
    line_end: bytes = b"\n"
    final_newline: bool = True
    mutations: list[str] = field(default_factory=list)

    @property
    def main_file(self) -> str:
        """The file holding the records (the record file of a MetaSchedule pair)."""
        return "database_tuning_record.json" if self.format == "meta_schedule" else next(iter(self.files))

    def write(self, directory: Path) -> Path:
        """Write the files into ``directory``; the path to read (a file, or the database)."""
        for name, lines in self.files.items():
            data = self.line_end.join(lines)
            if lines and self.final_newline:
                data += self.line_end
            (directory / name).write_bytes(data)
        return directory if self.format == "meta_schedule" else directory / self.main_file

    def describe(self) -> str:
        return f"{self.format} case after {', '.join(self.mutations) or 'no mutation'}"


# ---------------------------------------------------------------- the corpus

def autotvm_v01(line: dict[str, Any]) -> dict[str, Any]:
    """An AutoTVM layout-0.2 record as TVM's older layout 0.1 writes it."""
    inp, config = line["input"], line["config"]
    kwargs = inp[3] if len(inp) > 3 else {}
    workload = [inp[1], *inp[2]]
    old_config = {"i": config.get("index"), "t": "direct", "c": config.get("code_hash"), "e": config.get("entity")}
    return {"i": [inp[0], inp[1], inp[2], kwargs, workload, old_config], "r": line["result"], "v": 0.1}


@dataclass(repr=False)
class Corpus:
    """Record lines of the real logs the cases are cut from, per kind of log."""

    autotvm: list[list[bytes]]
    autotvm_v01: list[list[bytes]]
    ansor: list[list[bytes]]
    meta_schedule: tuple[list[bytes], list[bytes]]  # the workload file and the record file

    def __repr__(self) -> str:
        return (f"Corpus({len(self.autotvm)} AutoTVM logs, {len(self.ansor)} auto-scheduler logs, "
                f"{len(self.meta_schedule[0])} MetaSchedule workloads)")

    @classmethod
    def load(cls, data_dir: str | Path) -> Corpus:
        """The shared logs under ``data_dir`` (``tophub/``, ``ansor/``, ``meta_schedule/``)."""
        data_dir = Path(data_dir)

        def record_lines(path: Path) -> list[bytes]:
            return [line for line in path.read_bytes().splitlines() if not is_skipped(line)]

        autotvm_logs = [record_lines(path) for path in sorted((data_dir / "tophub").glob("*.log"))]
        v01 = [[json.dumps(autotvm_v01(json.loads(line))).encode() for line in lines[:60]] for lines in autotvm_logs]
        ansor_logs = [record_lines(path) for path in sorted((data_dir / "ansor").glob("*.json"))]
        workloads: list[bytes] = []
        records: list[bytes] = []
        for database in sorted((data_dir / "meta_schedule").iterdir()):
            index = len(workloads)
            workloads += record_lines(database / "database_workload.json")
            for line in record_lines(database / "database_tuning_record.json"):
                value = json.loads(line)
                value[0] += index  # the databases become one: a pair of two workloads
                records.append(json.dumps(value, separators=(",", ":")).encode())
        if not (autotvm_logs and ansor_logs and workloads):
            raise FileNotFoundError(f"{data_dir}: needs tophub/*.log, ansor/*.json and meta_schedule/*/ databases")
        return cls(autotvm_logs, v01, ansor_logs, (workloads, records))

    def case(self, rng: Any) -> LogCase:
        """A few consecutive record lines of one real log, unmutated."""
        kind = rng.choice(("autotvm", "autotvm", "autotvm_v01", "ansor", "ansor", "meta_schedule", "meta_schedule"))
        if kind == "meta_schedule":
            workloads, records = self.meta_schedule
            return LogCase("meta_schedule", {"database_workload.json": list(workloads),
                                             "database_tuning_record.json": _window(rng, records)})
        logs = getattr(self, kind)
        lines = _window(rng, rng.choice(logs))
        return LogCase("ansor" if kind == "ansor" else "autotvm", {"log.json" if kind == "ansor" else "log.log": lines})


def _window(rng: Any, lines: list[bytes]) -> list[bytes]:
    size = rng.randint(1, min(12, len(lines)))
    start = rng.randrange(len(lines) - size + 1)
    return list(lines[start:start + size])


# ---------------------------------------------------------------- mutations

def _pick_line(rng: Any, case: LogCase, file: str | None = None) -> tuple[str, int] | None:
    name = file or (case.main_file if rng.random() < 0.85 else rng.choice(list(case.files)))
    lines = case.files[name]
    return (name, rng.randrange(len(lines))) if lines else None


def _json_dumps(case: LogCase, value: Any) -> str:
    if case.format == "meta_schedule":
        return json.dumps(value, separators=(",", ":"))
    return json.dumps(value)  # TVM's spacing, so the fast paths still cut the line


def _node_path(rng: Any, value: Any) -> list[Any]:
    """A random path into a JSON value: a child at each level, stopping early at random."""
    path: list[Any] = []
    while isinstance(value, (list, dict)) and value and (not path or rng.random() < 0.7):
        key = rng.choice(list(value)) if isinstance(value, dict) else rng.randrange(len(value))
        path.append(key)
        value = value[key]
    return path


def _number_slots(container: Any, key: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key) holding a number within ``container[key]`` (itself included)."""
    value = container[key]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        yield container, key
    elif isinstance(value, (list, dict)):
        for inner in (range(len(value)) if isinstance(value, list) else list(value)):
            yield from _number_slots(value, inner)


def _edit_tree(rng: Any, value: Any) -> tuple[Any, dict[str, str], str]:
    """One structural edit of a parsed line: (new value, marker -> literal text, what was done)."""
    literals: dict[str, str] = {}
    path = _node_path(rng, value)
    if not path:
        return rng.choice([None, [], {}, 0, "x", [value]]), literals, "whole line replaced"
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    node = parent[key]
    action = rng.choice(("type", "number", "number", "negate", "delete", "rename", "duplicate", "name", "nest"))
    slots = list(_number_slots(parent, key))
    if action == "number" or (action == "negate" and not slots):
        marker = _MARK.format(len(literals))
        literals[marker] = rng.choice(EXTREME_NUMBERS)
        holder, at = rng.choice(slots) if slots and rng.random() < 0.8 else (parent, key)
        holder[at] = marker
        return value, literals, f"number {literals[marker]} at {path}"
    if action == "negate":
        holder, at = rng.choice(slots)
        holder[at] = -holder[at] if holder[at] else -1
        return value, literals, f"negated a number under {path}"
    if action == "type":
        choices = [None, True, 0, 1.5, "x", [], {}, [1], {"a": 1}, ["TENSOR", [1], "float32"]]
        parent[key] = rng.choice([choice for choice in choices if type(choice) is not type(node)])
        return value, literals, f"type changed at {path}"
    if action == "delete":
        del parent[key]
        return value, literals, f"deleted {path}"
    if action == "rename" and isinstance(parent, dict):
        new_key = rng.choice((key + "_", key.upper(), "", key[:-1] or "k", "i" if key != "i" else "input"))
        items = list(parent.items())
        parent.clear()
        parent.update((new_key if name == key else name, item) for name, item in items)
        return value, literals, f"renamed {path} to {new_key!r}"
    if action in ("rename", "duplicate"):
        if isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(node)))
        else:
            parent[f"{key}2"] = node
        return value, literals, f"duplicated {path}"
    if action == "name":
        parent[key] = rng.choice(UNKNOWN_NAMES)
        return value, literals, f"unknown name at {path}"
    marker = _MARK.format(len(literals))
    depth = rng.choice((100, 1100, 5000))
    literals[marker] = "[" * depth + "1" + "]" * depth
    parent[key] = marker
    return value, literals, f"nested {depth} deep at {path}"


def _dump_with_literals(case: LogCase, value: Any, literals: dict[str, str]) -> bytes:
    text = _json_dumps(case, value)
    for marker, literal in literals.items():
        text = text.replace(json.dumps(marker), literal)
    return text.encode("utf-8", "surrogatepass")


def _edit_line(rng: Any, case: LogCase, edit: Callable[[bytes], tuple[bytes, str]], file: str | None = None) -> str:
    """Apply ``edit(line) -> (line, what was done)`` to a random line (of ``file``, if given)."""
    picked = _pick_line(rng, case, file)
    if picked is None:
        return "nothing to edit: empty file"
    name, index = picked
    case.files[name][index], what = edit(case.files[name][index])
    return f"{what} in line {index + 1} of {name}"


def _edit_json_line(rng: Any, case: LogCase, edit: Callable[[Any], tuple[bytes, str]], file: str | None = None) -> str:
    """Apply ``edit(parsed line) -> (line, what was done)`` to a random line that parses."""
    def parse_and_edit(line: bytes) -> tuple[bytes, str]:
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            return line, "nothing done (not JSON)"
        return edit(value)
    return _edit_line(rng, case, parse_and_edit, file)


def mutate_json(rng: Any, case: LogCase) -> str:
    """Parse one line, change one node (type, extreme number, sign, key, name, depth), write it back."""
    def edit(value: Any) -> tuple[bytes, str]:
        value, literals, what = _edit_tree(rng, value)
        return _dump_with_literals(case, value, literals), what
    return _edit_json_line(rng, case, edit)


def mutate_embedded_json(rng: Any, case: LogCase) -> str:
    """Edit JSON held inside a string: an auto-scheduler workload key, a MetaSchedule module graph."""
    if case.format == "ansor":
        picked = _pick_line(rng, case)
        if picked is None:
            return "embedded: empty file"
        name, index = picked
        try:
            line = json.loads(case.files[name][index])
            key = json.loads(line["i"][0][0])
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            return "embedded: no workload key"
        key, literals, what = _edit_tree(rng, key)
        line["i"][0][0] = _dump_with_literals(case, key, literals).decode("utf-8", "surrogatepass")
        case.files[name][index] = json.dumps(line).encode("utf-8", "surrogatepass")
        return f"workload key: {what}"
    if case.format == "meta_schedule":
        picked = _pick_line(rng, case, "database_workload.json")
        if picked is None:
            return "embedded: no workload"
        name, index = picked
        try:
            entry = json.loads(case.files[name][index])
            raw = base64.b64decode(entry[1])
            graph = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        except (ValueError, IndexError, TypeError, KeyError, RecursionError):
            return "embedded: module unreadable already"
        for _ in range(rng.randint(1, 3)):
            graph, literals, what = _edit_tree(rng, graph)
            text = _dump_with_literals(case, graph, literals)
            try:
                graph = json.loads(text)
            except (ValueError, RecursionError):
                break
        entry[1] = base64.b64encode(len(text).to_bytes(8, "little") + text).decode()
        case.files[name][index] = json.dumps(entry, separators=(",", ":")).encode()
        return f"module graph: {what}"
    return mutate_json(rng, case)


def truncate(rng: Any, case: LogCase) -> str:
    """Cut a file short inside a line (a crashed writer)."""
    picked = _pick_line(rng, case)
    if picked is None:
        return "truncate: empty file"
    name, index = picked
    line = case.files[name][index]
    case.files[name][index:] = [line[:rng.randrange(len(line) + 1)]]
    case.final_newline = False
    return f"truncated {name} in line {index + 1}"


def flip_byte(rng: Any, case: LogCase) -> str:
    def flip(line: bytes) -> tuple[bytes, str]:
        if not line:
            return line, "no byte to flip"
        edited, at = bytearray(line), rng.randrange(len(line))
        edited[at] ^= 1 << rng.randrange(8)
        return bytes(edited), f"flipped a bit of byte {at}"
    return _edit_line(rng, case, flip)


def splice_bytes(rng: Any, case: LogCase) -> str:
    """Insert or overwrite a few bytes: invalid UTF-8, escapes, brackets, control characters."""
    def splice(line: bytes) -> tuple[bytes, str]:
        at, snippet = rng.randrange(len(line) + 1), rng.choice(BYTE_SNIPPETS)
        rest = line[at:] if rng.random() < 0.5 else line[at + len(snippet):]
        return line[:at] + snippet + rest, f"spliced {snippet!r}"
    return _edit_line(rng, case, splice)


def delete_bytes(rng: Any, case: LogCase) -> str:
    def delete(line: bytes) -> tuple[bytes, str]:
        at = rng.randrange(len(line) + 1)
        return line[:at] + line[at + rng.randint(1, 8):], "deleted bytes"
    return _edit_line(rng, case, delete)


def change_digit(rng: Any, case: LogCase) -> str:
    """Change one digit: numbers change, leading zeros appear, configs keep their skeleton."""
    def change(line: bytes) -> tuple[bytes, str]:
        digits = [at for at, byte in enumerate(line) if 48 <= byte <= 57]
        if not digits:
            return line, "no digit to change"
        edited = bytearray(line)
        edited[rng.choice(digits)] = rng.choice(b"0123456789")
        return bytes(edited), "changed a digit"
    return _edit_line(rng, case, change)


def shuffle_lines(rng: Any, case: LogCase) -> str:
    """Drop, repeat or swap lines, or add blank and comment lines."""
    name = case.main_file if rng.random() < 0.8 else rng.choice(list(case.files))
    lines = case.files[name]
    action = rng.choice(("drop", "repeat", "swap", "blank"))
    if action == "blank" or not lines:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice((b"", b"   ", b"# a comment", b"\t#", b"\x0c")))
    elif action == "drop":
        del lines[rng.randrange(len(lines))]
    elif action == "repeat":
        at = rng.randrange(len(lines))
        lines.insert(at, lines[at])
    else:
        first, second = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[first], lines[second] = lines[second], lines[first]
    return f"{action} lines of {name}"


def line_ends(rng: Any, case: LogCase) -> str:
    """CRLF line ends, no final newline, or a byte-order mark."""
    action = rng.choice(("crlf", "no final newline", "bom"))
    if action == "crlf":
        case.line_end = b"\r\n"
    elif action == "no final newline":
        case.final_newline = False
    elif case.files[case.main_file]:
        case.files[case.main_file][0] = b"\xef\xbb\xbf" + case.files[case.main_file][0]
    return action


def mix_formats(rng: Any, case: LogCase, corpus: Corpus) -> str:
    """A line of another log (maybe of another format) among this log's lines."""
    other = corpus.case(rng)
    lines = other.files[other.main_file]
    if not lines:
        return "mix: nothing to take"
    case.files[case.main_file].insert(rng.randrange(len(case.files[case.main_file]) + 1), rng.choice(lines))
    return f"mixed in a {other.format} line"


def disagree(rng: Any, case: LogCase) -> str:
    """MetaSchedule: a workload file that does not match its record file."""
    if case.format != "meta_schedule":
        return mutate_json(rng, case)
    workloads = case.files["database_workload.json"]
    action = rng.choice(("drop", "swap", "empty", "index", "shash"))
    if action == "drop" and workloads:
        del workloads[rng.randrange(len(workloads))]
    elif action == "swap" and len(workloads) > 1:
        workloads.reverse()
    elif action == "empty":
        workloads.clear()
    elif action == "shash" and workloads:
        try:
            entry = json.loads(workloads[0])
            entry[0] = rng.choice((None, 12, [], "", "not-a-hash", 2**70))
        except (ValueError, RecursionError, TypeError, IndexError, KeyError):
            return "disagree: workload line already broken"
        workloads[0] = json.dumps(entry, separators=(",", ":")).encode()
    else:
        records = case.files["database_tuning_record.json"]
        if records:
            at = rng.randrange(len(records))
            text = records[at]
            comma = text.find(b",")
            literal = rng.choice((b"-1", b"2", b"999999", b"9223372036854775808", b'"0"', b"1.0", b"null", b"true"))
            records[at] = b"[" + literal + text[comma:] if comma > 0 else text
    return f"workload file and record file disagree ({action})"


def _places(case: LogCase, value: Any) -> list[tuple[list[Any], str]]:
    """(path, what) of the names and shapes a reader derives keys, targets and layouts from."""
    places: list[tuple[list[Any], str]] = []
    if case.format == "autotvm" and isinstance(value, dict):
        inp, key = (value.get("input"), "input") if "input" in value else (value.get("i"), "i")
        if isinstance(inp, list) and len(inp) >= 3:
            places += [([key, 0], "target"), ([key, 1], "task")]
            if isinstance(inp[2], list):
                places += [([key, 2, at], "argument") for at in range(len(inp[2]))]
    elif case.format == "ansor" and isinstance(value, dict):
        places += [(["i", 0, 0], "workload key"), (["i", 0, 1], "target")]
    elif case.format == "meta_schedule" and isinstance(value, list) and len(value) == 2:
        places += [([1, 2], "target"), ([1, 3], "arguments")]
    return places


def mutate_names(rng: Any, case: LogCase) -> str:
    """Change what names a record: its target, task, workload key or layout argument, or make a
    tensor shape negative."""
    def edit(value: Any) -> tuple[bytes, str]:
        places = _places(case, value)
        if not places:
            return _json_dumps(case, value).encode(), "nothing to rename"
        path, what = rng.choice(places)
        try:
            parent = value
            for step in path[:-1]:
                parent = parent[step]
            node = parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            return _json_dumps(case, value).encode(), "nothing renamed (not where expected)"
        slots = list(_number_slots(parent, path[-1])) if isinstance(parent, (list, dict)) else []
        if slots and rng.random() < 0.5:
            holder, at = rng.choice(slots)
            holder[at] = -abs(holder[at]) - rng.choice((0, 1))
            what = f"negative number in the {what}"
        elif isinstance(node, dict):
            node[rng.choice(list(node) or ["kind"])] = rng.choice(UNKNOWN_NAMES)
        elif isinstance(parent, (list, dict)):
            parent[path[-1]] = rng.choice(UNKNOWN_NAMES)
        return _json_dumps(case, value).encode("utf-8", "surrogatepass"), f"names: {what}"
    return _edit_json_line(rng, case, edit, case.main_file)


#: name -> (weight, mutation). Each returns what it did (for the failure report).
MUTATIONS: dict[str, tuple[int, Callable[..., str]]] = {
    "json": (10, mutate_json),
    "names": (4, mutate_names),
    "embedded": (3, mutate_embedded_json),
    "truncate": (2, truncate),
    "flip": (2, flip_byte),
    "splice": (3, splice_bytes),
    "delete": (1, delete_bytes),
    "digit": (2, change_digit),
    "lines": (2, shuffle_lines),
    "line_ends": (1, line_ends),
    "mix": (1, mix_formats),
    "disagree": (2, disagree),
}


def mutated_case(rng: Any, corpus: Corpus) -> LogCase:
    """A real log cut short and changed by one to four random mutations."""
    case = corpus.case(rng)
    names = list(MUTATIONS)
    weights = [MUTATIONS[name][0] for name in names]
    for _ in range(rng.choices((1, 2, 3, 4), (8, 4, 2, 1))[0]):
        name = rng.choices(names, weights)[0]
        mutation = MUTATIONS[name][1]
        case.mutations.append(mutation(rng, case, corpus) if name == "mix" else mutation(rng, case))
    return case


# ---------------------------------------------------------------- the properties

@dataclass
class Finding:
    """A property a reader broke on a case: ``crash`` (an exception other than the documented
    ones) or ``disagreement`` (readers that differ, an error without its line, a wrong count)."""

    kind: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} in {self.where}: {self.message}"


@contextlib.contextmanager
def _native(enabled: bool) -> Iterator[None]:
    before = os.environ.get("LORIEN_NATIVE")
    os.environ["LORIEN_NATIVE"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["LORIEN_NATIVE"]
        else:
            os.environ["LORIEN_NATIVE"] = before


class _Checker:
    """Runs the readers on one written case and collects what they break."""

    def __init__(self, case: LogCase, path: Path):
        self.case, self.path = case, path
        self.findings: list[Finding] = []

    def crash(self, where: str, exc: BaseException) -> None:
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        self.findings.append(Finding("crash", where, f"{type(exc).__name__}: {exc}\n{''.join(lines[-6:])}"))

    def disagree(self, where: str, message: str) -> None:
        self.findings.append(Finding("disagreement", where, message))

    def call(self, where: str, function: Callable[[], Any], allowed: tuple[type[BaseException], ...] = ()) -> Any:
        """``function()``; an exception outside ``allowed`` is a crash (returns None then)."""
        try:
            return function()
        except allowed:
            raise
        except Exception as exc:  # noqa: BLE001 - any other exception is what the fuzz suite looks for
            self.crash(where, exc)
            return None

    def file_path(self, file: str) -> Path:
        return self.path / file if self.case.format == "meta_schedule" else self.path.parent / file

    def lines_of(self, file: str) -> int:
        """Lines of a written file, as the readers number them."""
        data = self.file_path(file).read_bytes()
        return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)

    def record_lines(self) -> int:
        """Lines of the record file that may hold a record (as the readers split it)."""
        data = self.file_path(self.case.main_file).read_bytes()
        return sum(1 for line in data.split(b"\n") if not is_skipped(line))

    def check_errors(self, where: str, errors: list[Any]) -> None:
        for error in errors:
            if not isinstance(error, RecordParseError):
                self.disagree(where, f"an error that is not a RecordParseError: {error!r}")
            elif error.path is None or error.line is None:
                self.disagree(where, f"an error without its file and line: {error}")
            elif Path(error.path).name not in self.case.files or not 1 <= error.line <= self.lines_of(
                    Path(error.path).name):
                self.disagree(where, f"an error naming a line that does not exist: {error}")


def _error_keys(errors: list[RecordParseError]) -> list[tuple[str | None, int | None, str]]:
    return [(error.path, error.line, str(error)) for error in errors]


def check_log(case: LogCase, directory: Path, store: bool = True, parallel: bool = False) -> list[Finding]:
    """Write ``case`` into ``directory`` and check every property on it (see the module doc);
    ``store`` adds the ingest checks, ``parallel`` the worker-process reader."""
    from lorien.formats import detect_format, read_log

    path = case.write(directory)
    check = _Checker(case, path)
    fmt = case.format
    try:
        check.call("detect_format", lambda: detect_format(path), (UnknownFormatError,))
    except UnknownFormatError:
        pass
    result = check.call("read_log", lambda: read_log(path, fmt))
    if result is None:
        return check.findings
    check.check_errors("read_log", result.errors)
    record_errors = [error for error in result.errors if Path(error.path or "").name == case.main_file]
    if len(result.records) + len(record_errors) != check.record_lines():
        check.disagree("read_log", f"{len(result.records)} records and {len(record_errors)} bad lines "
                                   f"from {check.record_lines()} record lines")
    for record in result.records:
        insane = _insane(record)
        if insane:
            check.disagree("read_log", f"record {record.record_id} {insane}")
            break
    _check_tables(check, result, parallel)
    _check_round_trip(check, result, directory)
    if store:
        _check_ingest(check, result, directory)
    return check.findings


def _insane(record: Any) -> str:
    """What is wrong with a decoded record's values, or "" (numbers finite, FLOP not negative,
    error_no an int32, names that can name a partition)."""
    numbers = [*record.costs, record.all_cost, record.timestamp]
    if not all(math.isfinite(value) for value in numbers):
        return f"has a number that is not finite: {numbers}"
    if record.flop is not None and not (math.isfinite(record.flop) and record.flop >= 0):
        return f"has FLOP {record.flop}"
    if not -(1 << 31) <= record.error_no < 1 << 31:
        return f"has error_no {record.error_no}"
    if not record.layout or not record.target_key or not record.target:
        return f"has an empty layout, target or target key ({record.layout!r}, {record.target!r})"
    return ""


def _check_tables(check: _Checker, result: Any, parallel: bool) -> None:
    from lorien.formats import autotvm, iter_log_tables
    from lorien.record import records_to_table

    expected_rows = check.call("records_to_table", lambda: records_to_table(result.records).to_pylist())
    if expected_rows is None:
        return
    expected_errors = _error_keys(result.errors)
    readers: list[tuple[str, Callable[[], Any]]] = []
    for native in ((False, True) if check.case.format == "autotvm" else (False,)):
        def read(native: bool = native) -> Any:
            with _native(native):
                return list(iter_log_tables(check.path, check.case.format, batch_size=3, workers=1))
        readers.append((f"iter_log_tables(native={native})", read))
    if parallel and check.case.format == "autotvm":
        readers.append(("iter_log_tables(2 worker processes)",
                        lambda: list(autotvm._iter_tables_parallel(check.path, False, 3, 2, 256))))
    for where, read in readers:
        tables = check.call(where, read)
        if tables is None:
            continue
        rows = [row for table, _ in tables for row in table.to_pylist()]
        errors = [error for _, batch_errors in tables for error in batch_errors]
        check.check_errors(where, errors)
        if rows != expected_rows:
            check.disagree(where, f"{len(rows)} rows where read_log gives {len(expected_rows)} records "
                                  f"(or the rows differ)")
        if _error_keys(errors) != expected_errors:
            check.disagree(where, f"errors {_error_keys(errors)} where read_log gives {expected_errors}")


def _check_round_trip(check: _Checker, result: Any, directory: Path) -> None:
    from lorien.formats import decode_line, encode_record, read_log, write_log

    if not result.records:
        return
    ids = sorted(record.record_id for record in result.records)
    if check.case.format == "meta_schedule":
        out = directory / "written"
        if check.call("write_log", lambda: write_log(result.records, "meta_schedule", out)) is None:
            return
        again = check.call("read_log of written", lambda: read_log(out, "meta_schedule"))
        if again is not None and (again.errors or sorted(record.record_id for record in again.records) != ids):
            check.disagree("round trip", "the written database does not read back as the same records")
        return
    for record in result.records:
        line = check.call("encode_record", lambda record=record: encode_record(record, check.case.format))
        if line is None:
            return
        try:
            back = decode_line(line, check.case.format)
        except RecordParseError as exc:
            check.disagree("round trip", f"a good record is written as a line that does not read: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a crash is a finding
            check.crash("decode_line of a written record", exc)
            return
        if back.record_id != record.record_id:
            check.disagree("round trip", f"record {record.record_id} reads back as {back.record_id}: {line[:200]}")
            return


def _check_ingest(check: _Checker, result: Any, directory: Path) -> None:
    from lorien.ingest import ingest_paths
    from lorien.warehouse import open_store

    fmt = check.case.format
    good_ids = {record.record_id for record in result.records}
    store_uri = f"parquet:{directory / 'store'}"
    report = check.call("ingest", lambda: ingest_paths([check.path], store_uri, format=fmt, batch_size=4))
    if report is not None:
        if report.records != len(result.records):
            check.disagree("ingest", f"{report.records} records ingested, read_log gives {len(result.records)}")
        if _error_keys(report.errors) != _error_keys(result.errors):
            check.disagree("ingest", "its bad lines differ from read_log's")

        def stored() -> tuple[set[str], dict[str, Any]]:
            with open_store(store_uri) as opened:
                return set(opened.scan(columns=["record_id"]).column("record_id").to_pylist()), opened.stats()

        found = check.call("store after ingest", stored)
        if found is not None and found[0] != good_ids:
            check.disagree("store after ingest", f"holds {len(found[0])} records, the log has {len(good_ids)} "
                                                 f"distinct good ones")
    strict_uri = f"parquet:{directory / 'strict-store'}"
    try:
        check.call("strict ingest", lambda: ingest_paths([check.path], strict_uri, strict=True, format=fmt,
                                                         batch_size=4), (RecordParseError,))
        refused = False
    except RecordParseError:
        refused = True
    if refused != bool(result.errors):
        check.disagree("strict ingest", f"{'refused' if refused else 'took'} a log with {len(result.errors)} bad lines")

    def strict_count() -> int:
        with open_store(strict_uri) as opened:
            return opened.scan(columns=["record_id"]).num_rows

    count = check.call("store after strict ingest", strict_count)
    if count is not None and count != (0 if refused else len(good_ids)):
        check.disagree("strict ingest", f"the store holds {count} records after a {'refused' if refused else 'whole'} ingest")


# ---------------------------------------------------------------- the long run

@dataclass
class FuzzReport:
    """Cases run and the findings of each failing case."""

    cases: int = 0
    failures: list[tuple[int, LogCase, list[Finding]]] = field(default_factory=list)

    @property
    def crashes(self) -> int:
        """Cases where some reader raised an undocumented exception."""
        return sum(any(finding.kind == "crash" for finding in findings) for _, _, findings in self.failures)

    @property
    def disagreements(self) -> int:
        """Cases without a crash where readers disagreed or a count was wrong."""
        return len(self.failures) - self.crashes


def run_fuzz(data_dir: str | Path, cases: int, seed: int = 0, store_every: int = 10, parallel_every: int = 50,
             on_case: Callable[[int, LogCase, list[Finding]], None] | None = None) -> FuzzReport:
    """Check ``cases`` mutated logs drawn from ``random.Random(seed)``; ingest every
    ``store_every``-th into a store and read every ``parallel_every``-th with worker processes."""
    import logging

    corpus = Corpus.load(data_dir)
    report = FuzzReport()
    quiet = logging.getLogger("lorien")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the FLOP-unknown and similar warnings of thousands of odd logs
    try:
        for number in range(cases):
            rng = random.Random(f"{seed}:{number}")
            case = mutated_case(rng, corpus)
            with tempfile.TemporaryDirectory(prefix="lorien-fuzz-") as temp:
                findings = check_log(case, Path(temp), store=number % store_every == 0,
                                     parallel=parallel_every > 0 and number % parallel_every == 0)
            report.cases += 1
            if findings:
                report.failures.append((number, case, findings))
            if on_case is not None:
                on_case(number, case, findings)
    finally:
        quiet.setLevel(level)
    return report
