"""Ansor's transform steps replayed on Lorien's engine.

A record's config is a list of steps in Ansor's vocabulary. Stage ids index the compute
DAG's ops in Ansor's order, inputs included (:func:`lorien.engine.dag.ansor_order`);
iterator ids index the stage's current loops, outermost first. Each step becomes engine
schedule steps:

==== ============================================ ==========================================
SP   ``[SP, stage, iter, extent, lengths, inner_to_outer]``  successive splits (by factor from the inside, or by nparts)
FSP  ``[FSP, stage, iter, src_step, n_split]``      a split with the lengths of step ``src_step`` (the last ones multiplied)
FFSP ``[FFSP, stage, iter, src_steps, level, factor_or_nparts]``  one split by the product of the ``level``-th lengths
RE   ``[RE, stage, order]``                           reorder (all loops)
FU   ``[FU, stage, iters]``                           fuse adjacent loops
AN   ``[AN, stage, iter, code]``                      0 none, 1 unroll, 2 vectorize, 3 parallel; 4-10 GPU bindings
PR   ``[PR, stage, iter, pragma]``                    ``auto_unroll_max_step$N`` (see :func:`lorien.engine.replay.auto_unroll`)
CA   ``[CA, stage, target_stage, target_iter]``       compute_at
CI / CR ``[CI, stage]``                               compute_inline / compute_root
CHR  ``[CHR, stage, scope, readers]``                 cache_read: a stage after ``stage``
CHW  ``[CHW, stage, scope]``                          cache_write: a stage before ``stage``
RF   ``[RF, stage, iter, factor_iter]``               rfactor: a stage before ``stage``
SA   ``[SA, stage, iter, factor, offset]``            storage_align (no effect on the CPU)
==== ============================================ ==========================================

GPU bindings of CUDA records run on the CPU: ``blockIdx.*`` loops become parallel loops,
``vthread`` and ``threadIdx.*`` loops serial ones (the replay's ``notes`` say so). A step that
cannot be applied raises :class:`StepError` naming the step, its index and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lorien.engine.dag import ComputeDAG
from lorien.engine.replay import Replay, auto_unroll
from lorien.engine.schedule import ScheduleError, Stage
from lorien.errors import DialectError

#: Ansor's annotation codes (TVM's ``IteratorAnnotation``) and the engine loop kind of each on the CPU.
ANNOTATION_NAMES = {0: "none", 1: "unroll", 2: "vectorize", 3: "parallel", 4: "vthread", 5: "blockIdx.x",
                    6: "threadIdx.x", 7: "blockIdx.y", 8: "threadIdx.y", 9: "blockIdx.z", 10: "threadIdx.z",
                    11: "tensorize"}
CPU_LOOP_KINDS = {1: "unrolled", 2: "vectorized", 3: "parallel", 4: "serial", 5: "parallel", 6: "serial",
                  7: "parallel", 8: "serial", 9: "parallel", 10: "serial"}
GPU_CODES = range(4, 11)
AUTO_UNROLL = "auto_unroll_max_step"


class StepError(DialectError):
    """A step of a record that cannot be applied to the workload's computation."""

    def __init__(self, index: int, step: Sequence[Any], reason: str):
        super().__init__(f"step {index} {list(step)}: {reason}")
        self.index, self.step, self.reason = index, list(step), reason


def split_lengths(steps: Sequence[Sequence[Any]], index: int) -> tuple[list[int | None], bool]:
    """(lengths, inner_to_outer) of the split made by step ``index`` (SP, FSP or FFSP)."""
    step = steps[index]
    kind = step[0]
    if kind == "SP":
        return list(step[4]), bool(step[5])
    if kind == "FSP":
        src = _split_step(steps, step[3], index)
        n_split = int(step[4])
        lengths = list(src[4])
        if not 1 <= n_split <= len(lengths) + 1:
            raise StepError(index, step, f"n_split {n_split} does not fit the {len(lengths)} lengths of step {step[3]}")
        tail = lengths[n_split - 1:]
        last = None if any(v is None for v in tail) else math.prod(tail)
        return lengths[:n_split - 1] + [last], True
    if kind == "FFSP":
        level = int(step[4])
        product: int | None = 1
        for src_index in step[3]:
            src = _split_step(steps, src_index, index)
            if not 0 <= level < len(src[4]):
                raise StepError(index, step, f"level {level} is not a level of step {src_index}")
            value = src[4][level]
            product = None if value is None or product is None else product * value
        return [product], bool(step[5])
    raise StepError(index, step, "is not a split step")


