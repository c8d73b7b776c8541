"""The search space of a workload: its sketches and the choices that complete them.

Knobs, as an indexed space (``lorien.search``): which sketch; for every tiling split the
lengths (a factorization of the loop's extent, innermost at most ``max_innermost``); how
many outer loops are fused into the parallel loop; the ``auto_unroll_max_step`` value. A point
renders to Ansor steps (:func:`sketch.render`), so tuners of :mod:`lorien.search` search it
as they search AutoTVM spaces, and records are Ansor records.

Tiling splits are shared across sketches by their position among the sketch's tiling
splits, extent and level count (the same anchor loop in the fused, cache-write and plain
sketches). :meth:`SketchSpace.mutate` is Ansor's mutation: mostly a tile-size move (one prime
factor of a split moves from one level to another), sometimes another unroll step, sketch or
parallel depth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dialects.auto_scheduler.dag import ComputeDAG
from dialects.auto_scheduler.sketch import (
    AUTO_UNROLL_STEPS,
    LoopState,
    _filled,
    generate_sketches,
    parallel_candidates,
    render,
)
from lorien.errors import DialectError

MAX_INNERMOST = 64
#: Probability of each mutation kind (Ansor's CPU defaults, compute location folded into sketch).
MUTATIONS = (("tile", 0.90), ("unroll", 0.04), ("sketch", 0.05), ("parallel", 0.01))


def _divisors(value: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(value) + 1) if value % d == 0]
    return sorted(set(small + [value // d for d in small]))


def factorizations(extent: int, parts: int, max_innermost: int = MAX_INNERMOST) -> list[tuple[int, ...]]:
    """Every way to write ``extent`` as an ordered product of ``parts`` factors (outermost
    first), the innermost at most ``max_innermost``."""
    if parts == 1:
        return [(extent,)] if extent <= max_innermost else []
    return [(first, *rest) for first in _divisors(extent)
            for rest in factorizations(extent // first, parts - 1, max_innermost)]


def _primes(value: int) -> list[int]:
    primes, p = [], 2
    while p * p <= value:
        while value % p == 0:
            primes.append(p)
            value //= p
        p += 1
    return primes + ([value] if value > 1 else [])


@dataclass(frozen=True)
class TileKnob:
    """One tiling split: its key across sketches and the factorizations it may take."""

    key: tuple[int, int, int]
    entities: tuple[tuple[int, ...], ...]


class SketchSpace:
    """All programs of a workload's sketches, as an indexed space (first knob least significant)."""

    def __init__(self, dag: ComputeDAG, max_innermost: int = MAX_INNERMOST):
        self.dag = dag
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
        self.max_parallel = max(1, max(self._parallel_candidates(s) for s in self.sketches))
        self.dims = [len(self.sketches), *(len(t.entities) for t in self.tiles), self.max_parallel,
                     len(AUTO_UNROLL_STEPS)]
        self._size = math.prod(self.dims)
        if self._size >= 1 << 62:
            raise DialectError(f"the search space of stages {dag.stage_names} has {self._size} points, "
                               "more than an index can hold")
        self._radix = np.cumprod([1, *self.dims[:-1]]).astype(np.int64)
        self._entity_index = [{entity: i for i, entity in enumerate(t.entities)} for t in self.tiles]

    def _parallel_candidates(self, sketch: Any) -> int:
        state = LoopState(self.dag)
        for step in _filled(sketch.steps):
            state.apply(step)
        return max((parallel_candidates(state, st) for st in state.schedule.stages if st.attach is None),
                   default=1)

    # ------------------------------------------------------------ IndexedSpace
    def __len__(self) -> int:
        return self._size

    def knob_indices(self, index: int) -> list[int]:
        index = int(index)
        positions = []
        for dim in self.dims:
            positions.append(index % dim)
            index //= dim
        return positions

    def index_of_knobs(self, positions: Sequence[int]) -> int:
        return int(sum(int(p) * int(r) for p, r in zip(positions, self._radix, strict=True)))

    def get(self, index: int) -> list[list[Any]]:
        """The Ansor steps of point ``index``."""
        positions = self.knob_indices(index)
        sketch_id, parallel, unroll = positions[0], positions[-2] + 1, AUTO_UNROLL_STEPS[positions[-1]]
        lengths = [self.tiles[k].entities[positions[1 + k]][1:] for k in self._tile_of[sketch_id]]
        return render(self.dag, self.sketches[sketch_id], lengths, parallel, unroll)

    def knob_feature_tables(self) -> list[np.ndarray]:
        """Per knob, features of each of its entities (log2 of tile factors, values)."""
        tables = [np.arange(len(self.sketches), dtype=float).reshape(-1, 1)]
        tables += [np.log2(np.array(t.entities, dtype=float)) for t in self.tiles]
        tables.append(np.arange(1, self.max_parallel + 1, dtype=float).reshape(-1, 1))
        tables.append(np.log2(1.0 + np.array(AUTO_UNROLL_STEPS, dtype=float)).reshape(-1, 1))
        return tables

    # ------------------------------------------------------------ evolution
    def mutate(self, index: int, rng: np.random.Generator) -> int:
        """One of Ansor's mutations of a point (see the module docstring)."""
        positions = self.knob_indices(index)
        kinds, weights = zip(*MUTATIONS, strict=True)
        kind = kinds[int(rng.choice(len(kinds), p=np.array(weights) / sum(weights)))]
        used = [k for k in self._tile_of[positions[0]] if len(self.tiles[k].entities) > 1]
        if kind == "tile" and used:
            knob = used[int(rng.integers(len(used)))]
            positions[1 + knob] = self._move_factor(knob, positions[1 + knob], rng)
        elif kind == "sketch" and len(self.sketches) > 1:
            positions[0] = _other(positions[0], len(self.sketches), rng)
        elif kind == "parallel" and self.max_parallel > 1:
            positions[-2] = _other(positions[-2], self.max_parallel, rng)
        else:
            positions[-1] = _other(positions[-1], len(AUTO_UNROLL_STEPS), rng)
        return self.index_of_knobs(positions)

    def _move_factor(self, knob: int, position: int, rng: np.random.Generator) -> int:
        """A factorization with one prime factor moved from one level to another."""
        parts = list(self.tiles[knob].entities[position])
        sources = [i for i, v in enumerate(parts) if v > 1]
        for _ in range(8):
            src = sources[int(rng.integers(len(sources)))]
            dst = _other(src, len(parts), rng)
            primes = _primes(parts[src])
            prime = primes[int(rng.integers(len(primes)))]
            moved = list(parts)
            moved[src] //= prime
            moved[dst] *= prime
            found = self._entity_index[knob].get(tuple(moved))
            if found is not None:
                return found
        return _other(position, len(self.tiles[knob].entities), rng)

    # ------------------------------------------------------------ records back to points
    def index_of_steps(self, steps: Sequence[Sequence[Any]]) -> int | None:
        """The point whose rendering gives exactly ``steps``, or None (a record made elsewhere)."""
        steps = [list(step) for step in steps]
        for sketch_id, sketch in enumerate(self.sketches):
            if len(steps) < len(sketch.steps) or any(
                    _shape(a) != _shape(b) for a, b in zip(steps, sketch.steps, strict=False)):
                continue
            positions = [sketch_id] + [0] * len(self.tiles) + [0, 0]
            try:
                for k, step_index in zip(self._tile_of[sketch_id], sketch.tile_steps, strict=True):
                    step = steps[step_index]
                    outer = step[3] // math.prod(step[4])
                    positions[1 + k] = self._entity_index[k][(outer, *step[4])]
            except (KeyError, TypeError, ZeroDivisionError):
                continue
            unroll = next((int(str(s[3]).split("$")[1]) for s in steps[len(sketch.steps):] if s[0] == "PR"), 0)
            if unroll not in AUTO_UNROLL_STEPS:
                continue
            positions[-1] = AUTO_UNROLL_STEPS.index(unroll)
            for parallel in range(self.max_parallel):
                positions[-2] = parallel
                index = self.index_of_knobs(positions)
                if self.get(index) == steps:
                    return index
        return None


def _shape(step: Sequence[Any]) -> list[Any]:
    """A step without its split lengths (what a sketch fixes)."""
    return [*step[:4], step[5]] if step[0] == "SP" else list(step)


def _other(current: int, size: int, rng: np.random.Generator) -> int:
    """A uniformly chosen value in ``range(size)`` other than ``current``."""
    choice = int(rng.integers(size - 1))
    return choice if choice < current else choice + 1
