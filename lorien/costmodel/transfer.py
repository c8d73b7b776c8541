"""Cross-target transfer: a cost model trained on one target's records plus a fraction of
another's, against a model trained on that fraction alone.

Rows are told apart by their stored target (the Parquet output of ``lorien featurize`` keeps
it): the destination is every row whose target matches ``target`` by the query rule (same
family, same value of every option the query names), the source every row matching
``source``. Evaluation holds out whole destination workloads (group k-fold); each fold trains

* the **transfer** model on all source rows plus ``fraction`` of the rows of each destination
  training workload (drawn at random), and
* the **own** model on those destination rows alone,

and both rank the held-out destination workloads (TenSet's top-1 / top-5 scores, pairwise
accuracy). Source rows of the held-out workloads stay in: the source target's warehouse holds
them, the destination has not measured them. Target features (:mod:`lorien.features.targets`)
tell the model which machine a row was measured on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lorien.costmodel.metrics import evaluate_by_workload
from lorien.costmodel.models import make_model
from lorien.costmodel.splits import group_kfold, sample_by_workload
from lorien.errors import LorienError

#: Fractions of the destination's data a transfer curve evaluates by default.
DEFAULT_FRACTIONS = (0.0, 0.05, 0.1, 1.0)


def transfer_cross_validate(kind: str, params: dict[str, Any], X: np.ndarray, y: np.ndarray, groups: np.ndarray,
                            source: np.ndarray, destination: np.ndarray,
                            fractions: Sequence[float] = DEFAULT_FRACTIONS, folds: int = 5,
                            seed: int = 0) -> dict[float, dict[str, Any]]:
    """Per fraction: the transfer and own models' evaluation on held-out destination workloads.

    ``source`` and ``destination`` are boolean row masks. Returns ``{fraction: {"transfer":
    summary, "own": summary or None (no destination rows at 0), "destination_rows": mean
    destination rows trained on per fold, "transfer_per_workload": ...}}``.
    """
    if (source & destination).any():
        raise LorienError(f"the source and destination targets match the same {int((source & destination).sum())} "
                          "rows: name targets that tell them apart (e.g. by -mcpu or -num-cores)")
    if not source.any():
        raise LorienError("no rows of the source target")
    destination_rows = np.flatnonzero(destination)
    if destination_rows.size == 0:
        raise LorienError("no rows of the destination target")
    source_rows = np.flatnonzero(source)
    splits = group_kfold(groups[destination_rows], folds, seed)
    predictions = {(f, model): np.full(destination_rows.size, np.nan) for f in fractions for model in ("transfer", "own")}
    trained_rows: dict[float, list[int]] = {f: [] for f in fractions}
    for fold, (train_part, test_part) in enumerate(splits):
        train_rows, test_rows = destination_rows[train_part], destination_rows[test_part]
        for fraction in fractions:
            sample = sample_by_workload(groups, train_rows, fraction, seed + fold)
            trained_rows[fraction].append(int(sample.size))
            rows = np.concatenate([source_rows, sample])
            model = make_model(kind, **params).fit(X[rows], y[rows], groups=groups[rows])
            predictions[(fraction, "transfer")][test_part] = model.predict(X[test_rows])
            if sample.size and (y[sample] > 0).any():
                own = make_model(kind, **params).fit(X[sample], y[sample], groups=groups[sample])
                predictions[(fraction, "own")][test_part] = own.predict(X[test_rows])
    truth, held_out_groups = y[destination_rows], groups[destination_rows]
    curve: dict[float, dict[str, Any]] = {}
    for fraction in fractions:
        transfer = evaluate_by_workload(truth, predictions[(fraction, "transfer")], held_out_groups)
        own_predictions = predictions[(fraction, "own")]
        own = (evaluate_by_workload(truth, own_predictions, held_out_groups)
               if np.isfinite(own_predictions).all() else None)
        curve[fraction] = {"transfer": transfer["summary"], "own": own["summary"] if own else None,
                           "destination_rows": float(np.mean(trained_rows[fraction])),
                           "transfer_per_workload": transfer["per_workload"],
                           "own_per_workload": own["per_workload"] if own else None}
    return curve


def plot_transfer_curve(curve: dict[float, dict[str, Any]], path: Any, title: str) -> None:
    """Top-1, top-5 and pairwise accuracy of the transfer and own models by fraction (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = sorted(curve)
    positions = {fraction: i for i, fraction in enumerate(fractions)}  # evenly spaced, labelled in %
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharex=True)
    for ax, metric, label in zip(axes, ("top1", "top5", "pairwise_accuracy"),
                                 ("top-1 score", "top-5 score", "pairwise accuracy"), strict=True):
        ax.plot(range(len(fractions)), [curve[f]["transfer"][metric] for f in fractions], "o-",
                label="source + destination")
        own = [(positions[f], curve[f]["own"][metric]) for f in fractions if curve[f]["own"]]
        if own:
            ax.plot(*zip(*own, strict=True), "s--", label="destination only")
        ax.set_xticks(range(len(fractions)))
        ax.set_xticklabels([f"{100 * f:g}%" for f in fractions])
        ax.set_xlabel("destination data used")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
