"""Sketches: schedule structures generated from the compute DAG by Ansor's CPU rules, and
the annotations that make a sketch a complete program.

Stages are visited from the last to the first (outputs first). For each compute stage:

* an input, or a stage already inlined or computed at another: skipped;
* **inline**: an element-wise stage that is not an output and has no expensive op
  (``exp``, ``sqrt``) and no branch is inlined into its readers (bias adds, activations);
* **compute location**: an element-wise stage with a branch (padding: a select in every
  element) is left for the completion to place (Ansor's random compute location):
  inlined into its reader, at the root, or computed at the end of its tiled reader's
  ``S0``, ``S1`` or ``R0`` level (:data:`LOCATIONS`);
* **multi-level tiling**: a reduction with data reuse (an input that misses a spatial loop)
  is tiled ``SSRSRS``: each spatial loop split in four, each reduce loop in two, ordered
  ``S0 S1 R0 S2 R1 S3`` (split lengths are left open);
  - **fusion**: when its only reader is an element-wise stage of the same shape reading it
    element by element (an epilogue), the reader follows the tiling (FSP) to level 1 or 2
    and the tiled stage is computed at that level: two sketches;
  - **cache write**: otherwise a local cache stage takes the computation (CHW) and is fused
    into the original stage as above; a third sketch tiles without it.

A sketch is completed (:func:`render`) by filling the split lengths, placing the stages
whose compute location is open, and annotating:
the outer spatial loops of every root stage are fused and parallelized, as many as it takes
for the parallel loop to reach :data:`PARALLEL_CHUNKS` (a knob) chunks per core, or every
outer spatial loop up to the first one other stages are computed at (Ansor's rule),
the innermost loop of every stage is vectorized when it is spatial and at most
:data:`MAX_VECTOR_LANES` long, and each tiled stage gets the ``auto_unroll_max_step`` pragma
(a knob over :data:`AUTO_UNROLL_STEPS`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dialects.auto_scheduler.steps import AUTO_UNROLL, LoopState
from lorien.engine import te
from lorien.engine.dag import ComputeDAG, loads_in_order, needs_multi_level_tiling
from lorien.engine.schedule import Stage, leaf_extents

#: Spatial levels and reduce levels of CPU multi-level tiling (``SSRSRS``).
SPATIAL_LEVELS, REDUCE_LEVELS = 4, 2
#: Fusion levels a fused consumer follows the tiling to.
FUSION_LEVELS = (1, 2)
AUTO_UNROLL_STEPS = (0, 16, 64, 512)
#: Iterations per core the fused parallel loop should reach (infinite: fuse every outer loop).
PARALLEL_CHUNKS = (1, 4, 16, math.inf)
MAX_VECTOR_LANES = 64
#: The rfactor (GEMV) sketch is added for reductions with at most this many output rows
#: besides the last axis, over at least GEMV_MIN_REDUCE elements.
GEMV_MAX_ROWS = 4
GEMV_MIN_REDUCE = 16
#: Where a stage of open compute location goes: inlined, at the root, or computed at the end
#: of a tiling level of its reader (S0, S1 or R0 of ``SSRSRS``).
LOCATIONS = ("inline", "root", "S0", "S1", "R0")
_EXPENSIVE_CALLS = ("exp", "sqrt")


@dataclass
class Sketch:
    """Steps with open split lengths (``None``), the tiling split steps, the tiled stages."""

    steps: list[list[Any]]
    description: str
    tile_steps: list[int] = field(default_factory=list)
    tiled_stages: list[str] = field(default_factory=list)
    #: Stages (by id) whose compute location the completion chooses (see :data:`LOCATIONS`).
    located: list[int] = field(default_factory=list)
    #: Tiling split steps whose inner length becomes a vectorized loop (the rfactor sketch's
    #: reduction split), beside the last spatial split of a tiled stage.
    vector_splits: list[int] = field(default_factory=list)


def _filled(steps: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """Steps with every open split length set to 1 (to read the loop structure)."""
    return [[*step[:4], [1 if v is None else v for v in step[4]], *step[5:]] if step[0] == "SP" else list(step)
            for step in steps]


def sketch_state(dag: ComputeDAG, steps: Sequence[Sequence[Any]]) -> LoopState:
    """The loop state after a sketch's steps (open split lengths read as 1)."""
    state = LoopState(dag)
    for step in _filled(steps):
        state.apply(step)
    return state


