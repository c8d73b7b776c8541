"""AutoTVM JSON lines: record layout 0.2 (``{"input", "config", "result", "version", "tvm_version"}``)
and the older 0.1 (``{"i": [target, task, args, kwargs, workload, config], "r": ..., "v": 0.1}``).

Decoding is cached per distinct workload (target, task, args): target parsing, the readable
workload key, the layout and the FLOP count are computed once per workload, not per line.
Lines laid out as TVM writes them are cut at their top-level keys so that only the config
and the result are parsed per line; any other layout goes through a full JSON parse.
Blocks of such lines go through the native scanner (:mod:`lorien.formats.native`) when it
can reproduce every line of the block exactly, and through the Python decoder otherwise.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import itertools
import json
import mmap
import multiprocessing
import operator
import os
import re
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
from lorien.formats import native
from lorien.formats.base import INT32_LIMIT, is_skipped, iter_lines, parse_error
from lorien.record import ARROW_SCHEMA, TuningRecord, record_id_head, record_id_numbers
from lorien.target import parse_target
from lorien.workload import autotvm_workload_key, compute_flop, infer_layout, negative_dimension

FORMAT = "autotvm"
#: The ``dialect`` of the records this codec decodes and writes.
DIALECT = "autotvm"
#: A line log; the suffix of its files (TopHub's ``*.log``).
LOG_SUFFIX = ".log"
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
_UNSEEN = object()
#: Maps every digit to ``0``: configs of one template that differ only in their numbers share this form.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
#: Skeletons a decoder remembers before it starts over (bounds memory on logs of many shapes).
MAX_SKELETONS = 1 << 16
#: Workloads a decoder remembers before the code reading a log starts a fresh one (between
#: blocks, whose tables hold their own values): about 3 KiB each, so a decoding process stays
#: near 100 MiB on a log of any number of workloads (a 20M-record synthetic log has 400,000).
MAX_DECODER_WORKLOADS = 1 << 15


class Decoder:
    """Decodes AutoTVM lines into column values, caching per-workload and per-version work."""

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.workloads: list[Workload] = []
        self._by_raw_input: dict[bytes, Workload] = {}
        self._by_input: dict[bytes, Workload] = {}
        self._targets: dict[str, tuple[str, str]] = {}  # raw target -> (canonical, alternate key)
        self.extras: list[str] = []
        self._extra_index: dict[Any, int] = {}
        #: A variant is one (workload, extra) pair; rows of a batch name theirs by index.
        self._workload_columns: dict[str, pa.Array] = {}
        self.variants: list[tuple[int, int]] = []
        self._variant_index: dict[tuple[int, int], int] = {}
        #: (workload index, raw line tail from ``, "version": ``) -> variant index, for the hot loop.
        self.variant_of_tail: dict[tuple[int, bytes], int] = {}
        #: Config skeleton (digits as ``0``) -> getter of the first byte of each multi-digit number,
        #: or None where configs of that skeleton must be parsed (see :meth:`learn_skeleton`).
        self.skeletons: dict[bytes, Any] = {}

    # -------------------------------------------------------------- cached parts
    def _workload(self, target_raw: Any, task_name: Any, args: Any, kwargs: Any) -> Workload:
        key = orjson.dumps([target_raw, task_name, args, None if kwargs is _ABSENT else kwargs, kwargs is _ABSENT])
        found = self._by_input.get(key)
        if found is not None:
            return found
        if type(target_raw) is not str or type(task_name) is not str or type(args) is not list:
            raise RecordParseError(
                f"input needs [target string, task name, args list, ...], got {[target_raw, task_name, args]!r}")
        names = self._targets.get(target_raw)
        if names is None:
            try:
                target = parse_target(target_raw)
            except TargetError as exc:
                raise RecordParseError(f"unknown or unparseable target in record: {exc}") from exc
            names = self._targets[target_raw] = (target.canonical, target.alternate_key)
        canonical, target_key = names
        damaged = negative_dimension(args)
        if damaged is not None:
            raise RecordParseError(f"tensor argument {damaged!r} has a negative dimension")
        workload_key = autotvm_workload_key(task_name, args)
        layout = infer_layout(task_name, args)
        found = Workload(
            index=len(self.workloads), target=canonical, target_key=target_key,
            target_raw=target_raw, workload_key=workload_key, task_name=task_name,
            args=orjson.dumps(args).decode(), layout=layout, flop=compute_flop(task_name, args),
            kwargs=kwargs, id_prefix=record_id_head(DIALECT, canonical, workload_key, layout),
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

    def learn_skeleton(self, raw: bytes, skeleton: bytes, text: bytes | None) -> None:
        """Remember whether configs of ``skeleton`` (``raw`` with its digits as ``0``) can skip parsing.

        A config may skip it when ``raw`` parsed to an object whose compact JSON ``text`` is ``raw``
        without its spaces, with no digit inside a string, no fraction or exponent, no escape and
        no number of 19 digits or more. Another config with the same skeleton then differs from
        ``raw`` only in the digits of its integers, so it is the same JSON with other integers,
        and its compact text is itself without spaces -- provided none of its numbers has a
        leading zero (the getter stored here returns the first byte of every number of two or
        more digits) and none is ``-0`` (the hot loop parses every config with a minus sign).
        """
        if len(self.skeletons) >= MAX_SKELETONS:
            self.skeletons.clear()
        cacheable = (
            text is not None and text == raw.translate(None, b" ")
            and not any(mark in skeleton for mark in (b"0.", b"0e", b"0E", b"\\", b"0" * 19))
            # without escapes, every other piece between quotes is the inside of a string
            and _DIGIT.search(b"".join(text.split(b'"')[1::2])) is None
        )
        if not cacheable:
            self.skeletons[skeleton] = None
            return
        starts = [match.start() for match in _MULTI_DIGIT.finditer(skeleton)]
        # position 0 holds the "{" of the object, never a digit; it keeps the getter's result a tuple
        self.skeletons[skeleton] = operator.itemgetter(*starts, 0, 0)

    def workload_column(self, name: str, type_: pa.DataType) -> pa.Array:
        """One field of every workload seen so far, as an Arrow array (extended, not rebuilt)."""
        built = self._workload_columns.get(name)
        if built is None or len(built) < len(self.workloads):
            start = 0 if built is None else len(built)
            fresh = pa.array([getattr(workload, name) for workload in self.workloads[start:]], type=type_)
            built = fresh if built is None else pa.concat_arrays([built, fresh])
            self._workload_columns[name] = built
        return built

    @property
    def full(self) -> bool:
        """Whether it remembers :data:`MAX_DECODER_WORKLOADS` workloads (time to start over)."""
        return len(self.workloads) >= MAX_DECODER_WORKLOADS

    def variant(self, workload_index: int, extra_index: int) -> int:
        """Index of the (workload, extra) pair, added on first use."""
        key = (workload_index, extra_index)
        index = self._variant_index.get(key)
        if index is None:
            index = self._variant_index[key] = len(self.variants)
            self.variants.append(key)
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

    def cut_variant(self, line: bytes, p_config: int, p_version: int) -> tuple[Workload, int] | None:
        """(workload, extra index) of a line laid out as TVM writes it, cut at ``p_config`` and
        ``p_version``; its input and version tail are decoded once and cached. None when a piece
        is not what the cut says; raises RecordParseError or a JSON error."""
        raw_input = line[10:p_config]
        tail = line[p_version:]
        cached = self._by_raw_input.get(raw_input)
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
            self.variant_of_tail[extra_key] = self.variant(cached.index, extra_index)
        return cached, extra_index

    def _decode_tvm_layout(self, line: bytes, p_config: int, p_result: int, p_version: int):
        try:
            cut = self.cut_variant(line, p_config, p_version)
            if cut is None:
                return None
            cached, extra_index = cut
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
        if not -INT32_LIMIT <= error_no < INT32_LIMIT:
            raise RecordParseError(f"result {result!r} has an error_no out of the int32 range")
        payload = workload.id_prefix + config.encode() + record_id_numbers(costs, error_no, timestamp)
        record_id = hashlib.sha256(payload).hexdigest()[:32]
        return workload, extra_index, config, costs, error_no, all_cost, timestamp, record_id


_MULTI_DIGIT = re.compile(rb"0{2,}")
_DIGIT = re.compile(rb"[0-9]")


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


def claims_value(value: Any) -> bool:
    """Whether one JSON-decoded log line is an AutoTVM record (layout 0.2 ``{"input", "config",
    "result", ...}`` or 0.1 ``{"i", "r", "v": 0.1}``)."""
    if not isinstance(value, dict):
        return False
    return ("input" in value and "result" in value) or ("i" in value and "r" in value and value.get("v") == 0.1)


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
        elif decoder.full:
            decoder = _DECODERS[source] = Decoder(source)
        try:
            return record_from_fields(decoder, decoder.decode(raw.strip()))
        except (RecordParseError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise parse_error(exc, path, lineno) from exc


def iter_records(path: str | Path, strict: bool = False) -> Iterator[TuningRecord | RecordParseError]:
    """Every record (or the error of every bad line) of an AutoTVM log, in file order."""
    decoder = Decoder(str(path))
    for lineno, line in iter_lines(path):
        if decoder.full:
            decoder = Decoder(str(path))
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
CHUNK_BYTES = 4 << 20
#: Bytes of log handed to the decoding workers and not yet taken by the consumer: what a decoded
#: block waits in (the committing process holds the blocks that are done), so the consumer's
#: memory does not depend on how much faster than it the workers decode. At least one block a
#: worker, plus one, are in flight.
DECODE_AHEAD_BYTES = 16 << 20


def iter_tables(path: str | Path, strict: bool = False, batch_size: int = 65536, workers: int | None = None,
                dictionary: bool = False) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    """Arrow tables (ARROW_SCHEMA) of an AutoTVM log, built column by column, in file order.

    ``workers`` processes decode chunks of the log in parallel (default: one per free core,
    up to 8, for logs of at least :data:`PARALLEL_MIN_BYTES` read from a process without other
    threads; ``1`` decodes in this process).
    Workers are forked, so the caller's main module is not imported again; where fork is not
    available the log is decoded in this process. With ``dictionary``, the columns of
    :data:`SHARED_VALUE_COLUMNS` may come dictionary-encoded (as the workers send them), for a
    consumer that takes such columns (the parquet store: it decodes them as it writes files).
    """
    if workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        single_threaded = threading.active_count() == 1  # forking a threaded process is unsafe
        workers = min(cores, 8) if single_threaded and os.path.getsize(path) >= PARALLEL_MIN_BYTES else 1
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        yield from _iter_tables_parallel(path, strict, batch_size, workers, CHUNK_BYTES, dictionary)
        return
    yield from _rebatch(_decode_in_process(path, CHUNK_BYTES), batch_size, strict, str(path))


def _decode_in_process(path: str | Path, chunk_bytes: int) -> Iterator[tuple[list[pa.Table], list[RecordParseError]]]:
    """(tables, errors) of each block of the log in file order, decoded in this process."""
    decoder = Decoder(str(path))
    first_lineno = 1
    for start, end in _block_bounds(path, chunk_bytes):
        if decoder.full:
            decoder = Decoder(str(path))
        with _mapped(path, start, end) as data:
            tables, errors, n_lines = _decode_block(decoder, data, first_lineno)
        yield tables, errors
        first_lineno += n_lines


@contextlib.contextmanager
def _mapped(path: str | Path, start: int, end: int) -> Iterator[memoryview]:
    """Bytes ``start:end`` of a file, mapped rather than read (no copy; unmapped on exit)."""
    with open(path, "rb") as handle:
        base = start - start % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(handle.fileno(), end - base, access=mmap.ACCESS_READ, offset=base)
    view = memoryview(mapping)[start - base:]
    try:
        yield view
    finally:
        try:
            view.release()
            mapping.close()
        except BufferError:  # something still holds a view: the mapping goes with it
            pass


def _decode_block(decoder: Decoder, data: bytes | memoryview, first_lineno: int, wire: bool = False
                  ) -> tuple[list[pa.Table], list[RecordParseError], int]:
    """Tables, errors (in line order) and the number of lines of a block of whole lines, the
    first numbered ``first_lineno``.

    The native scanner (:mod:`lorien.formats.native`) takes blocks whose every line it can
    reproduce exactly; any other block is decoded line by line in Python (:func:`_decode_lines`).
    With ``wire`` the tables are in the form to send to another process (see :func:`_assemble`).
    """
    native_table = _native_table(decoder, data, wire)
    if native_table is not None:
        table, n_lines = native_table
        return [table], [], n_lines
    data = bytes(data)
    tables, errors = [], []
    for table, batch_errors in _decode_lines(decoder, io.BytesIO(data), first_lineno, False, 1 << 62):
        tables.append(_to_wire(table) if wire else table)
        errors.extend(batch_errors)
    return tables, errors, data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _native_table(decoder: Decoder, data: bytes | memoryview, wire: bool = False) -> tuple[pa.Table, int] | None:
    """The table and line count of a block through the native scanner, or None where the block
    needs Python."""
    if native.library() is None:
        return None
    scan = native.scan_autotvm(data)
    if isinstance(scan, int) or scan.rows == 0:
        return None
    group_rows = np.flatnonzero(scan.group_start)
    group_variants = []
    for row in group_rows.tolist():
        start = int(scan.line_start[row])
        line = bytes(data[start:start + int(scan.line_len[row])])
        variant = _line_variant(decoder, line, int(scan.cut_config[row]), int(scan.cut_version[row]))
        if variant is None:
            return None
        group_variants.append(variant)
    group_lengths = np.diff(np.append(group_rows, scan.rows))
    variant = np.repeat(np.array(group_variants, dtype=np.int32), group_lengths)
    workloads = decoder.workloads
    heads = b"".join(workloads[decoder.variants[v][0]].id_prefix for v in group_variants)
    row_head = np.repeat(np.arange(len(group_variants), dtype=np.int32), group_lengths)
    costs = pa.ListArray.from_arrays(pa.array(scan.cost_offsets), pa.array(scan.cost_values))
    config = pa.StringArray.from_buffers(scan.rows, pa.py_buffer(scan.config_offsets), pa.py_buffer(scan.config_bytes))
    hex_ids = native.record_ids(scan, heads, row_head)
    if hex_ids is not None:
        record_ids = _fixed_width_strings(scan.rows, hex_ids)
    else:
        config_bytes, bounds = scan.config_bytes.tobytes(), scan.config_offsets.tolist()
        record_ids = hash_record_ids([heads[32 * g:32 * g + 32] for g in row_head.tolist()],
                                     [config_bytes[a:b] for a, b in itertools.pairwise(bounds)],
                                     costs, scan.error_no, scan.timestamp)
    table = _assemble(decoder, variant, record_ids, config, costs, scan.error_no, scan.all_cost, scan.timestamp, wire)
    return table, scan.lines


def _line_variant(decoder: Decoder, line: bytes, p_config: int, p_version: int) -> int | None:
    """The variant of a line the native scanner cut at ``p_config`` and ``p_version`` (it has
    checked the config and result); None when its input or tail is not what the cut says, or
    is refused (Python then decodes the block and reports it)."""
    try:
        cut = decoder.cut_variant(line, p_config, p_version)
    except (RecordParseError, orjson.JSONDecodeError, ValueError, TypeError):
        return None
    return None if cut is None else decoder.variant_of_tail[(cut[0].index, line[p_version:])]


def _decode_lines(decoder: Decoder, lines: Iterable[bytes], first_lineno: int, strict: bool, batch_size: int
                  ) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    """The ingest hot path: a line whose workload and version tail were seen before costs a cut
    at its top-level keys, one config lookup (see :meth:`Decoder.learn_skeleton`; other configs
    are parsed) and one small JSON parse of its result; numbers, record ids and the Arrow
    columns are then built for the whole batch (:meth:`_Batch.table`). Any other line goes
    through :meth:`Decoder.decode`, which produces the same values and reports what is wrong.

    The cyclic garbage collector is paused while a batch is decoded (its rows hold no cycles,
    and collections passing over a growing batch cost more than the decoding itself); it is
    resumed whenever a table is handed to the caller.
    """
    source = decoder.source
    batch = _Batch()
    errors: list[RecordParseError] = []
    by_raw_input, variant_of_tail, skeletons = decoder._by_raw_input, decoder.variant_of_tail, decoder.skeletons
    learn_skeleton = decoder.learn_skeleton
    add_variant, add_config, add_costs, add_error, add_all_cost, add_time, add_line, add_lineno = batch.appenders()
    loads, dumps, decode_error = orjson.loads, orjson.dumps, orjson.JSONDecodeError
    collecting = gc.isenabled()
    gc.disable()
    try:
        last_head, last_tail, last_variant = b"\n\n", b"\n\n", None  # two newlines: never in one line
        last_p_config = tail_length = 0
        last_skeleton, last_run_starts = None, None
        for lineno, line in enumerate(lines, first_lineno):
            if line.startswith(last_head) and line.endswith(last_tail):
                # the same input and version tail as the line before (the usual case): same cuts
                p_config = last_p_config
                p_version = len(line) - tail_length
                p_result = line.rfind(_RESULT_MARK, p_config, p_version)
                variant = last_variant if p_result > 0 else None
            elif line.startswith(_INPUT_HEAD):
                p_config = line.find(_CONFIG_MARK, 10)
                p_version = line.rfind(_VERSION_MARK)
                p_result = line.rfind(_RESULT_MARK, p_config, p_version)
                workload = by_raw_input.get(line[10:p_config]) if p_config > 0 else None
                if workload is not None and p_result > 0 and p_version > 0:
                    variant = variant_of_tail.get((workload.index, line[p_version:]))
                    if variant is not None:
                        last_head, last_tail, last_variant = line[:p_config + 12], line[p_version:], variant
                        last_p_config, tail_length = p_config, len(last_tail)
                else:
                    variant = None
            elif is_skipped(line):
                continue
            else:
                variant = None
            if variant is not None:
                raw_config = line[p_config + 12:p_result]
                skeleton = raw_config.translate(_DIGITS_TO_ZERO)
                if skeleton == last_skeleton:
                    run_starts = last_run_starts
                else:
                    run_starts = skeletons.get(skeleton, _UNSEEN)
                    if run_starts is not _UNSEEN:
                        last_skeleton, last_run_starts = skeleton, run_starts
                try:
                    if run_starts is None or run_starts is _UNSEEN or b"-" in raw_config \
                            or 48 in run_starts(raw_config):  # a leading zero: not JSON
                        config = loads(raw_config)
                        config_text = dumps(config) if type(config) is dict else None
                        if run_starts is _UNSEEN:
                            learn_skeleton(raw_config, skeleton, config_text)
                    else:  # same bytes as a checked config except its digits: same JSON shape
                        config_text = raw_config.translate(None, b" ")
                    costs, error_no, all_cost, timestamp = loads(line[p_result + 12:p_version])
                except (decode_error, ValueError, TypeError):
                    pass  # the full decoder below reports what is wrong
                else:
                    if config_text is not None:
                        add_variant(variant)
                        add_config(config_text)
                        add_costs(costs)
                        add_error(error_no)
                        add_all_cost(all_cost)
                        add_time(timestamp)
                        add_line(line)
                        add_lineno(lineno)
                        if len(batch.variant) < batch_size:
                            continue
                        line = b""  # the batch is full: hand it over below
            if line:
                try:
                    batch.add(decoder, decoder.decode(line), line, lineno)
                except (RecordParseError, decode_error, ValueError, TypeError) as exc:
                    error = parse_error(exc, source, lineno)
                    if strict:
                        if batch.size and batch.numbers() is None:
                            batch.redecode(decoder, [], strict)  # raises the error of an earlier line, if any
                        raise error from exc
                    errors.append(error)
                    continue
            if batch.size >= batch_size:
                table = batch.table(decoder, errors, strict)
                if collecting:
                    gc.enable()
                yield table, errors
                collecting = gc.isenabled()
                gc.disable()
                batch, errors = _Batch(), []
                add_variant, add_config, add_costs, add_error, add_all_cost, add_time, add_line, add_lineno = batch.appenders()
        if batch.size or errors:
            table = batch.table(decoder, errors, strict)
            if collecting:
                gc.enable()
            collecting = False
            yield table, errors
    finally:
        if collecting:
            gc.enable()


def _block_bounds(path: str | Path, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) byte ranges of about ``chunk_bytes`` each, cut after a newline."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        start = 0
        while start < size:
            handle.seek(min(start + chunk_bytes, size))
            handle.readline()
            end = min(handle.tell(), size)
            yield start, end
            start = end


#: Per worker process: the decoder of each log it works on, so workloads are parsed once.
_WORKER_DECODERS: dict[str, Decoder] = {}


def _decode_chunk(path: str, start: int, end: int) -> tuple[list[pa.Table], list[tuple[int, str]], int]:
    """Worker task: (tables, (line within chunk, message) of each bad line, lines in chunk)."""
    decoder = _WORKER_DECODERS.get(path)
    if decoder is None or decoder.full:
        _WORKER_DECODERS.clear()
        decoder = _WORKER_DECODERS[path] = Decoder(path)
    with _mapped(path, start, end) as data:
        tables, errors, n_lines = _decode_block(decoder, data, 1, wire=True)
    return tables, [(error.line or 0, str(error)[len(f"{path}:{error.line}: "):]) for error in errors], n_lines


def _iter_tables_parallel(path: str | Path, strict: bool, batch_size: int, workers: int, chunk_bytes: int,
                          dictionary: bool = False) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    source = str(path)
    yield from _rebatch(_decode_in_workers(source, workers, chunk_bytes, dictionary), batch_size, strict, source)


def _decode_in_workers(source: str, workers: int, chunk_bytes: int, dictionary: bool = False
                       ) -> Iterator[tuple[list[pa.Table], list[RecordParseError]]]:
    """(tables, errors) of each block of the log in file order, decoded by ``workers`` forked processes."""
    bounds = _block_bounds(source, chunk_bytes)
    pending: deque = deque()
    line_offset = 0
    # pyarrow imports pandas (when installed) on its first array conversion, about half a second
    # of CPU: do it here once, before the fork, rather than in every worker; the same for loading
    # the native scanner and finding libcrypto
    pa.array(np.zeros(0))
    native.sha256_functions()
    ahead = max(workers + 1, DECODE_AHEAD_BYTES // chunk_bytes)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        try:
            for start, end in itertools.islice(bounds, ahead):
                pending.append(pool.submit(_decode_chunk, source, start, end))
            while pending:
                tables, chunk_errors, n_lines = pending.popleft().result()
                for start, end in itertools.islice(bounds, 1):
                    pending.append(pool.submit(_decode_chunk, source, start, end))
                block = [table if dictionary else _from_wire(table) for table in tables]
                del tables  # the consumer holds the block's tables while this waits for the next
                yield block, [RecordParseError(message, source, line_offset + line) for line, message in chunk_errors]
                del block
                line_offset += n_lines
        finally:
            for future in pending:
                future.cancel()


def _rebatch(blocks: Iterable[tuple[list[pa.Table], list[RecordParseError]]], batch_size: int, strict: bool,
             source: str) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    """Tables of ``batch_size`` rows (the last may be shorter) from the tables of each block, in
    order; each block's errors go with the next table handed out. With ``strict`` the first
    error is raised before any row of its block is handed out. ``blocks`` is closed on the way
    out, however it is left (its worker processes stop in this thread, not in the GC's)."""
    block_iter = iter(blocks)
    try:
        yield from _rebatch_blocks(block_iter, batch_size, strict, source)
    finally:
        close = getattr(block_iter, "close", None)
        if close is not None:
            close()


def _rebatch_blocks(blocks: Iterator[tuple[list[pa.Table], list[RecordParseError]]], batch_size: int, strict: bool,
                    source: str) -> Iterator[tuple[pa.Table, list[RecordParseError]]]:
    held: list[pa.Table] = []
    held_rows = 0
    errors: list[RecordParseError] = []
    for tables, block_errors in blocks:
        if strict and block_errors:
            raise block_errors[0]
        errors.extend(block_errors)
        for table in tables:
            held.append(table)
            held_rows += table.num_rows
        del tables
        while held_rows >= batch_size:
            merged = pa.concat_tables(held)
            batch, rest = merged.slice(0, batch_size), merged.slice(batch_size)
            del merged
            held, held_rows = ([rest] if rest.num_rows else []), rest.num_rows
            del rest
            yield batch, errors
            # nothing here keeps a batch handed out while the next one is decoded
            del batch
            errors = []
    if held_rows or errors:
        merged = pa.concat_tables(held) if held else _Batch().table(Decoder(source), [], strict)
        yield merged, errors


_NUMBER_TYPES = {int, float}
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


class _Batch:
    """Rows of one batch as the hot loop found them: variant index, compact config (UTF-8), the
    four parts of the result as parsed, and the line itself with its number (to decode it again
    should its result need the careful path). :meth:`table` turns them into columns."""

    def __init__(self) -> None:
        self.variant: list[int] = []
        self.config: list[bytes] = []
        self.costs: list[Any] = []
        self.error_no: list[Any] = []
        self.all_cost: list[Any] = []
        self.timestamp: list[Any] = []
        self.line: list[bytes] = []
        self.lineno: list[int] = []

    def appenders(self) -> tuple:
        """Bound ``append`` of every column, for the hot loop."""
        return (self.variant.append, self.config.append, self.costs.append, self.error_no.append,
                self.all_cost.append, self.timestamp.append, self.line.append, self.lineno.append)

    @property
    def size(self) -> int:
        return len(self.variant)

    def add(self, decoder: Decoder, fields: tuple, line: bytes, lineno: int) -> None:
        """A row decoded by :meth:`Decoder.decode`."""
        workload, extra_index, config, costs, error_no, all_cost, timestamp, _ = fields
        self.variant.append(decoder.variant(workload.index, extra_index))
        self.config.append(config.encode())
        self.costs.append(costs)
        self.error_no.append(error_no)
        self.all_cost.append(all_cost)
        self.timestamp.append(timestamp)
        self.line.append(line)
        self.lineno.append(lineno)

    def numbers(self) -> tuple[pa.ListArray, np.ndarray, np.ndarray, np.ndarray] | None:
        """(costs, error_no int64, all_cost, timestamp) of every row, or None when some result is
        not plainly ``[[number, ...], int, number, number]`` (then rows are decoded one by one)."""
        costs, error_no, all_cost, timestamp = self.costs, self.error_no, self.all_cost, self.timestamp
        if (set(map(type, costs)) != {list} or set(map(type, error_no)) != {int}
                or not set(map(type, all_cost)) | set(map(type, timestamp)) <= _NUMBER_TYPES
                or not set(map(type, itertools.chain.from_iterable(costs))) <= _NUMBER_TYPES):
            return None
        try:
            numbers = (pa.array(costs, type=pa.list_(pa.float64())), np.array(error_no, dtype=np.int64),
                       np.array(all_cost, dtype=np.float64), np.array(timestamp, dtype=np.float64))
        except (pa.ArrowInvalid, OverflowError):  # an integer no float64 (or int64) holds exactly
            return None
        errors = numbers[1]
        if len(errors) and not (-INT32_LIMIT <= errors.min() and errors.max() < INT32_LIMIT):
            return None
        return numbers

    def redecode(self, decoder: Decoder, errors: list[RecordParseError], strict: bool) -> None:
        """Decode every row again with :meth:`Decoder.decode`; rows it refuses become errors."""
        rows = list(zip(self.line, self.lineno, strict=True))
        self.__init__()
        for line, lineno in rows:
            try:
                self.add(decoder, decoder.decode(line), line, lineno)
            except (RecordParseError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
                error = parse_error(exc, decoder.source, lineno)
                if strict:
                    raise error from exc
                errors.append(error)
        errors.sort(key=lambda error: error.line or 0)

    def table(self, decoder: Decoder, errors: list[RecordParseError], strict: bool) -> pa.Table:
        """The rows as an Arrow table in ARROW_SCHEMA, record ids computed for the whole batch."""
        numbers = self.numbers() if self.size else None
        if numbers is None and self.size:
            self.redecode(decoder, errors, strict)
            numbers = self.numbers() if self.size else None
        if numbers is None:
            costs_array = pa.array([], type=pa.list_(pa.float64()))
            error_no, all_cost, timestamp = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))
        else:
            costs_array, error_no, all_cost, timestamp = numbers
        variant = np.array(self.variant, dtype=np.int32)
        record_ids = self._record_ids(decoder, costs_array, error_no, timestamp)
        config = pa.array(self.config, type=pa.binary()).cast(pa.string())
        return _assemble(decoder, variant, record_ids, config, costs_array, error_no, all_cost, timestamp)

    def _record_ids(self, decoder: Decoder, costs: pa.ListArray, error_no: np.ndarray, timestamp: np.ndarray
                    ) -> pa.Array:
        workloads = decoder.workloads
        head_of_variant = [workloads[workload_index].id_prefix for workload_index, _ in decoder.variants]
        return hash_record_ids([head_of_variant[variant] for variant in self.variant], self.config, costs, error_no,
                               timestamp)


