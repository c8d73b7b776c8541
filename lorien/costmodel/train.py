"""Train and evaluate cost models from a featurization output directory.

Evaluation holds out whole workloads (GroupKFold over workload keys), never random rows: the
question a cost model answers is how well it ranks candidates of a workload it has not seen.
The final model is fitted on every row (of the chosen targets); a report (JSON and PNG plots)
is written beside it. Training on another target's records plus a fraction of this one's is
:mod:`lorien.costmodel.transfer`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lorien.costmodel.bundle import CostModel, TemplateModel
from lorien.costmodel.metrics import evaluate_by_workload, relative_to_group_best
from lorien.costmodel.models import make_model
from lorien.costmodel.splits import group_kfold, sample_by_workload, target_rows
from lorien.costmodel.transfer import plot_transfer_curve, transfer_cross_validate
from lorien.errors import LorienError
from lorien.features.meta import TARGET_COLUMN
from lorien.features.pipeline import (
    MANIFEST,
    PROGRAM_TEMPLATE,
    list_templates,
    load_features,
    safe_name,
)
from lorien.progress import Progress

REPORT_FILE = "report.json"
#: Trees grown per boosting round (``parallel_trees``) of an XGBoost model of the ``program``
#: template unless the caller names it: the model that guides tuning in every dialect ranks
#: programs of workloads it never saw, and a boosted forest ranked them better there than
#: plain boosting (issue 22: trials to 95 % of fixed measured sets of held-out layers in the
#: model's order, auto_scheduler 5.80 -> 2.54, meta_schedule 8.62 -> 9.61, docs/costmodel.md).
PROGRAM_PARALLEL_TREES = 3


def workload_groups(frame: pd.DataFrame, feature_names: list[str]) -> np.ndarray:
    """The workload of each row: its target and ``workload_key`` where the features carry them
    (the same workload measured on two targets is two groups), else the combination of its
    workload features (``attr_*``/``in_*``)."""
    if "workload_key" in frame.columns and frame["workload_key"].notna().all():
        keys = frame["workload_key"].astype(str)
        for column in ("target", "target_key"):
            if column in frame.columns and frame[column].notna().all():
                return (frame[column].astype(str) + "|" + keys).to_numpy()
        return keys.to_numpy()
    workload_columns = [n for n in feature_names if n.startswith(("attr_", "in_"))]
    if not workload_columns:
        raise LorienError("cannot tell workloads apart: no workload_key column and no attr_/in_ features")
    return frame[workload_columns].round(6).astype(str).agg("|".join, axis=1).to_numpy()


def template_params(kind: str, template: str, params: dict[str, Any]) -> dict[str, Any]:
    """The estimator parameters for one template: ``params``, with :data:`PROGRAM_PARALLEL_TREES`
    for an XGBoost model of the program template that does not name ``parallel_trees``."""
    if template == PROGRAM_TEMPLATE and kind.startswith("xgb-") and "parallel_trees" not in params:
        return {**params, "parallel_trees": PROGRAM_PARALLEL_TREES}
    return dict(params)


def cross_validate(kind: str, params: dict[str, Any], X: np.ndarray, y: np.ndarray, groups: np.ndarray,
                   folds: int, seed: int = 0, fraction: float = 1.0) -> tuple[np.ndarray, dict[str, Any]]:
    """Out-of-fold predictions (every workload predicted by a model that never saw it) and
    their per-workload evaluation; each fold trains on ``fraction`` of the rows of each of its
    training workloads."""
    predictions = np.zeros(len(y))
    for fold, (train_rows, test_rows) in enumerate(group_kfold(groups, folds, seed)):
        train_rows = sample_by_workload(groups, train_rows, fraction, seed + fold)
        model = make_model(kind, **params).fit(X[train_rows], y[train_rows], groups=groups[train_rows])
        predictions[test_rows] = model.predict(X[test_rows])
    return predictions, evaluate_by_workload(y, predictions, groups)


def _check_transfer_options(target: str | None, transfer_from: str | None, target_fraction: float,
                            curve: Sequence[float] | None) -> None:
    if transfer_from is not None and target is None:
        raise LorienError(f"transfer from {transfer_from!r} needs the destination target (--target)")
    for fraction in [target_fraction, *(curve or ())]:
        if not 0.0 <= fraction <= 1.0:
            raise LorienError(f"a fraction of the target's data is between 0 and 1, got {fraction}")
    if target is None and target_fraction < 1.0:
        raise LorienError(f"a target fraction ({target_fraction}) needs the target it is a fraction of (--target)")
    if transfer_from is None and target_fraction == 0.0:
        raise LorienError("a target fraction of 0 leaves nothing to train on without --transfer-from")
    if curve and transfer_from is None:
        raise LorienError("a transfer curve needs --transfer-from (the source target)")


def train_cost_model(features_dir: str | Path, out_dir: str | Path, kind: str = "xgb-rank",
                     templates: list[str] | None = None, folds: int = 5, params: dict[str, Any] | None = None,
                     baseline: str | None = "random-forest", name: str | None = None, plots: bool = True,
                     progress: bool = True, seed: int = 0, target: str | None = None,
                     transfer_from: str | None = None, target_fraction: float = 1.0,
                     curve: Sequence[float] | None = None) -> dict[str, Any]:
    """Evaluate (workload-held-out CV), fit on everything, save model + report + plots.

    ``target`` keeps the rows of the targets it matches (the query rule), ``target_fraction``
    of each of their workloads' rows. ``transfer_from`` names a source target: the model
    trains on the source's rows plus that fraction of the target's, and is evaluated against
    a model of the target's fraction alone on held-out target workloads (``curve``: also at
    these fractions; :mod:`lorien.costmodel.transfer`). Returns the report (also written to
    ``out_dir/report.json``).
    """
    _check_transfer_options(target, transfer_from, target_fraction, curve)
    features_dir = Path(features_dir)
    out = Path(out_dir)
    available = list_templates(features_dir)
    if not available:
        raise LorienError(f"no featurized templates in {features_dir} (run `lorien featurize` first)")
    chosen = templates or available
    unknown = sorted(set(chosen) - set(available))
    if unknown:
        raise LorienError(f"unknown template(s) {unknown} in {features_dir} (available: {available})")
    params = dict(params or {})
    model = CostModel(name or out.name, info={"kind": kind, "params": params,
                                              "features_dir": str(features_dir.resolve())})
    if target is not None:
        model.info.update(target=target, target_fraction=target_fraction, transfer_from=transfer_from)
    manifest = features_dir / MANIFEST
    if manifest.is_file():
        manifest_data = json.loads(manifest.read_text())
        model.info["features_source"] = manifest_data.get("source")
        model.info["features_filters"] = manifest_data.get("filters")
    report: dict[str, Any] = {"model": model.name, "kind": kind, "params": params, "folds": folds,
                              "baseline": None if transfer_from else baseline, "templates": {}, "skipped": {}}
    if target is not None:
        report.update(target=target, target_fraction=target_fraction, transfer_from=transfer_from)
    out.mkdir(parents=True, exist_ok=True)
    bar = Progress(len(chosen), "train", unit="template", enabled=progress)
    for template in chosen:
        start = time.perf_counter()
        chosen_params = template_params(kind, template, params)
        frame, meta = load_features(features_dir, template)
        X = frame[meta.names].to_numpy(dtype=np.float32)
        y = frame[TARGET_COLUMN].to_numpy(dtype=np.float64)
        if not np.isfinite(y).all():
            raise LorienError(f"{template}: {int((~np.isfinite(y)).sum())} thrpt values are NaN or infinite")
        groups = workload_groups(frame, meta.names)
        source = target_rows(frame, transfer_from) if transfer_from else np.zeros(len(y), dtype=bool)
        destination = target_rows(frame, target) if target else np.ones(len(y), dtype=bool)
        used = source | destination
        if not destination.any() or (y[used] > 0).sum() == 0:
            report["skipped"][template] = (f"no records of target {target!r}" if not destination.any() else
                                           f"no valid measurement among {int(used.sum())} records")
            bar.step(f"{template}: skipped")
            continue
        destination_workloads = int(np.unique(groups[destination]).size)
        entry: dict[str, Any] = {"rows": int(used.sum()), "workloads": destination_workloads,
                                 "features": len(meta.names), "params": chosen_params}
        if transfer_from:
            entry["source_rows"], entry["destination_rows"] = int(source.sum()), int(destination.sum())
        if destination_workloads < 2:
            entry["cv"] = None
            entry["cv_skipped"] = "only one workload: nothing to hold out"
        elif transfer_from:
            fractions = sorted({target_fraction, *(curve or ())})
            result = transfer_cross_validate(kind, chosen_params, X, y, groups, source, destination, fractions,
                                             folds, seed)
            chosen_fraction = result[target_fraction]
            entry["cv"] = {"summary": chosen_fraction["transfer"], "per_workload": chosen_fraction["transfer_per_workload"]}
            entry["own_cv"] = chosen_fraction["own"]
            entry["transfer_curve"] = {f"{fraction:g}": {key: value for key, value in point.items()
                                                          if not key.endswith("per_workload")}
                                       for fraction, point in result.items()}
            if plots:
                plot_path = out / f"{safe_name(template)}.transfer.png"
                plot_transfer_curve(result, plot_path, f"{template}: {transfer_from} -> {target}")
                entry["plots"] = {"transfer": plot_path.name}
        else:
            rows = np.flatnonzero(destination)
            predictions, evaluation = cross_validate(kind, chosen_params, X[rows], y[rows], groups[rows], folds,
                                                     seed, target_fraction)
            entry["cv"] = evaluation
            if baseline:
                _, baseline_eval = cross_validate(baseline, {}, X[rows], y[rows], groups[rows], folds, seed,
                                                  target_fraction)
                entry["baseline_cv"] = baseline_eval["summary"]
            if plots:
                entry["plots"] = _plots(out, template, y[rows], predictions, groups[rows], evaluation)
        train_rows = np.concatenate([np.flatnonzero(source),
                                     sample_by_workload(groups, np.flatnonzero(destination), target_fraction, seed)])
        estimator = make_model(kind, **chosen_params).fit(X[train_rows], y[train_rows], groups=groups[train_rows])
        model.templates[template] = TemplateModel(meta, estimator, {"rows": int(train_rows.size),
                                                                    "workloads": entry["workloads"]})
        entry["seconds"] = round(time.perf_counter() - start, 3)
        report["templates"][template] = entry
        summary = entry["cv"]["summary"] if entry["cv"] else {}
        bar.step(f"{template}: {entry['rows']} rows, {entry['workloads']} workloads"
                 + "".join(f", {k}={summary[k]:.3f}" for k in ("spearman", "pairwise_accuracy", "top1", "top5")
                           if k in summary))
    bar.close()
    if not model.templates:
        raise LorienError(f"no template could be trained: {report['skipped']}")
    model.save(out)
    (out / REPORT_FILE).write_text(report_json(report))
    return report


def report_json(report: dict[str, Any]) -> str:
    """A training report as JSON text (what ``report.json`` holds)."""
    return json.dumps(report, indent=2, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return str(value)


def _plots(out: Path, template: str, y: np.ndarray, predictions: np.ndarray, groups: np.ndarray,
           evaluation: dict[str, Any]) -> dict[str, str]:
    """Predicted vs measured (relative throughput) and top-k score per held-out workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem = safe_name(template)
    relative = relative_to_group_best(y, groups)
    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.scatter(predictions, relative, s=6, alpha=0.5)
    ax.set_xlabel("predicted score (held-out workload)")
    ax.set_ylabel("measured throughput / workload best")
    ax.set_title(f"{template}: predicted vs measured")
    fig.tight_layout()
    scatter_path = out / f"{stem}.pred_vs_measured.png"
    fig.savefig(scatter_path, dpi=100)
    plt.close(fig)

    per_workload = evaluation["per_workload"]
    names = sorted(per_workload)
    fig, ax = plt.subplots(figsize=(max(5, 0.35 * len(names) + 2), 4))
    positions = np.arange(len(names))
    ax.bar(positions - 0.2, [per_workload[n]["top1"] for n in names], width=0.4, label="top-1")
    ax.bar(positions + 0.2, [per_workload[n]["top5"] for n in names], width=0.4, label="top-5")
    ax.set_xticks(positions)
    ax.set_xticklabels([str(i) for i in range(len(names))])
    ax.set_xlabel("held-out workload (index, see report.json)")
    ax.set_ylabel("best picked / best measured")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower right")
    ax.set_title(f"{template}: top-k score per workload")
    fig.tight_layout()
    topk_path = out / f"{stem}.topk.png"
    fig.savefig(topk_path, dpi=100)
    plt.close(fig)
    return {"pred_vs_measured": scatter_path.name, "topk": topk_path.name, "workload_order": names}
