"""Evolutionary search over a cost model (Ansor's optimizer): find the points a model scores highest.

A population (the best measured points, topped up with random ones, drawn from the space's
own prior ``sample(rng)`` when it has one) is scored by the model;
each generation draws parents with probability proportional to their score and mutates each
with probability ``mutation_prob`` (the space's own ``mutate(index, rng)`` when it has one,
e.g. Ansor's tile-size moves; otherwise one knob set to another value). Every point scored on
the way competes for the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lorien.search.base import IndexedSpace
from lorien.search.random_search import draw


def random_neighbor(space: IndexedSpace, index: int, rng: np.random.Generator) -> int:
    """``index`` with one knob (of more than one value) moved to another value."""
    positions = space.knob_indices(index)
    movable = [k for k, dim in enumerate(space.dims) if dim > 1]
    if not movable:
        return int(index)
    knob = movable[int(rng.integers(len(movable)))]
    choice = int(rng.integers(space.dims[knob] - 1))
    positions[knob] = choice if choice < positions[knob] else choice + 1
    return space.index_of_knobs(positions)


def evolve(space: IndexedSpace, score: Callable[[np.ndarray], np.ndarray], num: int,
           rng: np.random.Generator, exclude: set[int], starts: Sequence[int] = (),
           population: int = 256, generations: int = 4, mutation_prob: float = 0.85) -> list[int]:
    """The ``num`` best-scored indices not in ``exclude`` (best first); see the module docstring."""
    mutate: Callable[[int, np.random.Generator], int] = getattr(
        space, "mutate", lambda index, generator: random_neighbor(space, index, generator))
    pool = list(dict.fromkeys(int(i) for i in starts))[:population]
    pool += [draw(space, rng) for _ in range(population - len(pool))]
    found: dict[int, float] = {}
    for generation in range(generations + 1):
        scores = np.asarray(score(np.array(pool, dtype=np.int64)), dtype=float)
        for index, value in zip(pool, scores.tolist(), strict=True):
            if index not in exclude:
                found[index] = value
        if generation == generations:
            break
        weights = np.maximum(scores - scores.min(), 0.0) + 1e-9
        parents = rng.choice(len(pool), size=population, p=weights / weights.sum())
        pool = [mutate(pool[p], rng) if rng.random() < mutation_prob else pool[p] for p in parents.tolist()]
    return sorted(found, key=found.__getitem__, reverse=True)[:num]