def hash_record_ids(heads: list[bytes], configs: list[bytes], costs: pa.ListArray, error_no: np.ndarray,
                    timestamp: np.ndarray) -> pa.Array:
    """:func:`lorien.record.compute_record_id` of every row (its head, its config text as UTF-8):
    the numbers part of each payload (:func:`lorien.record.record_id_numbers`) is laid out for
    the whole batch at once."""
    n = len(heads)
    if n == 0:
        return pa.array([], type=pa.string())
    offsets = np.asarray(costs.offsets, dtype=np.int64)
    counts = np.diff(offsets)
    words = counts + 3
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(words, out=starts[1:])
    packed = np.empty(starts[-1], dtype="<u8")
    values = np.asarray(costs.values, dtype="<f8")[offsets[0]:offsets[-1]]
    packed[np.repeat(starts[:-1] - (offsets[:-1] - offsets[0]), counts) + np.arange(len(values))] = values.view("<u8")
    ends = starts[1:]
    packed[ends - 3] = error_no.astype("<i8").view("<u8")
    packed[ends - 2] = timestamp.astype("<f8").view("<u8")
    packed[ends - 1] = counts
    numbers = packed.tobytes()
    byte_starts, byte_ends = (starts[:-1] * 8).tolist(), (ends * 8).tolist()
    sha256 = hashlib.sha256
    digests = b"".join([sha256(head + config + numbers[start:end]).digest()
                        for head, config, start, end in zip(heads, configs, byte_starts, byte_ends, strict=True)])
    raw = np.frombuffer(digests, dtype=np.uint8).reshape(n, 32)[:, :16].ravel()
    text = np.empty(2 * len(raw), dtype=np.uint8)
    text[0::2] = _HEX_DIGITS[raw >> 4]
    text[1::2] = _HEX_DIGITS[raw & 15]
    return _fixed_width_strings(n, text.tobytes())


