"""The compute DAG of a computation in the engine's DSL: its ops in Ansor's stage order, FLOPs,
layout, a structural hash, a JSON form, a NumPy evaluation of the whole computation, and
which of its ops need multi-level tiling (:func:`needs_multi_level_tiling`). The dialects that
schedule a DAG without templates (auto_scheduler steps, meta_schedule traces) share it.

Ansor numbers stages by its own topological order of *all* ops, inputs included (TVM's
``TopoSortOps``: a depth-first walk from the I/O tensors gives each op a priority, then ops
whose inputs are ready leave a max-priority queue). Steps in a log name stages and loops by
those numbers, so a record replays only on a DAG with the same ops in the same order.

The DAG hash is Lorien's own: the MD5 of the canonical JSON of the DAG (:meth:`ComputeDAG.to_json`,
keys sorted, no spaces). TVM hashes its printed DAG instead, so TVM's hashed keys cannot be
recomputed here; such workloads are known only when someone registers their tensors under
TVM's key (:func:`lorien.workload_registry.register_workload_tensors`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from lorien.engine import te
from lorien.engine.reference import NUMPY_CALLS
from lorien.engine.schedule import Schedule, create_schedule
from lorien.errors import WorkloadError
from lorien.workload import LAYOUT_NA, OPERATORS, infer_layout, json_workload_key


def loads_in_order(expr: te.Expr) -> list[te.Load]:
    """Loads of ``expr`` in TVM's post-order (left to right, a load after the loads in its indices)."""
    found: list[te.Load] = []

    def visit(node: te.Expr) -> None:
        if isinstance(node, te.BinOp):
            visit(node.a)
            visit(node.b)
        elif isinstance(node, te.Call):
            for arg in node.args:
                visit(arg)
        elif isinstance(node, te.Select):
            visit(node.cond)
            visit(node.a)
            visit(node.b)
        elif isinstance(node, te.Reduce):
            visit(node.source)
        elif isinstance(node, te.Load):
            for index in node.indices:
                visit(index)
            found.append(node)

    visit(expr)
    return found


def input_tensors(tensor: te.Tensor) -> list[te.Tensor]:
    """The distinct tensors a compute op reads, in TVM's ``InputTensors`` order."""
    if not isinstance(tensor.op, te.ComputeOp):
        return []
    seen: dict[str, te.Tensor] = {}
    for load in loads_in_order(tensor.op.body):
        seen.setdefault(load.tensor.name, load.tensor)
    return list(seen.values())


def needs_multi_level_tiling(op: te.ComputeOp) -> bool:
    """A reduction where some input misses a spatial loop (so a tile reuses what it loads)."""
    if not op.reduce_axis:
        return False
    spatial = [iv for iv in op.axis if iv.extent > 1]
    for tensor_loads in _loads_by_tensor(op.body).values():
        used = {node for load in tensor_loads for index in load.indices for node in te.walk(index)
                if isinstance(node, te.Var)}
        if any(iv not in used for iv in spatial):
            return True
    return False


def _loads_by_tensor(body: te.Expr) -> dict[str, list[te.Load]]:
    found: dict[str, list[te.Load]] = {}
    for load in loads_in_order(body):
        found.setdefault(load.tensor.name, []).append(load)
    return found


def ansor_order(io_tensors: Sequence[te.Tensor]) -> list[te.Tensor]:
    """Every tensor of the DAG in Ansor's stage order (see the module docstring)."""
    priority: dict[str, int] = {}
    degree: dict[str, int] = {}
    consumers: dict[str, list[te.Tensor]] = {}
    by_name: dict[str, te.Tensor] = {}
    stack = list(io_tensors)
    while stack:
        tensor = stack.pop()
        if tensor.name in priority:
            if by_name[tensor.name] is not tensor:
                raise WorkloadError(f"two different tensors are named {tensor.name!r}; names must be unique")
            continue
        by_name[tensor.name] = tensor
        priority[tensor.name] = len(priority)
        inputs = input_tensors(tensor)
        degree[tensor.name] = len(inputs)
        for producer in inputs:
            consumers.setdefault(producer.name, []).append(tensor)
            stack.append(producer)
    ready = [name for name, count in degree.items() if count == 0]
    order: list[te.Tensor] = []
    while ready:
        name = max(ready, key=priority.__getitem__)
        ready.remove(name)
        order.append(by_name[name])
        for consumer in consumers.get(name, []):
            degree[consumer.name] -= 1
            if degree[consumer.name] == 0:
                ready.append(consumer.name)
    return order


