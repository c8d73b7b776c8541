"""Lowering: a schedule becomes a flat list of loop-nest micro-ops (``UOp``).

The list is what every renderer consumes (``codegen/llvm.py`` today, a CUDA C renderer
later). Structure is kept with paired ``LOOP``/``ENDLOOP`` and ``IF``/``ENDIF`` ops; values
are SSA: an op's ``src`` are indices of earlier ops. Unrolled loops are expanded here and
vectorized loops become ops with ``lanes > 1``, so a renderer only sees serial and parallel
loops. Kinds:

ARG(index, name)  ALLOC(name, size, scope)  FREE  CONST(value)  LOOP(name, extent, kind)  ENDLOOP
IF  ENDIF  LOAD(buf, idx[, mask])  STORE(buf, idx, value)  ALU(op)  CAST(dtype)  BROADCAST
VECTOR(scalars...)  EXTRACT(lane)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from lorien.engine import te
from lorien.engine.schedule import Schedule, ScheduleError, Stage, derived_extents

PURE_OPS = ("CONST", "ALU", "CAST", "BROADCAST", "VECTOR", "EXTRACT")


@dataclass(frozen=True)
class UOp:
    """One micro-op: ``op`` kind, element ``dtype``, vector ``lanes``, operand indices, argument."""

    op: str
    dtype: str
    lanes: int
    src: tuple[int, ...]
    arg: object = None


@dataclass
class ArgSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    is_output: bool
    packing: Any = None  # lorien.engine.arrays.Packing of an input whose layout the schedule rewrote


@dataclass
class Program:
    """The lowered loop nest of one kernel."""

    name: str
    uops: list[UOp]
    args: list[ArgSpec] = field(default_factory=list)

    def __str__(self) -> str:
        lines, depth = [f"kernel {self.name}({', '.join(f'{a.name}: {a.dtype}{list(a.shape)}' for a in self.args)})"], 1
        for i, u in enumerate(self.uops):
            if u.op in ("ENDLOOP", "ENDIF"):
                depth -= 1
            ty = u.dtype + (f"x{u.lanes}" if u.lanes > 1 else "")
            src = " ".join(f"%{s}" for s in u.src)
            if u.op in ("LOAD", "STORE"):
                buf = self.uops[u.src[0]].arg
                src = f"%{u.src[0]}({buf[1] if self.uops[u.src[0]].op == 'ARG' else buf[0]}) " + src.split(" ", 1)[1]
            arg = "" if u.arg is None else f" {u.arg}"
            lines.append(f"{'  ' * depth}%{i} = {u.op} {ty} {src}{arg}".rstrip())
            if u.op in ("LOOP", "IF"):
                depth += 1
        return "\n".join(lines)


# ---------------------------------------------------------------- affine analysis

class Atom:
    """A non-affine sub-expression (``f // 14``, ``f % 14``...) treated as one opaque variable."""

    def __init__(self, expr: te.Expr):
        self.expr, self.key = expr, repr(expr)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, Atom) and other.key == self.key


def linear(expr: te.Expr) -> dict | None:
    """``{Var or Atom: coeff, 1: const}``: ``expr`` as an affine form over variables and opaque atoms.

    Integer sub-expressions that are not affine become atoms; None for float expressions.
    """
    kind = type(expr)
    if kind is te.Const:
        return {1: expr.value} if type(expr.value) is int else None
    if kind is te.Var or isinstance(expr, te.Var):
        return {expr: 1}
    if expr.dtype != te.INDEX_DTYPE:
        return None
    if kind is te.BinOp and expr.op in _AFFINE_OPS:
        a = linear(expr.a)
        b = linear(expr.b) if a is not None else None
        if b is None:
            return {Atom(expr): 1}
        if expr.op == "mul":
            if a.keys() <= {1}:  # a constant: keep the variables in a
                a, b = b, a
            if not b.keys() <= {1}:
                return {Atom(expr): 1}
            k = b.get(1, 0)
            return {v: c * k for v, c in a.items() if c * k}
        sign = 1 if expr.op == "add" else -1
        out = dict(a)
        for v, c in b.items():
            out[v] = out.get(v, 0) + sign * c
        return {v: c for v, c in out.items() if c}
    return {Atom(expr): 1}


_AFFINE_OPS = frozenset(("add", "sub", "mul"))


def from_linear(form: dict) -> te.Expr:
    expr: te.Expr | None = None
    terms = [v for v in form if v != 1]
    terms.sort(key=lambda v: (0, v.uid, "") if isinstance(v, te.Var) else (1, 0, v.key))
    bases = [var if isinstance(var, te.Var) else var.expr for var in terms]
    if all(b.dtype == te.INDEX_DTYPE for b in bases) and all(type(c) is int for c in form.values()):
        # the tree the operators below build, made directly (index dtype and int coefficients
        # throughout: no literal is converted)
        for var, base in zip(terms, bases, strict=True):
            term = base if form[var] == 1 else te.BinOp("mul", base, te.Const(form[var], te.INDEX_DTYPE))
            expr = term if expr is None else te.BinOp("add", expr, term)
        c = form.get(1, 0)
        if expr is None:
            return te.Const(c, te.INDEX_DTYPE)
        return te.BinOp("add", expr, te.Const(c, te.INDEX_DTYPE)) if c else expr
    for var in terms:
        base = var if isinstance(var, te.Var) else var.expr
        term = base if form[var] == 1 else base * form[var]
        expr = term if expr is None else expr + term
    c = form.get(1, 0)
    if expr is None:
        return te.const(c)
    return expr + c if c else expr


