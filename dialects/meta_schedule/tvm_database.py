"""Real TVM MetaSchedule tunes straight into the warehouse: a ``PyDatabase`` backed by a Lorien
store (needs the ``tvm`` extra; Lorien never needs TVM otherwise).

::

    import tvm.s_tir.meta_schedule as ms
    from dialects.meta_schedule.tvm_database import warehouse_database

    database = warehouse_database("parquet:./lorien-warehouse")
    ms.tune_tir(mod, target, work_dir, max_trials_global=64, database=database)
    schedule = ms.tir_integration.compile_tir(database, mod, target)   # TVM compiles from the store

TVM's workloads and records cross the boundary in their JSON form (``Workload.as_json``,
``TuningRecord.as_json``), the same form a JSONDatabase file holds, so what TVM commits is
what ``lorien ingest`` would have read from its files: ``lorien query --workload-key <shash>``
finds it, ``lorien export --format meta_schedule`` writes it back.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from dialects.meta_schedule.database import Record, StoreDatabase, Workload
from lorien.errors import DialectError
from lorien.record import TuningRecord

#: TVM's ``ModuleEquality`` choices (TVM 0.27's names): how two modules are one workload.
MODULE_EQUALITIES = ("structural", "ignore-tensor", "anchor-block")
#: Older TVM releases' name of ``ignore-tensor``.
_RENAMED_EQUALITIES = {"ignore-ndarray": "ignore-tensor"}


def _tvm() -> tuple[Any, Any]:
    try:
        import tvm.s_tir.meta_schedule as ms
        from tvm.ir.utils import derived_object
    except ImportError as exc:
        raise DialectError(f"the TVM adapter needs apache-tvm (pip install 'lorien[tvm]'): {exc}") from exc
    return ms, derived_object


def module_equality_name(module_equality: str) -> str:
    """TVM's name of a ``module_equality`` choice (``ignore-ndarray``, as older TVM releases call
    ``ignore-tensor``, is taken too); DialectError for anything else."""
    name = _RENAMED_EQUALITIES.get(module_equality, module_equality)
    if name not in MODULE_EQUALITIES:
        raise DialectError(f"module_equality must be one of {list(MODULE_EQUALITIES)}, got {module_equality!r}")
    return name


def warehouse_database(store: Any = None, target: Any = None, batch_size: int = 64,
                       module_equality: str = "structural") -> Any:
    """A ``tvm.s_tir.meta_schedule.database.PyDatabase`` over a Lorien store (URI or Store;
    None: the default store). ``target``: answer with records of that hardware only (TVM's
    databases ignore the target); records are committed ``batch_size`` at a time, each kept
    in a journal from the moment TVM commits it (:class:`StoreDatabase`).

    ``module_equality`` is TVM's, as its JSONDatabase takes it: which modules are one workload.
    ``structural`` (TVM's default): structurally equal modules; ``ignore-tensor``: the same,
    ignoring the data of tensor constants; ``anchor-block``: modules whose anchor block (the
    reduction block that ``tvm.s_tir.analysis.find_anchor_sblock`` finds, e.g. a conv2d with any
    fused epilogue) is equal. A workload is stored under the hash TVM computes for that
    equality, so records committed for one module answer every module equal to it, and TVM
    applies an anchor-block record to another module's epilogue as it does from its own
    databases (``ScheduleUsingAnchorTrace``). The PyDatabase object TVM sees carries the same
    equality, which TVM's search strategies use to tell the candidates they measured apart."""
    equality = module_equality_name(module_equality)
    ms, derived_object = _tvm()

    class EqualityPyDatabase(ms.database.database._PyDatabase):
        """TVM's PyDatabase object made with a ``module_equality``: ``derived_object`` hands its
        object only the methods, so the equality comes first, as a field."""

        def __init__(self, module_equality: str, *methods: Any):
            super().__init__(*methods, module_equality=module_equality)

    class PyDatabaseWithEquality(ms.database.PyDatabase):
        _tvm_metadata = {"cls": EqualityPyDatabase, "fields": ["module_equality"],
                         "methods": ms.database.PyDatabase._tvm_metadata["methods"]}

    @derived_object
    class WarehouseDatabase(PyDatabaseWithEquality):
        """TVM's Database interface answered by :class:`StoreDatabase`."""

        def __init__(self, lorien_store: Any):
            super().__init__()
            self.module_equality = equality
            self.lorien = StoreDatabase(lorien_store, source="tvm meta_schedule", target=target, batch_size=batch_size)
            #: Hashes and matches modules as TVM's own databases do with this ``module_equality``.
            self.keys = ms.database.MemoryDatabase(module_equality=equality)
            self.tvm_workloads: dict[str, Any] = {}

        def _workload(self, mod: Any) -> tuple[Any, Workload]:
            """TVM's workload of ``mod`` (the first module committed that is equal to it) and
            Lorien's, keyed by the equality's hash."""
            tvm_workload = self.keys.commit_workload(mod)
            workload = Workload.from_json(tvm_workload.as_json())
            return self.tvm_workloads.setdefault(workload.shash, tvm_workload), workload

        def _tvm_record(self, record: Record) -> Any:
            tvm_workload = self.tvm_workloads.get(record.workload.shash)
            if tvm_workload is None:
                tvm_workload = ms.database.Workload.from_json(record.workload.as_json())
                self.tvm_workloads[record.workload.shash] = tvm_workload
            return ms.database.TuningRecord.from_json(record.as_json(), tvm_workload)

        def has_workload(self, mod: Any) -> bool:
            return self.lorien.has_workload(self._workload(mod)[1])

        def commit_workload(self, mod: Any) -> Any:
            tvm_workload, workload = self._workload(mod)
            self.lorien.commit_workload(workload)
            return tvm_workload

        def commit_tuning_record(self, record: Any) -> None:
            _, workload = self._workload(record.workload.mod)
            self.lorien.commit_tuning_record(Record.from_json(record.as_json(), self.lorien.commit_workload(workload)))

        def get_top_k(self, workload: Any, top_k: int) -> list[Any]:
            found = self.lorien.get_top_k(self._workload(workload.mod)[1], int(top_k))
            return [self._tvm_record(record) for record in found]

        def get_all_tuning_records(self) -> list[Any]:
            return [self._tvm_record(record) for record in self.lorien.get_all_tuning_records()]

        def query_tuning_record(self, mod: Any, target: Any, workload_name: str | None = None) -> Any:
            _, workload = self._workload(mod)
            best = self.lorien.query_tuning_record(workload, None if target is None else orjson.loads(str(target)))
            return None if best is None else self._tvm_record(best)

        def __len__(self) -> int:
            return len(self.lorien)

    return WarehouseDatabase(store)


def tvm_module_of(dag: Any) -> Any:
    """The TVM IRModule (TE ``create_prim_func``) of a computation defined with Lorien's compute
    DSL: blocks named after its stages, arguments in its I/O order, shapes and indices int64 as
    relax's legalization makes them (so a computation equal to a relax task has its structural
    hash); what TVM tunes and hashes."""
    import tvm
    from tvm import te as tvm_te
    from tvm import tirx

    from lorien.engine import te

    ms, _ = _tvm()
    binary = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
              "div": lambda a, b: a / b if _is_float(a) or _is_float(b) else tirx.floordiv(a, b),
              "floordiv": tirx.floordiv, "mod": tirx.floormod, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
              "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "and": tirx.all, "or": tirx.any}
    calls = {"max": tirx.max, "min": tirx.min, "exp": tirx.exp, "log": tirx.log, "sqrt": tirx.sqrt,
             "rsqrt": tirx.rsqrt, "tanh": tirx.tanh, "erf": tirx.erf, "sigmoid": tirx.sigmoid, "fabs": tirx.abs,
             "pow": tirx.pow}
    reducers = {"sum": tvm_te.sum, "max": tvm_te.max, "min": tvm_te.min}
    tensors: dict[str, Any] = {}

    def int64(extents: Any) -> list[Any]:
        return [tirx.IntImm("int64", int(extent)) for extent in extents]

    def convert(expr: Any, variables: dict[Any, Any]) -> Any:
        if isinstance(expr, te.Const):
            return tirx.const(expr.value, "int64" if expr.dtype == te.INDEX_DTYPE else expr.dtype)
        if isinstance(expr, te.Var):
            return variables[expr]
        if isinstance(expr, te.BinOp):
            return binary[expr.op](convert(expr.a, variables), convert(expr.b, variables))
        if isinstance(expr, te.Call):
            args = [convert(arg, variables) for arg in expr.args]
            return args[0].astype(expr.dtype) if expr.fn.startswith("cast:") else calls[expr.fn](*args)
        if isinstance(expr, te.Select):
            return tirx.if_then_else(*(convert(part, variables) for part in (expr.cond, expr.a, expr.b)))
        if isinstance(expr, te.Load):
            return tensors[expr.tensor.name][tuple(convert(i, variables) for i in expr.indices)]
        if isinstance(expr, te.Reduce):
            axes = [variables[axis] for axis in expr.axes]
            return reducers[expr.combiner](convert(expr.source, variables), axis=axes)
        raise DialectError(f"cannot express {expr!r} in TVM's TE")

    for tensor in dag.ops:
        if not isinstance(tensor.op, te.ComputeOp):
            tensors[tensor.name] = tvm_te.placeholder(int64(tensor.shape), tensor.dtype, tensor.name)
            continue
        op = tensor.op
        reduce_axes = {iv: tvm_te.reduce_axis(tuple(int64((0, iv.extent))), iv.name) for iv in op.reduce_axis}
        tensors[tensor.name] = tvm_te.compute(int64(tensor.shape), _body(convert, op, reduce_axes), name=tensor.name)
    function = tvm_te.create_prim_func([tensors[t.name] for t in dag.io_tensors], index_dtype_override="int64")
    return tvm.IRModule({"main": function})


def _is_float(expr: Any) -> bool:
    """Whether a TVM expression is of a float type: TVM 0.27 gives a loaded value's type as
    ``dtype`` (a ``PrimType``, not a string) and a constant's as ``ty``."""
    for attribute in ("dtype", "ty"):
        value = getattr(expr, attribute, None)
        if value is not None:
            return str(value).startswith(("float", "bfloat"))
    return False


def tvm_block_names(trace: list[Any]) -> list[Any]:
    """A trace of a Lorien workload with its blocks named as TVM names them (``dense.acc`` is
    block ``dense_acc`` in TVM's PrimFunc)."""
    instructions, decisions = trace
    renamed = [[name, inputs, [str(attrs[0]).replace(".", "_"), *attrs[1:]], outputs] if name == "GetSBlock"
               else [name, inputs, attrs, outputs] for name, inputs, attrs, outputs in instructions]
    return [renamed, decisions]


def _body(convert: Any, op: Any, reduce_axes: dict[Any, Any]) -> Any:
    """The ``fcompute`` of one compute op for TVM's ``te.compute`` (positional indices only)."""
    return lambda *indices: convert(op.body, {**dict(zip(op.axis, indices, strict=True)), **reduce_axes})


def write_tvm_database(records: Iterable[TuningRecord], work_dir: str | Path, store: Any = None,
                       entries: Mapping[str, str] | None = None) -> int:
    """Write MetaSchedule records as a JSONDatabase pair real TVM loads and compiles from: the
    workload of a record tuned here (a Lorien DAG) becomes its TIR module with TVM's own
    structural hash; a TVM workload is written unchanged. Workload entries are found as
    :func:`dialects.meta_schedule.compile.workload_entry` finds them (``store``, ``entries``).
    Every workload is converted before anything is written, and the pair is written aside
    and moved into ``work_dir`` whole. Returns the records written."""
    from dialects.meta_schedule.compile import is_lorien_entry, workload_dag, workload_entry
    from lorien.formats.meta_schedule import encode_record, fields_path, pair_paths, write_database

    ms, _ = _tvm()
    records = list(records)
    entries = dict(entries or {})
    theirs, ours, modules = [], [], {}
    for record in records:
        if not is_lorien_entry(workload_entry(record, store, entries)):
            theirs.append(record)
            continue
        ours.append(record)
        if record.workload_key not in modules:
            modules[record.workload_key] = tvm_module_of(workload_dag(record, store, entries))
    directory = Path(work_dir)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".lorien-export-", dir=directory) as staging:
        write_database(theirs, staging, entries)
        database = ms.database.JSONDatabase(work_dir=staging)
        for record in ours:
            workload = database.commit_workload(modules[record.workload_key])
            fields = orjson.loads(encode_record(record))[1]
            fields[0] = tvm_block_names(fields[0])
            database.commit_tuning_record(ms.database.TuningRecord.from_json(fields, workload))
        for staged, final in zip(pair_paths(staging), pair_paths(directory), strict=True):
            os.replace(staged, final)
        if fields_path(staging).is_file():  # fields of TVM's own workloads' records measured here
            os.replace(fields_path(staging), fields_path(directory))
        else:
            fields_path(directory).unlink(missing_ok=True)
    return len(records)


