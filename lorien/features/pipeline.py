"""Two-phase featurization: records -> per-template spill files -> normalized CSV/Parquet.

Phase 1 streams Arrow batches of records, groups each batch by template (the task name),
extracts flat features per record (``thrpt`` in GFLOPS last, 0 for failed records) and
spills them as Arrow IPC files, one per batch and template. Phase 2 handles one template
per process: a first pass over its spill files gathers mean/std of numeric columns and the
values of string columns, a second pass writes ``<template>.csv``, ``<template>.parquet``
and ``<template>.meta``. Memory is bounded by the batch size, never by the dataset.
"""

from __future__ import annotations

import gc
import json
import math
import multiprocessing
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from lorien import __version__
from lorien.dialect import Dialect, get_dialect
from lorien.errors import DialectError, LorienError
from lorien.features.columns import feature_array
from lorien.features.meta import ID_COLUMNS, TARGET_COLUMN, FeatureColumn, FeatureMeta
from lorien.features.sources import SourceInfo, iter_log_batches, iter_store_batches
from lorien.features.targets import TARGET_FEATURES, relative_knob_features, target_features
from lorien.progress import Progress
from lorien.record import TuningRecord
from lorien.search.base import LABEL_STATISTIC

SPILL_DIR = "_phase1"
#: The one template program features (``extractor="program"``) are written under.
PROGRAM_TEMPLATE = "program"
#: MiB of record columns a phase-1 batch read from a local store holds at most: at 1M synthetic
#: records (about 600 bytes of record columns each) a worker peaked at 342 MiB with batches of
#: 65,536 records (38 MiB), 278 MiB at 32,768 and 236 MiB at 16,384; with this bound, 251 MiB.
DEFAULT_BATCH_MIB = 12.0
#: Phase-1 batches a worker process handles before it is replaced.
WORKER_BATCHES = 8
MANIFEST = "manifest.json"


@dataclass
class FeaturizeReport:
    """Counts and outputs of one featurization run."""

    out_dir: str
    records_read: int = 0
    records_featurized: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    zeroed: dict[str, int] = field(default_factory=dict)
    missing_values: dict[str, dict[str, int]] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    filters: dict[str, Any] = field(default_factory=dict)
    parse_errors: int = 0
    examples: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def records_per_s(self) -> float:
        return self.records_read / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``lorien featurize --json``)."""
        return {**asdict(self), "seconds": round(self.seconds, 3), "records_per_s": round(self.records_per_s, 1)}

    def summary(self) -> str:
        lines = [f"featurized {self.records_featurized} of {self.records_read} records into "
                 f"{len(self.templates)} templates in {self.seconds:.2f}s -> {self.out_dir}"]
        for name, info in sorted(self.templates.items()):
            lines.append(f"  {name}: {info['rows']} rows, {len(info['columns'])} features")
        for reason, count in sorted(self.dropped.items()):
            lines.append(f"  dropped {count} records: {reason}")
        for reason, count in sorted(self.zeroed.items()):
            lines.append(f"  thrpt set to 0 for {count} records: {reason}")
        if self.parse_errors:
            lines.append(f"  {self.parse_errors} log lines failed to parse (not featurized)")
        for example in self.examples:
            lines.append(f"    e.g. {example}")
        return "\n".join(lines)


# ---- phase 1 ----------------------------------------------------------------------------

def safe_name(template: str) -> str:
    """A file name for a template (task names may hold characters file systems dislike)."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", template)


