"""MetaSchedule traces replayed on Lorien's engine.

A trace is ``[instructions, decisions]``; an instruction is ``[name, inputs, attrs, outputs]``
whose inputs and outputs are random variables: blocks (``b3``), loops (``l7``) and values
(``v12``); a decision ``[index, value]`` fixes what the sampling instruction at ``index``
drew. Each instruction becomes engine schedule steps on the workload's compute DAG
(:mod:`dialects.meta_schedule.workload`), one engine stage per block:

==================================== ==============================================================
GetSBlock / GetLoops / GetChildBlocks   the stage of a block name; a block's loops, outermost first, including the loops it shares with the block it is computed at; the blocks in nest order
SamplePerfectTile / SampleCategorical   the decision's tile sizes / ``candidates[decision]``
SampleComputeLocation                   ``decision`` indexes the loops around all consumers (-1 root, -2 inline); as in TVM a unit loop is no location (the nearest outer loop that is one is taken)
GetConsumers / GetProducers             the blocks that read / are read by a block (an inlined block stands for its own)
Split / Fuse / Reorder                  split (one factor may be None, or ``"None"`` as TVM writes it), fuse, reorder
Parallel / Vectorize / Unroll           loop kinds
Annotate (loop)                         ``pragma_auto_unroll_max_step`` unrolls as TVM's UnrollLoop (see :func:`lorien.engine.replay.auto_unroll`); other pragmas are hints
Annotate / Unannotate (block)           ``meta_schedule.*`` hints, realized by the postprocessing instructions that follow them (listed in the replay's notes)
ReverseComputeInline                    the consumer's stage takes the producer's loops and stands for its block (engine ``reverse_compute_inline``)
CacheWrite                              the block computes into a cache stage; the returned block copies it out
ReverseComputeAt                        the copy runs inside a loop of the computing block
ComputeAt / ComputeInline               compute_at (a block read by several is computed where they all run) / compute_inline
RFactor                                 the engine's rfactor; the new ``<block>_rf`` keeps the block's loops and loop variables
DecomposeReduction / EnterPostproc      nothing to do: the engine initializes reductions itself
==================================== ==============================================================

The engine attaches a producer inside its consumer's loops, so ``ReverseComputeAt(copy, l)``
is rebuilt the other way round: the copy stage is split like the computing stage's loops
down to ``l`` (one loop per dimension below), and the computing stage is computed at the
copy's ``l``; its own loops down to ``l`` are then unit loops, and the loops the two blocks
share in TVM are the copy's. A stage computed at such a shared loop is computed at the unit
loop that stands for it (the replay's ``notes`` say so). An instruction that cannot be
applied raises :class:`TraceError` naming its index, its name and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lorien.engine import te
from lorien.engine.dag import ComputeDAG
from lorien.engine.replay import Replay, auto_unroll
from lorien.engine.schedule import ScheduleError, Stage, leaf_extents
from lorien.errors import DialectError

ROOT_LOCATION, INLINE_LOCATION = -1, -2
UNROLL_PRAGMA = "pragma_auto_unroll_max_step"
#: Instructions that only record hints for TVM's own passes.
HINTS = {"EnterPostproc", "DecomposeReduction", "Unannotate"}


class TraceError(DialectError):
    """An instruction of a trace that cannot be applied to the workload's computation."""

    def __init__(self, index: int, name: str, reason: str):
        super().__init__(f"instruction {index} {name}: {reason}")
        self.index, self.name, self.reason = index, name, reason


@dataclass(frozen=True)
class Loop:
    """A loop random variable: a leaf of one stage."""

    stage: str
    leaf: str


class _Failure(Exception):
    """Raised inside a handler; the caller names the instruction."""


def parse_trace(value: Any) -> tuple[list[list[Any]], dict[int, Any]]:
    """(instructions, decisions by instruction index) of a trace's JSON value."""
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], list):
        raise DialectError(f"config is not a trace [instructions, decisions]: {str(value)[:120]!r}")
    decisions: dict[int, Any] = {}
    for item in value[1] or []:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int):
            raise DialectError(f"malformed trace decision {item!r}")
        decisions[item[0]] = item[1]
    return value[0], decisions