def _readers(state: LoopState, name: str) -> list[Stage]:
    return [st for st in state.schedule.stages
            if st.attach != "inline" and any(ld.tensor.name == name for ld in loads_in_order(_body(state, st)))]


def _body(state: LoopState, stage: Stage) -> te.Expr:
    """A stage's body with inlined producers substituted (what lowering will compute)."""
    def load_fn(load: te.Load, indices: tuple) -> te.Expr:
        producer = next((st for st in state.schedule.stages if st.name == load.tensor.name), None)
        if producer is not None and producer.attach == "inline":
            return te.substitute(_body(state, producer), dict(zip(producer.op.axis, indices, strict=True)))
        return te.Load(load.tensor, indices)

    return te.substitute(stage.op.body, {}, load_fn)


def _is_output(state: LoopState, stage: Stage) -> bool:
    return any(stage.tensor is out for out in state.schedule.outputs)


def _inlinable(state: LoopState, stage: Stage) -> bool:
    """An element-wise stage that is not an output and computes nothing expensive."""
    return (not stage.op.reduce_axis and not _is_output(state, stage)
            and not any(isinstance(n, te.Call) and n.fn in _EXPENSIVE_CALLS for n in te.walk(stage.op.body)))


def _has_branch(stage: Stage) -> bool:
    """A stage whose every element takes a select (padding): where it is computed matters."""
    return any(isinstance(n, te.Select) for n in te.walk(stage.op.body))


def _matched_consumer(state: LoopState, stage: Stage) -> Stage | None:
    """The only reader of ``stage`` when it is element-wise, of the same shape, and reads
    ``stage`` at its own loop indices (an epilogue that can follow the tiling)."""
    readers = _readers(state, stage.name)
    if len(readers) != 1:
        return None
    consumer = readers[0]
    if consumer.op.reduce_axis or consumer.tensor.shape != stage.tensor.shape or consumer.relations:
        return None
    loads = [ld for ld in loads_in_order(_body(state, consumer)) if ld.tensor.name == stage.name]
    identity = all(len(ld.indices) == len(consumer.op.axis)
                   and all(index is axis for index, axis in zip(ld.indices, consumer.op.axis, strict=True))
                   for ld in loads)
    return consumer if loads and identity else None


def _tile(state: LoopState, stage_id: int) -> tuple[list[list[Any]], list[int], list[int]]:
    """SSRSRS steps of one stage: (steps, spatial split step offsets, all split step offsets)."""
    stage = state.stage(stage_id)
    steps: list[list[Any]] = []
    spatial, position = [], 0
    for iv in stage.op.axis:
        spatial.append(len(steps))
        steps.append(["SP", stage_id, position, iv.extent, [None] * (SPATIAL_LEVELS - 1), 1])
        position += SPATIAL_LEVELS
    splits = list(spatial)
    for iv in stage.op.reduce_axis:
        splits.append(len(steps))
        steps.append(["SP", stage_id, position, iv.extent, [None] * (REDUCE_LEVELS - 1), 1])
        position += REDUCE_LEVELS
    n, base = len(stage.op.axis), SPATIAL_LEVELS * len(stage.op.axis)
    s_level = [[SPATIAL_LEVELS * d + level for d in range(n)] for level in range(SPATIAL_LEVELS)]
    r_level = [[base + REDUCE_LEVELS * e + level for e in range(len(stage.op.reduce_axis))]
               for level in range(REDUCE_LEVELS)]
    order = s_level[0] + s_level[1] + r_level[0] + s_level[2] + r_level[1] + s_level[3]
    steps.append(["RE", stage_id, order])
    return steps, spatial, splits