# ---------------------------------------------------------------- JSON form of expressions

def _number(value: float | int | bool) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _encode(expr: te.Expr) -> list[Any]:
    if isinstance(expr, te.Const):
        return ["const", _number(expr.value), expr.dtype]
    if isinstance(expr, te.Var):
        return ["var", expr.name]
    if isinstance(expr, te.BinOp):
        return ["bin", expr.op, _encode(expr.a), _encode(expr.b)]
    if isinstance(expr, te.Call):
        return ["call", expr.fn, expr.dtype, [_encode(arg) for arg in expr.args]]
    if isinstance(expr, te.Select):
        return ["select", _encode(expr.cond), _encode(expr.a), _encode(expr.b)]
    if isinstance(expr, te.Load):
        return ["load", expr.tensor.name, [_encode(index) for index in expr.indices]]
    if isinstance(expr, te.Reduce):
        return ["reduce", expr.combiner, _encode(expr.source), [axis.name for axis in expr.axes]]
    raise WorkloadError(f"cannot serialize expression {expr!r}")


def _decode(value: Any, variables: dict[str, te.Var], tensors: dict[str, te.Tensor]) -> te.Expr:
    kind = value[0]
    if kind == "const":
        number = float(value[1]) if isinstance(value[1], str) else value[1]
        return te.Const(number, value[2])
    if kind == "var":
        return variables[value[1]]
    if kind == "bin":
        return te.BinOp(value[1], _decode(value[2], variables, tensors), _decode(value[3], variables, tensors))
    if kind == "call":
        return te.Call(value[1], [_decode(arg, variables, tensors) for arg in value[3]], value[2])
    if kind == "select":
        return te.Select(*(_decode(part, variables, tensors) for part in value[1:4]))
    if kind == "load":
        return te.Load(tensors[value[1]], [_decode(index, variables, tensors) for index in value[2]])
    if kind == "reduce":
        return te.Reduce(value[1], _decode(value[2], variables, tensors), [variables[name] for name in value[3]])
    raise WorkloadError(f"unknown expression kind {kind!r} in a serialized DAG")


