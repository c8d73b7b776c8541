"""The search space of a workload: its sketches and the choices that complete them.

Knobs, as an indexed space (``lorien.search``): which sketch; for every tiling split the
lengths (a factorization of the loop's extent, innermost at most ``max_innermost``); for
every stage of open compute location (padding) where it goes (``LOCATIONS``); how
many iterations per core the parallel loop should reach (``PARALLEL_CHUNKS``); the
``auto_unroll_max_step`` value. A point
renders to Ansor steps (:func:`sketch.render`), so tuners of :mod:`lorien.search` search it
as they search AutoTVM spaces, and records are Ansor records.

Tiling splits are shared across sketches by their position among the sketch's tiling
splits, extent and level count (the same anchor loop in the fused, cache-write and plain
sketches). :meth:`SketchSpace.mutate` is Ansor's mutation: mostly a tile-size move (one prime
factor of a split moves from one level to another), sometimes another unroll step, compute
location, sketch or parallel depth.

A last knob with a single value carries the workload's shape (log2 of its arguments): it
changes no point, but lets one cost model learn from records of other workloads of the same
function (:meth:`SketchSpace.features_of_steps` gives their features in this space's layout).
:meth:`SketchSpace.derived_features` adds the tile volumes per tiling level, which carry
across shapes better than the per-loop factors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dialects.auto_scheduler.sketch import (
    AUTO_UNROLL_STEPS,
    LOCATIONS,
    PARALLEL_CHUNKS,
    REDUCE_LEVELS,
    SPATIAL_LEVELS,
    generate_sketches,
    location_steps,
    render,
    sketch_state,
)
from lorien.engine.dag import ComputeDAG
from lorien.errors import DialectError
from lorien.search.base import MixedRadixSpace
from lorien.search.tiles import MAX_INNERMOST, divisors, factorizations, move_factor, other_choice

#: Names of :meth:`SketchSpace.derived_features` (log2 of tile volumes: spatial levels
#: S0..S3, reduce levels R0..R1, output tiles below S0 and S1, the innermost block's work).
DERIVED_FEATURES = ("tile_s0", "tile_s1", "tile_s2", "tile_s3", "tile_r0", "tile_r1",
                    "tile_below_s0", "tile_below_s1", "block_s3_r1")
#: Innermost tile the sampler wants on a vectorized loop (8 float32 lanes: one AVX2 vector).
VECTOR_TILE = 8
#: Probability of each mutation kind (Ansor's CPU defaults, its compute-location share split
#: between the open compute locations and the sketch's fused or cached structure).
MUTATIONS = (("tile", 0.90), ("unroll", 0.04), ("location", 0.03), ("sketch", 0.02), ("parallel", 0.01))


@dataclass(frozen=True)
class TileKnob:
    """One tiling split: its key across sketches and the factorizations it may take."""

    key: tuple[int, int, int]
    entities: tuple[tuple[int, ...], ...]


class SketchSpace(MixedRadixSpace):
    """All programs of a workload's sketches, as an indexed space (first knob least significant)."""

    #: The sketch knob: a tuner's first batch measures each sketch (the rfactor one among them).
    path_knobs = (0,)

    def __init__(self, dag: ComputeDAG, args: Sequence[Any] = (), max_innermost: int = MAX_INNERMOST):
        self.dag = dag
        self.shape_features = shape_features(args)
        self.sketches = generate_sketches(dag)
        if not self.sketches:
            raise DialectError(f"no sketch for the DAG of stages {dag.stage_names}")
        self.tiles: list[TileKnob] = []
        self._tile_of: list[list[int]] = []  # per sketch: knob of each tiling split
        for sketch in self.sketches:
            knobs = []
            for ordinal, step_index in enumerate(sketch.tile_steps):
                step = sketch.steps[step_index]
                key = (ordinal, int(step[3]), len(step[4]) + 1)
                found = next((i for i, t in enumerate(self.tiles) if t.key == key), None)
                if found is None:
                    self.tiles.append(TileKnob(key, tuple(factorizations(key[1], key[2], max_innermost))))
                    found = len(self.tiles) - 1
                knobs.append(found)
            self._tile_of.append(knobs)
        #: Stages of open compute location, one knob each (shared by the sketches that place them).
        self.located = sorted({stage_id for sketch in self.sketches for stage_id in sketch.located})
        self.dims = [len(self.sketches), *(len(t.entities) for t in self.tiles), *([len(LOCATIONS)] * len(self.located)),
                     len(PARALLEL_CHUNKS), len(AUTO_UNROLL_STEPS), 1]
        states = [sketch_state(dag, sketch.steps) for sketch in self.sketches]
        self._placements = [self._placement_steps(sketch, state) for sketch, state in zip(self.sketches, states,
                                                                                           strict=True)]
        # the prior of sample(): the vectorized (last spatial) split of a tiled stage draws
        # only factorizations whose innermost tile fills a vector where some can
        self._prior: dict[int, list[int]] = {}
        for sketch_id, (sketch, state) in enumerate(zip(self.sketches, states, strict=True)):
            for knob, step_index in zip(self._tile_of[sketch_id], sketch.tile_steps, strict=True):
                step = sketch.steps[step_index]
                if step_index in sketch.vector_splits:  # the rfactor sketch's reduction split: whole vectors
                    entities = self.tiles[knob].entities
                    lanes = max((f for f in divisors(step[3]) if f <= VECTOR_TILE), default=1)
                    self._prior[knob] = [i for i, e in enumerate(entities) if e[-1] % lanes == 0]
                elif step[2] == SPATIAL_LEVELS * (len(state.stage(step[1]).op.axis) - 1):
                    entities = self.tiles[knob].entities
                    lanes = max((f for f in divisors(step[3]) if f <= VECTOR_TILE), default=1)
                    self._prior[knob] = [i for i, e in enumerate(entities) if e[-1] >= lanes]
        if len(self) >= 1 << 62:
            raise DialectError(f"the search space of stages {dag.stage_names} has {len(self)} points, "
                               "more than an index can hold")
        self._entity_index = [{entity: i for i, entity in enumerate(t.entities)} for t in self.tiles]
        self._log_entities = [np.log2(np.array(t.entities, dtype=float)) for t in self.tiles]
        # columns of the knob features (log2 of each level's tile factor) per tiling level
        self._level_columns: dict[tuple[str, int], list[int]] = {}
        column = 1
        for tile in self.tiles:
            kind = "S" if tile.key[2] == SPATIAL_LEVELS else "R"
            for level in range(tile.key[2]):
                self._level_columns.setdefault((kind, level), []).append(column + level)
            column += tile.key[2]

    def get(self, index: int) -> list[list[Any]]:
        """The Ansor steps of point ``index``."""
        positions = self.knob_indices(index)
        sketch_id, chunks, unroll = positions[0], PARALLEL_CHUNKS[positions[-3]], AUTO_UNROLL_STEPS[positions[-2]]
        lengths = [self.tiles[k].entities[positions[1 + k]][1:] for k in self._tile_of[sketch_id]]
        return render(self.dag, self.sketches[sketch_id], lengths, chunks, unroll,
                      self._locations(sketch_id, positions))

    def _placement_steps(self, sketch: Any, state: Any) -> dict[str, tuple[int, int]]:
        """Per step that places an open stage in this sketch (keyed by its repr; ``state``:
        the sketch's loop state): (location knob, entity)."""
        found = {}
        for stage_id in sketch.located:
            for entity, where in enumerate(LOCATIONS):
                for step in location_steps(state, dataclasses.replace(sketch, located=[stage_id]), [where]):
                    found.setdefault(repr(step), (self.located.index(stage_id), entity))
        return found

    def _read_locations(self, sketch_id: int, tail: Sequence[Sequence[Any]]) -> list[int] | None:
        """The location entity of each open stage from the steps after a sketch's own (root
        where no step places it), or None when a placing step fits none of :data:`LOCATIONS`."""
        entities = [LOCATIONS.index("root")] * len(self.located)
        for step in tail:
            if step[0] in ("CI", "CA") and step[1] in self.located:
                placed = self._placements[sketch_id].get(repr(list(step)))
                if placed is None:
                    return None
                entities[placed[0]] = placed[1]
        return entities

    def _locations(self, sketch_id: int, positions: Sequence[int]) -> list[str]:
        """The compute location of each stage the sketch leaves open, from a point's knobs."""
        first = 1 + len(self.tiles)
        return [LOCATIONS[positions[first + self.located.index(stage_id)]]
                for stage_id in self.sketches[sketch_id].located]

    def knob_feature_tables(self) -> list[np.ndarray]:
        """Per knob, features of each of its entities (log2 of tile factors, values)."""
        tables = [np.arange(len(self.sketches), dtype=float).reshape(-1, 1)]
        tables += [np.log2(np.array(t.entities, dtype=float)) for t in self.tiles]
        tables += [np.eye(len(LOCATIONS)) for _ in self.located]
        tables.append(np.log2(np.minimum(PARALLEL_CHUNKS, 64.0)).reshape(-1, 1))
        tables.append(np.log2(1.0 + np.array(AUTO_UNROLL_STEPS, dtype=float)).reshape(-1, 1))
        tables.append(np.array([self.shape_features], dtype=float).reshape(1, -1))
        return tables

    def derived_features(self, rows: np.ndarray) -> np.ndarray:
        """Columns combining the tile knobs of feature rows (:meth:`knob_feature_tables`
        layout), see :data:`DERIVED_FEATURES`: log2 of the tile volume at each spatial and
        reduce level (the product over loops), of the output tile below levels 1 and 2, and
        of the work of the innermost block (``S3`` x ``R1``). A register tile or a cache
        block that suits the machine has the same volume in any shape, so records of other
        workloads teach it; trees learn such products poorly from the parts."""
        rows = np.asarray(rows, dtype=float)

        def level(kind: str, index: int) -> np.ndarray:
            columns = self._level_columns.get((kind, index), [])
            return rows[:, columns].sum(axis=1) if columns else np.zeros(len(rows))

        s = [level("S", i) for i in range(SPATIAL_LEVELS)]
        r = [level("R", i) for i in range(REDUCE_LEVELS)]
        return np.stack([*s, *r, s[1] + s[2] + s[3], s[2] + s[3], s[3] + r[-1]], axis=1)

    def _sketch_of(self, steps: Sequence[Sequence[Any]]) -> int | None:
        """The first sketch whose steps a program (of any workload of this function) starts
        with, extents and split lengths aside; None when none fits."""
        return next((sketch_id for sketch_id, sketch in enumerate(self.sketches)
                     if len(steps) >= len(sketch.steps)
                     and all(_skeleton(a) == _skeleton(b) for a, b in zip(steps, sketch.steps, strict=False))), None)

    def features_of_steps(self, steps: Sequence[Sequence[Any]], args: Sequence[Any]) -> np.ndarray | None:
        """The feature row (as :meth:`knob_feature_tables` gives for a point) of a record of
        another workload of the same function, or None when its steps fit no sketch here."""
        steps = [list(step) for step in steps]
        sketch_id = self._sketch_of(steps)
        if sketch_id is None:
            return None
        sketch = self.sketches[sketch_id]
        row = [float(sketch_id)]
        used = dict(zip(self._tile_of[sketch_id], sketch.tile_steps, strict=True))
        for k, tile in enumerate(self.tiles):
            if k not in used:
                row.extend([0.0] * tile.key[2])
                continue
            step = steps[used[k]]
            inner = math.prod(step[4])
            if step[3] % inner:
                return None
            row.extend(math.log2(v) for v in (step[3] // inner, *step[4]))
        tail = steps[len(sketch.steps):]
        locations = self._read_locations(sketch_id, tail)
        if locations is None:
            return None
        for entity in locations:
            row.extend(np.eye(len(LOCATIONS))[entity])
        row.append(math.nan)  # the parallel knob depends on this workload's extents: unknown
        row.append(math.log2(1.0 + _unroll_step(tail)))
        row.extend(shape_features(args))
        return np.array(row, dtype=float)

    def nearest_point(self, steps: Sequence[Sequence[Any]]) -> int | None:
        """The point of this space closest to a program of another workload of the same
        function (a transfer seed): its sketch (matched by step skeleton), every tiling split
        the factorization of this extent whose inner tile lengths are nearest in log2 to the
        program's, its compute locations, unroll step and parallel depth (the depth whose
        rendering fuses as many outer loops of each stage, else 16 iterations per core).
        None when its steps fit no sketch here."""
        steps = [list(step) for step in steps]
        sketch_id = self._sketch_of(steps)
        if sketch_id is None:
            return None
        sketch = self.sketches[sketch_id]
        tail = steps[len(sketch.steps):]
        locations = self._read_locations(sketch_id, tail) or [LOCATIONS.index("root")] * len(self.located)
        positions = [sketch_id] + [0] * len(self.tiles) + locations + [0, 0, 0]
        for k, step_index in zip(self._tile_of[sketch_id], sketch.tile_steps, strict=True):
            wanted = np.log2(np.maximum(np.array(steps[step_index][4], dtype=float), 1.0))
            table = self._log_entities[k][:, 1:]
            positions[1 + k] = int(np.argmin(np.abs(table - wanted).sum(axis=1)))
        unroll = math.log2(1 + _unroll_step(tail))
        positions[-2] = int(np.argmin([abs(math.log2(1 + u) - unroll) for u in AUTO_UNROLL_STEPS]))
        fused = [(s[1], len(s[2])) for s in tail if s[0] == "FU"]
        for parallel in range(len(PARALLEL_CHUNKS)):
            positions[-3] = parallel
            rendered = self.get(self.index_of_knobs(positions))[len(sketch.steps):]
            if [(s[1], len(s[2])) for s in rendered if s[0] == "FU"] == fused:
                break
        else:
            positions[-3] = PARALLEL_CHUNKS.index(16)
        return self.index_of_knobs(positions)

    # ------------------------------------------------------------ evolution
    def sample(self, rng: np.random.Generator) -> int:
        """A random point: every knob uniform, except that the vectorized split of each tiled
        stage keeps an innermost tile of at least :data:`VECTOR_TILE` lanes (or the largest
        its extent allows): programs with scalar inner loops are orders of magnitude slower."""
        positions = [int(rng.integers(dim)) for dim in self.dims]
        for knob, allowed in self._prior.items():
            positions[1 + knob] = allowed[int(rng.integers(len(allowed)))]
        return self.index_of_knobs(positions)

    def mutate(self, index: int, rng: np.random.Generator) -> int:
        """One of Ansor's mutations of a point (see the module docstring)."""
        positions = self.knob_indices(index)
        kinds, weights = zip(*MUTATIONS, strict=True)
        kind = kinds[int(rng.choice(len(kinds), p=np.array(weights) / sum(weights)))]
        used = [k for k in self._tile_of[positions[0]] if len(self.tiles[k].entities) > 1]
        if kind == "tile" and used:
            knob = used[int(rng.integers(len(used)))]
            positions[1 + knob] = self._move_factor(knob, positions[1 + knob], rng)
        elif kind == "location" and self.located:
            knob = 1 + len(self.tiles) + int(rng.integers(len(self.located)))
            positions[knob] = other_choice(positions[knob], len(LOCATIONS), rng)
        elif kind == "sketch" and len(self.sketches) > 1:
            positions[0] = other_choice(positions[0], len(self.sketches), rng)
        elif kind == "parallel":
            positions[-3] = other_choice(positions[-3], len(PARALLEL_CHUNKS), rng)
        else:
            positions[-2] = other_choice(positions[-2], len(AUTO_UNROLL_STEPS), rng)
        return self.index_of_knobs(positions)

    def _move_factor(self, knob: int, position: int, rng: np.random.Generator) -> int:
        return move_factor(self.tiles[knob].entities, self._entity_index[knob], position, rng)

    # ------------------------------------------------------------ records back to points
    def index_of_steps(self, steps: Sequence[Sequence[Any]]) -> int | None:
        """The point whose rendering gives exactly ``steps``, or None (a record made elsewhere)."""
        steps = [list(step) for step in steps]
        for sketch_id, sketch in enumerate(self.sketches):
            if len(steps) < len(sketch.steps) or any(
                    _shape(a) != _shape(b) for a, b in zip(steps, sketch.steps, strict=False)):
                continue
            locations = self._read_locations(sketch_id, steps[len(sketch.steps):])
            if locations is None:
                continue
            positions = [sketch_id] + [0] * len(self.tiles) + locations + [0, 0, 0]
            try:
                for k, step_index in zip(self._tile_of[sketch_id], sketch.tile_steps, strict=True):
                    step = steps[step_index]
                    outer = step[3] // math.prod(step[4])
                    positions[1 + k] = self._entity_index[k][(outer, *step[4])]
            except (KeyError, TypeError, ZeroDivisionError):
                continue
            unroll = _unroll_step(steps[len(sketch.steps):])
            if unroll not in AUTO_UNROLL_STEPS:
                continue
            positions[-2] = AUTO_UNROLL_STEPS.index(unroll)
            for parallel in range(len(PARALLEL_CHUNKS)):
                positions[-3] = parallel
                index = self.index_of_knobs(positions)
                if self.get(index) == steps:
                    return index
        return None


def _unroll_step(steps: Sequence[Sequence[Any]]) -> int:
    """The ``auto_unroll_max_step`` value of a program's first unroll pragma (0 without one)."""
    return next((int(str(step[3]).split("$")[1]) for step in steps if step[0] == "PR"), 0)


def _shape(step: Sequence[Any]) -> list[Any]:
    """A step without its split lengths (what a sketch fixes)."""
    return [*step[:4], step[5]] if step[0] == "SP" else list(step)


def _skeleton(step: Sequence[Any]) -> list[Any]:
    """A step without extents and lengths (what sketches of one function share across shapes)."""
    return [*step[:3], len(step[4]), step[5]] if step[0] == "SP" else list(step)


def shape_features(args: Sequence[Any]) -> list[float]:
    """log2(1 + |x|) of every number of a workload's arguments (booleans 0 or 1, strings skipped)."""
    found: list[float] = []
    for arg in args:
        if isinstance(arg, (list, tuple)):
            found.extend(shape_features(arg))
        elif isinstance(arg, bool):
            found.append(float(arg))
        elif isinstance(arg, (int, float)):
            found.append(math.log2(1.0 + abs(arg)))
    return found
