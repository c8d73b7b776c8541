"""AutoTVM JSON lines: record layout 0.2 (``{"input", "config", "result", "version", "tvm_version"}``)
and the older 0.1 (``{"i": [target, task, args, kwargs, workload, config], "r": ..., "v": 0.1}``).

Decoding is cached per distinct workload (target, task, args): target parsing, the readable
workload key, the layout and the FLOP count are computed once per workload, not per line.
Lines laid out as TVM writes them are cut at their top-level keys so that only the config
and the result are parsed per line; any other layout goes through a full JSON parse.
"""

from __future__ import annotations

import gc
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson
import pyarrow as pa

from lorien.errors import RecordParseError, TargetError
from lorien.formats.base import is_skipped, iter_lines, parse_error
from lorien.record import ARROW_SCHEMA, TuningRecord
from lorien.target import parse_target
from lorien.workload import autotvm_workload_key, compute_flop, infer_layout

FORMAT = "autotvm"
DIALECT = "autotvm"
#: Written into ``tvm_version`` of records that did not come from a TVM log.
DEFAULT_TVM_VERSION = "lorien"

_INPUT_HEAD = b'{"input": '
_CONFIG_MARK = b', "config": '
_RESULT_MARK = b', "result": '
_VERSION_MARK = b', "version": '


class Workload(NamedTuple):
    """Everything a record derives from its ``input``; computed once per distinct input."""

    index: int
    target: str
    target_key: str
    target_raw: str
    workload_key: str
    task_name: str
    args: str
    layout: str
    flop: float | None
    kwargs: Any  # the input's fourth element, or _ABSENT
    id_prefix: bytes


_ABSENT = object()


