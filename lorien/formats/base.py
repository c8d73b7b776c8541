"""Shared pieces of the log codecs: the read result, line iteration, value checks."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorien.errors import RecordParseError
from lorien.record import TuningRecord


@dataclass
class LogReadResult:
    """Records decoded from one log, and the lines that failed (file and line in each error)."""

    records: list[TuningRecord]
    errors: list[RecordParseError] = field(default_factory=list)
    format: str = ""
    path: str = ""


def is_skipped(line: bytes | str) -> bool:
    """Blank lines and ``#`` comment lines carry no record."""
    stripped = line.strip()
    return not stripped or stripped[:1] in (b"#", "#")


def iter_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """(line number, raw bytes) of every line that may hold a record, numbered from 1."""
    with open(path, "rb") as handle:
        for lineno, line in enumerate(handle, 1):
            if not is_skipped(line):
                yield lineno, line


def log_line(path: str | Path, line_no: int) -> str:
    """The text of line ``line_no`` (1-based, comment lines count) of a log that holds a record;
    ConfigError names the file and line otherwise."""
    from lorien.errors import ConfigError

    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read log {path}: {exc}") from exc
    if not 1 <= line_no <= len(lines):
        raise ConfigError(f"{path} has {len(lines)} lines; line {line_no} does not exist")
    text = lines[line_no - 1].strip()
    if not text or text.startswith("#"):
        raise ConfigError(f"{path}:{line_no} is a comment or blank, not a record")
    return text


#: ``error_no`` is stored as int32 (TVM's MeasureErrorNo values are small).
INT32_LIMIT = 1 << 31


def number(value: Any, what: str) -> float:
    """A JSON number as a finite float; bools, strings and numbers no double holds are refused."""
    if type(value) is float or type(value) is int:
        try:
            result = float(value)
        except OverflowError:
            result = math.inf
        if math.isfinite(result):
            return result
        raise ValueError(f"{what} {value!r} is not a finite number")
    raise ValueError(f"{what} {value!r} is not a number")


def integer(value: Any, what: str) -> int:
    if type(value) is int:
        return value
    raise ValueError(f"{what} {value!r} is not an integer")


def error_number(value: Any, what: str = "error_no") -> int:
    """A measurement's error number: an integer in the int32 range it is stored in."""
    number = integer(value, what)
    if not -INT32_LIMIT <= number < INT32_LIMIT:
        raise ValueError(f"{what} {value!r} is out of the int32 range")
    return number


def costs_list(value: Any, what: str = "costs") -> list[float]:
    if type(value) is not list:
        raise ValueError(f"{what} {value!r} is not a list")
    return [number(cost, what) for cost in value]


def parse_error(exc: BaseException, path: str | None, lineno: int | None) -> RecordParseError:
    """The RecordParseError for a line whose decoding raised ``exc``."""
    if isinstance(exc, RecordParseError):
        if exc.path is None and path is not None:
            return RecordParseError(str(exc), path, lineno)
        return exc
    kind = type(exc).__name__
    if kind == "JSONDecodeError":
        return RecordParseError(f"malformed or truncated JSON ({exc})", path, lineno)
    return RecordParseError(f"{kind}: {exc}", path, lineno)
