"""Train and evaluate cost models from a featurization output directory.

Evaluation holds out whole workloads (GroupKFold over workload keys), never random rows: the
question a cost model answers is how well it ranks candidates of a workload it has not seen.
The final model is fitted on every row; a report (JSON and PNG plots) is written beside it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lorien.costmodel.bundle import CostModel, TemplateModel
from lorien.costmodel.metrics import evaluate_by_workload, relative_to_group_best
from lorien.costmodel.models import make_model
from lorien.errors import LorienError
from lorien.features.meta import TARGET_COLUMN
from lorien.features.pipeline import MANIFEST, list_templates, load_features, safe_name
from lorien.progress import Progress

REPORT_FILE = "report.json"


def workload_groups(frame: pd.DataFrame, feature_names: list[str]) -> np.ndarray:
    """The workload of each row: ``workload_key`` where the features carry it, else the
    combination of its workload features (``attr_*``/``in_*``)."""
    if "workload_key" in frame.columns and frame["workload_key"].notna().all():
        keys = frame["workload_key"].astype(str)
        if "target_key" in frame.columns and frame["target_key"].notna().all():
            keys = frame["target_key"].astype(str) + "|" + keys
        return keys.to_numpy()
    workload_columns = [n for n in feature_names if n.startswith(("attr_", "in_"))]
    if not workload_columns:
        raise LorienError("cannot tell workloads apart: no workload_key column and no attr_/in_ features")
    return frame[workload_columns].round(6).astype(str).agg("|".join, axis=1).to_numpy()


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


def cross_validate(kind: str, params: dict[str, Any], X: np.ndarray, y: np.ndarray, groups: np.ndarray,
                   folds: int, seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    """Out-of-fold predictions (every workload predicted by a model that never saw it) and
    their per-workload evaluation."""
    predictions = np.zeros(len(y))
    for train_rows, test_rows in group_kfold(groups, folds, seed):
        model = make_model(kind, **params).fit(X[train_rows], y[train_rows], groups=groups[train_rows])
        predictions[test_rows] = model.predict(X[test_rows])
    return predictions, evaluate_by_workload(y, predictions, groups)


def train_cost_model(features_dir: str | Path, out_dir: str | Path, kind: str = "xgb-rank",
                     templates: list[str] | None = None, folds: int = 5, params: dict[str, Any] | None = None,
                     baseline: str | None = "random-forest", name: str | None = None, plots: bool = True,
                     progress: bool = True, seed: int = 0) -> dict[str, Any]:
    """Evaluate (workload-held-out CV), fit on everything, save model + report + plots.

    Returns the report (also written to ``out_dir/report.json``).
    """
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
    manifest = features_dir / MANIFEST
    if manifest.is_file():
        manifest_data = json.loads(manifest.read_text())
        model.info["features_source"] = manifest_data.get("source")
        model.info["features_filters"] = manifest_data.get("filters")
    report: dict[str, Any] = {"model": model.name, "kind": kind, "params": params, "folds": folds,
                              "baseline": baseline, "templates": {}, "skipped": {}}
    out.mkdir(parents=True, exist_ok=True)
    bar = Progress(len(chosen), "train", unit="template", enabled=progress)
    for template in chosen:
        start = time.perf_counter()
        frame, meta = load_features(features_dir, template)
        X = frame[meta.names].to_numpy(dtype=np.float32)
        y = frame[TARGET_COLUMN].to_numpy(dtype=np.float64)
        if not np.isfinite(y).all():
            raise LorienError(f"{template}: {int((~np.isfinite(y)).sum())} thrpt values are NaN or infinite")
        groups = workload_groups(frame, meta.names)
        if (y > 0).sum() == 0:
            report["skipped"][template] = f"no valid measurement among {len(y)} records"
            bar.step(f"{template}: skipped")
            continue
        entry: dict[str, Any] = {"rows": int(len(y)), "workloads": int(np.unique(groups).size),
                                 "features": len(meta.names)}
        if entry["workloads"] >= 2:
            predictions, evaluation = cross_validate(kind, params, X, y, groups, folds, seed)
            entry["cv"] = evaluation
            if baseline:
                _, baseline_eval = cross_validate(baseline, {}, X, y, groups, folds, seed)
                entry["baseline_cv"] = baseline_eval["summary"]
            if plots:
                entry["plots"] = _plots(out, template, y, predictions, groups, evaluation)
        else:
            entry["cv"] = None
            entry["cv_skipped"] = "only one workload: nothing to hold out"
        estimator = make_model(kind, **params).fit(X, y, groups=groups)
        model.templates[template] = TemplateModel(meta, estimator, {"rows": entry["rows"],
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