def throughput_gflops(table: pa.Table, cost: str = "mean") -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """GFLOPS of every row (0 where not computable) and masks of why a row got 0. ``cost``: a
    record's latency is the ``mean`` of its repeats (TVM's) or the fastest one (``min``), which
    a wake-up or preemption spike in one repeat does not move."""
    if cost not in ("mean", "min"):
        raise ValueError(f"cost must be 'mean' or 'min', got {cost!r}")
    n = table.num_rows
    costs = table["costs"].combine_chunks()
    parents = pc.list_parent_indices(costs).to_numpy()
    values = pc.list_flatten(costs).to_numpy(zero_copy_only=False).astype(np.float64)
    counts = np.bincount(parents, minlength=n)
    sums = np.bincount(parents, weights=values, minlength=n)
    finite_each = np.bincount(parents, weights=np.isfinite(values).astype(np.float64), minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_cost = sums / counts
    latency = mean_cost
    if cost == "min":
        latency = np.full(n, np.inf)
        with np.errstate(invalid="ignore"):  # a NaN repeat makes its row NaN: bad_cost below
            np.minimum.at(latency, parents, values)
    error_no = table["error_no"].to_numpy(zero_copy_only=False)
    flop = table["flop"].to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> nan
    failed = error_no != 0
    bad_cost = ~failed & ((counts == 0) | (finite_each != counts) | ~(latency > 0))
    no_flop = ~failed & ~bad_cost & ~(np.isfinite(flop) & (flop > 0))
    valid = ~failed & ~bad_cost & ~no_flop
    thrpt = np.zeros(n, dtype=np.float64)
    thrpt[valid] = flop[valid] / latency[valid] / 1e9
    reasons = {"failed measurement (error_no != 0)": failed,
               "NaN, infinite, empty or non-positive costs": bad_cost,
               "unknown flop count": no_flop}
    return thrpt, reasons


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Concatenate feature tables of different knob layouts; missing columns become null and
    a column typed differently across tables becomes float (numbers) or string."""
    if len(tables) == 1:
        return tables[0]
    types: dict[str, set[pa.DataType]] = {}
    for table in tables:
        for schema_field in table.schema:
            types.setdefault(schema_field.name, set()).add(schema_field.type)
    unified = {}
    for name, kinds in types.items():
        if len(kinds) == 1:
            continue
        numeric = all(pa.types.is_integer(k) or pa.types.is_floating(k) for k in kinds)
        unified[name] = pa.float64() if numeric else pa.string()
    fixed = []
    for table in tables:
        for name, kind in unified.items():
            if name in table.column_names:
                index = table.column_names.index(name)
                table = table.set_column(index, name, table[name].cast(kind))
        fixed.append(table)
    return pa.concat_tables(fixed, promote_options="default")


@contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing creates millions of small containers and
    would otherwise trigger collections over and over (several times slower)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


#: ``auto``: each dialect's :meth:`~lorien.dialect.Dialect.featurize_batch`; ``dialect``: its
#: ``featurize(record)`` record by record; ``builtin``: the name ``auto`` had before dialects
#: declared their batch featurizers, kept for existing command lines.
EXTRACTORS = ("auto", "builtin", "dialect", "program")


def featurize_table(table: pa.Table, extractor: str = "auto") -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """Phase 1 of one batch: per-template feature tables and the batch's counts.

    ``extractor``: ``"auto"`` (or ``"builtin"``) asks each dialect for the features of its
    records at once (:meth:`Dialect.featurize_batch`, column-wise where the dialect can);
    ``"dialect"`` calls every dialect's ``featurize(record)`` record by record.
    """
    if extractor.partition("@")[0] not in EXTRACTORS:
        raise LorienError(f"unknown extractor {extractor!r} (known: {', '.join(EXTRACTORS)})")
    with _no_gc():
        return _featurize_table(table, extractor)


@cache
def _installed_dialect(name: str) -> Dialect | None:
    """The dialect registered under ``name``; None if it is not installed (or fails to load)."""
    try:
        return get_dialect(name)
    except (DialectError, AttributeError):
        return None


def _extract(dialect: Dialect, records: pa.Table, extractor: str
             ) -> tuple[list[tuple[list[int], dict[str, Any]]], list[tuple[int, str]]]:
    if extractor.startswith("program"):
        from lorien.features.program import featurize_program_batch

        # "program@URI": the store the records come from, where a record that names its
        # workload by reference (a MetaSchedule workload hash) finds it
        return featurize_program_batch(dialect, records, extractor.partition("@")[2] or None)
    if extractor == "dialect":
        return Dialect.featurize_batch(dialect, records)  # the record-by-record form every dialect has
    return dialect.featurize_batch(records)


def _featurize_table(table: pa.Table, extractor: str) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    counts: dict[str, Any] = {"read": table.num_rows, "featurized": 0, "dropped": Counter(),
                              "zeroed": Counter(), "examples": []}
    if table.num_rows == 0:
        return {}, counts
    # program features: the fastest repeat (a model of the lowered program learns the program's
    # speed, not the machine's hiccups; docs/costmodel.md, "Pre-trained models in tuning")
    thrpt, reasons = throughput_gflops(table, LABEL_STATISTIC if extractor.startswith("program") else "mean")
    for reason, mask in reasons.items():
        hit = int(mask.sum())
        if hit:
            counts["zeroed"][reason] += hit
    dialect_codes, dialect_names = _codes(table["dialect"])
    template_codes, template_names = _codes(table["task_name"])
    combined = dialect_codes * max(1, len(template_names)) + template_codes
    order = np.argsort(combined, kind="stable")
    starts = np.flatnonzero(np.diff(combined[order], prepend=-1))
    ends = np.append(starts[1:], order.size)

    ids = table.select(list(ID_COLUMNS))
    target_columns = target_feature_columns(table)

    outputs: dict[str, pa.Table] = {}
    for start, end in zip(starts, ends, strict=True):
        indices = order[start:end]
        dialect_name = dialect_names[dialect_codes[indices[0]]]
        template = template_names[template_codes[indices[0]]]
        dialect = _installed_dialect(dialect_name)
        try:
            if dialect is None:
                raise DialectError(f"dialect {dialect_name!r} has no feature extractor")
            pieces, failed = _extract(dialect, table.take(pa.array(indices)), extractor)
        except DialectError as exc:
            counts["dropped"][str(exc)] += len(indices)
            continue
        for position, reason in failed:
            counts["dropped"][f"{template}: features not extractable"] += 1
            if len(counts["examples"]) < 5:
                counts["examples"].append(f"{table['workload_key'][int(indices[position])].as_py()}: {reason}")
        tables = []
        for positions, columns in pieces:
            rows = indices[np.asarray(positions, dtype=np.int64)]
            taken = ids.take(pa.array(rows))
            arrays = {name: values if isinstance(values, (pa.Array, pa.ChunkedArray)) else feature_array(values)
                      for name, values in columns.items() if name != TARGET_COLUMN}
            arrays.update({name: pa.array(values[rows]) for name, values in target_columns.items()})
            knobs = {name: array.to_numpy(zero_copy_only=False) for name, array in arrays.items()
                     if name.startswith(("sp_", "tg_"))}
            arrays.update({name: pa.array(values) for name, values in relative_knob_features(knobs).items()})
            arrays.update({name: taken[name] for name in ID_COLUMNS})
            arrays[TARGET_COLUMN] = pa.array(np.round(thrpt[rows], 6))
            tables.append(pa.table(arrays))
        if tables:
            # program features are one vector for every dialect and template: one output
            name = PROGRAM_TEMPLATE if extractor.startswith("program") else template
            merged = _concat(tables)
            outputs[name] = _concat([outputs[name], merged]) if name in outputs else merged
            counts["featurized"] += merged.num_rows
    return outputs, counts


def record_features(record: TuningRecord) -> dict[str, Any]:
    """The raw features featurization gives a record (without ``thrpt``): its dialect's, the
    target features of its target and build, and its knobs relative to them
    (:mod:`lorien.features.targets`)."""
    features = get_dialect(record.dialect).featurize(record)
    features.pop(TARGET_COLUMN, None)
    features.update(target_features(record.target, record.build))
    return {**features, **relative_knob_features(features)}


def target_feature_columns(table: pa.Table) -> dict[str, np.ndarray]:
    """Target features (:mod:`lorien.features.targets`) of every row, computed once per
    distinct (target, build) pair of the batch."""
    target_codes, targets = _codes(table["target"])
    build_codes, builds = _codes(table["build"])
    width = max(1, len(builds))
    pairs, pair_of_row = np.unique(target_codes * width + build_codes, return_inverse=True)
    per_pair = [target_features(targets[pair // width], builds[pair % width] or "") for pair in pairs.tolist()]
    return {name: np.array([features[name] for features in per_pair], dtype=np.float64)[pair_of_row]
            for name in TARGET_FEATURES}


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[Any]]:
    """Integer codes of a string column and the distinct values they index."""
    encoded = pc.dictionary_encode(column).combine_chunks()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def _phase1_task(table: pa.Table, spill_dir: str, batch_index: int, extractor: str) -> dict[str, Any]:
    outputs, counts = featurize_table(table, extractor=extractor)
    rows_of = {template: features.num_rows for template, features in outputs.items()}
    for template, features in outputs.items():
        folder = Path(spill_dir) / safe_name(template)
        folder.mkdir(parents=True, exist_ok=True)
        with ipc.new_file(str(folder / f"part-{batch_index:06d}.arrow"), features.schema) as writer:
            writer.write_table(features)
    del outputs
    pa.default_memory_pool().release_unused()  # return freed batch buffers to the OS
    counts["templates"] = rows_of
    counts["dropped"] = dict(counts["dropped"])
    counts["zeroed"] = dict(counts["zeroed"])
    return counts


def _phase1_file_task(batch_path: str, spill_dir: str, batch_index: int, extractor: str) -> dict[str, Any]:
    """:func:`_phase1_task` of a batch the reader wrote to ``batch_path`` (deleted after)."""
    with pa.memory_map(batch_path) as source:
        table = ipc.open_file(source).read_all()
    try:
        return _phase1_task(table, spill_dir, batch_index, extractor)
    finally:
        del table
        os.unlink(batch_path)


# ---- phase 2 ----------------------------------------------------------------------------

def _natural_key(name: str) -> tuple[int, int, str]:
    """Column order: workload features (``attr_i``, ``in_i`` by number), config features (as
    first seen), target features (in :data:`TARGET_FEATURES` order), knobs relative to the
    target (``tr_*``, by name)."""
    if name in TARGET_FEATURES:
        return 3, TARGET_FEATURES.index(name), ""
    prefix_rank = {"attr": 0, "in": 1}
    prefix, _, rest = name.partition("_")
    if prefix in prefix_rank and rest.isdigit():
        return prefix_rank[prefix], int(rest), ""
    if prefix == "tr":
        return 4, 0, name
    return 2, 0, ""


def _read_part(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return ipc.open_file(source).read_all()


def _part_schemas(parts: list[Path]) -> list[pa.Schema]:
    schemas = []
    for path in parts:
        with pa.memory_map(str(path)) as source:
            schemas.append(ipc.open_file(source).schema)
    return schemas


def _merge_moments(stats: tuple[int, float, float], values: np.ndarray) -> tuple[int, float, float]:
    """Chan's parallel update of (count, mean, M2) with a chunk of values."""
    count, mean, m2 = stats
    n = values.size
    if n == 0:
        return stats
    chunk_mean = float(values.mean())
    chunk_m2 = float(((values - chunk_mean) ** 2).sum())
    total = count + n
    delta = chunk_mean - mean
    return total, mean + delta * n / total, m2 + chunk_m2 + delta * delta * count * n / total


def _phase2_task(template: str, spill_folder: str, out_dir: str) -> dict[str, Any]:
    """Normalize and enumerate one template's features; write CSV, Parquet and .meta."""
    parts = sorted(Path(spill_folder).glob("part-*.arrow"))
    schemas = _part_schemas(parts)
    order: list[str] = []
    is_string: dict[str, bool] = {}
    for schema in schemas:
        for schema_field in schema:
            name = schema_field.name
            if name in ID_COLUMNS or name == TARGET_COLUMN:
                continue
            if name not in is_string:
                order.append(name)
                is_string[name] = False
            if pa.types.is_string(schema_field.type) or pa.types.is_large_string(schema_field.type):
                is_string[name] = True
    order.sort(key=_natural_key)  # stable: config features keep first-seen order

    moments: dict[str, tuple[int, float, float]] = {n: (0, 0.0, 0.0) for n in order if not is_string[n]}
    categories: dict[str, set[str]] = {n: set() for n in order if is_string[n]}
    missing: Counter[str] = Counter()
    rows = 0
    for path in parts:
        part = _read_part(path)
        rows += part.num_rows
        for name in order:
            if name not in part.column_names:
                missing[name] += part.num_rows
                if is_string[name]:
                    categories[name].add("None")
                continue
            column = part[name]
            if is_string[name]:
                nulls = column.null_count
                if nulls:
                    missing[name] += nulls
                    categories[name].add("None")
                categories[name].update(pc.unique(column.cast(pa.string())).drop_null().to_pylist())
            else:
                values = column.to_numpy(zero_copy_only=False).astype(np.float64)
                finite = values[np.isfinite(values)]
                missing[name] += values.size - finite.size
                moments[name] = _merge_moments(moments[name], finite)

    columns: list[FeatureColumn] = []
    for name in order:
        if is_string[name]:
            columns.append(FeatureColumn(name, "category", categories=sorted(categories[name])))
        else:
            count, mean, m2 = moments[name]
            std = math.sqrt(m2 / count) if count else 0.0
            columns.append(FeatureColumn(name, "numeric", mean if count else 0.0,
                                         std if std > 0 and math.isfinite(std) else 1.0))
    meta = FeatureMeta(template, columns)

    paths = output_paths(out_dir, template)
    meta.write(paths["meta"])
    out_names = [*meta.names, TARGET_COLUMN]
    parquet_schema = pa.schema([*(pa.field(n, pa.float64()) for n in meta.names),
                                pa.field(TARGET_COLUMN, pa.float64()),
                                *(pa.field(n, pa.string()) for n in ID_COLUMNS)])
    csv_schema = pa.schema([pa.field(n, pa.float64()) for n in out_names])
    csv_options = pacsv.WriteOptions(include_header=False, quoting_style="none")
    with open(paths["csv"], "wb") as csv_file, \
            pacsv.CSVWriter(csv_file, csv_schema, write_options=csv_options) as csv_writer, \
            pq.ParquetWriter(str(paths["parquet"]), parquet_schema) as parquet_writer:
        csv_file.write((",".join(out_names) + "\n").encode())
        for path in parts:
            part = _read_part(path)
            arrays = [_normalize(part, column) for column in columns]
            arrays.append(part[TARGET_COLUMN].cast(pa.float64()))
            csv_writer.write_table(pa.Table.from_arrays(arrays, schema=csv_schema))
            ids = [part[n] if n in part.column_names else pa.nulls(part.num_rows, pa.string()) for n in ID_COLUMNS]
            parquet_writer.write_table(pa.Table.from_arrays(arrays + ids, schema=parquet_schema))
    return {"template": template, "rows": rows, "columns": meta.names,
            **{kind: str(path) for kind, path in paths.items()},
            "missing_values": {name: count for name, count in missing.items() if count}}


def _normalize(part: pa.Table, column: FeatureColumn) -> pa.Array:
    n = part.num_rows
    if column.kind == "numeric":
        if column.name not in part.column_names:
            return pa.array(np.zeros(n))
        values = part[column.name].to_numpy(zero_copy_only=False).astype(np.float64)
        values = np.where(np.isfinite(values), values, column.mean)
        return pa.array((values - column.mean) / column.std)
    if column.name not in part.column_names:
        strings = pa.array(["None"] * n, type=pa.string())
    else:
        strings = pc.fill_null(part[column.name].cast(pa.string()), "None")
    codes = pc.index_in(strings, value_set=pa.array(column.categories, type=pa.string()))
    return pc.fill_null(codes, -1).cast(pa.float64())


# ---- orchestration ----------------------------------------------------------------------

def _worker_context() -> multiprocessing.context.BaseContext:
    """Worker processes forked from a server that has imported this module once (fresh
    workers start in milliseconds and hold none of the parent's memory)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def featurize(out_dir: str | Path, store: str | None = None, paths: Sequence[str | Path] = (),
              filters: dict[str, Any] | None = None, templates: Sequence[str] | None = None,
              jobs: int | None = None, batch_size: int = 65536, extractor: str = "auto",
              progress: bool = True, keep_spill: bool = False,
              batch_mib: float | None = DEFAULT_BATCH_MIB) -> FeaturizeReport:
    """Featurize the records of a store URI or of log files into ``out_dir``.

    ``filters`` select records (column -> value or values: dialect, target, target_key,
    task_name, workload_key, layout); ``templates`` limits output to some templates (a name
    that matches no record is an error). ``jobs`` bounds the worker processes (1 runs
    everything in this process). A phase-1 batch holds at most ``batch_size`` records and,
    read from a local store, ends once its record columns hold ``batch_mib`` MiB (None: no
    such bound), so that memory follows the batch, not the records' count or size.
    """
    if (store is None) == (not paths):
        raise LorienError("featurize needs exactly one source: a store URI or log paths")
    if extractor not in EXTRACTORS:
        raise LorienError(f"unknown extractor {extractor!r} (known: {', '.join(EXTRACTORS)})")
    phase1_extractor = f"program@{store}" if extractor == "program" and store is not None else extractor
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spill = out / SPILL_DIR
    if spill.exists():
        shutil.rmtree(spill)
    spill.mkdir()
    all_filters = dict(filters or {})
    if templates:
        all_filters["task_name"] = list(templates)
    jobs = max(1, jobs if jobs is not None else min(os.cpu_count() or 1, 4))
    info = SourceInfo(kind="")
    if store is not None:
        from lorien.features.sources import NEEDED_COLUMNS

        columns = [*NEEDED_COLUMNS, "extra"] if extractor == "program" else NEEDED_COLUMNS
        batches: Iterator[pa.Table] = iter_store_batches(
            store, all_filters, batch_size, info, columns,
            batch_bytes=None if batch_mib is None else int(batch_mib * 2**20))
    else:
        batches = iter_log_batches(paths, all_filters, batch_size, info)

    report = FeaturizeReport(out_dir=str(out), filters=all_filters)
    dropped: Counter[str] = Counter()
    zeroed: Counter[str] = Counter()
    template_rows: Counter[str] = Counter()

    def absorb(counts: dict[str, Any]) -> None:
        report.records_read += counts["read"]
        report.records_featurized += counts["featurized"]
        dropped.update(counts["dropped"])
        zeroed.update(counts["zeroed"])
        template_rows.update(counts["templates"])
        report.examples.extend(counts["examples"][: max(0, 5 - len(report.examples))])

    phase1 = Progress(None, "featurize: phase 1", unit="record", enabled=progress, line_interval_s=2.0)
    read_before = 0

    def phase1_step() -> None:
        nonlocal read_before
        phase1.step(f"{report.records_featurized} featurized", count=report.records_read - read_before)
        read_before = report.records_read

    # Program features of log files are computed here: a MetaSchedule database's records name
    # their workloads by hash, and the entries were read into this process with the log.
    if jobs == 1 or (extractor == "program" and store is None):
        for index, batch in enumerate(batches):
            absorb(_phase1_task(batch, str(spill), index, phase1_extractor))
            phase1_step()
    else:
        inbox = spill / "_batches"
        inbox.mkdir()
        # Workers are replaced every few batches: their allocators keep what a batch freed.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=_worker_context(),
                                 max_tasks_per_child=WORKER_BATCHES) as pool:
            pending: list[Future] = []
            for index, batch in enumerate(batches):
                # Hand the batch over as a file: pickling it would hold two more copies in memory.
                batch_path = inbox / f"batch-{index:06d}.arrow"
                with ipc.new_file(str(batch_path), batch.schema) as writer:
                    writer.write_table(batch)
                del batch
                pending.append(pool.submit(_phase1_file_task, str(batch_path), str(spill), index, phase1_extractor))
                while len(pending) >= jobs + 1:
                    absorb(pending.pop(0).result())
                    phase1_step()
            for future in pending:
                absorb(future.result())
                phase1_step()
    phase1.close()
    if progress:
        print(f"featurize: phase 1: {report.records_read} records read, {report.records_featurized} featurized "
              f"into {len(template_rows)} templates", file=sys.stderr, flush=True)

    report.parse_errors = info.parse_errors
    report.examples.extend(info.parse_error_examples)
    report.source = {"kind": info.kind, **info.description}
    report.dropped = dict(dropped)
    report.zeroed = dict(zeroed)
    if report.records_read == 0:
        where = f"store {store}" if store is not None else f"logs {', '.join(map(str, paths))}"
        raise LorienError(f"no records to featurize in {where} (filters: {all_filters or 'none'}; "
                          f"{info.parse_errors} unparsable lines)")
    if templates:
        unknown = sorted(set(templates) - set(template_rows))
        if unknown:
            raise LorienError(f"unknown template(s) {unknown}: no featurizable records "
                              f"(templates found: {sorted(template_rows) or 'none'})")
    if not template_rows:
        raise LorienError(f"none of the {report.records_read} records could be featurized: {report.dropped}")

    names = sorted(template_rows)
    phase2 = Progress(len(names), "featurize: phase 2", unit="template", enabled=progress)
    if jobs == 1 or len(names) == 1:
        results = []
        for name in names:
            results.append(_phase2_task(name, str(spill / safe_name(name)), str(out)))
            phase2.step(name)
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(names)), mp_context=_worker_context(),
                                 max_tasks_per_child=WORKER_BATCHES) as pool:
            futures = [pool.submit(_phase2_task, name, str(spill / safe_name(name)), str(out)) for name in names]
            results = []
            for future in futures:
                results.append(future.result())
                phase2.step(results[-1]["template"])
    phase2.close()
    for result in results:
        missing = result.pop("missing_values")
        if missing:
            report.missing_values[result["template"]] = missing
        report.templates[result["template"]] = result
    if not keep_spill:
        shutil.rmtree(spill)
    report.seconds = time.perf_counter() - start
    write_manifest(report)
    return report


def write_manifest(report: FeaturizeReport) -> Path:
    """``manifest.json``: the source snapshot, filters, counts and outputs of a run."""
    manifest = {"lorien_version": __version__, "created": time.time(), **asdict(report),
                "records_per_s": report.records_per_s}
    path = Path(report.out_dir) / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return path


def load_features(out_dir: str | Path, template: str) -> tuple[Any, FeatureMeta]:
    """A template's normalized features (pandas DataFrame, from Parquet or CSV) and its meta."""
    import pandas as pd

    paths = output_paths(out_dir, template)
    if not paths["meta"].is_file():
        raise LorienError(f"unknown template {template!r} in {out_dir} "
                          f"(available: {list_templates(out_dir) or 'none'})")
    meta = FeatureMeta.read(paths["meta"], template)
    if paths["parquet"].is_file():
        frame = pq.read_table(paths["parquet"]).to_pandas()
    elif paths["csv"].is_file():
        frame = pd.read_csv(paths["csv"])
    else:
        raise LorienError(f"no features for template {template!r} in {out_dir} (.parquet or .csv)")
    missing = [name for name in [*meta.names, TARGET_COLUMN] if name not in frame.columns]
    if missing:
        raise LorienError(f"{paths['meta']}: feature columns {missing} are missing from the feature table")
    return frame, meta


def output_paths(out_dir: str | Path, template: str) -> dict[str, Path]:
    """Where a template's ``csv``, ``meta`` and ``parquet`` files live."""
    stem = safe_name(template)
    return {kind: Path(out_dir) / f"{stem}.{kind}" for kind in ("csv", "meta", "parquet")}


def list_templates(out_dir: str | Path) -> list[str]:
    """Templates featurized in ``out_dir`` (from its manifest, else its .meta files)."""
    manifest = Path(out_dir) / MANIFEST
    if manifest.is_file():
        return sorted(json.loads(manifest.read_text())["templates"])
    return sorted(p.name[: -len(".meta")] for p in Path(out_dir).glob("*.meta"))
