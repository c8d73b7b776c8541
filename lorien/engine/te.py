"""The compute DSL: placeholders, ``compute`` with reduce axes, and scalar expressions.

Expressions are small immutable trees. A ``Tensor`` is either a placeholder (an input
buffer) or the result of ``compute``; indexing a tensor gives a ``Load`` expression::

    A = te.placeholder((M, K), "float32", name="A")
    k = te.reduce_axis(K, name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
"""

from __future__ import annotations

import builtins
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from lorien.errors import LorienError

FLOAT_DTYPES = ("float32", "float64")
INT_DTYPES = ("int32", "int64", "bool")
INDEX_DTYPE = "int64"


class DSLError(LorienError, ValueError):
    """A compute definition that is malformed (wrong index count, unknown dtype...)."""


def _result_dtype(a: Expr, b: Expr) -> str:
    if a.dtype in FLOAT_DTYPES or b.dtype in FLOAT_DTYPES:
        return a.dtype if a.dtype in FLOAT_DTYPES else b.dtype
    return INDEX_DTYPE if INDEX_DTYPE in (a.dtype, b.dtype) else a.dtype


def const(value: float | int | bool, dtype: str | None = None) -> Const:
    """A literal; int literals are int64, float literals float32 unless ``dtype`` says otherwise."""
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else INDEX_DTYPE if isinstance(value, int) else "float32"
    return Const(value, dtype)


