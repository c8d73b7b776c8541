"""Simulated annealing over a cost model: find the points a model scores highest."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from lorien.search.base import IndexedSpace


def anneal(space: IndexedSpace, score: Callable[[np.ndarray], np.ndarray], num: int,
           rng: np.random.Generator, exclude: set[int], starts: Sequence[int] = (),
           parallel_size: int = 128, n_iter: int = 60, temperature: tuple[float, float] = (1.0, 0.0),
           ) -> list[int]:
    """The ``num`` best-scored indices not in ``exclude`` found by parallel annealing chains.

    ``score(indices)`` returns one score per index (higher is better). Chains start at
    ``starts`` (e.g. the best measured points) topped up with random indices; each step
    changes one knob of each chain and accepts worse points with probability
    ``exp(delta / t)`` as ``t`` cools linearly.
    """
    size = len(space)
    dims = np.array(space.dims)
    points = list(starts)[:parallel_size]
    points += [int(i) for i in rng.integers(size, size=parallel_size - len(points))]
    points_arr = np.array(points, dtype=np.int64)
    scores = score(points_arr)
    best: list[tuple[float, int]] = []
    in_heap: set[int] = set()

    def offer(indices: np.ndarray, values: np.ndarray) -> None:
        for index, value in zip(indices.tolist(), values.tolist(), strict=True):
            if index in exclude or index in in_heap:
                continue
            if len(best) < num:
                heapq.heappush(best, (value, index))
                in_heap.add(index)
            elif value > best[0][0]:
                _, dropped = heapq.heapreplace(best, (value, index))
                in_heap.discard(dropped)
                in_heap.add(index)

    offer(points_arr, scores)
    t_start, t_end = temperature
    radix = np.cumprod(np.concatenate([[1], dims[:-1]])).astype(np.int64)
    movable = np.flatnonzero(dims > 1)
    if len(movable) == 0:
        return [index for _, index in sorted(best, reverse=True)]
    for step in range(n_iter):
        t = t_start + (t_end - t_start) * step / max(1, n_iter - 1)
        proposals = _neighbors(points_arr, dims, radix, movable, rng)
        new_scores = score(proposals)
        delta = new_scores - scores
        accept = delta > 0
        if t > 0:
            accept |= rng.random(len(delta)) < np.exp(np.minimum(delta, 0) / t)
        points_arr = np.where(accept, proposals, points_arr)
        scores = np.where(accept, new_scores, scores)
        offer(proposals, new_scores)
    return [index for _, index in sorted(best, reverse=True)]


def _neighbors(indices: np.ndarray, dims: np.ndarray, radix: np.ndarray, movable: np.ndarray,
               rng: np.random.Generator) -> np.ndarray:
    """Each index with one random knob moved to a different random position (mixed radix)."""
    knobs = movable[rng.integers(len(movable), size=len(indices))]
    current = (indices // radix[knobs]) % dims[knobs]
    choice = (rng.random(len(indices)) * (dims[knobs] - 1)).astype(np.int64)
    new = np.where(choice < current, choice, choice + 1)
    return indices + (new - current) * radix[knobs]
