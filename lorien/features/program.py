"""Program features: what the lowered loop nest of a candidate does, whichever dialect made it.

Every dialect's record (an AutoTVM config, Ansor steps, a MetaSchedule trace) becomes an
engine schedule (:meth:`lorien.dialect.Dialect.schedule_record`), and every engine schedule
lowers to one loop-nest IR (:mod:`lorien.engine.lower`). The features here are computed from
that IR, so a model trained on one dialect's records can rank another dialect's programs.

The nest is lowered *structurally* (:func:`structure`): unrolled loops stay loops (marked
``unrolled``) instead of being expanded, so a program of thousands of instructions is analysed
in a few milliseconds; vectorized loops become vector accesses as in real lowering.

For every buffer access (load or store, per buffer) the analysis takes the affine form of its
flat index over the enclosing loops and computes, in the spirit of Ansor's per-store features
(our own definitions):

- how often it runs (trip count x lanes) and its vector width;
- the stride of the innermost loop and of the vector lanes (0: reused across the loop);
- the bytes touched while the innermost 1, 2, 3 loops run, and the reuse there (accesses per
  distinct element);
- the data moved across a 32 KiB and a 1 MiB working set: the outermost loop level whose
  footprint fits, times how often that level is entered (a cache-traffic estimate).

Accesses are grouped per buffer; the vector holds the output store, the largest local store
and the four busiest loaded buffers (by traffic), then program-wide features: float operations
(vector and scalar), parallel extent and its balance, loop counts and depth, unrolled work,
local / temporary buffer sizes, arithmetic intensity against the traffic estimates and the
kernel's compulsory bytes. Values are ``log2(1 + x)`` unless named ``*_frac``; the ``pr_``
features repeat those that grow with the workload per float operation (log2 ratios), so a
model can rank programs of shapes it was not trained on. The vector has a fixed length
(:data:`FEATURE_NAMES`) for every program.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lorien.engine import te
from lorien.engine.lower import Program, UOp, _Lowering
from lorien.errors import LorienError

#: Working-set sizes (bytes) the traffic features are measured against: a typical L1 data
#: cache and a typical per-core L2. Features, not assumptions about this CPU: a model learns
#: how much each one matters on the target it is trained for.
CACHE_LEVELS = (32 * 1024, 1024 * 1024)
#: Loaded buffers kept per program (the busiest first).
TOP_LOADS = 4
ACCESS_FIELDS = ("count", "lanes", "stride_inner", "stride_vector", "bytes_l1", "bytes_l2", "bytes_l3",
                 "reuse_l1", "reuse_l2", "reuse_l3", "traffic_32k", "traffic_1m", "unrolled", "contiguous_frac")
GLOBAL_FIELDS = ("flops", "vector_flops_frac", "fma_frac", "parallel_extent", "parallel_loops", "parallel_work",
                 "loops", "max_depth", "unrolled_loops", "unroll_work", "uops", "vector_lanes", "local_bytes",
                 "temp_bytes", "guards", "stages", "arg_bytes", "intensity_args", "intensity_32k", "intensity_1m",
                 "traffic_32k", "traffic_1m", "innermost_extent", "vector_waste_8", "vector_waste_16",
                 "parallel_balance_2", "parallel_balance_4", "parallel_balance_16", "serial_flops_frac",
                 "body_flops", "body_mem_ops", "scalar_mem_frac", "out_vector_frac")
ROLES = ("out", "local", *(f"load{i}" for i in range(TOP_LOADS)))
#: Size-free versions (log2 of the value per float operation) of the features that grow with
#: the workload: what a model trained on some shapes can carry to shapes it never saw.
RELATIVE_GLOBAL = ("traffic_32k", "traffic_1m", "arg_bytes", "local_bytes", "uops", "guards", "mem_ops",
                   "loop_entries")
#: Core counts the parallel balance is measured against (``pg_parallel_balance_<n>``: the
#: share of ``n`` cores kept busy when the parallel iterations are dealt out evenly).
BALANCE_CORES = (2, 4, 16)
RELATIVE_ACCESS = ("count", "traffic_32k", "traffic_1m", "bytes_l3")
#: Feature names, in vector order: ``pg_<name>`` program-wide, ``pa_<role>_<field>`` per access
#: role, ``pr_<name>`` / ``pr_<role>_<field>`` those per float operation.
FEATURE_NAMES: tuple[str, ...] = (*(f"pg_{name}" for name in GLOBAL_FIELDS),
                                  *(f"pa_{role}_{name}" for role in ROLES for name in ACCESS_FIELDS),
                                  *(f"pr_{name}" for name in RELATIVE_GLOBAL),
                                  *(f"pr_{role}_{name}" for role in ROLES for name in RELATIVE_ACCESS))
PROGRAM_TEMPLATE = "program"
_DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "int32": 4, "int64": 8, "int8": 1, "uint8": 1,
                "int16": 2, "bool": 1}


class _Structural(_Lowering):
    """Lowering that keeps unrolled loops as loops (for analysis only: nothing renders it)."""

    def loop(self, var: te.Var, extent: int, kind: str, fn, vectorizable: bool) -> None:
        if extent == 1 or (kind == "vectorized" and vectorizable and self.vec is None):
            super().loop(var, extent, kind, fn, vectorizable)
            return
        self.emit_loop(var, extent, kind, fn, unrolled_label="unrolled")


def structure(schedule: Any, args: Sequence[Any], name: str = "kernel") -> Program:
    """The loop nest of a schedule with unrolled loops kept as loops (kind ``unrolled``)."""
    return _Structural(schedule, list(args), name).run()


def _bytes(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype, 4)


def _log(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


class _Access:
    __slots__ = ("buf", "store", "dtype", "lanes", "loops", "coeffs", "vector_stride")

    def __init__(self, buf: int, store: bool, dtype: str, lanes: int, loops: list[tuple[int, int, str]],
                 coeffs: list[int | None], vector_stride: int):
        self.buf, self.store, self.dtype, self.lanes = buf, store, dtype, lanes
        self.loops, self.coeffs, self.vector_stride = loops, coeffs, vector_stride


def _affine(uops: list[UOp]) -> list[dict | None]:
    """Affine forms ``{loop uop id: coeff, -1: const}`` of the scalar integer values (None: not affine)."""
    forms: list[dict | None] = [None] * len(uops)
    for i, u in enumerate(uops):
        if u.op == "CONST" and u.lanes == 1 and isinstance(u.arg, int) and not isinstance(u.arg, bool):
            forms[i] = {-1: u.arg}
        elif u.op == "LOOP":
            forms[i] = {i: 1}
        elif u.op == "ALU" and u.lanes == 1 and u.arg in ("add", "sub", "mul") and len(u.src) == 2:
            a, b = forms[u.src[0]], forms[u.src[1]]
            if a is None or b is None:
                continue
            if u.arg == "mul":
                if set(a) <= {-1}:
                    a, b = b, a
                if not set(b) <= {-1}:
                    continue
                k = b.get(-1, 0)
                forms[i] = {v: c * k for v, c in a.items() if c * k}
            else:
                sign = 1 if u.arg == "add" else -1
                out = dict(a)
                for v, c in b.items():
                    out[v] = out.get(v, 0) + sign * c
                forms[i] = {v: c for v, c in out.items() if c}
    return forms


def _depends(uops: list[UOp]) -> list[frozenset]:
    """The loops each value depends on (for indices that are not affine)."""
    deps: list[frozenset] = [frozenset()] * len(uops)
    for i, u in enumerate(uops):
        if u.op == "LOOP":
            deps[i] = frozenset((i,))
        elif u.op in ("ALU", "CAST", "BROADCAST", "VECTOR", "EXTRACT", "LOAD"):
            merged: frozenset = frozenset()
            for s in u.src:
                merged |= deps[s]
            deps[i] = merged
    return deps


def program_features(program: Program) -> np.ndarray:
    """The fixed-length feature vector (:data:`FEATURE_NAMES`) of a (structurally) lowered program."""
    uops = program.uops
    forms = _affine(uops)
    deps: list[frozenset] | None = None
    stack: list[tuple[int, int, str]] = []
    trips = [1.0]
    flops = vector_flops = fma = 0.0
    parallel_extent, parallel_loops, loops, max_depth, unrolled_loops = 1.0, 0, 0, 0, 0
    unroll_work = guards = 0.0
    vector_lanes, innermost = 1, 1
    local_bytes = temp_bytes = 0.0
    waste = {8: 0.0, 16: 0.0}  # flops of vector ops times the share of their last register left empty
    serial_flops = mem_ops = scalar_mem_ops = loop_entries = out_elems = out_vector_elems = 0.0
    bodies: dict[int, list[float]] = {}  # innermost enclosing loop -> [flops, memory ops, trips] of one pass
    buffers: dict[int, tuple[str, str, int]] = {}  # uop id -> (scope, dtype, size)
    outputs = {i for i, u in enumerate(uops) if u.op == "ARG" and program.args[u.arg[0]].is_output} \
        if program.args else set()
    accesses: list[tuple[_Access, float]] = []
    for i, u in enumerate(uops):
        op = u.op
        if op == "LOOP":
            _, extent, kind = u.arg
            stack.append((i, int(extent), kind))
            loop_entries += trips[-1]
            trips.append(trips[-1] * extent)
            loops += 1
            max_depth = max(max_depth, len(stack))
            if kind == "parallel":
                parallel_extent *= extent
                parallel_loops += 1
            elif kind == "unrolled":
                unrolled_loops += 1
        elif op == "ENDLOOP":
            stack.pop()
            trips.pop()
        elif op == "ARG":
            spec = program.args[u.arg[0]] if program.args else None
            size = math.prod(spec.shape) if spec is not None else 0
            buffers[i] = ("arg", u.dtype, int(size))
        elif op == "ALLOC":
            _, size, scope = u.arg
            buffers[i] = (scope, u.dtype, int(size))
            if scope == "local":
                local_bytes += size * _bytes(u.dtype)
            else:
                temp_bytes += size * _bytes(u.dtype)
        elif op == "IF":
            guards += trips[-1]
        elif op == "ALU" and u.dtype.startswith("float"):
            work = trips[-1] * u.lanes * (2 if u.arg == "fma" else 1)
            flops += work
            if not any(kind == "parallel" for _, _, kind in stack):
                serial_flops += work
            body = bodies.setdefault(stack[-1][0] if stack else -1, [0.0, 0.0, trips[-1]])
            body[0] += u.lanes * (2 if u.arg == "fma" else 1)
            if u.lanes > 1:
                vector_flops += work
                vector_lanes = max(vector_lanes, u.lanes)
                for width in waste:
                    waste[width] += work * (1.0 - u.lanes / (width * math.ceil(u.lanes / width)))
            if u.arg == "fma":
                fma += work
            unrolled = math.prod(extent for _, extent, kind in stack if kind == "unrolled")
            if unrolled > 1:
                unroll_work += unrolled
        elif op in ("LOAD", "STORE"):
            buf, index = u.src[0], u.src[1]
            form = forms[index]
            coeffs: list[int | None] = []
            if form is None:
                deps = deps or _depends(uops)
                coeffs = [None if loop_id in deps[index] else 0 for loop_id, _, _ in stack]
            else:
                coeffs = [form.get(loop_id, 0) for loop_id, _, _ in stack]
            lanes = u.lanes if op == "LOAD" else uops[u.src[2]].lanes
            if lanes > 1:
                vector_lanes = max(vector_lanes, lanes)
            mem_ops += trips[-1]
            if lanes == 1:
                scalar_mem_ops += trips[-1]
            bodies.setdefault(stack[-1][0] if stack else -1, [0.0, 0.0, trips[-1]])[1] += 1
            if op == "STORE" and buf in outputs:
                out_elems += trips[-1] * lanes
                out_vector_elems += trips[-1] * lanes if lanes > 1 else 0.0
            access = _Access(buf, op == "STORE", u.dtype, lanes, list(stack), coeffs, 1 if lanes > 1 else 0)
            accesses.append((access, trips[-1]))
            if op == "STORE" and buf in outputs and stack:
                innermost = stack[-1][1]
    per_buffer: dict[tuple[int, bool], list[float]] = {}
    total_32k = total_1m = 0.0
    for access, trip in accesses:
        values = _access_values(access, trip, buffers.get(access.buf, ("arg", access.dtype, 0))[2])
        total_32k += values[ACCESS_FIELDS.index("traffic_32k")]
        total_1m += values[ACCESS_FIELDS.index("traffic_1m")]
        key = (access.buf, access.store)
        if key in per_buffer:
            per_buffer[key] = _merge(per_buffer[key], values)
        else:
            per_buffer[key] = values
    roles: dict[str, list[float]] = {}
    out_stores = [v for (buf, store), v in per_buffer.items() if store and buf in outputs]
    if out_stores:
        roles["out"] = max(out_stores, key=lambda v: v[0])
    local_stores = [v for (buf, store), v in per_buffer.items()
                    if store and buf not in outputs and buffers.get(buf, ("",))[0] == "local"]
    if local_stores:
        roles["local"] = max(local_stores, key=lambda v: v[0])
    loads = sorted((v for (buf, store), v in per_buffer.items() if not store),
                   key=lambda v: -v[ACCESS_FIELDS.index("traffic_32k")])
    for rank, values in enumerate(loads[:TOP_LOADS]):
        roles[f"load{rank}"] = values
    arg_bytes = sum(size * _bytes(dtype) for scope, dtype, size in buffers.values() if scope == "arg")
    # the loop body that does the most arithmetic (its flops x passes): what one pass of it computes and loads
    busiest = max(bodies.values(), key=lambda body: body[0] * body[2]) if bodies else [0.0, 0.0, 0.0]
    global_values = {
        "flops": _log(flops), "vector_flops_frac": vector_flops / flops if flops else 0.0,
        "fma_frac": fma / flops if flops else 0.0, "parallel_extent": _log(parallel_extent),
        "parallel_loops": float(parallel_loops), "parallel_work": _log(flops / max(parallel_extent, 1.0)),
        "loops": float(loops), "max_depth": float(max_depth), "unrolled_loops": float(unrolled_loops),
        "unroll_work": _log(unroll_work), "uops": _log(len(uops)), "vector_lanes": float(vector_lanes),
        "local_bytes": _log(local_bytes), "temp_bytes": _log(temp_bytes), "guards": _log(guards),
        "stages": float(sum(1 for u in uops if u.op == "ALLOC") + 1), "arg_bytes": _log(arg_bytes),
        "intensity_args": flops / arg_bytes if arg_bytes else 0.0,
        "intensity_32k": _log(flops / total_32k) if total_32k else 0.0,
        "intensity_1m": _log(flops / total_1m) if total_1m else 0.0,
        "traffic_32k": _log(total_32k), "traffic_1m": _log(total_1m), "innermost_extent": _log(innermost),
        "vector_waste_8": waste[8] / flops if flops else 0.0, "vector_waste_16": waste[16] / flops if flops else 0.0,
        **{f"parallel_balance_{cores}": parallel_extent / (cores * math.ceil(parallel_extent / cores))
           for cores in BALANCE_CORES},
        "serial_flops_frac": serial_flops / flops if flops else 0.0,
        "body_flops": _log(busiest[0]), "body_mem_ops": float(busiest[1]),
        "scalar_mem_frac": scalar_mem_ops / mem_ops if mem_ops else 0.0,
        "out_vector_frac": out_vector_elems / out_elems if out_elems else 0.0,
        "mem_ops": _log(mem_ops), "loop_entries": _log(loop_entries),
    }
    row = [global_values[name] for name in GLOBAL_FIELDS]
    for role in ROLES:
        values = roles.get(role)
        row += [_finish(name, values[j]) if values is not None else 0.0 for j, name in enumerate(ACCESS_FIELDS)]
    log_flops = global_values["flops"]
    row += [global_values[name] - log_flops for name in RELATIVE_GLOBAL]
    for role in ROLES:
        values = roles.get(role)
        row += [_finish(name, values[ACCESS_FIELDS.index(name)]) - log_flops if values is not None else 0.0
                for name in RELATIVE_ACCESS]
    return np.array(row, dtype=np.float64)


def _access_values(access: _Access, trip: float, buffer_elems: int) -> list[float]:
    """Raw (not yet log-scaled) values of :data:`ACCESS_FIELDS` for one access."""
    size = _bytes(access.dtype)
    lanes = access.lanes
    count = trip * lanes
    loops, coeffs = access.loops, access.coeffs
    cap = buffer_elems if buffer_elems > 0 else math.inf
    # distinct elements touched while the innermost k loops run, k = 0 .. depth
    distinct = [float(min(lanes, cap))]
    span = lanes - 1
    product = float(lanes)
    for (_, extent, _), coeff in zip(reversed(loops), reversed(coeffs), strict=True):
        if coeff is None:
            product *= extent
            span = math.inf
        elif coeff:
            product *= extent
            span += abs(coeff) * (extent - 1)
        distinct.append(float(min(product, span + 1, cap)))
    inner_trips = [1.0]
    for _, extent, _ in reversed(loops):
        inner_trips.append(inner_trips[-1] * extent)

    def level(k: int) -> tuple[float, float]:
        k = min(k, len(loops))
        elems = distinct[k]
        return elems * size, (inner_trips[k] * lanes) / elems if elems else 0.0

    (b1, r1), (b2, r2), (b3, r3) = level(1), level(2), level(3)

    def traffic(limit: float) -> float:
        k = 0
        while k < len(loops) and distinct[k + 1] * size <= limit:
            k += 1
        outer = trip / inner_trips[k] if inner_trips[k] else 0.0
        return outer * distinct[k] * size

    inner_stride = 0.0
    if coeffs:
        inner_stride = math.inf if coeffs[-1] is None else float(abs(coeffs[-1]))
    contiguous = 1.0 if lanes > 1 or inner_stride in (0.0, 1.0) else 0.0
    unrolled = math.prod(extent for _, extent, kind in loops if kind == "unrolled")
    return [count, float(lanes), inner_stride, float(access.vector_stride), b1, b2, b3, r1, r2, r3,
            traffic(CACHE_LEVELS[0]), traffic(CACHE_LEVELS[1]), float(unrolled), contiguous * count]


def _merge(a: list[float], b: list[float]) -> list[float]:
    """Two accesses of one buffer: counts and traffic add, the rest keeps the busier access's."""
    busier, other = (a, b) if a[0] >= b[0] else (b, a)
    merged = list(busier)
    for name in ("count", "traffic_32k", "traffic_1m", "contiguous_frac"):
        j = ACCESS_FIELDS.index(name)
        merged[j] = a[j] + b[j]
    return merged


