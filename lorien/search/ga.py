"""Genetic search over knob positions (AutoTVM's GATuner idea).

Each config is a genome of per-knob entity positions. After every ``pop_size`` measured
trials a generation ends: the ``elite_num`` fittest genomes survive unchanged, the rest are
children of fitness-proportional parents (uniform crossover) whose genes mutate with
probability ``mutation_prob``. Children already measured are replaced, so no point repeats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lorien.search.base import IndexedSpace, MeasuredLike, Tuner, result_cost
from lorien.search.random_search import sample_unvisited


class GATuner(Tuner):
    """Genetic algorithm with elitism."""

    def __init__(self, space: IndexedSpace, seed: int | None = None, pop_size: int = 100,
                 elite_num: int = 3, mutation_prob: float = 0.1):
        super().__init__(space, seed)
        if pop_size < 1 or not 0 <= elite_num <= pop_size or not 0 <= mutation_prob <= 1:
            raise ValueError(f"need pop_size >= 1, 0 <= elite_num <= pop_size, 0 <= mutation_prob <= 1;"
                             f" got {pop_size}, {elite_num}, {mutation_prob}")
        self.pop_size = min(pop_size, len(space))
        self.elite_num = min(elite_num, self.pop_size)
        self.mutation_prob = mutation_prob
        self.fitness: dict[int, float] = {}
        self.elites: list[int] = []
        self._queue: list[int] = sample_unvisited(self, self.pop_size)
        self._generation: list[int] = []
        self.generations = 0

    def next_batch(self, n: int) -> list[int]:
        batch: list[int] = []
        while len(batch) < n and self.has_next():
            if not self._queue:
                # The generation is proposed but not fully measured yet: add fresh explorers.
                self._queue = sample_unvisited(self, n - len(batch))
                if not self._queue:
                    break
            index = self._queue.pop(0)
            if index in self.visited:
                continue
            batch.append(self._mark(index))
        return batch

    def update(self, indices: Sequence[int], results: Sequence[MeasuredLike]) -> None:
        super().update(indices, results)
        for index, result in zip(indices, results, strict=True):
            cost = result_cost(result)
            self.fitness[int(index)] = 0.0 if math.isinf(cost) else 1.0 / cost
            self._generation.append(int(index))
        if len(self._generation) >= self.pop_size:
            self._evolve()

    def _evolve(self) -> None:
        """End a generation: keep elites, breed the next population."""
        self.generations += 1
        ranked = sorted(self.fitness, key=self.fitness.__getitem__, reverse=True)
        self.elites = ranked[: self.elite_num]
        population = ranked[: self.pop_size]
        scores = np.array([self.fitness[i] for i in population], dtype=float)
        if scores.sum() <= 0:
            scores = np.ones_like(scores)
        probs = scores / scores.sum()
        genomes = [self.space.knob_indices(i) for i in population]
        dims = self.space.dims
        children: list[int] = []
        wanted = self.pop_size - len(self.elites)
        attempts = 0
        while len(children) < wanted and attempts < wanted * 20:
            attempts += 1
            mother, father = self.rng.choice(len(population), size=2, p=probs)
            mask = self.rng.random(len(dims)) < 0.5
            child = [genomes[mother][k] if mask[k] else genomes[father][k] for k in range(len(dims))]
            for k, dim in enumerate(dims):
                if self.rng.random() < self.mutation_prob:
                    child[k] = int(self.rng.integers(dim))
            index = self.space.index_of_knobs(child)
            if index not in self.visited and index not in children:
                children.append(index)
        if len(children) < wanted:
            children += [i for i in sample_unvisited(self, wanted - len(children)) if i not in children]
        self._queue = children
        self._generation = []