class ComputeDAG:
    """A workload's computation as Ansor sees it.

    ``io_tensors`` are the tensors a registered function returns (inputs and outputs, in the
    kernel's argument order); ``ops`` every tensor in Ansor's stage order.
    """

    def __init__(self, io_tensors: Sequence[te.Tensor]):
        self.io_tensors = list(io_tensors)
        if not self.io_tensors or not any(isinstance(t.op, te.ComputeOp) for t in self.io_tensors):
            raise WorkloadError(f"a compute DAG needs its input and output tensors, got {self.io_tensors}")
        self.ops = ansor_order(self.io_tensors)
        self.outputs = [t for t in self.io_tensors if isinstance(t.op, te.ComputeOp)]

    @property
    def stage_names(self) -> list[str]:
        return [t.name for t in self.ops]

    def flop(self) -> float:
        """FLOPs of one run: every compute op (see :func:`lorien.engine.te.flop`)."""
        return te.flop(self.io_tensors)

    def layout(self) -> str:
        """Data layout of the first op Lorien knows by its tag (conv2d_nhwc -> NHWC), else NA."""
        for tensor in self.ops:
            if isinstance(tensor.op, te.ComputeOp) and tensor.op.tag in OPERATORS:
                args = [["TENSOR", list(t.shape), t.dtype] for t in input_tensors(tensor)]
                return infer_layout(tensor.op.tag, args)
        return LAYOUT_NA

    def init_schedule(self) -> Schedule:
        """A fresh engine schedule of the DAG's outputs."""
        return create_schedule(self.outputs)

    # ------------------------------------------------------------ serialization and hash
    def to_json(self) -> dict[str, Any]:
        """The DAG as plain data: tensors in stage order, the I/O tensors by name."""
        tensors = []
        for tensor in self.ops:
            entry: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "dtype": tensor.dtype}
            if isinstance(tensor.op, te.ComputeOp):
                entry.update(axis=[[iv.name, iv.extent] for iv in tensor.op.axis],
                             reduce_axis=[[iv.name, iv.extent] for iv in tensor.op.reduce_axis],
                             body=_encode(tensor.op.body), tag=tensor.op.tag)
            tensors.append(entry)
        return {"tensors": tensors, "io": [t.name for t in self.io_tensors]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComputeDAG:
        """Inverse of :meth:`to_json`."""
        try:
            tensors: dict[str, te.Tensor] = {}
            for entry in data["tensors"]:
                if "body" not in entry:
                    tensors[entry["name"]] = te.placeholder(entry["shape"], entry["dtype"], entry["name"])
                    continue
                axis = [te.IterVar(name, int(extent), "spatial") for name, extent in entry["axis"]]
                reduce_axis = [te.IterVar(name, int(extent), "reduce") for name, extent in entry["reduce_axis"]]
                variables = {iv.name: iv for iv in axis + reduce_axis}
                body = _decode(entry["body"], variables, tensors)
                op = te.ComputeOp(entry["name"], axis, body, entry.get("tag", ""))
                tensors[entry["name"]] = te.Tensor(entry["shape"], entry["dtype"], entry["name"], op)
            return cls([tensors[name] for name in data["io"]])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise WorkloadError(f"malformed serialized compute DAG: {exc!r}") from exc

    def hash_key(self) -> str:
        """MD5 of the canonical JSON of the DAG (Lorien's DAG hash)."""
        return hashlib.md5(orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)).hexdigest()

    def workload_key(self) -> str:
        """The hashed workload key ``[hash, *shapes of the I/O tensors]`` (TVM's form)."""
        return json_workload_key([self.hash_key(), *(d for t in self.io_tensors for d in t.shape)])

    # ------------------------------------------------------------ NumPy evaluation
    def evaluate(self, *inputs: np.ndarray, budget: int = 1 << 22) -> list[np.ndarray]:
        """The outputs computed by NumPy from ``inputs`` (the input tensors, in I/O order).

        Generic and exact but slow for large reductions: a reduction is evaluated in chunks
        of its outer reduce loops, about ``budget`` elements at a time.
        """
        placeholders = [t for t in self.io_tensors if not isinstance(t.op, te.ComputeOp)]
        if len(inputs) != len(placeholders):
            raise WorkloadError(f"evaluate takes {len(placeholders)} inputs "
                                f"({[t.name for t in placeholders]}), got {len(inputs)}")
        values = {t.name: np.asarray(a) for t, a in zip(placeholders, inputs, strict=True)}
        for tensor in self.ops:
            if isinstance(tensor.op, te.ComputeOp):
                values[tensor.name] = _evaluate_op(tensor, values, budget)
        return [values[t.name] for t in self.outputs]


_NUMPY_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "floordiv": np.floor_divide,
    "mod": np.mod, "lt": np.less, "le": np.less_equal, "eq": np.equal, "ne": np.not_equal,
    "and": np.logical_and, "or": np.logical_or,
}
_NUMPY_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def _evaluate_expr(expr: te.Expr, env: dict, values: dict[str, np.ndarray]) -> Any:
    if isinstance(expr, te.Const):
        return np.array(expr.value, dtype=expr.dtype if expr.dtype != te.INDEX_DTYPE else np.int64)
    if isinstance(expr, te.Var):
        return env[expr]
    if isinstance(expr, te.BinOp):
        return _NUMPY_BINARY[expr.op](_evaluate_expr(expr.a, env, values), _evaluate_expr(expr.b, env, values))
    if isinstance(expr, te.Call):
        args = [_evaluate_expr(arg, env, values) for arg in expr.args]
        if expr.fn.startswith("cast:"):
            return np.asarray(args[0]).astype(expr.dtype)
        return NUMPY_CALLS[expr.fn](*args)
    if isinstance(expr, te.Select):
        cond = _evaluate_expr(expr.cond, env, values)
        # Indices of the branch not taken may be out of bounds: evaluate each branch clipped.
        return np.where(cond, _evaluate_expr(expr.a, env, values), _evaluate_expr(expr.b, env, values))
    if isinstance(expr, te.Load):
        array = values[expr.tensor.name]
        indices = [np.clip(_evaluate_expr(index, env, values), 0, size - 1)
                   for index, size in zip(expr.indices, array.shape, strict=True)]
        return array[tuple(indices)]
    raise WorkloadError(f"cannot evaluate {expr!r}")