def _follow(consumer_id: int, split_steps: list[int], level: int, n_spatial: int) -> list[list[Any]]:
    """FSP steps tiling a consumer like its producer down to ``level``, and its reorder."""
    steps: list[list[Any]] = [["FSP", consumer_id, d * (level + 1), src, level] for d, src in enumerate(split_steps)]
    order = [d * (level + 1) + lv for lv in range(level + 1) for d in range(n_spatial)]
    steps.append(["RE", consumer_id, order])
    return steps


def generate_sketches(dag: ComputeDAG) -> list[Sketch]:
    """Every sketch of a DAG by the CPU rules (see the module docstring)."""
    done: list[Sketch] = []
    frontier = [(Sketch([], "", [], []), len(dag.stage_names) - 1)]
    while frontier:
        sketch, index = frontier.pop()
        if index < 0:
            sketch.description = sketch.description.strip("; ") or "as defined"
            done.append(sketch)
            continue
        state = sketch_state(dag, sketch.steps)
        name = state.names[index]
        if name not in {st.name for st in state.schedule.stages}:
            frontier.append((sketch, index - 1))
            continue
        stage = state.schedule[name]
        if stage.attach is not None:
            frontier.append((sketch, index - 1))
        elif _inlinable(state, stage) and _has_branch(stage):
            frontier.append((_extend(sketch, [], f"place {name}", located=[index]), index - 1))
        elif _inlinable(state, stage):
            frontier.append((_extend(sketch, [["CI", index]], f"inline {name}"), index - 1))
        elif needs_multi_level_tiling(stage.op):
            if _gemv_like(stage) and not stage.name.endswith(".local"):  # not again on its cache-write copy
                frontier.append((_rfactor_sketch(state, sketch, index), index - 1))
            frontier.extend(reversed(_tiling_sketches(state, sketch, index)))
        else:
            frontier.append((sketch, index - 1))
    return done


def _extend(sketch: Sketch, steps: list[list[Any]], what: str, tile_steps: Sequence[int] = (),
            tiled: Sequence[str] = (), located: Sequence[int] = (), vector_splits: Sequence[int] = ()) -> Sketch:
    return Sketch(sketch.steps + steps, f"{sketch.description}; {what}",
                  sketch.tile_steps + list(tile_steps), sketch.tiled_stages + list(tiled),
                  sketch.located + list(located), sketch.vector_splits + list(vector_splits))


def _gemv_like(stage: Stage) -> bool:
    """A reduction over one axis of at least :data:`GEMV_MIN_REDUCE` whose output has at most
    :data:`GEMV_MAX_ROWS` rows besides its last axis (dense or batch_matmul at M = 1..4): little
    to reuse across rows, so the reduction itself is what vectorizes."""
    if len(stage.op.reduce_axis) != 1 or stage.op.reduce_axis[0].extent < GEMV_MIN_REDUCE or not stage.op.axis:
        return False
    return math.prod(iv.extent for iv in stage.op.axis[:-1]) <= GEMV_MAX_ROWS


