"""An index sum adds its constant terms last (``_Lowering.index_sum``): in an unrolled body the
sum of the loop-variant terms is one op reused by every iteration, which adds one constant to it;
the kernels compute what they computed with the sum in its written order."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LAYER_OPS

import lorien.builtin_workloads  # noqa: F401 - registers the layers of LAYER_OPS
from dialects.meta_schedule.space import TraceSpace
from dialects.meta_schedule.trace import replay_trace
from lorien import workload_registry
from lorien.engine import te
from lorien.engine.build import build_program
from lorien.engine.lower import _Lowering, lower
from lorien.engine.schedule import create_schedule


class _InOrder(_Lowering):
    """The lowering as before: an index sum evaluated in its written order, partial sum by partial sum."""

    def index_sum(self, e, mask):
        return self.alu(e.op, self.ex(e.a, mask), self.ex(e.b, mask))


def _lowering() -> _Lowering:
    a = te.placeholder((4,), name="a")
    out = te.compute((4,), lambda i: a[i], name="out")
    return _Lowering(create_schedule(out), [a, out], "kernel")


def test_an_unrolled_iteration_adds_one_constant_to_the_sum_of_the_other_terms():
    low = _lowering()
    u, b, c = te.Var("u", te.INDEX_DTYPE), te.Var("b", te.INDEX_DTYPE), te.Var("c", te.INDEX_DTYPE)
    low.env[b] = low.emit("LOOP", te.INDEX_DTYPE, 1, (low.const(0), low.const(8)))
    low.env[c] = low.emit("LOOP", te.INDEX_DTYPE, 1, (low.const(0), low.const(8)))
    index = u * 28 + b + c * 3 + (-29)
    results = []
    for iteration in range(3):  # u is an unrolled loop's variable: a constant in each iteration
        low.env[u] = low.const(iteration)
        before = len(low.uops)
        results.append(low.ex(index))
        added = low.uops[before:]
        if iteration:  # the sum b + c * 3 is reused; one add of the iteration's constant
            assert [(uop.op, uop.arg) for uop in added if uop.op == "ALU"] == [("ALU", "add")]
    first = low.uops[results[0]]
    assert first.op == "ALU" and first.arg == "add" and low.uops[first.src[1]].arg == -29
    assert [low.uops[low.uops[r].src[1]].arg for r in results] == [-29, -1, 27]
    assert len({low.uops[r].src[0] for r in results}) == 1


@pytest.mark.parametrize("op", ["conv2d NHWC+bias+relu", "depthwise+bias+relu", "dense+bias+relu"])
def test_traces_lower_to_no_more_ops_and_compute_what_the_sum_in_order_computes(op):
    name, args = LAYER_OPS[op]
    dag = workload_registry.workload_dag(workload_registry.make_workload_key(name, args))
    space = TraceSpace(dag, cores=2)
    rng = np.random.default_rng(0)
    fewer = 0
    for _ in range(6):
        replay = replay_trace(dag, space.get(int(rng.integers(len(space)))))
        program = lower(replay.schedule, list(replay.args))
        in_order = _InOrder(replay.schedule, list(replay.args), "kernel").run()
        ops, ops_in_order = (sum(u.op != "CONST" for u in p.uops) for p in (program, in_order))  # instructions
        assert ops <= ops_in_order
        fewer += ops < ops_in_order
        data = np.random.default_rng(1)
        arrays = [data.uniform(-1, 1, spec.shape).astype(spec.dtype) for spec in program.args]
        outputs = []
        for lowered in (program, in_order):
            given = [np.zeros_like(a) if spec.is_output else a.copy() for a, spec in zip(arrays, program.args, strict=True)]
            build_program(lowered)(*given)
            outputs.append([g for g, spec in zip(given, program.args, strict=True) if spec.is_output])
        for got, want in zip(*outputs, strict=True):
            np.testing.assert_array_equal(got, want)
    assert fewer > 0