def _finish(name: str, value: float) -> float:
    if name == "contiguous_frac":
        return value  # made a fraction by the caller
    if name == "stride_inner" and math.isinf(value):
        return 64.0  # not affine: no regular stride
    return _log(value)


def _fractions(row: np.ndarray) -> np.ndarray:
    for role in ROLES:
        count = FEATURE_NAMES.index(f"pa_{role}_count")
        frac = FEATURE_NAMES.index(f"pa_{role}_contiguous_frac")
        total = 2.0 ** row[count] - 1.0
        row[frac] = row[frac] / total if total > 0 else 0.0
    return row


def schedule_features(schedule: Any, args: Sequence[Any]) -> np.ndarray:
    """The feature vector of an engine schedule and its kernel arguments."""
    return _fractions(program_features(structure(schedule, args)))


#: Errors that mean a point of a space does not lower (its features are None: never preferred).
NOT_LOWERED = (LorienError, KeyError, TypeError, ValueError, ZeroDivisionError)
#: Points featurized in the engine's build workers only from this many on (fewer: here).
PARALLEL_MIN = 16
#: How long one worker's share of :func:`point_features_in_workers` may take before it is done here.
FEATURES_TIMEOUT_S = 600.0


def point_features(space: Any, schedule_of: Any, indices: Sequence[int]) -> list[np.ndarray | None]:
    """The feature vectors of points of a search space (``space.get(index)`` -> config,
    ``schedule_of(config)`` -> (schedule, args)); None for a point that does not lower."""
    rows: list[np.ndarray | None] = []
    for index in indices:
        try:
            schedule, args = schedule_of(space.get(int(index)))
            rows.append(schedule_features(schedule, args))
        except NOT_LOWERED:
            rows.append(None)
    return rows