class TraceState:
    """The engine schedule of a DAG as a trace's instructions are applied one by one."""

    def __init__(self, dag: ComputeDAG):
        self.dag = dag
        self.schedule = dag.init_schedule()
        self.rvs: dict[str, Any] = {}
        self.block_names: dict[str, str] = {}
        self.aliases: dict[Loop, Loop] = {}
        self.unroll_pragmas: list[tuple[Loop, int]] = []
        self.notes: list[str] = []
        #: Decisions as TVM realizes them (SampleComputeLocation: a unit loop is no location).
        self.realized: dict[int, Any] = {}
        #: Instructions and annotations accepted as hints for TVM, without effect here.
        self.hints: list[str] = []
        #: The block iteration variables of a block made by RFactor, in TVM's order: ComputeAt
        #: gives a block one loop per variable in this order.
        self.var_order: dict[str, list[str]] = {}
        self.index = 0

    # ------------------------------------------------------------ random variables
    def value(self, name: Any) -> Any:
        if isinstance(name, str) and name in self.rvs:
            return self.rvs[name]
        if isinstance(name, str) and name[:1] in "blv" and name[1:].isdigit():
            raise _Failure(f"random variable {name!r} is not defined")
        return name

    def stage(self, name: Any) -> Stage:
        value = self.value(name)
        if not isinstance(value, str):
            raise _Failure(f"{name!r} is not a block")
        try:
            return self.schedule[value]
        except ScheduleError as exc:
            raise _Failure(str(exc)) from exc

    def resolve(self, loop: Loop) -> Loop:
        while loop in self.aliases:
            loop = self.aliases[loop]
        return loop

    def loop(self, name: Any) -> Loop:
        value = self.value(name)
        if not isinstance(value, Loop):
            raise _Failure(f"{name!r} is not a loop")
        loop = self.resolve(value)
        if loop.leaf not in self.schedule[loop.stage].leaf:
            raise _Failure(f"loop {name!r} ({loop.leaf} of {loop.stage}) no longer exists")
        return loop

    def bind(self, outputs: Sequence[str], values: Sequence[Any]) -> None:
        if len(outputs) != len(values):
            raise _Failure(f"gives {len(values)} results, the trace names {len(outputs)}")
        self.rvs.update(zip(outputs, values, strict=True))

    # ------------------------------------------------------------ the loop nest as TVM sees it
    def own_leaves(self, stage: Stage) -> list[str]:
        return [leaf for leaf in stage.leaf if Loop(stage.name, leaf) not in self.aliases]

    def loops_of(self, stage: Stage) -> list[Loop]:
        """The loops around a block: those of the block it is computed at, down to the
        attach point, then its own."""
        own = [Loop(stage.name, leaf) for leaf in self.own_leaves(stage)]
        if not isinstance(stage.attach, tuple):
            return own
        host = self.schedule[stage.attach[0]]
        outer = self.loops_of(host)
        point = self.resolve(Loop(host.name, stage.attach[1]))
        return outer[: outer.index(point) + 1] + own

    def blocks_in_order(self) -> list[str]:
        """Blocks in the order TVM lists a nest's children: stages computed inside a loop come
        before the block that loop belongs to."""
        order: list[str] = []

        def visit(stage: Stage) -> None:
            for leaf in stage.leaf:
                for child in self.schedule.stages:
                    if child.attach == (stage.name, leaf):
                        visit(child)
            order.append(stage.name)

        for stage in self.schedule.stages:
            if stage.attach is None:
                visit(stage)
        return order

    # ------------------------------------------------------------ applying
    def apply(self, index: int, inst: Sequence[Any], decision: Any) -> None:
        """Apply one instruction; TraceError names it and its index when it cannot be applied."""
        name = str(inst[0]) if isinstance(inst, (list, tuple)) and inst else "?"
        if not isinstance(inst, (list, tuple)) or len(inst) != 4:
            raise TraceError(index, name, f"an instruction is [name, inputs, attrs, outputs], got {str(inst)[:80]}")
        _, inputs, attrs, outputs = inst
        self.index = index
        if name in HINTS:
            self.rvs.update({out: None for out in outputs})
            self._hint(name)
            return
        handler = getattr(self, f"_{name}", None)
        if handler is None:
            raise TraceError(index, name, "is not supported on Lorien's engine")
        try:
            handler(list(inputs), list(attrs), list(outputs), decision)
        except _Failure as exc:
            raise TraceError(index, name, str(exc)) from exc
        except ScheduleError as exc:
            raise TraceError(index, name, str(exc)) from exc
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise TraceError(index, name, f"malformed instruction ({exc!r})") from exc

    def result(self) -> Replay:
        """The schedule, with the auto-unroll pragmas applied now that every loop is known."""
        for loop, max_step in self.unroll_pragmas:
            loop = self.resolve(loop)
            host = self.schedule[loop.stage]
            auto_unroll(host, loop.leaf, max_step)
            for stage in self.schedule.stages:
                if stage is not host and self._inside(stage, host, loop.leaf) and self.own_leaves(stage):
                    auto_unroll(stage, self.own_leaves(stage)[0], max_step)
        notes = self.notes + ([f"hints for TVM, no effect on the engine: {', '.join(self.hints)}"] if self.hints else [])
        return Replay(self.schedule, list(self.dag.io_tensors), [s.name for s in self.schedule.stages], notes)

    def _inside(self, stage: Stage, host: Stage, leaf: str) -> bool:
        while isinstance(stage.attach, tuple):
            parent = self.schedule[stage.attach[0]]
            if parent is host:
                return host.leaf.index(stage.attach[1]) >= host.leaf.index(leaf)
            stage = parent
        return False

    # ------------------------------------------------------------ instructions
    def _GetSBlock(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802 - TVM's names
        block = str(attrs[0])
        if block == "root":
            self.bind(outputs, ["root"])
            return
        name = self.block_names.get(block, block)
        if name not in {s.name for s in self.schedule.stages}:
            raise _Failure(f"the workload has no block {block!r} (blocks: {[s.name for s in self.schedule.stages]})")
        self.bind(outputs, [name])

    def _GetLoops(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        self.bind(outputs, self.loops_of(self.stage(inputs[0])))

    def _GetChildBlocks(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        if self.value(inputs[0]) != "root":
            raise _Failure("only the root block's children can be listed")
        self.bind(outputs, [name for name in self.blocks_in_order()
                            if self.schedule[name].attach != "inline"])

    def _SamplePerfectTile(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        loop = self.loop(inputs[0])
        if not isinstance(decision, list) or len(decision) != len(outputs):
            raise _Failure(f"decision {decision!r} is not {len(outputs)} tile sizes")
        extent = leaf_extents(self.schedule[loop.stage])[loop.leaf]
        if math.prod(decision) != extent:
            raise _Failure(f"tile sizes {decision} do not multiply to the loop's extent {extent}")
        self.bind(outputs, list(decision))

    def _SampleCategorical(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        candidates = attrs[0]
        if not isinstance(decision, int) or not 0 <= decision < len(candidates):
            raise _Failure(f"decision {decision!r} is not an index of the candidates {candidates}")
        self.bind(outputs, [candidates[decision]])

    def _SampleComputeLocation(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        stage = self.stage(inputs[0])
        if decision in (ROOT_LOCATION, INLINE_LOCATION):
            self.bind(outputs, [decision])
            return
        loops = self._locations(stage)
        if not isinstance(decision, int) or not 0 <= decision < len(loops):
            raise _Failure(f"decision {decision!r} is not an index of the {len(loops)} loops around the consumers "
                           f"of {stage.name!r}")
        valid = [i for i, loop in enumerate(loops) if leaf_extents(self.schedule[loop.stage])[loop.leaf] > 1]
        lower = [i for i in valid if i <= decision]
        self.realized[self.index] = lower[-1] if lower else ROOT_LOCATION
        self.bind(outputs, [loops[lower[-1]] if lower else ROOT_LOCATION])

    def _readers(self, name: str) -> list[Stage]:
        return [other for other in self.schedule.stages
                if any(isinstance(n, te.Load) and n.tensor.name == name for n in te.walk(other.op.body))]

    def _consumers(self, stage: Stage) -> list[Stage]:
        """The blocks that read ``stage``, as TVM sees them: an inlined reader stands for its own
        consumers."""
        found: list[Stage] = []
        for reader in self._readers(stage.name):
            for consumer in self._consumers(reader) if reader.attach == "inline" else [reader]:
                if consumer not in found:
                    found.append(consumer)
        return found

    def _producers(self, stage: Stage) -> list[Stage]:
        """The computed blocks ``stage`` reads (an inlined one stands for its own producers)."""
        found: list[Stage] = []
        for tensor in stage.op.input_tensors():
            if not isinstance(tensor.op, te.ComputeOp) or tensor.name not in {s.name for s in self.schedule.stages}:
                continue
            producer = self.schedule[tensor.name]
            for block in self._producers(producer) if producer.attach == "inline" else [producer]:
                if block not in found:
                    found.append(block)
        return found

    def _GetConsumers(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        self.bind(outputs, [c.name for c in self._consumers(self.stage(inputs[0]))])

    def _GetProducers(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        self.bind(outputs, [p.name for p in self._producers(self.stage(inputs[0]))])

    def _RFactor(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        """The reduction of the loop's block is factored: a new block ``<block>_rf`` keeps the
        block's loops (the given one becomes spatial, its dimension at ``factor_axis``), and the
        block reduces the partial results over new loops."""
        loop = self.loop(inputs[0])
        stage = self.schedule[loop.stage]
        order = list(stage.leaf)
        rf = self.schedule[self.schedule.rfactor(stage.tensor, loop.leaf, int(attrs[0])).name]
        rf.reorder(*order)
        self.var_order[rf.name] = [loop.leaf] + [iv.name for iv in rf.op.axis if iv.name != loop.leaf] + \
            [iv.name for iv in rf.op.reduce_axis]
        self.var_order[stage.name] = [iv.name for iv in stage.op.reduce_axis] + [iv.name for iv in stage.op.axis]
        for rv, value in self.rvs.items():
            if isinstance(value, Loop) and value.stage == stage.name:
                self.rvs[rv] = Loop(rf.name, value.leaf)
        for key, target in list(self.aliases.items()):
            if target.stage == stage.name:
                self.aliases[key] = Loop(rf.name, target.leaf)
        self.block_names[f"{self._tvm_name(stage.name)}_rf"] = rf.name
        self.bind(outputs, [rf.name])

    def _tvm_name(self, name: str) -> str:
        """The block name TVM gives to an engine stage."""
        return next((tvm for tvm, ours in self.block_names.items() if ours == name), name)

    def _locations(self, stage: Stage) -> list[Loop]:
        """The loops a block can be computed at: those around all its consumers, outermost first."""
        consumers = self._consumers(stage)
        if not consumers:
            raise _Failure(f"block {stage.name!r} has no consumer to be computed at")
        common = self.loops_of(consumers[0])
        for consumer in consumers[1:]:
            theirs = self.loops_of(consumer)
            shared = 0
            while shared < min(len(common), len(theirs)) and common[shared] == theirs[shared]:
                shared += 1
            common = common[:shared]
        return common

    def _Split(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        loop = self.loop(inputs[0])
        stage = self.schedule[loop.stage]
        factors = [None if v in (None, "None") else self.value(v) for v in inputs[1:]]
        extent = leaf_extents(stage)[loop.leaf]
        if factors.count(None) > 1 or any(f is not None and (not isinstance(f, int) or f < 1) for f in factors):
            raise _Failure(f"split factors {factors} are not positive integers with at most one None")
        if None in factors:
            known = math.prod(f for f in factors if f is not None)
            factors[factors.index(None)] = -(-extent // known)
        current, inners = loop.leaf, []
        for factor in reversed(factors[1:]):
            outer, inner = stage.split(current, factor=factor)
            current = outer.name
            inners.append(inner.name)
        self.bind(outputs, [Loop(stage.name, leaf) for leaf in [current, *reversed(inners)]])

    def _Fuse(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        loops = [self.loop(v) for v in inputs]
        stages = {loop.stage for loop in loops}
        if len(stages) != 1:
            raise _Failure(f"fuses loops of different stages {sorted(stages)}")
        if len(loops) == 1:
            self.bind(outputs, loops)
            return
        stage = self.schedule[loops[0].stage]
        fused = stage.fuse(*[loop.leaf for loop in loops]).name
        old = {loop.leaf for loop in loops}
        for key, target in list(self.aliases.items()):
            if target.stage == stage.name and target.leaf in old:
                self.aliases[key] = Loop(stage.name, fused)
        self.bind(outputs, [Loop(stage.name, fused)])

    def _Reorder(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        loops = [self.loop(v) for v in inputs]
        stages = {loop.stage for loop in loops}
        if len(stages) != 1:
            raise _Failure(f"reorders loops of different stages {sorted(stages)}")
        self.schedule[loops[0].stage].reorder(*[loop.leaf for loop in loops])

    def _annotate_loop(self, name: str, kind: str) -> None:
        loop = self.loop(name)
        self.schedule.apply({"kind": "annotate", "stage": loop.stage, "axis": loop.leaf, "ann": kind})

    def _Parallel(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        self._annotate_loop(inputs[0], "parallel")

    def _Vectorize(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        self._annotate_loop(inputs[0], "vectorized")

    def _Unroll(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        self._annotate_loop(inputs[0], "unrolled")

    def _Annotate(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        target = self.value(inputs[0])
        if isinstance(target, Loop) and attrs[0] == UNROLL_PRAGMA:
            max_step = self.value(inputs[1])
            if not isinstance(max_step, int):
                raise _Failure(f"{UNROLL_PRAGMA} value {max_step!r} is not an integer")
            self.unroll_pragmas.append((self.loop(inputs[0]), max_step))
            return
        self._hint(str(attrs[0]))

    def _hint(self, what: str) -> None:
        """Record an instruction or annotation that only informs TVM's own passes."""
        if what not in self.hints:
            self.hints.append(what)

    def _CacheWrite(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        stage = self.stage(inputs[0])
        scope = str(attrs[1]) if len(attrs) > 1 else "global"
        if isinstance(stage.attach, tuple) or any(isinstance(s.attach, tuple) and s.attach[0] == stage.name
                                                  for s in self.schedule.stages):
            raise _Failure(f"block {stage.name!r} is already part of a compute_at nest")
        original = stage.name
        old_steps = list(self.schedule.steps)
        schedule = self.dag.init_schedule()
        cache = schedule.cache_write(schedule.tensors[original], scope)
        for step in old_steps:
            schedule.apply({**step, "stage": cache.name if step["stage"] == original else step["stage"],
                            **({"target": cache.name} if step.get("target") == original else {})})
        self.schedule = schedule
        for rv, value in self.rvs.items():
            if value == original:
                self.rvs[rv] = cache.name
            elif isinstance(value, Loop) and value.stage == original:
                self.rvs[rv] = Loop(cache.name, value.leaf)
        self.block_names[original] = cache.name
        self.block_names[f"{original}_{scope}"] = original
        self.bind(outputs, [original])

    def _ReverseComputeAt(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        copy, point = self.stage(inputs[0]), self.loop(inputs[1])
        producer = self.schedule[point.stage]
        if isinstance(producer.attach, tuple) or copy.relations:
            raise _Failure(f"block {producer.name!r} must be at the root and {copy.name!r} untouched")
        shared = producer.leaf[: producer.leaf.index(point.leaf) + 1]
        if any(producer.axes[leaf].kind != "spatial" for leaf in shared):
            raise _Failure(f"loop {point.leaf!r} of {producer.name!r} is inside a reduction loop")
        extents = leaf_extents(producer)
        mirror: dict[str, str] = {}
        own: list[str] = []
        if [iv.extent for iv in copy.op.axis] != [iv.extent for iv in producer.op.axis]:
            raise _Failure(f"block {copy.name!r} does not have the spatial loops of {producer.name!r}")
        for axis, copy_axis in zip(producer.op.axis, copy.op.axis, strict=True):
            pieces = _pieces(producer, axis.name)
            if pieces is None:
                raise _Failure(f"axis {axis.name!r} of {producer.name!r} was fused; only split loops can be shared")
            outer = [p for p in pieces if p in shared]
            if pieces[: len(outer)] != outer:
                raise _Failure(f"the shared loops of axis {axis.name!r} are not its outermost pieces")
            inner_extent = math.prod(extents[p] for p in pieces[len(outer):])
            current = own_leaf = copy_axis.name
            if outer:
                head, tail = copy.split(current, factor=inner_extent)
                current, own_leaf = head.name, tail.name
            made = []
            for piece in reversed(outer[1:]):
                head, tail = copy.split(current, factor=extents[piece])
                current = head.name
                made.append(tail.name)
            for piece, leaf in zip(outer, [current, *reversed(made)] if outer else [], strict=True):
                mirror[piece] = leaf
            own.append(own_leaf)
        copy.reorder(*[mirror[leaf] for leaf in shared], *own)
        producer.compute_at(copy, mirror[point.leaf])
        for leaf in shared:
            self.aliases[Loop(producer.name, leaf)] = Loop(copy.name, mirror[leaf])

    def _ComputeAt(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        stage = self.stage(inputs[0])
        location = self.value(inputs[1])
        if location == ROOT_LOCATION:
            return
        if location == INLINE_LOCATION:
            stage.compute_inline()
            return
        point = self.loop(inputs[1])
        if point not in self._locations(stage):
            raise _Failure(f"loop {point.leaf!r} of {point.stage!r} is not around every consumer of {stage.name!r}")
        consumers = self._consumers(stage)
        stand_in = [key for key, target in self.aliases.items()
                    if len(consumers) == 1 and key.stage == consumers[0].name and self.resolve(key) == point]
        if stand_in:
            self.notes.append(f"{stage.name} is computed at the unit loop {stand_in[0].leaf} of {consumers[0].name}, "
                              f"which stands for {point.leaf} of {point.stage}")
            point = stand_in[0]
        if stage.name in self.var_order and not stage.relations:
            stage.reorder(*self.var_order[stage.name])
        stage.compute_at(self.schedule[point.stage], point.leaf)

    def _ComputeInline(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        self.stage(inputs[0]).compute_inline()

    def _ReverseComputeInline(self, inputs, attrs, outputs, decision) -> None:  # noqa: N802
        """TVM keeps the producer's block, now writing the consumer's buffer; here the consumer's
        stage takes the producer's loops and stands for its block."""
        consumer = self.stage(inputs[0])
        producers = self._producers(consumer)
        consumer.reverse_compute_inline()
        producer = producers[0].name
        for rv, value in self.rvs.items():
            if value == producer:
                self.rvs[rv] = consumer.name
            elif isinstance(value, Loop) and value.stage == producer:
                self.rvs[rv] = Loop(consumer.name, value.leaf)
        for key, target in list(self.aliases.items()):
            if target.stage == producer:
                self.aliases[key] = Loop(consumer.name, target.leaf)
        self.block_names[self._tvm_name(producer)] = consumer.name
        self.var_order.pop(producer, None)


def _pieces(stage: Stage, axis: str) -> list[str] | None:
    """The leaves split from root ``axis``, outermost first; None when a fuse touched it."""
    order = [axis]
    for rel in stage.relations:
        if rel[0] == "fuse" and (rel[1] in order or rel[2] in order):
            return None
        if rel[0] == "split" and rel[1] in order:
            position = order.index(rel[1])
            order[position: position + 1] = [rel[2], rel[3]]
    return order


def replay_trace(dag: ComputeDAG, trace: Any) -> Replay:
    """The engine schedule that a trace (``[instructions, decisions]``) describes on ``dag``."""
    instructions, decisions = parse_trace(trace)
    state = TraceState(dag)
    for index, inst in enumerate(instructions):
        state.apply(index, inst, decisions.get(index))
    return state.result()