def export_database(records: Iterable[TuningRecord], directory: str | Path,
                    entries: Mapping[str, str] | None = None, lorien_workloads: bool = False) -> int:
    """``lorien export --format meta_schedule -o DIR``: a JSONDatabase real TVM loads. Records
    of TVM's own workloads are written unchanged; workloads tuned here (Lorien compute DAGs)
    are converted to TVM modules by :func:`write_tvm_database`, which needs apache-tvm.
    With ``lorien_workloads`` they stay in Lorien's form (``lorien ingest`` and
    :class:`~dialects.meta_schedule.database.JSONDatabase` read it back; TVM does not).
    Without TVM and without that flag, raises DialectError naming the workloads before
    anything is written. Returns the records written."""
    from dialects.meta_schedule.compile import is_lorien_entry, workload_entry
    from lorien.formats import write_log

    records = list(records)
    entries = dict(entries or {})
    tuned_here = {record.workload_key: record.task_name for record in records
                  if is_lorien_entry(workload_entry(record, entries=entries))}
    if not tuned_here or lorien_workloads:
        return write_log(records, "meta_schedule", directory, entries)
    try:
        _tvm()
    except DialectError as exc:
        named = ", ".join(f"{task} ({key})" for key, task in sorted(tuned_here.items()))
        raise DialectError(
            f"{len(tuned_here)} workload(s) to export were tuned by Lorien's meta_schedule dialect: {named}. "
            f"TVM cannot load their Lorien compute DAGs, and converting them to TVM modules (with TVM's "
            f"structural hash) needs apache-tvm, which does not import here ({exc.__cause__}). Install it "
            f"(pip install 'lorien[tvm]'), or pass --lorien-workloads to write Lorien's form, which "
            f"lorien ingest reads back but TVM does not; nothing was written") from exc
    return write_tvm_database(records, directory, entries=entries)