def depends(form: dict, var: te.Var) -> bool:
    """Whether an affine form involves ``var``, directly or inside an atom."""
    return any(k is var or (isinstance(k, Atom) and contains(k.expr, var)) for k in form)


def contains(expr: te.Expr, var: te.Var) -> bool:
    return any(node is var for node in te.walk(expr))


@dataclass
class _Nest:
    """Per-stage loop state while emitting it."""

    stage: Stage
    leaves: list[str]
    vars: dict[str, te.Var]
    ext: dict[str, int]
    guards: list[tuple[te.Expr, str]]
    rootvals: dict
    body: te.Expr
    first_reduce: int


class _Lowering:
    def __init__(self, sch: Schedule, args: list[te.Tensor], name: str):
        self.sch, self.args, self.name = sch, list(args), name
        self.uops: list[UOp] = []
        # common subexpressions: one table of the pure ops visible here, and per open scope (loop
        # body, guarded block) the keys it added, dropped when the scope closes
        self._cse: dict[tuple, int] = {}
        self._cse_scopes: list[list[tuple]] = [[]]
        # per (buffer, index expressions) its flat index; per (flat index, vector loop) how it is
        # accessed: pure functions of expressions that unrolled iterations emit again and again.
        # Keyed by identity; each value holds its key's objects, so an id is never reused meanwhile.
        self._flat: dict[tuple, tuple] = {}
        self._access: dict[tuple, tuple] = {}
        # per load-free expression node its variables; per (node, its variables' values, vector
        # loop) the op :meth:`ex` made of it, dropped with the scope it was made in (like the CSE
        # table: while that scope is open, evaluating the node again would only find ops in it)
        self._vars: dict[int, tuple] = {}
        self._memo: dict[tuple, tuple] = {}
        self._memo_scopes: list[list[tuple]] = [[]]
        self._unrolling = 0  # unrolled loops open: only there is a node evaluated again and again
        self.stages = {st.name: st for st in sch.stages}
        self.env: dict = {}
        self.var_ext: dict = {}
        self.buffers: dict = {}
        self.vec: tuple[te.Var, int] | None = None
        self.in_parallel = False
        self._bodies: dict[str, te.Expr] = {}
        self.children: dict[tuple[str, str], list[Stage]] = defaultdict(list)

    # ---------------------------------------------------------------- emission helpers
    def emit(self, op: str, dtype: str, lanes: int = 1, src: tuple = (), arg=None) -> int:
        src = tuple(src)
        if op not in PURE_OPS:
            self.uops.append(UOp(op, dtype, lanes, src, arg))
            return len(self.uops) - 1
        key = (op, dtype, lanes, src, arg)  # a UOp's fields: equal and hashed as the UOp would be
        idx = self._cse.get(key)
        if idx is None:
            self.uops.append(UOp(op, dtype, lanes, src, arg))
            idx = self._cse[key] = len(self.uops) - 1
            self._cse_scopes[-1].append(key)
        return idx

    def open_scope(self) -> None:
        """Pure ops emitted from here on are reused only until :meth:`close_scope`."""
        self._cse_scopes.append([])
        self._memo_scopes.append([])

    def close_scope(self) -> None:
        for key in self._cse_scopes.pop():
            del self._cse[key]
        for key in self._memo_scopes.pop():
            del self._memo[key]

    def const(self, value, dtype: str = te.INDEX_DTYPE) -> int:
        key = ("CONST", dtype, 1, (), value)
        idx = self._cse.get(key)
        return self.emit("CONST", dtype, 1, (), value) if idx is None else idx

    def lanes(self, i: int) -> int:
        return self.uops[i].lanes

    def broadcast(self, i: int, lanes: int) -> int:
        u = self.uops[i]
        if u.lanes == lanes:
            return i
        if u.op == "CONST":
            return self.emit("CONST", u.dtype, lanes, (), tuple([u.arg] * lanes))
        return self.emit("BROADCAST", u.dtype, lanes, (i,))

    def alu(self, op: str, *srcs: int) -> int:
        if len(srcs) == 2:
            return self._alu2(op, srcs[0], srcs[1])
        us = [self.uops[s] for s in srcs]
        scalar_consts = [u.op == "CONST" and u.lanes == 1 for u in us]
        if all(scalar_consts) and op in _FOLD:
            value = _FOLD[op](*[u.arg for u in us])
            return self.const(value, "bool" if op in te.BinOp.COMPARE else us[0].dtype)
        unit = _UNIT.get(op)  # x + 0, x - 0, 0 + x, x * 1, 1 * x
        if unit is not None:
            if scalar_consts[1] and us[1].arg == unit:
                return srcs[0]
            if op != "sub" and scalar_consts[0] and us[0].arg == unit:
                return srcs[1]
        lanes = max(u.lanes for u in us)
        if any(u.lanes != lanes for u in us):
            srcs = tuple(self.broadcast(s, lanes) for s in srcs)
        dtype = "bool" if op in _BOOL_RESULT else us[1].dtype if op == "where" else us[0].dtype
        idx = self._cse.get(("ALU", dtype, lanes, srcs, op))
        return self.emit("ALU", dtype, lanes, srcs, op) if idx is None else idx

    def _alu2(self, op: str, a: int, b: int) -> int:
        """:meth:`alu` of two operands (most ops), the same steps without the lists."""
        ua, ub = self.uops[a], self.uops[b]
        const_a = ua.op == "CONST" and ua.lanes == 1
        const_b = ub.op == "CONST" and ub.lanes == 1
        if const_a and const_b and op in _FOLD:
            return self.const(_FOLD[op](ua.arg, ub.arg), "bool" if op in te.BinOp.COMPARE else ua.dtype)
        unit = _UNIT.get(op)
        if unit is not None:
            if const_b and ub.arg == unit:
                return a
            if op != "sub" and const_a and ua.arg == unit:
                return b
        lanes = ua.lanes if ua.lanes >= ub.lanes else ub.lanes
        if ua.lanes != lanes:
            a = self.broadcast(a, lanes)
        if ub.lanes != lanes:
            b = self.broadcast(b, lanes)
        dtype = "bool" if op in _BOOL_RESULT else ua.dtype
        idx = self._cse.get(("ALU", dtype, lanes, (a, b), op))
        return self.emit("ALU", dtype, lanes, (a, b), op) if idx is None else idx

    # ---------------------------------------------------------------- bodies and bounds
    def body_of(self, name: str) -> te.Expr:
        if name not in self._bodies:
            def load_fn(load: te.Load, idx: tuple) -> te.Expr:
                producer = self.stages.get(load.tensor.name)
                if producer is not None and producer.attach == "inline":
                    return te.substitute(self.body_of(producer.name), dict(zip(producer.op.axis, idx, strict=False)))
                return te.Load(load.tensor, idx)
            self._bodies[name] = te.substitute(self.stages[name].op.body, {}, load_fn)
        return self._bodies[name]

    def simp(self, e: te.Expr) -> te.Expr:
        """Rewrite ``(c*q + r) // c`` to ``q`` and ``% c`` to ``r`` when ``0 <= r < c`` over loop ranges."""
        if isinstance(e, te.BinOp):
            a, b = self.simp(e.a), self.simp(e.b)
            if e.op in ("floordiv", "mod") and isinstance(b, te.Const) and isinstance(b.value, int) and b.value > 0:
                form = linear(a)
                if form is not None:
                    c = b.value
                    quot = {v: k // c for v, k in form.items() if k % c == 0 and k // c}
                    rem = {v: k for v, k in form.items() if k % c != 0}
                    if form.get(1, 0) % c == 0:
                        quot[1] = form.get(1, 0) // c
                    else:
                        rem[1] = form.get(1, 0)
                    rb = self.bounds(from_linear(rem)) if rem else (0, 0)
                    if rb is not None and rb[0] >= 0 and rb[1] < c:
                        return from_linear(quot) if e.op == "floordiv" else from_linear(rem)
            return e if (a is e.a and b is e.b) else te.BinOp(e.op, a, b)
        if isinstance(e, te.Load):
            return te.Load(e.tensor, [self.simp(i) for i in e.indices])
        if isinstance(e, te.Call):
            return te.Call(e.fn, [self.simp(x) for x in e.args], e.dtype)
        if isinstance(e, te.Select):
            return te.Select(self.simp(e.cond), self.simp(e.a), self.simp(e.b))
        if isinstance(e, te.Reduce):
            return te.Reduce(e.combiner, self.simp(e.source), e.axes)
        return e

    def bounds(self, expr: te.Expr) -> tuple[int, int] | None:
        """Integer interval of ``expr`` over the loop ranges, or None when unknown."""
        if isinstance(expr, te.Const):
            return (expr.value, expr.value) if isinstance(expr.value, int) else None
        if isinstance(expr, te.Var):
            ext = self.var_ext.get(expr)
            return None if ext is None else (0, ext - 1)
        form = linear(expr)
        if form is not None and not (len(form) == 1 and isinstance(next(iter(form)), Atom)):
            lo = hi = form.get(1, 0)
            for v, c in form.items():
                if v == 1:
                    continue
                b = self.bounds(v if isinstance(v, te.Var) else v.expr)
                if b is None:
                    return None
                lo, hi = lo + min(c * b[0], c * b[1]), hi + max(c * b[0], c * b[1])
            return lo, hi
        if isinstance(expr, te.BinOp) and expr.op in ("floordiv", "mod") and isinstance(expr.b, te.Const):
            a, c = self.bounds(expr.a), expr.b.value
            if a is None or a[0] < 0 or not isinstance(c, int) or c <= 0:
                return None
            return (a[0] // c, a[1] // c) if expr.op == "floordiv" else (0, min(c - 1, a[1]))
        if isinstance(expr, te.BinOp) and expr.op == "mul":
            a, b = self.bounds(expr.a), self.bounds(expr.b)
            if a is None or b is None:
                return None
            products = [x * y for x in a for y in b]
            return min(products), max(products)
        return None

    # ---------------------------------------------------------------- main
    def run(self) -> Program:
        arg_names = [t.name for t in self.args]
        if len(set(arg_names)) != len(arg_names):
            raise ScheduleError(f"build arguments have duplicate names: {arg_names}")
        for name, st in self.stages.items():
            if st.attach == "inline" and name in arg_names:
                raise ScheduleError(f"stage {name!r} is inlined but is also a kernel argument")
            if isinstance(st.attach, tuple):
                self.children[st.attach].append(st)
        readers: dict[str, list[str]] = defaultdict(list)
        for name, st in self.stages.items():
            if st.attach != "inline":
                for node in te.walk(self.body_of(name)):
                    if isinstance(node, te.Load) and name not in readers[node.tensor.name]:
                        readers[node.tensor.name].append(name)
        for name, st in self.stages.items():
            if isinstance(st.attach, tuple) and any(not self._reads_inside(reader, st.attach) for reader in readers[name]):
                raise ScheduleError(f"compute_at: {name!r} is read by {readers[name]}, not only inside loop "
                                    f"{st.attach[1]!r} of {st.attach[0]!r}")
        for tname in readers:
            if tname not in self.stages and tname not in arg_names:
                raise ScheduleError(f"tensor {tname!r} is read but is not a kernel argument")
        for i, t in enumerate(self.args):
            self.buffers[t.name] = (self.emit("ARG", t.dtype, 1, (), (i, t.name)), [te.const(0)] * t.ndim,
                                    _strides(t.shape), _prod(t.shape))
        temps = []
        for name, st in self.stages.items():
            if st.attach is None and name not in arg_names:
                size = _prod(st.tensor.shape)
                temps.append(self.emit("ALLOC", st.tensor.dtype, 1, (), (name, size, "global")))
                self.buffers[name] = (temps[-1], [te.const(0)] * st.tensor.ndim, _strides(st.tensor.shape), size)
        for st in self.sch.stages:
            if st.attach is None:
                self.emit_stage(st, [(te.const(0), n) for n in st.tensor.shape])
        for t in temps:
            self.emit("FREE", self.uops[t].dtype, 1, (t,))
        specs = [ArgSpec(t.name, t.shape, t.dtype, isinstance(t.op, te.ComputeOp), getattr(t.op, "packing", None))
                 for t in self.args]
        return Program(self.name, self.uops, specs)

    def setup(self, st: Stage, region: list[tuple[te.Expr, int]]) -> _Nest:
        ext: dict[str, int] = {iv.name: e for iv, (_, e) in zip(st.op.axis, region, strict=False)}
        ext.update({iv.name: iv.extent for iv in st.op.reduce_axis})
        kinds = {name: iv.kind for name, iv in st.axes.items()}
        derived_extents(st.relations, ext)
        safe = st.name.replace(".", "_")
        lvars = {leaf: te.Var(f"{safe}.{leaf}") for leaf in st.leaf}
        values: dict[str, te.Expr] = dict(lvars)
        guards: list[tuple[te.Expr, str]] = []
        for v, leaf in ((lvars[leaf], leaf) for leaf in st.leaf):
            self.var_ext[v] = ext[leaf]
        for rel in reversed(st.relations):
            if rel[0] == "split":
                _, parent, outer, inner, _, _ = rel
                values[parent] = values[outer] * ext[inner] + values[inner]
                if ext[outer] * ext[inner] != ext[parent]:
                    guards.append((values[parent] < ext[parent], kinds[parent]))
            else:
                _, a, b, fused = rel
                values[a] = values[fused] // ext[b]
                values[b] = values[fused] % ext[b]
        rootvals = {}
        for d, (iv, (offset, _)) in enumerate(zip(st.op.axis, region, strict=False)):
            value = values[iv.name] if isinstance(offset, te.Const) and offset.value == 0 else offset + values[iv.name]
            rootvals[iv] = value
            lo_hi = self.bounds(value)
            if lo_hi is None or lo_hi[0] < 0:
                guards.append((value >= 0, "spatial"))
            if lo_hi is None or lo_hi[1] >= st.tensor.shape[d]:
                guards.append((value < st.tensor.shape[d], "spatial"))
        for iv in st.op.reduce_axis:
            rootvals[iv] = values[iv.name]
        guards = [(g, k) for g, k in guards if not self._provably_true(g)]
        body = self.simp(te.substitute(self.body_of(st.name), rootvals))
        first_reduce = next((p for p, leaf in enumerate(st.leaf) if kinds[leaf] == "reduce"), -1)
        return _Nest(st, list(st.leaf), lvars, ext, guards, rootvals, body, first_reduce)

    def _provably_true(self, cond: te.Expr) -> bool:
        if isinstance(cond, te.BinOp) and cond.op in ("lt", "le"):
            a, b = self.bounds(cond.a), self.bounds(cond.b)
            if a is not None and b is not None:
                return a[1] < b[0] if cond.op == "lt" else a[1] <= b[0]
        return False

    def emit_stage(self, st: Stage, region: list[tuple[te.Expr, int]]) -> None:
        self.emit_nest(self.setup(st, region), 0)

    def emit_nest(self, nest: _Nest, pos: int) -> None:
        if pos == nest.first_reduce:
            self.emit_init(nest, pos)
        if pos == len(nest.leaves):
            self.emit_body(nest)
            return
        leaf = nest.leaves[pos]
        var = nest.vars[leaf]
        attached = self.children.get((nest.stage.name, leaf), [])

        def inner() -> None:
            for child in attached:
                self.emit_child(child, nest, pos)
            self.emit_nest(nest, pos + 1)

        vectorizable = (pos == len(nest.leaves) - 1 and not attached and
                        nest.stage.axes[leaf].kind == "spatial" and not any(contains(g, var) for g, _ in nest.guards))
        self.loop(var, nest.ext[leaf], nest.stage.annotations.get(leaf, "serial"), inner, vectorizable)

    def loop(self, var: te.Var, extent: int, kind: str, fn, vectorizable: bool) -> None:
        if kind == "unrolled" or extent == 1:
            self._unrolling += extent > 1
            for value in range(extent):
                self.env[var] = self.const(value)
                fn()
            self._unrolling -= extent > 1
            self.env.pop(var, None)
            return
        if kind == "vectorized" and vectorizable and self.vec is None:
            self.vec = (var, extent)
            fn()
            self.vec = None
            return
        self.emit_loop(var, extent, kind, fn)

    def emit_loop(self, var: te.Var, extent: int, kind: str, fn, unrolled_label: str = "serial") -> None:
        """A LOOP .. ENDLOOP around ``fn``: parallel if asked and not inside a parallel loop
        already; an ``unrolled`` loop kept as a loop is labelled ``unrolled_label``."""
        parallel = kind == "parallel" and not self.in_parallel
        label = "parallel" if parallel else unrolled_label if kind == "unrolled" else "serial"
        loop_id = self.emit("LOOP", te.INDEX_DTYPE, 1, (), (var.name, extent, label))
        self.env[var] = loop_id
        self.open_scope()
        was_parallel, self.in_parallel = self.in_parallel, self.in_parallel or parallel
        fn()
        self.in_parallel = was_parallel
        self.close_scope()
        self.emit("ENDLOOP", te.INDEX_DTYPE, 1, (loop_id,))
        self.env.pop(var, None)

    def _runs_inside(self, name: str, host: str, pos: int) -> bool:
        """Whether stage ``name`` runs inside loop ``pos`` of stage ``host``: computed at that
        loop or a deeper one, directly or inside a stage that is."""
        where = self.stages[name].attach
        while isinstance(where, tuple):
            if where[0] == host:
                return self.stages[host].leaf.index(where[1]) >= pos
            where = self.stages[where[0]].attach
        return False

    def _reads_inside(self, reader: str, attach: tuple[str, str]) -> bool:
        """Whether stage ``reader`` reads inside loop ``attach`` (it is the host or runs inside)."""
        return reader == attach[0] or self._runs_inside(reader, attach[0], self.stages[attach[0]].leaf.index(attach[1]))

    def _loads_over_span(self, reader: Stage, child: Stage, nest: _Nest, pos: int) -> tuple[list[te.Load], set]:
        """Loads of ``child`` by ``reader`` (a stage inside loop ``pos`` of ``nest``) with its loop
        variables replaced by fresh variables over all it computes in one iteration of that
        loop; and the variables that vary."""
        mapping, varying = {}, set()
        for iv, (offset, extent) in zip(reader.op.axis, self._span(reader, nest, pos), strict=True):
            fresh = te.Var(f"{reader.name}.{iv.name}.r")
            self.var_ext[fresh] = extent
            varying.add(fresh)
            mapping[iv] = offset + fresh
        for iv in reader.op.reduce_axis:
            self.var_ext[iv] = iv.extent
            varying.add(iv)
        body = self.body_of(reader.name)
        source = body.source if isinstance(body, te.Reduce) else body
        loads = [n for n in te.walk(te.substitute(source, mapping)) if isinstance(n, te.Load) and n.tensor.name == child.name]
        return loads, varying

    def _span(self, stage: Stage, nest: _Nest, pos: int) -> list[tuple[te.Expr, int]]:
        """(offset, extent) per dimension of all that ``stage`` (inside loop ``pos`` of ``nest``)
        computes in one iteration of that loop."""
        host, leaf = stage.attach
        if host == nest.stage.name:
            return self.region(stage, nest, nest.leaves.index(leaf))
        loads, varying = self._loads_over_span(self.stages[host], stage, nest, pos)
        return self._fit(stage, loads, varying | {nest.vars[leaf] for leaf in nest.leaves[pos + 1:]})

    def emit_child(self, child: Stage, nest: _Nest, pos: int) -> None:
        region = self.region(child, nest, pos)
        size = _prod(e for _, e in region)
        buf = self.emit("ALLOC", child.tensor.dtype, 1, (), (child.name, size, "local"))
        self.buffers[child.name] = (buf, [o for o, _ in region], _strides([e for _, e in region]), size)
        self.emit_stage(child, region)

    def region(self, child: Stage, nest: _Nest, pos: int) -> list[tuple[te.Expr, int]]:
        """(offset, extent) per dimension of the part of ``child`` that one iteration of loop
        ``pos`` of ``nest`` reads (its body and the stages that run inside that loop)."""
        inner_vars = {nest.vars[leaf] for leaf in nest.leaves[pos + 1:]}
        loads = [n for n in te.walk(nest.body) if isinstance(n, te.Load) and n.tensor.name == child.name]
        for name, reader in self.stages.items():
            if reader is not child and reader.attach != "inline" and self._runs_inside(name, nest.stage.name, pos) \
                    and any(isinstance(n, te.Load) and n.tensor.name == child.name for n in te.walk(self.body_of(name))):
                more, varying = self._loads_over_span(reader, child, nest, pos)
                loads += more
                inner_vars |= varying
        return self._fit(child, loads, inner_vars)

    def _fit(self, child: Stage, loads: list[te.Load], inner_vars: set) -> list[tuple[te.Expr, int]]:
        """The box of ``child`` that ``loads`` touch while ``inner_vars`` run over their ranges:
        offsets in the other (outer) variables; the whole dimension where that is not affine."""
        region = []
        loads = [self.simp(ld) for ld in loads]  # (c*q + r) // c -> q: a packed panel's box, not the whole tensor
        for d, size in enumerate(child.tensor.shape):
            forms = [linear(ld.indices[d]) for ld in loads]
            if not forms or any(f is None or any(isinstance(k, Atom) and any(contains(k.expr, v) for v in inner_vars)
                                                 for k in f) for f in forms):
                region.append((te.const(0), size))
                continue
            outers, los, his = [], [], []
            for f in forms:
                outer = {v: c for v, c in f.items() if v != 1 and v not in inner_vars}
                lo = hi = f.get(1, 0)
                for v, c in f.items():
                    if v in inner_vars:
                        lo += min(0, c * (self.var_ext[v] - 1))
                        hi += max(0, c * (self.var_ext[v] - 1))
                outers.append(outer)
                los.append(lo)
                his.append(hi)
            extent = max(his) - min(los) + 1
            if any(o != outers[0] for o in outers) or extent >= size:
                region.append((te.const(0), size))
            else:
                region.append((from_linear({**outers[0], 1: min(los)}), extent))
        return region

    def emit_init(self, nest: _Nest, pos: int) -> None:
        spatial = [leaf for leaf in nest.leaves[pos:] if nest.stage.axes[leaf].kind == "spatial"]
        guards = [g for g, kind in nest.guards if kind == "spatial"]
        identity = nest.body.identity()

        def level(i: int) -> None:
            if i == len(spatial):
                self.guarded(guards, lambda: self.store(nest.stage.name, self._out_indices(nest), self.const(identity.value, identity.dtype)))
                return
            var = nest.vars[spatial[i]]
            vectorizable = i == len(spatial) - 1 and not any(contains(g, var) for g in guards)
            self.loop(var, nest.ext[spatial[i]], nest.stage.annotations.get(spatial[i], "serial"),
                      lambda: level(i + 1), vectorizable)

        level(0)

    def _out_indices(self, nest: _Nest) -> list[te.Expr]:
        return [nest.rootvals[iv] for iv in nest.stage.op.axis]

    def guarded(self, guards: list[te.Expr], fn) -> None:
        if not guards:
            fn()
            return
        cond = self.ex(guards[0])
        for g in guards[1:]:
            cond = self.alu("and", cond, self.ex(g))
        self.emit("IF", "bool", 1, (cond,))
        self.open_scope()
        fn()
        self.close_scope()
        self.emit("ENDIF", "bool", 1, ())

    def emit_body(self, nest: _Nest) -> None:
        body, name = nest.body, nest.stage.name
        indices = self._out_indices(nest)

        def statement() -> None:
            if isinstance(body, te.Reduce):
                acc = self.load(te.Load(nest.stage.tensor, indices), None)
                src = body.source
                if body.combiner == "sum" and body.dtype in te.FLOAT_DTYPES and isinstance(src, te.BinOp) and src.op == "mul":
                    value = self.alu("fma", self.ex(src.a), self.ex(src.b), acc)
                else:
                    value = self.alu({"sum": "add", "max": "max", "min": "min"}[body.combiner], acc, self.ex(src))
            else:
                value = self.ex(body)
            self.store(name, indices, value)

        self.guarded([g for g, _ in nest.guards], statement)

    # ---------------------------------------------------------------- expressions
    def ex(self, e: te.Expr, mask: int | None = None) -> int:
        if type(e) is te.BinOp:  # the most common node first
            if not self._unrolling:
                return self._binop(e, mask)
            variables = self._variables(e)
            if variables is None:  # loads: each evaluation emits them again
                return self._binop(e, mask)
            env = self.env
            key = (id(e), self.vec, *[env.get(v) for v in variables])
            memo = self._memo.get(key)
            if memo is not None:
                return memo[1]
            idx = self._binop(e, mask)
            self._memo[key] = (e, idx)
            self._memo_scopes[-1].append(key)
            return idx
        if isinstance(e, te.Const):
            return self.const(e.value, e.dtype)
        if isinstance(e, te.Var):
            if self.vec is not None and e is self.vec[0]:
                return self.emit("CONST", te.INDEX_DTYPE, self.vec[1], (), tuple(range(self.vec[1])))
            if e not in self.env:
                raise ScheduleError(f"variable {e.name!r} is used outside its loop (check compute_at targets)")
            return self.env[e]
        if isinstance(e, te.BinOp):
            return self.alu(e.op, self.ex(e.a, mask), self.ex(e.b, mask))
        if isinstance(e, te.Call):
            args = [self.ex(a, mask) for a in e.args]
            if e.fn.startswith("cast:"):
                return self.emit("CAST", e.dtype, self.lanes(args[0]), (args[0],), e.dtype)
            return self.alu(e.fn, *args)
        if isinstance(e, te.Select):
            cond = self.ex(e.cond, mask)
            has_a = any(isinstance(n, te.Load) for n in te.walk(e.a))
            has_b = any(isinstance(n, te.Load) for n in te.walk(e.b))
            mask_a = (cond if mask is None else self.alu("and", mask, cond)) if has_a else mask
            not_cond = self.alu("not", cond) if has_b else None
            mask_b = (not_cond if mask is None else self.alu("and", mask, not_cond)) if has_b else mask
            return self.alu("where", cond, self.ex(e.a, mask_a), self.ex(e.b, mask_b))
        if isinstance(e, te.Load):
            return self.load(e, mask)
        raise ScheduleError(f"cannot lower expression {e!r}")

    def _variables(self, e: te.Expr) -> tuple[te.Var, ...] | None:
        """The variables of a load-free expression (first occurrence order); None if it loads."""
        hit = self._vars.get(id(e))
        if hit is not None:
            return hit[1]
        if type(e) is te.BinOp:
            a, b = self._variables(e.a), self._variables(e.b)
            found = None if a is None or b is None else a + tuple(v for v in b if v not in a)
        elif isinstance(e, te.Var):
            found = (e,)
        elif isinstance(e, te.Const):
            found = ()
        else:
            found = _pure_vars(e)
        self._vars[id(e)] = (e, found)
        return found

    def _binop(self, e: te.BinOp, mask: int | None) -> int:
        if e.op == "add" and e.dtype == te.INDEX_DTYPE and type(e.a) is te.BinOp and e.a.op == "add":
            return self.index_sum(e, mask)
        return self.alu(e.op, self.ex(e.a, mask), self.ex(e.b, mask))

    def index_sum(self, e: te.BinOp, mask: int | None) -> int:
        """A chain of index additions, its constant terms added last: in an unrolled body an
        unrolled loop's variable is a constant, so the sum of the other terms is the same op in
        every iteration (one op, reused), and each iteration adds one constant to it, where the
        chain in its own order would make a new op of every partial sum after that variable.
        Integer addition wraps, so any order gives the same value."""
        terms = []
        while type(e) is te.BinOp and e.op == "add" and e.dtype == te.INDEX_DTYPE:
            terms.append(e.b)
            e = e.a
        terms.append(e)
        total, constant = None, 0
        for term in reversed(terms):
            value = self.ex(term, mask)
            u = self.uops[value]
            if u.op == "CONST" and u.lanes == 1:
                constant += u.arg
            else:
                total = value if total is None else self.alu("add", total, value)
        if total is None:
            return self.const(constant)
        return self.alu("add", total, self.const(constant)) if constant else total

    def flat_index(self, name: str, indices) -> te.Expr:
        entry = self.buffers[name]
        key = (id(entry), *map(id, indices))
        hit = self._flat.get(key)
        if hit is None:
            hit = self._flat[key] = (entry, tuple(indices), self._flat_index(entry, indices))
        return hit[2]

    @staticmethod
    def _flat_index(entry: tuple, indices) -> te.Expr:
        _, offsets, strides, _ = entry
        form: dict | None = {}
        for idx, off, stride in zip(indices, offsets, strides, strict=False):
            li, lo = linear(idx), linear(off)
            if form is None or li is None or lo is None:
                form = None
                break
            for v, c in li.items():
                form[v] = form.get(v, 0) + c * stride
            for v, c in lo.items():
                form[v] = form.get(v, 0) - c * stride
        if form is not None:
            return from_linear({v: c for v, c in form.items() if c})
        flat: te.Expr = te.const(0)
        for idx, off, stride in zip(indices, offsets, strides, strict=False):
            flat = flat + (idx - off) * stride
        return flat

    def _buffer(self, name: str):
        if name not in self.buffers:
            raise ScheduleError(f"tensor {name!r} is used where it is not computed (check compute_at)")
        return self.buffers[name]

    def vector_access(self, flat: te.Expr) -> tuple[str, Any]:
        """How the vectorized loop (if any) reaches flat index ``flat``: ``("scalar", flat)`` (it
        does not vary), ``("vector", base)`` (one contiguous vector from ``base``) or ``("lanes",
        [index per lane])``. Cached: it depends only on the expressions."""
        key = (id(flat), None if self.vec is None else (id(self.vec[0]), self.vec[1]))
        hit = self._access.get(key)
        if hit is not None:
            return hit[1]
        if self.vec is None or not contains(flat, self.vec[0]):
            plan: tuple[str, Any] = ("scalar", flat)
        else:
            var, lanes = self.vec
            form = linear(flat)
            if form is not None and form.get(var) == 1 and not depends({k: c for k, c in form.items() if k is not var}, var):
                plan = ("vector", from_linear({v: c for v, c in form.items() if v is not var}))
            else:
                plan = ("lanes", [te.substitute(flat, {var: te.const(lane)}) for lane in range(lanes)])
        self._access[key] = ((flat, self.vec), plan)
        return plan

    def load(self, e: te.Load, mask: int | None) -> int:
        buf, _, _, size = self._buffer(e.tensor.name)
        kind, where = self.vector_access(self.flat_index(e.tensor.name, e.indices))
        dtype = e.tensor.dtype

        def scalar(index: te.Expr) -> int:
            idx = self.ex(index)
            if mask is not None:
                idx = self.alu("min", self.alu("max", idx, self.const(0)), self.const(size - 1))
            return self.emit("LOAD", dtype, 1, (buf, idx))

        if kind == "scalar":
            return scalar(where)
        lanes = self.vec[1]
        if kind == "vector":
            base = self.ex(where)
            src = (buf, base) if mask is None else (buf, base, self.broadcast(mask, lanes))
            return self.emit("LOAD", dtype, lanes, src)
        parts = [scalar(index) for index in where]
        return self.emit("VECTOR", dtype, lanes, tuple(parts))

    def store(self, name: str, indices, value: int) -> None:
        buf = self._buffer(name)[0]
        kind, where = self.vector_access(self.flat_index(name, indices))
        if kind == "scalar":
            if self.lanes(value) > 1:
                raise ScheduleError(f"stage {name!r}: vectorized axis does not index the output")
            self.emit("STORE", self.uops[value].dtype, 1, (buf, self.ex(where), value))
            return
        value = self.broadcast(value, self.vec[1])
        if kind == "vector":
            base = self.ex(where)
            self.emit("STORE", self.uops[value].dtype, self.vec[1], (buf, base, value))
            return
        for lane, index in enumerate(where):
            part = self.emit("EXTRACT", self.uops[value].dtype, 1, (value,), lane)
            self.emit("STORE", self.uops[value].dtype, 1, (buf, self.ex(index), part))


_UNIT = {"add": 0, "sub": 0, "mul": 1}
_BOOL_RESULT = frozenset((*te.BinOp.COMPARE, "not"))
_FOLD = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "max": max, "min": min,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "and": lambda a, b: bool(a and b),
}


def _pure_vars(e: te.Expr) -> tuple[te.Var, ...] | None:
    """The variables of a load-free expression (first occurrence order); None if it loads."""
    seen: dict[te.Var, None] = {}
    for node in te.walk(e):
        if isinstance(node, te.Var):
            seen[node] = None
        elif isinstance(node, (te.Load, te.Reduce)):
            return None
    return tuple(seen)


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _strides(shape) -> list[int]:
    strides, acc = [], 1
    for n in reversed(list(shape)):
        strides.append(acc)
        acc *= int(n)
    return strides[::-1]


def lower(s: Schedule, args: list[te.Tensor], name: str = "kernel") -> Program:
    """Lower schedule ``s`` with kernel arguments ``args`` (inputs and outputs, in call order)."""
    return _Lowering(s, args, name).run()
