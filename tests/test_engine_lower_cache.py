"""The lowering's caches (one table of common subexpressions with a key list per open scope; flat
indices and vector accesses kept per expression; the op of a load-free expression kept per values
of its variables inside unrolled loops) give, byte for byte, the program that a lowering
without them gives: on traces of the meta_schedule space and on a nest whose computed-at buffer
is allocated again in every unrolled iteration."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LAYER_OPS

import lorien.builtin_workloads  # noqa: F401 - registers the layers of LAYER_OPS
from dialects.meta_schedule.space import TraceSpace
from dialects.meta_schedule.trace import replay_trace
from lorien import workload_registry
from lorien.engine import build, lower, ops, reference, te
from lorien.engine.lower import _FOLD, PURE_OPS, UOp, _Lowering
from lorien.engine.schedule import create_schedule


class _Uncached(_Lowering):
    """The lowering without its caches: a table of common subexpressions per open scope searched
    innermost first, each op folded and simplified operand by operand, every flat index and
    vector access worked out again at each use, every expression evaluated again."""

    def __init__(self, *args):
        super().__init__(*args)
        self.scopes: list[dict] = [{}]

    def emit(self, op, dtype, lanes=1, src=(), arg=None):
        uop = UOp(op, dtype, lanes, tuple(src), arg)
        if op in PURE_OPS:
            for scope in reversed(self.scopes):
                if uop in scope:
                    return scope[uop]
        self.uops.append(uop)
        if op in PURE_OPS:
            self.scopes[-1][uop] = len(self.uops) - 1
        return len(self.uops) - 1

    def const(self, value, dtype=te.INDEX_DTYPE):
        return self.emit("CONST", dtype, 1, (), value)

    def open_scope(self):
        self.scopes.append({})

    def close_scope(self):
        self.scopes.pop()

    def alu(self, op, *srcs):
        us = [self.uops[s] for s in srcs]
        if all(u.op == "CONST" and u.lanes == 1 for u in us) and op in _FOLD:
            return self.const(_FOLD[op](*[u.arg for u in us]), "bool" if op in te.BinOp.COMPARE else us[0].dtype)
        if op in ("add", "sub") and us[1].op == "CONST" and us[1].lanes == 1 and us[1].arg == 0:
            return srcs[0]
        if op == "add" and us[0].op == "CONST" and us[0].lanes == 1 and us[0].arg == 0:
            return srcs[1]
        if op == "mul" and us[1].op == "CONST" and us[1].lanes == 1 and us[1].arg == 1:
            return srcs[0]
        if op == "mul" and us[0].op == "CONST" and us[0].lanes == 1 and us[0].arg == 1:
            return srcs[1]
        lanes = max(u.lanes for u in us)
        srcs = tuple(self.broadcast(s, lanes) for s in srcs)
        dtype = "bool" if op in te.BinOp.COMPARE or op == "not" else us[1].dtype if op == "where" else us[0].dtype
        return self.emit("ALU", dtype, lanes, srcs, op)

    def flat_index(self, name, indices):
        return self._flat_index(self.buffers[name], indices)

    def ex(self, e, mask=None):
        return self._binop(e, mask) if type(e) is te.BinOp else super().ex(e, mask)

    def vector_access(self, flat):
        self._access.clear()
        return super().vector_access(flat)


def _both(schedule, args):
    """The program lowered with the caches and without."""
    return lower(schedule, list(args)), _Uncached(schedule, list(args), "kernel").run()


@pytest.mark.parametrize("op", sorted(LAYER_OPS))
def test_traces_of_the_space_lower_to_the_program_the_uncached_lowering_gives(op):
    name, args = LAYER_OPS[op]
    dag = workload_registry.workload_dag(workload_registry.make_workload_key(name, args))
    space = TraceSpace(dag, cores=2)
    rng = np.random.default_rng(0)
    for _ in range(6):
        replay = replay_trace(dag, space.get(int(rng.integers(len(space)))))
        cached, uncached = _both(replay.schedule, replay.args)
        assert cached.uops == uncached.uops
        assert str(cached) == str(uncached)


def test_a_window_allocated_again_in_every_unrolled_iteration_lowers_as_without_the_caches():
    data, kern = te.placeholder((1, 2, 6, 8), name="data"), te.placeholder((2, 2, 3, 3), name="kernel")
    out = ops.conv2d_nchw(data, kern, 1, 1)
    s = create_schedule(out)
    _, _, y, x = out.op.axis
    s["conv2d.pad"].compute_at(s[out], y)
    s[out].unroll(y)  # the padded window is allocated again, at another row offset, in each iteration
    s[out].vectorize(x)
    cached, uncached = _both(s, [data, kern, out])
    assert sum(u.op == "ALLOC" and u.arg[0] == "conv2d.pad" for u in cached.uops) == 6
    assert cached.uops == uncached.uops
    a = np.random.default_rng(0).standard_normal(data.shape).astype("float32")
    k = np.random.default_rng(1).standard_normal(kern.shape).astype("float32")
    c = np.zeros(out.shape, "float32")
    build(s, [data, kern, out])(a, k, c)
    np.testing.assert_allclose(c, reference.conv2d_nchw(a, k, 1, 1), rtol=1e-4, atol=1e-4)


def test_a_pure_op_of_a_closed_loop_is_emitted_again_after_it():
    data, weight, bias = (te.placeholder((4, 8), name="data"), te.placeholder((6, 8), name="weight"),
                          te.placeholder((6,), name="bias"))
    out = ops.dense(data, weight, bias=bias, relu=True)  # two nests at the root: the product, then bias + relu
    s = create_schedule(out)
    args = [data, weight, bias, out]
    program = lower(s, args)
    ends = [i for i, u in enumerate(program.uops) if u.op == "ENDLOOP"]
    assert len(ends) >= 4
    for i, u in enumerate(program.uops):  # every operand is visible where it is used
        for operand in u.src:
            closed = [e for e in ends if program.uops[e].src[0] < operand < e < i]
            assert not closed or program.uops[operand].op not in PURE_OPS, f"%{i} uses %{operand} of a closed loop"
    assert program.uops == _Uncached(s, args, "kernel").run().uops