def point_features_in_workers(space: Any, schedule_of: Any, indices: Sequence[int],
                              pool: Any = None) -> list[np.ndarray | None]:
    """:func:`point_features` of many points, shared out over the engine's build workers (the
    same processes that build candidates, idle while a tuner plans): on a 2-core machine the
    guide of a ResNet-18 task featurized its pools in about half the time. Where the space or
    ``schedule_of`` does not pickle, there are fewer than :data:`PARALLEL_MIN` points, or the
    pool has one worker, the points are featurized here; a share a worker cannot answer (it died,
    timed out, or raised something else than a point that does not lower) is featurized here too,
    so what it raises is raised as it would be without workers. The vectors are those computed
    here (the same code on the same points)."""
    import pickle

    indices = [int(index) for index in indices]
    if pool is None:
        from lorien.engine.measure import default_builder

        pool = default_builder().pool
    if len(indices) < PARALLEL_MIN or pool.size < 2:
        return point_features(space, schedule_of, indices)
    try:
        blob = pickle.dumps((space, schedule_of))
    except (pickle.PicklingError, AttributeError, TypeError):
        return point_features(space, schedule_of, indices)
    shares = pool.size * 2
    chunks = [indices[start::shares] for start in range(shares) if indices[start::shares]]
    replies = pool.map("call", [(features_task, (blob, chunk)) for chunk in chunks], FEATURES_TIMEOUT_S)
    rows: dict[int, np.ndarray | None] = {}
    for chunk, reply in zip(chunks, replies, strict=True):
        values = reply[1] if reply[0] == "ok" else point_features(space, schedule_of, chunk)
        rows.update(zip(chunk, values, strict=True))
    return [rows[index] for index in indices]