def as_expr(value: Expr | float | int, like: Expr | None = None) -> Expr:
    """Wrap a Python number as a ``Const``; a float literal takes ``like``'s float dtype."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, (int, float)) and like is not None and like.dtype in FLOAT_DTYPES:
        return Const(float(value), like.dtype)
    if isinstance(value, (int, float, bool)):
        return const(value)
    raise DSLError(f"cannot use {value!r} ({type(value).__name__}) in an expression")


class Expr:
    """Base of every expression node."""

    dtype: str = INDEX_DTYPE

    def _bin(self, op: str, other: Expr | float | int, reverse: bool = False) -> BinOp:
        other = as_expr(other, like=self)
        a, b = (other, self) if reverse else (self, other)
        if isinstance(a, Const) and a.dtype != b.dtype and b.dtype in FLOAT_DTYPES:
            a = Const(float(a.value), b.dtype)
        if isinstance(b, Const) and a.dtype != b.dtype and a.dtype in FLOAT_DTYPES:
            b = Const(float(b.value), a.dtype)
        if a.dtype != b.dtype and a.dtype in INT_DTYPES and b.dtype in INT_DTYPES:
            if isinstance(b, Const):
                b = Const(int(b.value), a.dtype)
            elif isinstance(a, Const):
                a = Const(int(a.value), b.dtype)
        return BinOp(op, a, b)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __floordiv__(self, o): return self._bin("floordiv", o)
    def __rfloordiv__(self, o): return self._bin("floordiv", o, True)
    def __mod__(self, o): return self._bin("mod", o)
    def __rmod__(self, o): return self._bin("mod", o, True)
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("lt", o, True)
    def __ge__(self, o): return self._bin("le", o, True)
    def __and__(self, o): return self._bin("and", o)
    def __or__(self, o): return self._bin("or", o)
    def __neg__(self): return self._bin("sub", 0, True)
    __hash__ = object.__hash__


class Const(Expr):
    def __init__(self, value: float | int | bool, dtype: str):
        self.value, self.dtype = value, dtype

    def __repr__(self) -> str:
        return repr(self.value) if self.dtype in (INDEX_DTYPE, "float32") else f"{self.dtype}({self.value!r})"


_var_ids = itertools.count()


class Var(Expr):
    """A scalar integer variable (a loop index)."""

    def __init__(self, name: str, dtype: str = INDEX_DTYPE):
        self.name, self.dtype, self.uid = name, dtype, next(_var_ids)

    def __repr__(self) -> str:
        return self.name


class IterVar(Var):
    """An axis of a computation: a variable with an extent and a kind (spatial or reduce)."""

    def __init__(self, name: str, extent: int | None, kind: str = "spatial"):
        super().__init__(name)
        self.extent, self.kind = extent, kind


class BinOp(Expr):
    COMPARE = ("lt", "le", "eq", "ne", "and", "or")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b = op, a, b
        self.dtype = "bool" if op in self.COMPARE else _result_dtype(a, b)

    def __repr__(self) -> str:
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%",
               "lt": "<", "le": "<=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}.get(self.op)
        return f"({self.a!r} {sym} {self.b!r})" if sym else f"{self.op}({self.a!r}, {self.b!r})"


class Call(Expr):
    """A pure elementwise function: max, min, one of :data:`INTRINSICS` or :data:`BINARY_INTRINSICS`, cast:<dtype>."""

    def __init__(self, fn: str, args: Sequence[Expr], dtype: str):
        self.fn, self.args, self.dtype = fn, tuple(args), dtype

    def __repr__(self) -> str:
        return f"{self.fn}({', '.join(map(repr, self.args))})"


class Select(Expr):
    def __init__(self, cond: Expr, a: Expr, b: Expr):
        self.cond, self.a, self.b = cond, a, b
        self.dtype = a.dtype

    def __repr__(self) -> str:
        return f"select({self.cond!r}, {self.a!r}, {self.b!r})"


class Load(Expr):
    def __init__(self, tensor: Tensor, indices: Sequence[Expr]):
        self.tensor, self.indices, self.dtype = tensor, tuple(indices), tensor.dtype

    def __repr__(self) -> str:
        return f"{self.tensor.name}[{', '.join(map(repr, self.indices))}]"


class Reduce(Expr):
    """A commutative reduction (sum, max, min) of ``source`` over ``axes``."""

    def __init__(self, combiner: str, source: Expr, axes: Sequence[IterVar]):
        self.combiner, self.source, self.axes, self.dtype = combiner, source, tuple(axes), source.dtype

    def identity(self) -> Const:
        value = {"sum": 0.0, "max": -math.inf, "min": math.inf}[self.combiner]
        return Const(value if self.dtype in FLOAT_DTYPES else int(max(min(value, 2**31 - 1), -(2**31))), self.dtype)

    def __repr__(self) -> str:
        return f"{self.combiner}({self.source!r}, axis=[{', '.join(a.name for a in self.axes)}])"


class PlaceholderOp:
    def __init__(self, name: str, packing: Any = None):
        self.name = name
        self.packing = packing  # lorien.engine.arrays.Packing: an input the schedule takes in a rewritten layout
        self.axis: list[IterVar] = []
        self.reduce_axis: list[IterVar] = []
        self.body = None


class ComputeOp:
    """``output[axis...] = body`` where body may be a ``Reduce`` over ``reduce_axis``."""

    def __init__(self, name: str, axis: list[IterVar], body: Expr, tag: str = "", attrs: dict | None = None):
        self.name, self.axis, self.body, self.tag = name, axis, body, tag
        self.attrs = dict(attrs or {})
        self.reduce_axis: list[IterVar] = list(body.axes) if isinstance(body, Reduce) else []

    def input_tensors(self) -> list[Tensor]:
        found: dict[str, Tensor] = {}
        for node in walk(self.body):
            if isinstance(node, Load):
                found.setdefault(node.tensor.name, node.tensor)
        return list(found.values())


class Tensor:
    """A named n-d array of ``dtype``: a placeholder or the output of a compute op."""

    def __init__(self, shape: Sequence[int], dtype: str, name: str, op: PlaceholderOp | ComputeOp):
        self.shape, self.dtype, self.name, self.op = tuple(int(s) for s in shape), dtype, name, op
        if dtype not in FLOAT_DTYPES + INT_DTYPES:
            raise DSLError(f"tensor {name!r}: unsupported dtype {dtype!r}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices) -> Load:
        indices = indices if isinstance(indices, tuple) else (indices,)
        if len(indices) != self.ndim:
            raise DSLError(f"tensor {self.name!r} of shape {self.shape} indexed with {len(indices)} indices")
        return Load(self, [as_expr(i) for i in indices])

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"


def placeholder(shape: Sequence[int], dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor."""
    return Tensor(shape, dtype, name, PlaceholderOp(name))