def _split_step(steps: Sequence[Sequence[Any]], src_index: Any, index: int) -> Sequence[Any]:
    if not isinstance(src_index, int) or not 0 <= src_index < index or steps[src_index][0] != "SP":
        raise StepError(index, steps[index], f"step {src_index} is not an earlier SP step to follow")
    return steps[src_index]


class LoopState:
    """The engine schedule of a DAG as Ansor steps are applied one by one.

    ``names`` are the current stages in Ansor's order (stages added by CHR, CHW and RF
    included); ``steps`` the steps applied so far (FSP and FFSP look back into them).
    """

    def __init__(self, dag: ComputeDAG):
        self.dag = dag
        self.schedule = dag.init_schedule()
        self.names = list(dag.stage_names)
        self.steps: list[list[Any]] = []
        self.gpu: set[str] = set()
        self.unroll_pragmas: list[tuple[str, str, int]] = []

    def fail(self, reason: str) -> StepError:
        return StepError(len(self.steps) - 1, self.steps[-1], reason)

    def stage(self, stage_id: Any) -> Stage:
        if not isinstance(stage_id, int) or not 0 <= stage_id < len(self.names):
            raise self.fail(f"stage {stage_id} is not one of the {len(self.names)} stages {self.names}")
        name = self.names[stage_id]
        if name not in {st.name for st in self.schedule.stages}:
            raise self.fail(f"stage {stage_id} ({name!r}) is an input, not a computation")
        return self.schedule[name]

    def stage_id(self, name: str) -> int:
        return self.names.index(name)

    def loop(self, stage: Stage, iter_id: Any) -> str:
        if not isinstance(iter_id, int) or not 0 <= iter_id < len(stage.leaf):
            raise self.fail(f"iterator {iter_id} is not one of the {len(stage.leaf)} loops of stage {stage.name!r}")
        return stage.leaf[iter_id]

    def apply(self, step: Sequence[Any]) -> None:
        """Apply one step; StepError names it and its index when it cannot be applied."""
        self.steps.append(list(step))
        handler = getattr(self, f"_{step[0]}", None) if step else None
        if handler is None:
            raise self.fail(f"unknown step kind {step[0] if step else None!r}")
        try:
            handler(*step[1:])
        except ScheduleError as exc:
            raise self.fail(str(exc)) from exc
        except (TypeError, ValueError, IndexError) as exc:
            raise self.fail(f"malformed step ({exc})") from exc

    def result(self, layout_rewrite: bool = False) -> Replay:
        """The schedule, with the auto-unroll pragmas applied now that every loop is known;
        with ``layout_rewrite``, weights laid out as the loops read them (:mod:`.layout`)."""
        for name, axis, max_step in self.unroll_pragmas:
            auto_unroll(self.schedule[name], axis, max_step)
        self.unroll_pragmas = []
        notes = []
        if self.gpu:
            notes.append("GPU bindings run as CPU loops: " + ", ".join(
                f"{name} -> {'parallel' if name.startswith('blockIdx') else 'serial'}" for name in sorted(self.gpu)))
        args = list(self.dag.io_tensors)
        if layout_rewrite:
            from dialects.auto_scheduler.layout import rewrite_layouts

            args = rewrite_layouts(self.schedule, args, self.dag)
        replay = Replay(self.schedule, args, list(self.names), notes)
        if replay.packed:
            replay.notes.append(f"layout rewritten (weights packed before the kernel runs): {', '.join(replay.packed)}")
        return replay

    # ------------------------------------------------------------ steps on one stage
    def _split(self, stage: Stage, axis: str, lengths: list[int | None], inner_to_outer: bool) -> None:
        if any(not isinstance(v, int) or v < 1 for v in lengths):
            raise self.fail(f"split lengths {lengths} are not all positive integers (an unfilled sketch?)")
        current = axis
        if inner_to_outer:
            for length in reversed(lengths):
                current = stage.split(current, factor=length)[0].name
        else:
            for length in lengths:
                current = stage.split(current, nparts=length)[1].name

    def _SP(self, stage_id, iter_id, extent, lengths, inner_to_outer) -> None:  # noqa: N802 - Ansor's tags
        stage = self.stage(stage_id)
        axis = self.loop(stage, iter_id)
        root = stage.axes[axis]
        if extent is not None and root.extent is not None and stage.attach is None and extent != root.extent:
            raise self.fail(f"loop {axis!r} of stage {stage.name!r} has extent {root.extent}, the record says "
                            f"{extent}: the record was made for another computation")
        self._split(stage, axis, *split_lengths(self.steps, len(self.steps) - 1))

    def _FSP(self, stage_id, iter_id, src_step, n_split) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        self._split(stage, self.loop(stage, iter_id), *split_lengths(self.steps, len(self.steps) - 1))

    def _FFSP(self, stage_id, iter_id, src_steps, level, factor_or_nparts) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        self._split(stage, self.loop(stage, iter_id), *split_lengths(self.steps, len(self.steps) - 1))

    def _RE(self, stage_id, order) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        if sorted(order) != list(range(len(stage.leaf))):
            raise self.fail(f"reorder {order} is not a permutation of the {len(stage.leaf)} loops of {stage.name!r}")
        stage.reorder(*[stage.leaf[i] for i in order])

    def _FU(self, stage_id, iter_ids) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        names = [self.loop(stage, i) for i in iter_ids]
        if len(names) > 1:
            stage.fuse(*names)

    def _AN(self, stage_id, iter_id, code) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        axis = self.loop(stage, iter_id)
        if code == 0:
            return
        if code not in CPU_LOOP_KINDS:
            raise self.fail(f"annotation {code} ({ANNOTATION_NAMES.get(code, 'unknown')}) has no CPU equivalent")
        if code in GPU_CODES:
            self.gpu.add(ANNOTATION_NAMES[code])
        kind = CPU_LOOP_KINDS[code]
        if kind != "serial":
            self.schedule.apply({"kind": "annotate", "stage": stage.name, "axis": axis, "ann": kind})

    def _PR(self, stage_id, iter_id, pragma) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        axis = self.loop(stage, iter_id)
        name, _, value = str(pragma).partition("$")
        if name != AUTO_UNROLL or not value.isdigit():
            raise self.fail(f"pragma {pragma!r} is not supported (only {AUTO_UNROLL}$N)")
        self.unroll_pragmas.append((stage.name, axis, int(value)))

    def _SA(self, stage_id, iter_id, factor, offset) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        stage.storage_align(self.loop(stage, iter_id), factor, offset)

    # ------------------------------------------------------------ steps on several stages
    def _CA(self, stage_id, target_stage_id, target_iter_id) -> None:  # noqa: N802
        stage, target = self.stage(stage_id), self.stage(target_stage_id)
        stage.compute_at(target, self.loop(target, target_iter_id))

    def _CI(self, stage_id) -> None:  # noqa: N802
        self.stage(stage_id).compute_inline()

    def _CR(self, stage_id) -> None:  # noqa: N802
        self.stage(stage_id).compute_root()

    def _CHR(self, stage_id, scope, reader_ids) -> None:  # noqa: N802
        if not isinstance(stage_id, int) or not 0 <= stage_id < len(self.names):
            raise self.fail(f"stage {stage_id} is not one of the {len(self.names)} stages")
        readers = [self.stage(r).name for r in reader_ids]
        cache = self.schedule.cache_read(self.schedule.tensors[self.names[stage_id]], str(scope), readers)
        self.names.insert(stage_id + 1, cache.name)

    def _CHW(self, stage_id, scope) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        cache = self.schedule.cache_write(stage.tensor, str(scope))
        self.names.insert(stage_id, cache.name)

    def _RF(self, stage_id, iter_id, factor_iter_id) -> None:  # noqa: N802
        stage = self.stage(stage_id)
        rf = self.schedule.rfactor(stage.tensor, self.loop(stage, iter_id), factor_iter_id)
        self.names.insert(stage_id, rf.name)


def replay_steps(dag: ComputeDAG, steps: Sequence[Sequence[Any]], layout_rewrite: bool = False) -> Replay:
    """The engine schedule that a record's steps describe on ``dag``; ``layout_rewrite``: the
    weights in the layout the loops read them (TVM's ``REWRITE_FOR_PRE_TRANSFORMED``)."""
    state = LoopState(dag)
    for step in steps:
        state.apply(step)
    return state.result(layout_rewrite)