def _fixed_width_strings(n: int, data: bytes) -> pa.Array:
    """A string array of ``n`` values of 32 ASCII characters each, laid one after another in ``data``."""
    return pa.StringArray.from_buffers(n, pa.py_buffer(np.arange(0, 32 * n + 1, 32, dtype=np.int32)),
                                       pa.py_buffer(data))


#: Columns whose value is one of a few per table (per workload, per version tail, or constant):
#: worker processes send them dictionary-encoded (:func:`_assemble` with ``wire``).
SHARED_VALUE_COLUMNS = ("dialect", "target", "target_key", "target_raw", "workload_key", "task_name", "args",
                        "layout", "flop", "build", "extra", "source")


def _assemble(decoder: Decoder, variant: np.ndarray, record_ids: pa.Array, config: pa.Array, costs: pa.ListArray,
              error_no: np.ndarray, all_cost: np.ndarray, timestamp: np.ndarray, wire: bool = False) -> pa.Table:
    """The table (ARROW_SCHEMA) of rows given their variants and their own columns.

    With ``wire`` the columns of :data:`SHARED_VALUE_COLUMNS` are dictionary arrays holding only
    the values these rows use (a table to send to another process; :func:`_from_wire` undoes it)."""
    n = len(variant)
    variants = np.array(decoder.variants, dtype=np.int32).reshape(-1, 2)
    wl_index = variants[variant, 0] if n else np.zeros(0, dtype=np.int32)
    extra_index = variants[variant, 1] if n else np.zeros(0, dtype=np.int32)

    zeros = np.zeros(n, dtype=np.int32)
    compact: dict[int, tuple[pa.Array, pa.Array]] = {}  # per index array: (values used, positions among them)

    def gather(values: pa.Array, index: np.ndarray) -> pa.Array:
        if not wire:
            return values.take(pa.array(index))
        if id(index) not in compact:
            if index is zeros:
                used, positions = np.zeros(1 if n else 0, dtype=np.int32), zeros
            else:
                used, positions = np.unique(index, return_inverse=True)
            compact[id(index)] = pa.array(used), pa.array(positions.astype(np.int32).reshape(-1))
        used_array, positions_array = compact[id(index)]
        return pa.DictionaryArray.from_arrays(positions_array, values.take(used_array))

    def per_workload(name: str, type_: pa.DataType) -> pa.Array:
        return gather(decoder.workload_column(name, type_), wl_index)

    def constant(value: str) -> pa.Array:
        return gather(pa.array([value], type=pa.string()), zeros)

    error_array = error_no.astype(np.int32)
    columns = {
        "record_id": record_ids,
        "dialect": constant(DIALECT),
        "target": per_workload("target", pa.string()),
        "target_key": per_workload("target_key", pa.string()),
        "target_raw": per_workload("target_raw", pa.string()),
        "workload_key": per_workload("workload_key", pa.string()),
        "task_name": per_workload("task_name", pa.string()),
        "args": per_workload("args", pa.string()),
        "layout": per_workload("layout", pa.string()),
        "config": config,
        "costs": costs,
        "cost_s": mean_costs(costs, error_array),
        "error_no": pa.array(error_array),
        "all_cost": pa.array(all_cost),
        "timestamp": pa.array(timestamp),
        "flop": per_workload("flop", pa.float64()),
        "build": constant("{}"),
        "extra": gather(pa.array(decoder.extras, type=pa.string()), extra_index),
        "source": constant(decoder.source),
    }
    arrays = [columns[f.name] for f in ARROW_SCHEMA]
    if wire:
        return pa.Table.from_arrays(arrays, names=ARROW_SCHEMA.names)
    return pa.Table.from_arrays(arrays, schema=ARROW_SCHEMA)


def _to_wire(table: pa.Table) -> pa.Table:
    """A table of ARROW_SCHEMA in the form :func:`_assemble` gives with ``wire``."""
    return pa.Table.from_arrays([column.combine_chunks().dictionary_encode() if name in SHARED_VALUE_COLUMNS
                                 else column for name, column in zip(table.column_names, table.columns, strict=True)],
                                names=table.column_names)


def _from_wire(table: pa.Table) -> pa.Table:
    """The ARROW_SCHEMA table of a table sent by a worker process (dictionaries decoded)."""
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name in SHARED_VALUE_COLUMNS:
            column = pa.chunked_array([chunk.dictionary.take(chunk.indices) for chunk in column.chunks],
                                      type=ARROW_SCHEMA.field(name).type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


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