def _grid(axes: Sequence[te.IterVar], first: int, ndim: int) -> dict:
    """Each axis an ``arange`` along its own dimension of an ``ndim``-d broadcast grid."""
    env = {}
    for d, axis in enumerate(axes):
        shape = [1] * ndim
        shape[first + d] = axis.extent
        env[axis] = np.arange(axis.extent, dtype=np.int64).reshape(shape)
    return env


def _evaluate_op(tensor: te.Tensor, values: dict[str, np.ndarray], budget: int) -> np.ndarray:
    op = tensor.op
    body = op.body
    if not isinstance(body, te.Reduce):
        env = _grid(op.axis, 0, len(op.axis))
        return np.broadcast_to(_evaluate_expr(body, env, values), tensor.shape).astype(tensor.dtype)
    contracted = _contract_product(tensor, values, budget)
    if contracted is not None:
        return contracted
    spatial, axes = op.axis, list(body.axes)
    points = math.prod(tensor.shape)
    split = 0  # reduce loops [0, split) run in Python, the rest is vectorized
    while split < len(axes) and points * math.prod(ax.extent for ax in axes[split:]) > budget:
        split += 1
    outer, inner = axes[:split], axes[split:]
    ndim = len(spatial) + len(inner)
    env = _grid(spatial, 0, ndim)
    env.update(_grid(inner, len(spatial), ndim))
    reduce_dims = tuple(range(len(spatial), ndim))
    result = None
    for point in np.ndindex(*[ax.extent for ax in outer]):
        env.update({ax: np.int64(i) for ax, i in zip(outer, point, strict=True)})
        block = np.broadcast_to(_evaluate_expr(body.source, env, values),
                                tensor.shape + tuple(ax.extent for ax in inner)).astype(tensor.dtype)
        part = _NUMPY_REDUCE[body.combiner](block, axis=reduce_dims) if reduce_dims else block
        result = part if result is None else _combine(body.combiner, result, part)
    return np.asarray(result, dtype=tensor.dtype)


def _contract_product(tensor: te.Tensor, values: dict[str, np.ndarray], budget: int) -> np.ndarray | None:
    """A sum over a product of two loads (a matmul, a convolution: most of a reference's time)
    as one ``np.einsum``: each load gathered over only the axes its indices use (im2col, for a
    convolution), then contracted, instead of the whole iteration space gathered in chunks.
    None when the body has another form, or a gathered operand would pass ``4 * budget`` elements."""
    body = tensor.op.body
    source = body.source
    if body.combiner != "sum" or not (isinstance(source, te.BinOp) and source.op == "mul"):
        return None
    factors = [source.a, source.b]
    if not all(isinstance(f, te.Load) and f.dtype == tensor.dtype for f in factors) \
            or tensor.dtype not in ("float32", "float64"):
        return None
    axes = list(tensor.op.axis) + list(body.axes)
    if len(axes) > 52:
        return None
    letters = {ax: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26) for i, ax in enumerate(axes)}
    operands, subscripts, seen = [], [], set()
    for factor in factors:
        names = {node for node in te.walk(factor) if isinstance(node, te.Var)}
        used = [ax for ax in axes if ax in names]
        if names - set(used) or math.prod(ax.extent for ax in used) > 4 * budget:
            return None
        gathered = _evaluate_expr(factor, _grid(used, 0, len(used)), values)
        operands.append(np.broadcast_to(gathered, tuple(ax.extent for ax in used)))
        subscripts.append("".join(letters[ax] for ax in used))
        seen.update(used)
    if not all(ax in seen for ax in tensor.op.axis):
        return None
    output = "".join(letters[ax] for ax in tensor.op.axis)
    result = np.einsum(f"{subscripts[0]},{subscripts[1]}->{output}", *operands, optimize=True)
    return np.asarray(result, dtype=tensor.dtype).reshape(tensor.shape)


def _combine(combiner: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return {"sum": np.add, "max": np.maximum, "min": np.minimum}[combiner](a, b)