def reduce_axis(extent: int, name: str = "k") -> IterVar:
    """A reduction axis ``0 <= name < extent``."""
    return IterVar(name, int(extent), "reduce")


def compute(shape: Sequence[int], fcompute: Callable[..., Expr], name: str = "compute",
            tag: str = "", attrs: dict | None = None) -> Tensor:
    """A tensor whose element at (i, j, ...) is ``fcompute(i, j, ...)``."""
    code = getattr(fcompute, "__code__", None)
    names = list(code.co_varnames[: code.co_argcount]) if code is not None else []
    if len(names) != len(shape) or len(set(names)) != len(names):
        names = [f"ax{d}" for d in range(len(shape))]
    axis = [IterVar(n, int(e), "spatial") for n, e in zip(names, shape, strict=False)]
    body = as_expr(fcompute(*axis))
    if isinstance(body, Reduce) is False and any(isinstance(n, Reduce) for n in walk(body)):
        raise DSLError(f"compute {name!r}: a reduction must be the whole body, got {body!r}")
    return Tensor(shape, body.dtype, name, ComputeOp(name, axis, body, tag, attrs))


def _reduce(combiner: str, expr: Expr, axis: IterVar | Sequence[IterVar]) -> Reduce:
    axes = [axis] if isinstance(axis, IterVar) else list(axis)
    for a in axes:
        if a.kind != "reduce":
            raise DSLError(f"{combiner}: axis {a.name!r} is not a reduce_axis")
    return Reduce(combiner, as_expr(expr), axes)


def sum(expr: Expr, axis: IterVar | Sequence[IterVar]) -> Reduce:  # noqa: A001
    """Sum reduction of ``expr`` over ``axis``."""
    return _reduce("sum", expr, axis)


def max(a: Expr, b: Expr | float | None = None, axis: IterVar | Sequence[IterVar] | None = None) -> Expr:  # noqa: A001
    """``max(expr, axis=k)`` is a max-reduction; ``max(a, b)`` is elementwise."""
    if axis is not None:
        return _reduce("max", a, axis)
    return maximum(a, b)


def min(a: Expr, b: Expr | float | None = None, axis: IterVar | Sequence[IterVar] | None = None) -> Expr:  # noqa: A001
    """``min(expr, axis=k)`` is a min-reduction; ``min(a, b)`` is elementwise."""
    if axis is not None:
        return _reduce("min", a, axis)
    return minimum(a, b)


def maximum(a: Expr, b: Expr | float) -> Call:
    b = as_expr(b, like=a)
    return Call("max", (a, b), a.dtype)


def minimum(a: Expr, b: Expr | float) -> Call:
    b = as_expr(b, like=a)
    return Call("min", (a, b), a.dtype)


#: Float functions of one argument (TVM's math intrinsics the fused PrimFuncs of models use).
INTRINSICS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "fabs")
#: Float functions of two arguments (``pow``: an ONNX Pow, e.g. layer norm's square, legalizes to it).
BINARY_INTRINSICS = ("pow",)


def power(a: Expr, b: Expr | float) -> Call:
    """``a ** b`` elementwise on float expressions (TVM's ``tirx.pow``)."""
    b = as_expr(b, like=a)
    return Call("pow", (a, b), a.dtype)


def intrinsic(fn: str, x: Expr) -> Call:
    """``fn(x)`` for one of :data:`INTRINSICS`, elementwise on a float expression."""
    if fn not in INTRINSICS:
        raise DSLError(f"unknown intrinsic {fn!r}; known: {INTRINSICS}")
    return Call(fn, (x,), x.dtype)


def exp(x: Expr) -> Call:
    return intrinsic("exp", x)


def sqrt(x: Expr) -> Call:
    return intrinsic("sqrt", x)


def rsqrt(x: Expr) -> Call:
    """``1 / sqrt(x)``."""
    return intrinsic("rsqrt", x)


def tanh(x: Expr) -> Call:
    return intrinsic("tanh", x)


def erf(x: Expr) -> Call:
    """The Gauss error function (GELU's ``0.5 * x * (1 + erf(x / sqrt(2)))``)."""
    return intrinsic("erf", x)


