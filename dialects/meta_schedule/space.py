"""The design space of a workload: schedule rules applied to its blocks, their sampling
instructions left open, and the postprocessing that completes a trace.

Rules (TVM's CPU defaults, applied to the blocks of the compute DAG in order):

- **multi-level tiling** ``SSRSRS`` on every block that needs it (a reduction whose loops
  are reused, :func:`lorien.engine.dag.needs_multi_level_tiling`): each spatial
  loop split in four by ``SamplePerfectTile``, each reduce loop in two, reordered
  S0 S1 R0 S2 R1 S3; the result is written through a cache (``CacheWrite`` +
  ``ReverseComputeAt``) at the end of S0 or S1, or not at all. A fused element-wise output
  consumer (bias, relu) takes the cache's place: it runs inside the tile, also through
  element-wise stages between the two (add bias, max 0, min 6), which are inlined first.
- **rfactor of a reduction that is not tiled** (TVM's AddRFactor: a layer norm's mean, softmax's
  max): for a reduction over one axis longer than the cores, a rule knob leaves it as it is or
  splits the axis in two (``SamplePerfectTile``) and factors the outer or the inner part out
  (``RFactor``) into ``<block>_rf``, computed at the root or one of the block's row loops
  (``SampleComputeLocation``); the block itself is placed over its one reader's loops when it is
  not an output (TVM's random compute location).
- **auto-inline**: other element-wise blocks without a condition are inlined.
- **random compute location**: a block with a condition (padding) is computed where
  ``SampleComputeLocation`` says: one of the outer two spatial tile levels of its consumer
  (a unit loop there means the nearest outer loop that is not one, as in TVM), or the root.
- **parallel / vectorize / unroll**: the root block is annotated with the largest parallel
  extent (jobs per core x cores), the vector width and a ``SampleCategorical`` unroll step.

A workload with no block to tile (a reshape, softmax, layer_norm, a fused element-wise task)
is scheduled by the other rules alone, as TVM does (its reductions by the rfactor rule).

Knobs of the indexed space (``lorien.search``; first knob least significant): the tile
sizes of every split loop (factorizations of its extent, innermost at most 64), the cache
level of every tiled block, per reduction offered an rfactor its rule, reduction split and
``<block>_rf`` location, the location of every block placed by a random compute location, the
unroll step, the parallel jobs per core. A point renders to a full trace:
the rules' instructions with the point's decisions, then ``EnterPostproc`` and the
postprocessing TVM's ``RewriteParallelVectorizeUnroll`` records (outer spatial loops fused
into one parallel loop until it passes the parallel extent, innermost spatial loops vectorized
when their extent is at most the vector width ``VECTOR_EXTENT``,
``pragma_auto_unroll_max_step`` on the tiled blocks) and ``DecomposeReduction``. Rendering
replays every instruction on the engine, which verifies the trace.

Mutators (:meth:`TraceSpace.mutate`): tile size (a prime factor moves between levels, also in
a reduction's rfactor split), unroll, compute location (also of ``<block>_rf``), parallel,
cache level (half the time a rule knob instead, where there is one).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dialects.meta_schedule.trace import ROOT_LOCATION, Loop, Replay, TraceState, replay_trace
from lorien.engine import te
from lorien.engine.dag import ComputeDAG, needs_multi_level_tiling
from lorien.engine.schedule import leaf_extents
from lorien.search.base import MixedRadixSpace
from lorien.search.tiles import MAX_INNERMOST, factorizations, move_factor, other_choice

UNROLL_STEPS = (0, 16, 64, 512)
JOBS_PER_CORE = (4, 16, 64)
VECTOR_EXTENT = 64
SPATIAL_LEVELS, REDUCE_LEVELS = 4, 2
#: Combinations of the knobs a trace's decisions do not name (cache levels, rules, compute
#: locations, parallel jobs) :meth:`TraceSpace.positions_of` renders at most to find a trace.
DECODE_LIMIT = 2048
#: Probability of each mutator.
MUTATIONS = (("tile", 0.85), ("unroll", 0.05), ("location", 0.05), ("parallel", 0.03), ("cache", 0.02))


@dataclass
class _Tiled:
    stage: str
    loops: list[tuple[str, int, int]]  # (root axis, extent, levels), spatial first
    epilogue: str | None
    #: Element-wise stages between the block and its epilogue (bias add, then clip's max),
    #: inlined before the block is tiled so that the epilogue reads the block.
    chain: list[str] = field(default_factory=list)
    tile_knobs: list[int] = field(default_factory=list)
    cache_knob: int = -1
    #: The rfactor (GEMV) rule, for blocks with few rows (see :func:`gemv_like`): a knob
    #: choosing it over multi-level tiling (-1: not offered), and its two tile knobs (the
    #: reduction split, its inner part factored and vectorized; the block of outputs).
    rule_knob: int = -1
    gemv_knobs: list[int] = field(default_factory=list)


#: The rfactor rule is offered for reductions with at most this many rows besides the last
#: axis (dense / batch_matmul at M = 1..4), over at least GEMV_MIN_REDUCE elements.
GEMV_MAX_ROWS = 4
GEMV_MIN_REDUCE = 16
#: The block of outputs the rfactor rule accumulates at once is at most this long.
GEMV_MAX_BLOCK = 16
RULES = ("multi_level_tiling", "rfactor")


def gemv_like(stage: Any) -> bool:
    """One reduce axis of at least GEMV_MIN_REDUCE and at most GEMV_MAX_ROWS output rows
    besides the last axis: little to reuse across rows; the reduction is what vectorizes."""
    if len(stage.op.reduce_axis) != 1 or stage.op.reduce_axis[0].extent < GEMV_MIN_REDUCE or not stage.op.axis:
        return False
    rows = 1
    for iv in stage.op.axis[:-1]:
        rows *= int(iv.extent)
    return rows <= GEMV_MAX_ROWS


#: The rules of a reduction that is not tiled (a layer norm's mean, softmax's max and sum), as
#: TVM's AddRFactor offers them: the split reduction's outer or inner loop factored out into
#: ``<block>_rf`` (``RFactor``), or neither.
REDUCTION_RULES = ("none", "rfactor_outer", "rfactor_inner")


@dataclass
class _Reduced:
    """A reduction that is not tiled, over one axis longer than the cores (TVM's AddRFactor
    condition): its rule knob, the reduction split's knob, and the ``SampleComputeLocation``
    knob of ``<block>_rf`` (the root or one of the block's spatial loops)."""
    stage: str
    spatial: int
    rule_knob: int
    split_knob: int
    location_knob: int
    choices: list[int] = field(default_factory=list)


def rfactor_reduction(stage: Any, cores: int) -> bool:
    """A reduction that is not tiled, over one axis longer than ``cores``: TVM's AddRFactor
    offers it an rfactor (``cum_reduce_len > max_parallel_basic``)."""
    return len(stage.op.reduce_axis) == 1 and int(stage.op.reduce_axis[0].extent) > cores and \
        not needs_multi_level_tiling(stage.op) and not _has_condition(stage)


@dataclass
class _Placed:
    stage: str
    consumer: str
    knob: int = -1
    choices: list[int] = field(default_factory=list)


class _Writer:
    """Emits instructions with fresh random-variable names, applying each to a TraceState."""

    def __init__(self, dag: ComputeDAG):
        self.state = TraceState(dag)
        self.instructions: list[list[Any]] = []
        self.decisions: list[list[Any]] = []
        self.counter = 0

    def names(self, prefix: str, count: int) -> list[str]:
        made = [f"{prefix}{self.counter + i}" for i in range(count)]
        self.counter += count
        return made

    def emit(self, name: str, inputs: list[Any], attrs: list[Any], outputs: list[str], decision: Any = None) -> list[str]:
        index = len(self.instructions)
        instruction = [name, inputs, attrs, outputs]
        self.instructions.append(instruction)
        if decision is not None:
            self.decisions.append([index, decision])
        self.state.apply(index, instruction, decision)
        if index in self.state.realized:
            self.decisions[-1][1] = self.state.realized[index]
        return outputs

    def trace(self) -> list[Any]:
        return [self.instructions, self.decisions]


def _reads(stage: Any, name: str) -> bool:
    return any(isinstance(n, te.Load) and n.tensor.name == name for n in te.walk(stage.op.body))


def _has_condition(stage: Any) -> bool:
    return any(isinstance(n, te.Select) for n in te.walk(stage.op.body))


def _epilogue(stages: Sequence[Any], stage: Any, outputs: set[str]) -> tuple[str | None, list[str]]:
    """The element-wise output consumer of a tiled stage that runs inside its tile (the
    cache's place), and the element-wise stages between the two, each the one consumer of the
    one before and inlined first (conv -> add bias -> max 0 -> min 6: ``min`` is the epilogue,
    ``add`` and ``max`` the chain), as TVM's multi-level tiling fuses a relax task's epilogue;
    ``(None, [])`` when there is none."""
    chain: list[str] = []
    current = stage
    while True:
        consumers = [s for s in stages if _reads(s, current.name)]
        if len(consumers) != 1:
            return None, []
        consumer = consumers[0]
        if consumer.op.reduce_axis or consumer.tensor.shape != stage.tensor.shape:
            return None, []
        if consumer.name in outputs:
            return consumer.name, chain
        if _has_condition(consumer):
            return None, []
        chain.append(consumer.name)
        current = consumer


class TraceSpace(MixedRadixSpace):
    """Every trace the rules give a workload, as an indexed space."""

    @property
    def path_knobs(self) -> list[int]:
        """The knobs choosing a block's rule (rfactor or multi-level tiling): a tuner's first
        batch measures each."""
        return [tiled.rule_knob for tiled in self.tiled if tiled.rule_knob >= 0] + \
            [reduced.rule_knob for reduced in self.reduced]

    def __init__(self, dag: ComputeDAG, cores: int | None = None, max_innermost: int = MAX_INNERMOST):
        self.dag = dag
        self.cores = cores or os.cpu_count() or 1
        schedule = dag.init_schedule()
        outputs = {t.name for t in dag.outputs}
        self.tiled: list[_Tiled] = []
        self.inlined: list[str] = []
        self.placed: list[_Placed] = []
        self.dims: list[int] = []
        self.tile_entities: list[tuple[tuple[int, ...], ...]] = []
        self.gemv_entities: list[tuple[tuple[int, ...], ...]] = []
        epilogues: set[str] = set()
        for stage in schedule.stages:
            if not needs_multi_level_tiling(stage.op):
                continue
            epilogue, chain = _epilogue(schedule.stages, stage, outputs)
            if epilogue is not None:
                epilogues.update([epilogue, *chain])
            loops = [(iv.name, int(iv.extent), SPATIAL_LEVELS) for iv in stage.op.axis]
            loops += [(iv.name, int(iv.extent), REDUCE_LEVELS) for iv in stage.op.reduce_axis]
            tiled = _Tiled(stage.name, loops, epilogue, chain)
            for _, extent, levels in loops:
                tiled.tile_knobs.append(len(self.dims))
                entities = tuple(factorizations(extent, levels, max_innermost))
                self.tile_entities.append(entities)
                self.dims.append(len(entities))
            tiled.cache_knob = len(self.dims)
            self.dims.append(3)
            if gemv_like(stage) and epilogue is None:
                tiled.rule_knob = len(self.dims)
                self.dims.append(len(RULES))
                k_extent, n_extent = int(stage.op.reduce_axis[0].extent), int(stage.op.axis[-1].extent)
                k_tiles = tuple(factorizations(k_extent, 2, max_innermost))
                whole = tuple(e for e in k_tiles if e[-1] % 8 == 0)   # whole vectors of K where K allows
                for entities in (whole or k_tiles, tuple(factorizations(n_extent, 2, GEMV_MAX_BLOCK))):
                    tiled.gemv_knobs.append(len(self.dims))
                    self.gemv_entities.append(entities)
                    self.dims.append(len(entities))
            self.tiled.append(tiled)
        tiled_names = {t.stage for t in self.tiled}

        def place(name: str, consumer) -> None:
            """A sampled compute location of ``name`` among its one consumer's loops (in a tiled
            consumer, the outer two spatial tile levels S0 S1: the locations TVM samples)."""
            loop_count = len(consumer.leaf) if consumer.name not in tiled_names else 2 * len(consumer.op.axis)
            placed = _Placed(name, consumer.name, len(self.dims), [ROOT_LOCATION, *range(loop_count)])
            self.dims.append(len(placed.choices))
            self.placed.append(placed)

        self.reduced: list[_Reduced] = []
        self.reduce_entities: list[tuple[tuple[int, ...], ...]] = []
        for stage in schedule.stages:
            if stage.name in tiled_names or stage.name in epilogues or not rfactor_reduction(stage, self.cores):
                continue
            entities = tuple(factorizations(int(stage.op.reduce_axis[0].extent), 2, max_innermost))
            spatial = len(stage.op.axis)
            reduced = _Reduced(stage.name, spatial, len(self.dims), len(self.dims) + 1, len(self.dims) + 2,
                               [ROOT_LOCATION, *range(spatial)])
            self.dims += [len(REDUCTION_RULES), len(entities), len(reduced.choices)]
            self.reduce_entities.append(entities)
            self.reduced.append(reduced)
        for stage in schedule.stages:
            if stage.name in tiled_names or stage.name in epilogues or stage.name in outputs:
                continue
            consumers = [s for s in schedule.stages if _reads(s, stage.name)]
            if stage.op.reduce_axis or len(consumers) != 1:
                continue
            if not _has_condition(stage):
                self.inlined.append(stage.name)
                continue
            place(stage.name, consumers[0])
        # TVM's random compute location also samples where a reduction that is not tiled runs:
        # here one offered an rfactor, not an output, read by one block that stays a block
        inlined = set(self.inlined)
        for reduced in self.reduced:
            consumers = [s for s in schedule.stages if _reads(s, reduced.stage)]
            if reduced.stage in outputs or len(consumers) != 1 or consumers[0].name in inlined:
                continue
            place(reduced.stage, consumers[0])
        self.unroll_knob = len(self.dims)
        self.dims.append(len(UNROLL_STEPS))
        self.parallel_knob = len(self.dims)
        self.dims.append(len(JOBS_PER_CORE))
        self._entity_index = [{e: i for i, e in enumerate(entities)} for entities in self.tile_entities]
        self._gemv_index = [{e: i for i, e in enumerate(entities)} for entities in self.gemv_entities]
        self._reduce_index = [{e: i for i, e in enumerate(entities)} for entities in self.reduce_entities]
        self._rendered: tuple[list[Any], TraceState] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rendered": None}  # a trace's state is of no use in another process

    def get(self, index: int) -> list[Any]:
        """The trace ``[instructions, decisions]`` of point ``index``."""
        return self.render(self.knob_indices(index))

    def knob_feature_tables(self) -> list[np.ndarray]:
        """Per knob, features of each value: log2 of tile sizes, the cache level, the location
        as a fraction of the consumer's loops, log2 of the unroll step and parallel extent."""
        tables: list[np.ndarray] = [np.zeros((1, 1))] * len(self.dims)
        knob = 0
        for tiled in self.tiled:
            for k in tiled.tile_knobs:
                tables[k] = np.log2(np.array(self.tile_entities[knob], dtype=float))
                knob += 1
            tables[tiled.cache_knob] = np.arange(3, dtype=float).reshape(-1, 1)
            if tiled.rule_knob >= 0:
                tables[tiled.rule_knob] = np.arange(len(RULES), dtype=float).reshape(-1, 1)
        for k, entities in zip((k for t in self.tiled for k in t.gemv_knobs), self.gemv_entities, strict=True):
            tables[k] = np.log2(np.array(entities, dtype=float))
        for placed in self.placed:
            tables[placed.knob] = (np.array(placed.choices, dtype=float) / max(1, len(placed.choices))).reshape(-1, 1)
        for reduced, entities in zip(self.reduced, self.reduce_entities, strict=True):
            tables[reduced.rule_knob] = np.arange(len(REDUCTION_RULES), dtype=float).reshape(-1, 1)
            tables[reduced.split_knob] = np.log2(np.array(entities, dtype=float))
            tables[reduced.location_knob] = (np.array(reduced.choices, dtype=float) /
                                             max(1, len(reduced.choices))).reshape(-1, 1)
        tables[self.unroll_knob] = np.log2(1.0 + np.array(UNROLL_STEPS, dtype=float)).reshape(-1, 1)
        tables[self.parallel_knob] = np.log2(np.array(JOBS_PER_CORE, dtype=float)).reshape(-1, 1)
        return tables

    # ------------------------------------------------------------ transfer
    def positions_of(self, trace: list[Any]) -> list[int] | None:
        """The knob positions whose rendering is ``trace`` (a trace of this space read back from
        a record); None when no point of the space renders it. The tiles are read from its
        ``SamplePerfectTile`` decisions and the unroll step from its ``SampleCategorical`` one;
        the other knobs (cache levels, rules, compute locations, parallel jobs: at most
        :data:`DECODE_LIMIT` combinations) are found by rendering each and comparing."""
        import orjson

        instructions, decisions = trace
        decided = {int(i): d for i, d in decisions}
        tiles = [decided.get(i) for i, inst in enumerate(instructions) if inst[0] == "SamplePerfectTile"]
        tile_knobs = [k for t in self.tiled for k in t.tile_knobs]
        if len(tiles) != len(tile_knobs):
            return None  # another rule (rfactor) took a block: its splits are no tile knobs
        positions = [0] * len(self.dims)
        for n, (k, sizes) in enumerate(zip(tile_knobs, tiles, strict=True)):
            found = self._entity_index[n].get(tuple(sizes or ()))
            if found is None:
                return None
            positions[k] = found
        unroll = [decided.get(i) for i, inst in enumerate(instructions) if inst[0] == "SampleCategorical"]
        if len(unroll) != 1 or not isinstance(unroll[0], int) or not 0 <= unroll[0] < len(UNROLL_STEPS):
            return None
        positions[self.unroll_knob] = int(unroll[0])
        rest = [k for k in range(len(self.dims)) if k not in tile_knobs and k != self.unroll_knob]
        if math.prod(self.dims[k] for k in rest) > DECODE_LIMIT:
            return None
        wanted = orjson.dumps(trace)
        for values in itertools.product(*(range(self.dims[k]) for k in rest)):
            for k, value in zip(rest, values, strict=True):
                positions[k] = value
            if orjson.dumps(self.render(positions)) == wanted:
                return list(positions)
        return None

    def nearest_point(self, source: TraceSpace, positions: Sequence[int]) -> int | None:
        """The point of this space nearest to point ``positions`` of ``source``, another
        workload's space of the same rules (a transfer seed): every loop's tiles the
        factorization of this loop's extent whose inner tiles are nearest in log2, the same
        cache levels, rules, unroll step and parallel jobs per core, the compute locations kept
        where they exist here. None when the two spaces' blocks differ (their count, their
        loops' count, the rules they offer)."""
        if len(source.tiled) != len(self.tiled) or len(source.reduced) != len(self.reduced) or any(
                len(a.loops) != len(b.loops) or (a.rule_knob >= 0) != (b.rule_knob >= 0)
                for a, b in zip(source.tiled, self.tiled, strict=True)):
            return None
        out = [0] * len(self.dims)
        knob = 0
        for there, here in zip(source.tiled, self.tiled, strict=True):
            for k_there, k_here in zip(there.tile_knobs, here.tile_knobs, strict=True):
                wanted = np.log2(np.array(source.tile_entities[knob][positions[k_there]], dtype=float))[1:]
                table = np.log2(np.array(self.tile_entities[knob], dtype=float))[:, 1:]
                out[k_here] = int(np.argmin(np.abs(table - wanted).sum(axis=1)))
                knob += 1
            out[here.cache_knob] = positions[there.cache_knob]
            if here.rule_knob >= 0:
                out[here.rule_knob] = positions[there.rule_knob]
        for there, here in zip(source.placed, self.placed, strict=False):  # a padded conv2d places its pad
            out[here.knob] = min(positions[there.knob], self.dims[here.knob] - 1)
        out[self.unroll_knob] = positions[source.unroll_knob]
        out[self.parallel_knob] = positions[source.parallel_knob]
        return self.index_of_knobs(out)

    # ------------------------------------------------------------ mutators
    def mutate(self, index: int, rng: np.random.Generator) -> int:
        """One mutation of a point: tile size, unroll, compute location, parallel or cache level."""
        positions = self.knob_indices(index)
        kinds, weights = zip(*MUTATIONS, strict=True)
        kind = kinds[int(rng.choice(len(kinds), p=np.array(weights) / sum(weights)))]
        tile_knobs = [k for t in self.tiled for k in t.tile_knobs]
        movable = [(self.tile_entities[n], self._entity_index[n], k) for n, k in enumerate(tile_knobs)]
        movable += [(self.gemv_entities[n], self._gemv_index[n], k)
                    for n, k in enumerate(k for t in self.tiled for k in t.gemv_knobs)]
        movable += [(self.reduce_entities[n], self._reduce_index[n], r.split_knob) for n, r in enumerate(self.reduced)]
        movable = [m for m in movable if self.dims[m[2]] > 1]
        rules = [t.rule_knob for t in self.tiled if t.rule_knob >= 0] + [r.rule_knob for r in self.reduced]
        locations = [p.knob for p in self.placed] + [r.location_knob for r in self.reduced]
        if kind == "tile" and movable:
            entities, index_of, k = movable[int(rng.integers(len(movable)))]
            positions[k] = move_factor(entities, index_of, positions[k], rng)
        elif kind == "cache" and rules and rng.random() < 0.5:
            k = rules[int(rng.integers(len(rules)))]
            positions[k] = other_choice(positions[k], self.dims[k], rng)
        elif kind == "location" and locations:
            k = locations[int(rng.integers(len(locations)))]
            positions[k] = other_choice(positions[k], self.dims[k], rng)
        elif kind == "parallel":
            positions[self.parallel_knob] = other_choice(positions[self.parallel_knob], len(JOBS_PER_CORE), rng)
        elif kind == "cache" and self.tiled:  # a space without tiled blocks (softmax) has no cache level
            tiled = self.tiled[int(rng.integers(len(self.tiled)))]
            positions[tiled.cache_knob] = other_choice(positions[tiled.cache_knob], 3, rng)
        else:
            positions[self.unroll_knob] = other_choice(positions[self.unroll_knob], len(UNROLL_STEPS), rng)
        return self.index_of_knobs(positions)

    # ------------------------------------------------------------ rendering
    def render(self, positions: Sequence[int]) -> list[Any]:
        """The trace of knob positions: the rules' instructions, then the postprocessing."""
        writer = _Writer(self.dag)
        blocks = {}
        for stage in writer.state.schedule.stages:
            (blocks[stage.name],) = writer.emit("GetSBlock", [], [stage.name, "main"], writer.names("b", 1))
        (root,) = writer.emit("GetSBlock", [], ["root", "main"], writer.names("b", 1))
        knob = 0
        gemv = 0
        for tiled in self.tiled:
            for name in tiled.chain:
                writer.emit("ComputeInline", [blocks[name]], [], [])
            if tiled.rule_knob >= 0 and RULES[positions[tiled.rule_knob]] == "rfactor":
                self._rfactor(writer, blocks, tiled, positions, gemv)
                knob += len(tiled.tile_knobs)
            else:
                knob = self._tile(writer, blocks, tiled, positions, knob)
            gemv += len(tiled.gemv_knobs)
        factored = [(reduced, self._reduce_rfactor(writer, blocks, reduced, entities, positions))
                    for reduced, entities in zip(self.reduced, self.reduce_entities, strict=True)]
        for name in self.inlined:
            writer.emit("ComputeInline", [blocks[name]], [], [])
        max_parallel = JOBS_PER_CORE[positions[self.parallel_knob]] * self.cores
        writer.emit("Annotate", [root, max_parallel], ["meta_schedule.parallel"], [])
        writer.emit("Annotate", [root, VECTOR_EXTENT], ["meta_schedule.vectorize"], [])
        unroll_position = positions[self.unroll_knob]
        (step,) = writer.emit("SampleCategorical", [], [list(UNROLL_STEPS), [1 / len(UNROLL_STEPS)] * len(UNROLL_STEPS)],
                              writer.names("v", 1), unroll_position)
        writer.emit("Annotate", [root, step], ["meta_schedule.unroll_explicit"], [])
        for placed in self.placed:
            (location,) = writer.emit("SampleComputeLocation", [blocks[placed.stage]], [], writer.names("l", 1),
                                      placed.choices[positions[placed.knob]])
            writer.emit("ComputeAt", [blocks[placed.stage], location], [1, -1], [])
        for reduced, rf in factored:
            if rf is not None:
                (location,) = writer.emit("SampleComputeLocation", [rf], [], writer.names("l", 1),
                                          reduced.choices[positions[reduced.location_knob]])
                writer.emit("ComputeAt", [rf, location], [1, -1], [])
        self._postprocess(writer, max_parallel, UNROLL_STEPS[unroll_position])
        trace = writer.trace()
        self._rendered = (trace, writer.state)
        return trace

    def replay(self, trace: list[Any]) -> Replay:
        """The engine schedule of ``trace`` (``replay_trace``): when it is the trace this space
        rendered last, the state that rendered it, which applied the same instructions (a guide
        featurizing a point replays it once, not twice); the state serves once."""
        rendered, self._rendered = self._rendered, None
        if rendered is not None and rendered[0] is trace:
            return rendered[1].result()
        return replay_trace(self.dag, trace)

    def _tile(self, writer: _Writer, blocks: dict[str, str], tiled: _Tiled, positions: Sequence[int], knob: int) -> int:
        block = blocks[tiled.stage]
        writer.emit("Annotate", [block, '"SSRSRS"'], ["meta_schedule.tiling_structure"], [])
        loops = writer.emit("GetLoops", [block], [], writer.names("l", len(tiled.loops)))
        spatial: list[list[str]] = [[] for _ in range(SPATIAL_LEVELS)]
        reduce: list[list[str]] = [[] for _ in range(REDUCE_LEVELS)]
        for loop, (_, _, levels), k in zip(loops, tiled.loops, tiled.tile_knobs, strict=True):
            sizes = list(self.tile_entities[knob][positions[k]])
            knob += 1
            factors = writer.emit("SamplePerfectTile", [loop], [levels, MAX_INNERMOST], writer.names("v", levels), sizes)
            parts = writer.emit("Split", [loop, *factors], [1, 0], writer.names("l", levels))
            for level, part in enumerate(parts):
                (spatial if levels == SPATIAL_LEVELS else reduce)[level].append(part)
        order = spatial[0] + spatial[1] + reduce[0] + spatial[2] + reduce[1] + spatial[3]
        writer.emit("Reorder", order, [], [])
        level = positions[tiled.cache_knob]
        if level:
            point = spatial[level - 1][-1]
            if tiled.epilogue is not None:
                writer.emit("ReverseComputeAt", [blocks[tiled.epilogue], point], [1, -1], [])
            else:
                (cache,) = writer.emit("CacheWrite", [block, []], [0, "global"], writer.names("b", 1))
                writer.emit("ReverseComputeAt", [cache, point], [1, -1], [])
        return knob

    def _rfactor(self, writer: _Writer, blocks: dict[str, str], tiled: _Tiled, positions: Sequence[int],
                 gemv: int) -> None:
        """The GEMV rule (TVM's AddRFactor, for vectorization): the reduction split in two
        (``SamplePerfectTile``), its inner loop factored out (``RFactor``) into ``<block>_rf``,
        which accumulates that many lanes (vectorized by the postprocessing) over the outer
        loop; the block then sums the lanes, its last axis split into blocks of outputs, and
        ``<block>_rf`` is computed at the outer block loop (``SampleComputeLocation``) with its
        reduction loop outermost and the rows and outputs unrolled around the vector."""
        block = blocks[tiled.stage]
        n_spatial = sum(1 for _, _, levels in tiled.loops if levels == SPATIAL_LEVELS)
        writer.emit("Annotate", [block, '"rfactor"'], ["meta_schedule.tiling_structure"], [])
        loops = writer.emit("GetLoops", [block], [], writer.names("l", len(tiled.loops)))
        k_sizes = list(self.gemv_entities[gemv][positions[tiled.gemv_knobs[0]]])
        n_sizes = list(self.gemv_entities[gemv + 1][positions[tiled.gemv_knobs[1]]])
        factors = writer.emit("SamplePerfectTile", [loops[-1]], [2, MAX_INNERMOST], writer.names("v", 2), k_sizes)
        _, inner = writer.emit("Split", [loops[-1], *factors], [1, 0], writer.names("l", 2))
        (rf,) = writer.emit("RFactor", [inner], [n_spatial], writer.names("b", 1))
        own = writer.emit("GetLoops", [block], [], writer.names("l", n_spatial + 1))      # spatial..., lanes
        factors = writer.emit("SamplePerfectTile", [own[n_spatial - 1]], [2, GEMV_MAX_BLOCK], writer.names("v", 2),
                              n_sizes)
        outer, block_inner = writer.emit("Split", [own[n_spatial - 1], *factors], [1, 0], writer.names("l", 2))
        writer.emit("Reorder", [*own[: n_spatial - 1], outer, block_inner], [], [])
        writer.emit("Unroll", [block_inner], [], [])
        (location,) = writer.emit("SampleComputeLocation", [rf], [], writer.names("l", 1), n_spatial - 1)
        writer.emit("ComputeAt", [rf, location], [1, -1], [])
        # the loops it shares (fewer when the location was a unit loop), then its own: lanes,
        # rows..., outputs, reduction
        count = len(writer.state.loops_of(writer.state.stage(rf)))
        inside = writer.emit("GetLoops", [rf], [], writer.names("l", count))[-(n_spatial + 2):]
        writer.emit("Reorder", [inside[-1], *inside[1:-1], inside[0]], [], [])
        for loop in inside[1:-1]:
            writer.emit("Unroll", [loop], [], [])

    def _reduce_rfactor(self, writer: _Writer, blocks: dict[str, str], reduced: _Reduced,
                        entities: tuple[tuple[int, ...], ...], positions: Sequence[int]) -> str | None:
        """TVM's AddRFactor on a reduction that is not tiled: the reduction loop split in two
        (``SamplePerfectTile``) and the outer or inner part factored out (``RFactor``) into
        ``<block>_rf``, whose partial results the block then reduces; the new block's name, or
        None for the rule that leaves the block as it is."""
        rule = REDUCTION_RULES[positions[reduced.rule_knob]]
        if rule == "none":
            return None
        loops = writer.emit("GetLoops", [blocks[reduced.stage]], [], writer.names("l", reduced.spatial + 1))
        factors = writer.emit("SamplePerfectTile", [loops[-1]], [2, MAX_INNERMOST], writer.names("v", 2),
                              list(entities[positions[reduced.split_knob]]))
        parts = writer.emit("Split", [loops[-1], *factors], [1, 0], writer.names("l", 2))
        part = parts[0] if rule == "rfactor_outer" else parts[1]
        (rf,) = writer.emit("RFactor", [part], [reduced.spatial], writer.names("b", 1))
        return rf

    def _postprocess(self, writer: _Writer, max_parallel: int, unroll: int) -> None:
        """TVM's RewriteParallelVectorizeUnroll as trace instructions, then DecomposeReduction."""
        state = writer.state
        writer.emit("EnterPostproc", [], [], [])
        (root,) = writer.emit("GetSBlock", [], ["root", "main"], writer.names("b", 1))
        for hint in ("meta_schedule.parallel", "meta_schedule.vectorize", "meta_schedule.unroll_explicit"):
            writer.emit("Unannotate", [root], [hint], [])
        order = [name for name in state.blocks_in_order() if state.schedule[name].attach != "inline"]
        children = writer.emit("GetChildBlocks", [root], [], writer.names("b", len(order)))
        tiled_names = {t.stage for t in self.tiled}
        for name, block in zip(order, children, strict=True):
            stage = state.schedule[name]
            loops = state.loops_of(stage)
            names = writer.emit("GetLoops", [block], [], writer.names("l", len(loops)))
            prefix = self._parallel_prefix(state, loops, max_parallel)
            first = None
            if prefix:
                (first,) = writer.emit("Fuse", names[:prefix], [1], writer.names("l", 1))
                writer.emit("Parallel", [first], [], [])
            own = state.own_leaves(stage)
            last = loops[-1]
            if own and last.stage == name and stage.axes[last.leaf].kind == "spatial" and len(loops) > prefix and \
                    leaf_extents(stage)[last.leaf] <= VECTOR_EXTENT and \
                    not any(s.attach == (name, last.leaf) for s in state.schedule.stages):
                (vector,) = writer.emit("Fuse", [names[-1]], [1], writer.names("l", 1))
                writer.emit("Vectorize", [vector], [], [])
            if name in tiled_names and unroll and loops:
                head = first or names[0]
                writer.emit("Annotate", [head, unroll], ["pragma_auto_unroll_max_step"], [])
                writer.emit("Annotate", [head, 1], ["pragma_unroll_explicit"], [])
        for tiled in self.tiled:
            stage = state.schedule[state.block_names.get(tiled.stage, tiled.stage)]
            (block,) = writer.emit("GetSBlock", [], [tiled.stage, "main"], writer.names("b", 1))
            loops = state.loops_of(stage)
            names = writer.emit("GetLoops", [block], [], writer.names("l", len(loops)))
            first_reduce = next(i for i, loop in enumerate(loops)
                                if state.schedule[loop.stage].axes[loop.leaf].kind == "reduce")
            writer.emit("DecomposeReduction", [block, names[first_reduce]], [], writer.names("b", 1))

    @staticmethod
    def _parallel_prefix(state: TraceState, loops: list[Loop], max_parallel: int) -> int:
        """How many outer loops to fuse into the parallel loop, as TVM's
        ``RewriteParallelVectorizeUnroll`` counts them: spatial loops of the root stage, not
        annotated, each taken in until their extents multiply to more than ``max_parallel`` or
        one holds more than one statement (a block computed at it); none when the outer loop
        is already parallel (made so for a block before this one in the same nest). The loop
        that passes ``max_parallel`` is fused too: a batch-1 nest (1 x 192 x ...) is parallel
        over its channels, not over its unit batch loop alone, one thread."""
        if not loops:
            return 0
        host = state.schedule[loops[0].stage]
        if host.attach is not None:
            return 0
        if host.annotations.get(loops[0].leaf) == "parallel":
            return 0
        extents = leaf_extents(host)
        count, product = 0, 1
        for loop in loops:
            if loop.stage != host.name or host.axes[loop.leaf].kind != "spatial" or loop.leaf in host.annotations:
                break
            product *= extents[loop.leaf]
            count += 1
            if product > max_parallel or any(s.attach == (host.name, loop.leaf) for s in state.schedule.stages):
                break
        return count