def features_task(payload: tuple[bytes, list[int]]) -> list[np.ndarray | None]:
    """A build worker's share of :func:`point_features_in_workers`."""
    import pickle

    blob, indices = payload
    space, schedule_of = pickle.loads(blob)
    return point_features(space, schedule_of, indices)


def feature_dict(vector: Sequence[float]) -> dict[str, float]:
    """A feature vector as named raw features (what featurization writes)."""
    return dict(zip(FEATURE_NAMES, (float(v) for v in vector), strict=True))


#: Feature vectors of configs already lowered in this process, by (dialect, target, workload, config).
_CACHE: dict[tuple[str, str, str, str], np.ndarray] = {}
_CACHE_LIMIT = 200_000


def record_program_features(dialect: Any, record: Any, store: Any = None) -> np.ndarray:
    """The program feature vector of one record (cached per config); LorienError (e.g.
    DialectError, ScheduleError) when its dialect cannot lower it."""
    key = (record.dialect, record.target, record.workload_key, record.config)
    vector = _CACHE.get(key)
    if vector is None:
        schedule, args = dialect.schedule_record(record, store)
        vector = schedule_features(schedule, args)
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = vector
    return vector


_STORES: dict[str, Any] = {}


def _open_store(uri: str) -> Any:
    """A store opened once per process (for reading workloads that records name by reference)."""
    if uri not in _STORES:
        from lorien.warehouse import open_store

        _STORES[uri] = open_store(uri)
    return _STORES[uri]


def featurize_program_batch(dialect: Any, records: Any, store: str | None = None
                            ) -> tuple[list[tuple[list[int], dict[str, Any]]], list[tuple[int, str]]]:
    """Program features of many records (an Arrow table of the record schema) in the form of
    :meth:`lorien.dialect.Dialect.featurize_batch`: one group of :data:`FEATURE_NAMES` columns,
    and ``(position, reason)`` of every record its dialect cannot lower. ``store``: the URI of
    the store the records come from (where a MetaSchedule record finds its workload)."""
    from lorien.errors import LorienError
    from lorien.record import TuningRecord

    positions: list[int] = []
    rows: list[np.ndarray] = []
    failed: list[tuple[int, str]] = []
    opened = _open_store(store) if store is not None else None
    for position, row in enumerate(records.to_pylist()):
        record = TuningRecord.from_row(row)
        try:
            rows.append(record_program_features(dialect, record, opened))
        except (LorienError, KeyError, TypeError, ValueError) as exc:
            failed.append((position, f"cannot lower its program: {exc}"))
            continue
        positions.append(position)
    if not rows:
        return [], failed
    matrix = np.vstack(rows)
    return [(positions, {name: matrix[:, j] for j, name in enumerate(FEATURE_NAMES)})], failed