def _rfactor_sketch(state: LoopState, sketch: Sketch, index: int) -> Sketch:
    """The GEMV sketch (Ansor's rfactor rule, for vectorization): the reduction split ``ko x
    ki`` and factored on ``ki`` (RF), so a stage ``<name>.rf`` accumulates ``ki`` lanes over
    ``ko``; the stage itself (one horizontal sum of ``ki`` per output) is split on its last
    axis, ``rf`` computed at the outer part (a block of outputs at once, all rows), whose loop
    is the parallel one; the rows and outputs around the vector of lanes are unrolled (the
    accumulators stay in registers), and so are the sums of the lanes. Split lengths open:
    ``ki`` (vectorized) and the block of outputs."""
    stage = state.schedule[state.names[index]]
    n_spatial = len(stage.op.axis)
    offset = len(sketch.steps)
    reduce_iter = n_spatial
    last = n_spatial - 1
    steps: list[list[Any]] = [
        ["SP", index, reduce_iter, stage.op.reduce_axis[0].extent, [None], 1],   # k -> ko, ki
        ["RF", index, reduce_iter + 1, n_spatial],                                # rf: [..spatial, ki] over ko
        # the stage is now index + 1: spatial axes, then ki.v (reduce); split the last spatial axis
        ["SP", index + 1, last, stage.op.axis[-1].extent, [None], 1],
        ["RE", index + 1, [last, *range(last), last + 1, last + 2]],                # block, rows, inner, ki.v
        ["CA", index, index + 1, 0],
        ["RE", index, [n_spatial + 1, *range(n_spatial + 1)]],                    # ko, rows, outputs, ki
        # the accumulators stay in registers: rows and outputs unrolled around the vector of
        # lanes; the sums of the lanes unrolled too
        *(["AN", index, position, 1] for position in range(1, n_spatial + 1)),
        ["AN", index + 1, n_spatial, 1],
        ["AN", index + 1, n_spatial + 1, 1],
    ]
    return _extend(sketch, steps, f"rfactor {stage.name} (GEMV: the reduction split, factored and vectorized)",
                   [offset, offset + 2], [f"{stage.name}.rf", stage.name], vector_splits=[offset])


def _tiling_sketches(state: LoopState, sketch: Sketch, index: int) -> list[tuple[Sketch, int]]:
    """Fusion sketches (levels 1 and 2) when an epilogue reads the stage; otherwise a cache
    write (the stage is visited again, now fused into the copy) and plain tiling."""
    stage = state.schedule[state.names[index]]
    consumer = _matched_consumer(state, stage)
    offset = len(sketch.steps)
    tile_steps, spatial, splits = _tile(state, index)
    tiling = [offset + s for s in splits]
    if consumer is not None:
        consumer_id = state.stage_id(consumer.name)
        found = []
        for level in FUSION_LEVELS:
            follow = _follow(consumer_id, [offset + s for s in spatial], level, len(spatial))
            attach = ["CA", index, consumer_id, level * len(spatial) - 1]
            found.append((_extend(sketch, tile_steps + follow + [attach],
                                  f"tile {stage.name} SSRSRS, fused into {consumer.name} at level {level}",
                                  tiling, [stage.name]), index - 1))
        return found
    cached = _extend(sketch, [["CHW", index, "local"]], f"cache write {stage.name}")
    plain = _extend(sketch, tile_steps, f"tile {stage.name} SSRSRS", tiling, [stage.name])
    return [(cached, index), (plain, index - 1)]


# ---------------------------------------------------------------- completing a sketch

def parallel_depth(state: LoopState, stage: Stage, chunks: float) -> int:
    """How many outer loops of a root stage to fuse into its parallel loop: the fewest whose
    extents multiply to ``chunks`` iterations per core, at most :func:`parallel_candidates`."""
    extents = leaf_extents(stage)
    wanted, degree = chunks * (os.cpu_count() or 1), 1
    candidates = parallel_candidates(state, stage)
    for depth, leaf in enumerate(stage.leaf[:candidates], 1):
        degree *= extents[leaf]
        if degree >= wanted:
            return depth
    return candidates


def parallel_candidates(state: LoopState, stage: Stage) -> int:
    """How many outer loops of a root stage can be fused into one parallel loop: spatial,
    not annotated, up to (and including) the first loop other stages are computed at."""
    attach_points = {st.attach[1] for st in state.schedule.stages
                     if isinstance(st.attach, tuple) and st.attach[0] == stage.name}
    count = 0
    for leaf in stage.leaf:
        if stage.axes[leaf].kind != "spatial" or leaf in stage.annotations:
            break
        count += 1
        if leaf in attach_points:
            break
    return count


