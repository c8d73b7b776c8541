"""Cost-model metrics, computed per workload and averaged (a model is judged by how well it
ranks the candidates of one workload, not by how well it separates workloads)."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import spearmanr

#: Pairs compared per workload at most (sampled beyond that, with a fixed seed).
MAX_PAIRS = 200_000


def r2_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Coefficient of determination; NaN when the truth is constant."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    total = float(((y_true - y_true.mean()) ** 2).sum())
    if total == 0:
        return float("nan")
    return 1.0 - float(((y_true - y_pred) ** 2).sum()) / total


def spearman(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Spearman rank correlation; NaN when either side is constant."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    if y_true.size < 2 or np.ptp(y_true) == 0 or np.ptp(y_pred) == 0:
        return float("nan")
    return float(spearmanr(y_true, y_pred).statistic)


def pairwise_accuracy(y_true: np.ndarray, y_pred: np.ndarray, seed: int = 0) -> float:
    """Fraction of candidate pairs with different truth that the prediction orders correctly
    (prediction ties count half)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    n = y_true.size
    if n < 2:
        return float("nan")
    if n * (n - 1) // 2 <= MAX_PAIRS:
        first, second = np.triu_indices(n, k=1)
    else:
        rng = np.random.default_rng(seed)
        first = rng.integers(0, n, MAX_PAIRS)
        second = rng.integers(0, n, MAX_PAIRS)
    true_sign = np.sign(y_true[first] - y_true[second])
    pred_sign = np.sign(y_pred[first] - y_pred[second])
    informative = true_sign != 0
    if not informative.any():
        return float("nan")
    agree = (true_sign == pred_sign)[informative].astype(np.float64)
    agree[(pred_sign == 0)[informative]] = 0.5
    return float(agree.mean())


def topk_score(y_true: np.ndarray, y_pred: np.ndarray, k: int) -> float:
    """TenSet's top-k score: best true throughput among the k best predicted candidates,
    divided by the best true throughput; NaN when no candidate has positive throughput."""
    y_true = np.asarray(y_true, dtype=np.float64)
    best = float(y_true.max()) if y_true.size else 0.0
    if best <= 0:
        return float("nan")
    picks = np.argsort(-np.asarray(y_pred, dtype=np.float64), kind="stable")[:k]
    return float(y_true[picks].max()) / best


def ndcg_at(scores: np.ndarray, gains: np.ndarray, k: int) -> float:
    """NDCG@k of ranking items by ``scores`` (higher first) when item i is worth ``gains[i]``
    (NaN when no item is worth anything)."""
    scores, gains = np.asarray(scores, dtype=float), np.asarray(gains, dtype=float)
    k = min(k, len(gains))
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = float(np.sort(gains)[::-1][:k] @ discount)
    got = float(gains[np.argsort(-scores, kind="stable")[:k]] @ discount)
    return got / ideal if ideal > 0 else float("nan")


def ndcg_of_random_orders(gains: np.ndarray, k: int, draws: int, rng: np.random.Generator) -> float:
    """The chance level of :func:`ndcg_at`: its mean over ``draws`` random orders of the items."""
    return float(np.mean([ndcg_at(rng.permutation(len(gains)).astype(float), gains, k) for _ in range(draws)]))


def relative_to_group_best(y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Throughput divided by the best throughput of its workload (0 where the best is 0)."""
    y = np.asarray(y, dtype=np.float64)
    _, codes = np.unique(groups, return_inverse=True)
    best = np.zeros(codes.max() + 1 if codes.size else 0)
    np.maximum.at(best, codes, y)
    scale = best[codes]
    return np.divide(y, scale, out=np.zeros_like(y), where=scale > 0)


def evaluate_by_workload(y_true: np.ndarray, y_pred: np.ndarray, groups: np.ndarray,
                         ks: tuple[int, ...] = (1, 5)) -> dict[str, Any]:
    """Per-workload R2 (against throughput relative to the workload's best), Spearman,
    pairwise accuracy and top-k scores, plus their means over workloads."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    groups = np.asarray(groups)
    relative = relative_to_group_best(y_true, groups)
    per_workload: dict[str, dict[str, float]] = {}
    for group in np.unique(groups):
        mask = groups == group
        truth, pred = y_true[mask], y_pred[mask]
        entry = {"n": int(mask.sum()), "r2": r2_score(relative[mask], pred),
                 "spearman": spearman(truth, pred), "pairwise_accuracy": pairwise_accuracy(truth, pred)}
        for k in ks:
            entry[f"top{k}"] = topk_score(truth, pred, k)
        per_workload[str(group)] = entry
    names = ["r2", "spearman", "pairwise_accuracy", *(f"top{k}" for k in ks)]
    summary: dict[str, Any] = {"workloads": len(per_workload), "records": int(y_true.size)}
    for name in names:
        values = np.array([entry[name] for entry in per_workload.values()], dtype=np.float64)
        finite = values[np.isfinite(values)]
        summary[name] = float(finite.mean()) if finite.size else float("nan")
    summary["r2_all"] = r2_score(relative, y_pred)
    return {"summary": summary, "per_workload": per_workload}