class Decoder:
    """Decodes AutoTVM lines into column values, caching per-workload and per-version work."""

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.workloads: list[Workload] = []
        self._by_raw_input: dict[bytes, Workload] = {}
        self._by_input: dict[bytes, Workload] = {}
        self.extras: list[str] = []
        self._extra_index: dict[Any, int] = {}

    # -------------------------------------------------------------- cached parts
    def _workload(self, target_raw: Any, task_name: Any, args: Any, kwargs: Any) -> Workload:
        key = orjson.dumps([target_raw, task_name, args, None if kwargs is _ABSENT else kwargs, kwargs is _ABSENT])
        found = self._by_input.get(key)
        if found is not None:
            return found
        if type(target_raw) is not str or type(task_name) is not str or type(args) is not list:
            raise RecordParseError(
                f"input needs [target string, task name, args list, ...], got {[target_raw, task_name, args]!r}")
        try:
            target = parse_target(target_raw)
        except TargetError as exc:
            raise RecordParseError(f"unknown or unparseable target in record: {exc}") from exc
        workload_key = autotvm_workload_key(task_name, args)
        layout = infer_layout(task_name, args)
        canonical = target.canonical
        found = Workload(
            index=len(self.workloads), target=canonical, target_key=target.alternate_key,
            target_raw=target_raw, workload_key=workload_key, task_name=task_name,
            args=orjson.dumps(args).decode(), layout=layout, flop=compute_flop(task_name, args),
            kwargs=kwargs, id_prefix=orjson.dumps([DIALECT, canonical, workload_key, layout])[:-1] + b",",
        )
        self.workloads.append(found)
        self._by_input[key] = found
        return found

    def _extra(self, workload: Workload, fields: dict[str, Any]) -> int:
        extra: dict[str, Any] = {}
        if workload.kwargs is not _ABSENT:
            extra["input_kwargs"] = workload.kwargs
        extra.update(fields)
        text = orjson.dumps(extra)
        index = self._extra_index.get(text)
        if index is None:
            index = self._extra_index[text] = len(self.extras)
            self.extras.append(text.decode())
        return index

    # -------------------------------------------------------------- one line
    def decode(self, line: bytes) -> tuple[Workload, int, str, list[float], int, float, float, str]:
        """(workload, extra index, config, costs, error_no, all_cost, timestamp, record_id) of a line.

        Raises RecordParseError (without file/line; the caller adds them) or a JSON error.
        """
        if line.startswith(_INPUT_HEAD):
            p_config = line.find(_CONFIG_MARK, 10)
            p_version = line.rfind(_VERSION_MARK)
            p_result = line.rfind(_RESULT_MARK, p_config, p_version)
            if p_config > 0 and p_result > 0 and p_version > 0:
                fast = self._decode_tvm_layout(line, p_config, p_result, p_version)
                if fast is not None:
                    return fast
        return self._decode_generic(orjson.loads(line))

    def _decode_tvm_layout(self, line: bytes, p_config: int, p_result: int, p_version: int):
        raw_input = line[10:p_config]
        tail = line[p_version:]
        cached = self._by_raw_input.get(raw_input)
        try:
            if cached is None:
                inp = orjson.loads(raw_input)
                if type(inp) is not list or len(inp) not in (3, 4):
                    return None
                cached = self._workload(inp[0], inp[1], inp[2], inp[3] if len(inp) == 4 else _ABSENT)
                self._by_raw_input[raw_input] = cached
            extra_key = (cached.index, tail)
            extra_index = self._extra_index.get(extra_key)
            if extra_index is None:
                fields = orjson.loads(b"{" + tail[2:].rstrip())
                if type(fields) is not dict:
                    return None
                extra_index = self._extra_index[extra_key] = self._extra(cached, fields)
            config = orjson.loads(line[p_config + 12:p_result])
            result = orjson.loads(line[p_result + 12:p_version])
        except orjson.JSONDecodeError:
            return None  # not cut where expected: let the full parse decide
        if type(config) is not dict:
            raise RecordParseError(f"config {config!r} is not a JSON object")
        return self._finish(cached, extra_index, orjson.dumps(config).decode(), result)

    def _decode_generic(self, data: Any) -> tuple:
        if type(data) is not dict:
            raise RecordParseError(f"an AutoTVM record is a JSON object, got {type(data).__name__}")
        if "input" in data:
            inp, config, result = data.get("input"), data.get("config"), data.get("result")
            if type(inp) is not list or len(inp) not in (3, 4) or type(config) is not dict or result is None:
                raise RecordParseError("an AutoTVM 0.2 record needs input [target, task, args(, kwargs)], config {...} and result")
            workload = self._workload(inp[0], inp[1], inp[2], inp[3] if len(inp) == 4 else _ABSENT)
            fields = {name: value for name, value in data.items() if name not in ("input", "config", "result")}
            return self._finish(workload, self._extra(workload, fields), orjson.dumps(config).decode(), result)
        if data.get("v") == 0.1 and "i" in data:
            inp, result = data["i"], data.get("r")
            if type(inp) is not list or len(inp) != 6 or type(inp[5]) is not dict or result is None:
                raise RecordParseError("an AutoTVM 0.1 record needs i [target, task, args, kwargs, workload, config] and r")
            workload = self._workload(inp[0], inp[1], inp[2], inp[3])
            old = inp[5]
            config = {"index": old.get("i"), "code_hash": old.get("c"), "entity": old.get("e")}
            fields = {name: value for name, value in data.items() if name not in ("i", "r")}
            fields["workload"] = inp[4]
            fields["config_keys"] = list(old)
            if "t" in old:
                fields["template_key"] = old["t"]
            return self._finish(workload, self._extra(workload, fields), orjson.dumps(config).decode(), result)
        raise RecordParseError(f"not an AutoTVM record (keys {sorted(data)!r})")

    @staticmethod
    def _finish(workload: Workload, extra_index: int, config: str, result: Any) -> tuple:
        if type(result) is not list or len(result) != 4 or type(result[0]) is not list or type(result[1]) is not int:
            raise RecordParseError(f"result {result!r} is not [costs, error_no, all_cost, timestamp]")
        try:
            costs = [cost + 0.0 for cost in result[0]]
            all_cost = result[2] + 0.0
            timestamp = result[3] + 0.0
        except TypeError as exc:
            raise RecordParseError(f"result {result!r} has a non-number cost or time") from exc
        error_no = result[1]
        payload = workload.id_prefix + orjson.dumps([config, costs, error_no, timestamp])[1:]
        record_id = hashlib.blake2b(payload, digest_size=16).hexdigest()
        return workload, extra_index, config, costs, error_no, all_cost, timestamp, record_id


def record_from_fields(decoder: Decoder, fields: tuple) -> TuningRecord:
    workload, extra_index, config, costs, error_no, all_cost, timestamp, record_id = fields
    return TuningRecord(
        dialect=DIALECT, target=workload.target, target_key=workload.target_key,
        workload_key=workload.workload_key, task_name=workload.task_name, args=workload.args,
        layout=workload.layout, config=config, costs=costs, error_no=error_no, all_cost=all_cost,
        timestamp=timestamp, flop=workload.flop, build="{}", extra=decoder.extras[extra_index],
        source=decoder.source, target_raw=workload.target_raw, record_id=record_id,
    )


_DECODERS: dict[str, Decoder] = {}
_DECODERS_LOCK = threading.Lock()