def location_steps(state: LoopState, sketch: Sketch, locations: Sequence[str]) -> list[list[Any]]:
    """The steps placing each stage of open compute location (one of :data:`LOCATIONS` per
    stage of ``sketch.located``); a level of a reader that is not tiled means the root."""
    steps: list[list[Any]] = []
    for stage_id, where in zip(sketch.located, locations, strict=True):
        if where == "inline":
            steps.append(["CI", stage_id])
            continue
        readers = [st for st in _readers(state, state.names[stage_id]) if st.name in sketch.tiled_stages]
        if where == "root" or len(readers) != 1:
            continue
        reader = readers[0]
        n_spatial, n_reduce = len(reader.op.axis), len(reader.op.reduce_axis)
        position = {"S0": n_spatial, "S1": 2 * n_spatial, "R0": 2 * n_spatial + n_reduce}[where] - 1
        steps.append(["CA", stage_id, state.stage_id(reader.name), position])
    return steps


def render(dag: ComputeDAG, sketch: Sketch, lengths: Sequence[Sequence[int]], parallel_chunks: float,
           unroll: int, locations: Sequence[str] = ()) -> list[list[Any]]:
    """The complete steps of a sketch: split lengths (one list per tiling split, in order),
    the compute location of each stage of ``sketch.located`` (one of :data:`LOCATIONS` each),
    then parallel (the outer loops of each root stage fused until the parallel loop has
    ``parallel_chunks`` iterations per core), vectorize, unroll."""
    steps = [list(step) for step in sketch.steps]
    for step_index, values in zip(sketch.tile_steps, lengths, strict=True):
        steps[step_index] = [*steps[step_index][:4], list(values), steps[step_index][5]]
    state = LoopState(dag)
    for step in steps:
        state.apply(step)
    for step in location_steps(state, sketch, locations):
        state.apply(step)
    computed = [st for st in state.schedule.stages if st.attach != "inline"]
    for stage in computed:
        count = parallel_depth(state, stage, parallel_chunks) if stage.attach is None else 0
        if count:
            stage_id = state.stage_id(stage.name)
            if count > 1:
                state.apply(["FU", stage_id, list(range(count))])
            state.apply(["AN", stage_id, 0, 3])
    for stage in computed:
        extents = leaf_extents(stage)
        innermost = stage.leaf[-1]
        attached = any(isinstance(st.attach, tuple) and st.attach == (stage.name, innermost)
                       for st in state.schedule.stages)
        if (stage.axes[innermost].kind == "spatial" and innermost not in stage.annotations and not attached
                and 1 < extents[innermost] <= MAX_VECTOR_LANES):
            state.apply(["AN", state.stage_id(stage.name), len(stage.leaf) - 1, 2])
    if unroll:
        for name in sketch.tiled_stages:
            state.apply(["PR", state.stage_id(name), 0, f"{AUTO_UNROLL}${unroll}"])
    return state.steps


def default_steps(dag: ComputeDAG) -> list[list[Any]]:
    """A reasonable untuned program: the first sketch, innermost tiles near 8 lanes, padding
    computed at the reader's second spatial level, outer loops fused into a parallel loop of
    16 iterations per core, unrolled up to 64 steps."""
    sketch = generate_sketches(dag)[0]
    lengths = []
    for index in sketch.tile_steps:
        step = sketch.steps[index]
        extent, parts = step[3], len(step[4])
        inner = max((f for f in range(1, min(extent, 8) + 1) if extent % f == 0), default=1)
        lengths.append([1] * (parts - 1) + [inner])
    return render(dag, sketch, lengths, parallel_chunks=16, unroll=64, locations=["S1"] * len(sketch.located))
