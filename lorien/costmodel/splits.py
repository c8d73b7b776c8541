"""How training and evaluation rows are chosen: whole workloads held out, a fraction of each
workload's rows, the rows of one target."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lorien.errors import LorienError
from lorien.target import match_tier, parse_target


def group_kfold(groups: np.ndarray, folds: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) row indices; each workload is in exactly one test fold."""
    unique = np.unique(groups)
    if unique.size < 2:
        raise LorienError(f"need at least 2 workloads to hold one out, got {unique.size}")
    folds = max(2, min(folds, unique.size))
    rng = np.random.default_rng(seed)
    shuffled = unique[rng.permutation(unique.size)]
    fold_of = {group: i % folds for i, group in enumerate(shuffled)}
    assignment = np.array([fold_of[g] for g in groups])
    return [(np.flatnonzero(assignment != k), np.flatnonzero(assignment == k)) for k in range(folds)]


def target_rows(frame: pd.DataFrame, target: str) -> np.ndarray:
    """Boolean mask of the rows whose stored target matches ``target`` (the query rule)."""
    if "target" not in frame.columns:
        raise LorienError("the features carry no target column (written by an older `lorien featurize`): "
                          "featurize the records again")
    query = parse_target(target).canonical
    stored = frame["target"].astype(str)
    matching = {value for value in stored.unique() if match_tier(query, value) is not None}
    return stored.isin(matching).to_numpy()


def sample_by_workload(groups: np.ndarray, rows: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """``fraction`` of ``rows`` of each workload, drawn at random (sorted); at least two rows of
    a workload when ``fraction`` > 0, so a ranking objective sees a pair."""
    if not 0.0 <= fraction <= 1.0:
        raise LorienError(f"a fraction of the target's data is between 0 and 1, got {fraction}")
    if fraction == 0.0 or rows.size == 0:
        return rows[:0]
    if fraction == 1.0:
        return rows
    rng = np.random.default_rng(seed)
    chosen = []
    for group in np.unique(groups[rows]):
        members = rows[groups[rows] == group]
        take = min(members.size, max(2, int(round(fraction * members.size))))
        chosen.append(rng.choice(members, size=take, replace=False))
    return np.sort(np.concatenate(chosen))
