"""benchmarks/pretrained_offline.py: the scores of a model's order of a measured set."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def offline():
    return load_benchmark("pretrained_offline.py", "bench_pretrained_offline")


THROUGHPUT = np.array([1.0, 4.0, 2.0, 3.9, 0.0, 0.5, 0.2, 0.3, 0.1])


def test_the_right_order_reaches_95_percent_at_trial_one_and_a_reversed_one_late(offline):
    best_first = offline.order_scores(THROUGHPUT, THROUGHPUT)
    assert best_first["t95"] == 1 and best_first["top1"] == 1.0 and best_first["ndcg8"] == pytest.approx(1.0)
    worst_first = offline.order_scores(-THROUGHPUT, THROUGHPUT)
    # measured slowest first: 0, 0.1, 0.2, 0.3, 0.5, 1, 2, 3.9 (0.975 of the best) at trial 8
    assert worst_first["t95"] == 8
    assert worst_first["top1"] == 0.0 and worst_first["top5"] == pytest.approx(0.5 / 4.0)
    assert worst_first["top8"] == pytest.approx(3.9 / 4.0)


def test_chance_lies_between_the_best_and_the_worst_order(offline):
    chance = offline.chance_scores(THROUGHPUT, draws=200)
    assert 1.0 < chance["t95"] < 8.0
    assert 0.0 < chance["top1"] < 1.0
    assert chance["ndcg8"] < offline.order_scores(THROUGHPUT, THROUGHPUT)["ndcg8"]


def test_first_batch_from_pools_counts_trials_within_the_batch(offline):
    def top_k(indices, k):  # a guide that knows the truth
        return np.asarray(indices)[np.argsort(-THROUGHPUT[indices], kind="stable")][:k]

    first, batch, trials = offline.pool_scores(top_k, THROUGHPUT, pool=len(THROUGHPUT))
    assert (first, batch, trials) == (1.0, 1.0, 1.0)

    def bottom_k(indices, k):  # one that picks the slowest first: its 8th pick of 9 is 3.9 of 4
        return np.asarray(indices)[np.argsort(THROUGHPUT[indices], kind="stable")][:k]

    first, batch, trials = offline.pool_scores(bottom_k, THROUGHPUT, pool=len(THROUGHPUT))
    assert first == 0.0 and batch == pytest.approx(3.9 / 4.0) and trials == 8.0
    # small pools seldom hold the best, so even the truth's first pick is worse on average
    first, _, _ = offline.pool_scores(top_k, THROUGHPUT, pool=3, draws=100)
    assert first < 1.0