def decode_line(line: str | bytes, path: str | None = None, lineno: int | None = None) -> TuningRecord:
    """One AutoTVM log line as a TuningRecord; RecordParseError names the file and line.

    Safe to call from several threads: decoders and their caches are shared under a lock.
    """
    source = "" if path is None else str(path)
    raw = line.encode() if isinstance(line, str) else line
    with _DECODERS_LOCK:
        decoder = _DECODERS.get(source)
        if decoder is None:
            if len(_DECODERS) > 64:
                _DECODERS.clear()
            decoder = _DECODERS[source] = Decoder(source)
        try:
            return record_from_fields(decoder, decoder.decode(raw.strip()))
        except (RecordParseError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise parse_error(exc, path, lineno) from exc


def iter_records(path: str | Path, strict: bool = False) -> Iterator[TuningRecord | RecordParseError]:
    """Every record (or the error of every bad line) of an AutoTVM log, in file order."""
    decoder = Decoder(str(path))
    for lineno, line in iter_lines(path):
        try:
            yield record_from_fields(decoder, decoder.decode(line))
        except (RecordParseError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
            error = parse_error(exc, str(path), lineno)
            if strict:
                raise error from exc
            yield error


#: Logs at least this large are decoded by worker processes when more than one core is free.
PARALLEL_MIN_BYTES = 64 << 20
#: Bytes of log one worker task decodes.
CHUNK_BYTES = 8 << 20


def iter_tables(path: str | Path, strict: bool = False, batch_size: int = 65536, workers: int | None = None
                ) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    """Arrow tables (ARROW_SCHEMA) of an AutoTVM log, built column by column, in file order.

    ``workers`` processes decode chunks of the log in parallel (default: one per free core,
    up to 8, for logs of at least :data:`PARALLEL_MIN_BYTES` read from a process without other
    threads; ``1`` decodes in this process).
    Workers are forked, so the caller's main module is not imported again; where fork is not
    available the log is decoded in this process.
    """
    if workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        single_threaded = threading.active_count() == 1  # forking a threaded process is unsafe
        workers = min(cores, 8) if single_threaded and os.path.getsize(path) >= PARALLEL_MIN_BYTES else 1
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        yield from _iter_tables_parallel(path, strict, batch_size, workers, CHUNK_BYTES)
        return
    decoder = Decoder(str(path))
    with open(path, "rb") as handle:
        yield from _decode_lines(decoder, handle, 1, strict, batch_size)


def _decode_lines(decoder: Decoder, lines: Iterable[bytes], first_lineno: int, strict: bool, batch_size: int
                  ) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    """The ingest hot path: a line whose workload and version tail were seen before costs two
    small JSON parses, one dump and one hash; any other line goes through :meth:`Decoder.decode`,
    which produces the same values and reports what is wrong.

    The cyclic garbage collector is paused while a batch is decoded (its rows hold no cycles,
    and collections passing over a growing batch cost more than the decoding itself); it is
    resumed whenever a table is handed to the caller.
    """
    source = decoder.source
    batch = _Columns()
    errors: list[RecordParseError] = []
    by_raw_input, extra_index_of = decoder._by_raw_input, decoder._extra_index
    add_workload, add_extra, add_config, add_costs, add_error, add_all_cost, add_time, add_id = batch.appenders()
    loads, dumps, blake2b, decode_error = orjson.loads, orjson.dumps, hashlib.blake2b, orjson.JSONDecodeError
    collecting = gc.isenabled()
    gc.disable()
    try:
        for lineno, line in enumerate(lines, first_lineno):
            if line.startswith(_INPUT_HEAD):
                p_config = line.find(_CONFIG_MARK, 10)
                p_version = line.rfind(_VERSION_MARK)
                p_result = line.rfind(_RESULT_MARK, p_config, p_version)
                workload = by_raw_input.get(line[10:p_config]) if p_config > 0 else None
                if workload is not None and p_result > 0 and p_version > 0:
                    extra_index = extra_index_of.get((workload.index, line[p_version:]))
                    if extra_index is not None:
                        try:
                            config = loads(line[p_config + 12:p_result])
                            costs, error_no, all_cost, timestamp = loads(line[p_result + 12:p_version])
                            costs = [cost + 0.0 for cost in costs]
                            all_cost += 0.0
                            timestamp += 0.0
                        except (decode_error, TypeError, ValueError):
                            pass  # the full decoder below reports what is wrong
                        else:
                            if type(config) is dict and type(error_no) is int:
                                config_text = dumps(config).decode()
                                add_workload(workload.index)
                                add_extra(extra_index)
                                add_config(config_text)
                                add_costs(costs)
                                add_error(error_no)
                                add_all_cost(all_cost)
                                add_time(timestamp)
                                add_id(blake2b(workload.id_prefix + dumps([config_text, costs, error_no, timestamp])[1:],
                                               digest_size=16).hexdigest())
                                if len(batch.record_id) < batch_size:
                                    continue
                                line = b""  # the batch is full: hand it over below
            elif is_skipped(line):
                continue
            if line:
                try:
                    batch.add(decoder.decode(line))
                except (RecordParseError, decode_error, ValueError, TypeError) as exc:
                    error = parse_error(exc, source, lineno)
                    if strict:
                        raise error from exc
                    errors.append(error)
                    continue
            if batch.size >= batch_size:
                table = batch.table(decoder)
                if collecting:
                    gc.enable()
                yield table, errors
                collecting = gc.isenabled()
                gc.disable()
                batch, errors = _Columns(), []
                (add_workload, add_extra, add_config, add_costs, add_error, add_all_cost, add_time,
                 add_id) = batch.appenders()
        if batch.size or errors:
            table = batch.table(decoder)
            if collecting:
                gc.enable()
            collecting = False
            yield table, errors
    finally:
        if collecting:
            gc.enable()


def _chunk_bounds(path: str | Path, chunk_bytes: int) -> list[tuple[int, int]]:
    """(start, end) byte ranges of about ``chunk_bytes`` each, cut after a newline."""
    bounds = []
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        start = 0
        while start < size:
            handle.seek(min(start + chunk_bytes, size))
            handle.readline()
            end = min(handle.tell(), size)
            bounds.append((start, end))
            start = end
    return bounds


#: Per worker process: the decoder of each log it works on, so workloads are parsed once.
_WORKER_DECODERS: dict[str, Decoder] = {}


def _decode_chunk(path: str, start: int, end: int) -> tuple[list[pa.Table], list[tuple[int, str]], int]:
    """Worker task: (tables, (line within chunk, message) of each bad line, lines in chunk)."""
    decoder = _WORKER_DECODERS.get(path)
    if decoder is None:
        _WORKER_DECODERS.clear()
        decoder = _WORKER_DECODERS[path] = Decoder(path)
    with open(path, "rb") as handle:
        handle.seek(start)
        data = handle.read(end - start)
    n_lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    tables, errors = [], []
    for table, batch_errors in _decode_lines(decoder, io.BytesIO(data), 1, False, 1 << 30):
        tables.append(table)
        errors.extend((error.line or 0, str(error)[len(f"{path}:{error.line}: "):]) for error in batch_errors)
    return tables, errors, n_lines


def _iter_tables_parallel(path: str | Path, strict: bool, batch_size: int, workers: int, chunk_bytes: int
                          ) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    source = str(path)
    bounds = iter(_chunk_bounds(path, chunk_bytes))
    pending: deque = deque()
    held: list[pa.Table] = []
    held_rows = 0
    errors: list[RecordParseError] = []
    line_offset = 0
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        try:
            for start, end in itertools.islice(bounds, 2 * workers):
                pending.append(pool.submit(_decode_chunk, source, start, end))
            while pending:
                tables, chunk_errors, n_lines = pending.popleft().result()
                for start, end in itertools.islice(bounds, 1):
                    pending.append(pool.submit(_decode_chunk, source, start, end))
                for line, message in chunk_errors:
                    error = RecordParseError(message, source, line_offset + line)
                    if strict:
                        raise error
                    errors.append(error)
                line_offset += n_lines
                for table in tables:
                    held.append(table)
                    held_rows += table.num_rows
                while held_rows >= batch_size:
                    merged = pa.concat_tables(held)
                    yield merged.slice(0, batch_size), errors
                    errors = []
                    rest = merged.slice(batch_size)
                    held, held_rows = ([rest] if rest.num_rows else []), rest.num_rows
        finally:
            for future in pending:
                future.cancel()
    if held_rows or errors:
        merged = pa.concat_tables(held) if held else _Columns().table(Decoder(source))
        yield merged, errors


class _Columns:
    """Column values of one batch; per-workload columns are gathered by index when the table is built."""

    def __init__(self) -> None:
        self.workload_index: list[int] = []
        self.extra_index: list[int] = []
        self.config: list[str] = []
        self.costs: list[list[float]] = []
        self.error_no: list[int] = []
        self.all_cost: list[float] = []
        self.timestamp: list[float] = []
        self.record_id: list[str] = []

    def appenders(self) -> tuple:
        """Bound ``append`` of every column, in :meth:`add` order, for the hot loop."""
        return (self.workload_index.append, self.extra_index.append, self.config.append, self.costs.append,
                self.error_no.append, self.all_cost.append, self.timestamp.append, self.record_id.append)

    @property
    def size(self) -> int:
        return len(self.record_id)

    def add(self, fields: tuple) -> None:
        workload, *values = fields
        for append, value in zip(self.appenders(), (workload.index, *values), strict=True):
            append(value)

    def table(self, decoder: Decoder) -> pa.Table:
        n = self.size
        wl_index = pa.array(np.asarray(self.workload_index, dtype=np.int32))
        zeros = pa.array(np.zeros(n, dtype=np.int32))
        workloads = decoder.workloads

        def per_workload(name: str, type_: pa.DataType) -> pa.Array:
            return pa.array([getattr(w, name) for w in workloads], type=type_).take(wl_index)

        def constant(value: str) -> pa.Array:
            return pa.array([value], type=pa.string()).take(zeros)

        costs_array = pa.array(self.costs, type=pa.list_(pa.float64()))
        error_array = np.asarray(self.error_no, dtype=np.int32)
        columns = {
            "record_id": pa.array(self.record_id, type=pa.string()),
            "dialect": constant(DIALECT),
            "target": per_workload("target", pa.string()),
            "target_key": per_workload("target_key", pa.string()),
            "target_raw": per_workload("target_raw", pa.string()),
            "workload_key": per_workload("workload_key", pa.string()),
            "task_name": per_workload("task_name", pa.string()),
            "args": per_workload("args", pa.string()),
            "layout": per_workload("layout", pa.string()),
            "config": pa.array(self.config, type=pa.string()),
            "costs": costs_array,
            "cost_s": mean_costs(costs_array, error_array),
            "error_no": pa.array(error_array),
            "all_cost": pa.array(np.asarray(self.all_cost, dtype=np.float64)),
            "timestamp": pa.array(np.asarray(self.timestamp, dtype=np.float64)),
            "flop": per_workload("flop", pa.float64()),
            "build": constant("{}"),
            "extra": pa.array(decoder.extras, type=pa.string()).take(
                pa.array(np.asarray(self.extra_index, dtype=np.int32))),
            "source": constant(decoder.source),
        }
        return pa.Table.from_arrays([columns[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def mean_costs(costs: pa.ListArray, error_no: np.ndarray) -> pa.Array:
    """Column ``cost_s``: per record the mean of its costs, null where the record failed.

    Sums run left to right per record (``np.bincount``), exactly as ``sum(costs)`` does, so
    the column equals :attr:`TuningRecord.cost_s` bit for bit.
    """
    n = len(costs)
    offsets = np.asarray(costs.offsets)
    lengths = np.diff(offsets)
    values = np.asarray(costs.flatten(), dtype=np.float64)
    parents = np.repeat(np.arange(n), lengths)
    sums = np.bincount(parents, weights=values, minlength=n) if n else np.zeros(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        means = sums / lengths
    valid = (error_no == 0) & (lengths > 0) & np.isfinite(means) & (means > 0)
    return pa.array(means, mask=~valid, type=pa.float64())


# ------------------------------------------------------------------ encoding

def encode_record(record: TuningRecord) -> str:
    """The AutoTVM log line of a record (layout 0.1 or 0.2, as its ``extra`` says)."""
    extra = orjson.loads(record.extra) if record.extra else {}
    config = orjson.loads(record.config)
    if type(config) is not dict:
        raise RecordParseError(f"record {record.record_id}: AutoTVM config must be a JSON object, got {record.config[:80]!r}")
    args = orjson.loads(record.args)
    result = [list(record.costs), record.error_no, record.all_cost, record.timestamp]
    kwargs = extra.pop("input_kwargs", _ABSENT)
    if extra.get("v") == 0.1:
        workload = extra.pop("workload", None)
        keys = extra.pop("config_keys", ["i", "t", "c", "e"])
        values = {"i": config.get("index"), "t": extra.pop("template_key", None),
                  "c": config.get("code_hash"), "e": config.get("entity")}
        old_config = {key: values.get(key) for key in keys}
        line = {"i": [record.target_raw, record.task_name, args, {} if kwargs is _ABSENT else kwargs,
                      workload, old_config], "r": result}
        line.update(extra)
        return json.dumps(line)
    inp = [record.target_raw, record.task_name, args]
    if kwargs is not _ABSENT:
        inp.append(kwargs)
    line = {"input": inp, "config": config, "result": result}
    if not extra:
        extra = {"version": 0.2, "tvm_version": DEFAULT_TVM_VERSION}
    line.update(extra)
    return json.dumps(line)