def cast(x: Expr, dtype: str) -> Call:
    return Call(f"cast:{dtype}", (x,), dtype)


def if_then_else(cond: Expr, a: Expr | float, b: Expr | float) -> Select:
    """``a`` where ``cond`` holds, else ``b``; only the chosen side's loads are performed."""
    a = as_expr(a, like=b if isinstance(b, Expr) else None)
    return Select(cond, a, as_expr(b, like=a))


def all(*conds: Expr) -> Expr:  # noqa: A001
    """Logical and of conditions."""
    result = conds[0]
    for c in conds[1:]:
        result = result & c
    return result


def walk(expr: Expr):
    """All nodes of an expression tree, parents first."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, BinOp):
            stack += [node.a, node.b]
        elif isinstance(node, Call):
            stack += list(node.args)
        elif isinstance(node, Select):
            stack += [node.cond, node.a, node.b]
        elif isinstance(node, Load):
            stack += list(node.indices)
        elif isinstance(node, Reduce):
            stack.append(node.source)


def substitute(expr: Expr, mapping: dict, load_fn: Callable[[Load, tuple], Expr] | None = None) -> Expr:
    """Replace variables by ``mapping[var]`` (keyed by Var); optionally rewrite loads."""
    def go(e: Expr) -> Expr:
        if isinstance(e, Var):
            return mapping.get(e, e)
        if isinstance(e, BinOp):
            return BinOp(e.op, go(e.a), go(e.b))
        if isinstance(e, Call):
            return Call(e.fn, [go(a) for a in e.args], e.dtype)
        if isinstance(e, Select):
            return Select(go(e.cond), go(e.a), go(e.b))
        if isinstance(e, Load):
            idx = tuple(go(i) for i in e.indices)
            return load_fn(e, idx) if load_fn else Load(e.tensor, idx)
        if isinstance(e, Reduce):
            return Reduce(e.combiner, go(e.source), e.axes)
        return e
    return go(expr)


def topo_order(outputs: Sequence[Tensor]) -> list[Tensor]:
    """Every tensor reachable from ``outputs``, producers before consumers."""
    order: list[Tensor] = []
    seen: dict[str, Tensor] = {}

    def visit(t: Tensor) -> None:
        if t.name in seen:
            if seen[t.name] is not t:
                raise DSLError(f"two different tensors are named {t.name!r}; names must be unique")
            return
        seen[t.name] = t
        if isinstance(t.op, ComputeOp):
            for inp in t.op.input_tensors():
                visit(inp)
        order.append(t)

    for out in outputs:
        visit(out)
    return order


#: Float calls that count one FLOP each (index arithmetic and casts count nothing).
FLOP_CALLS = ("max", "min", *INTRINSICS, *BINARY_INTRINSICS)


def _expr_flop(expr: Expr) -> int:
    if isinstance(expr, BinOp):
        own = int(expr.op not in BinOp.COMPARE and expr.dtype in FLOAT_DTYPES)
        return own + _expr_flop(expr.a) + _expr_flop(expr.b)
    if isinstance(expr, Call):
        own = int(expr.fn in FLOP_CALLS and expr.dtype in FLOAT_DTYPES)
        return own + builtins.sum(_expr_flop(arg) for arg in expr.args)
    if isinstance(expr, Select):
        return _expr_flop(expr.a) + _expr_flop(expr.b)
    return 0


def op_flop(tensor: Tensor) -> float:
    """Float operations of one compute op: per output point (times the reduction's trip count,
    plus one combine per step of a reduction). Data movement (padding, copies) counts nothing."""
    body = tensor.op.body
    points = float(math.prod(tensor.shape))
    if isinstance(body, Reduce):
        return points * math.prod(ax.extent for ax in body.axes) * (_expr_flop(body.source) + 1)
    return points * _expr_flop(body)


def flop(outputs: Sequence[Tensor]) -> float:
    """FLOPs of one run of the computation of ``outputs``: every compute op they reach (see
    :func:`op_flop`). The one FLOP count of Lorien: what the DSL describes is what is counted."""
    return builtins.sum(op_flop(t) for t in topo_order(outputs) if isinstance(t.op, ComputeOp))
