"""A saved cost model: one estimator per template plus the feature metadata it was trained
with, so it can score raw records or fresh configs later.

On disk a model is a directory: ``model.json`` (format, name, per-template feature metadata
and estimator state) and one XGBoost model file per template. Nothing is pickled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lorien import __version__
from lorien.costmodel.models import XGBCostModel, load_estimator
from lorien.errors import ConfigError, LorienError
from lorien.features.meta import FeatureMeta
from lorien.features.pipeline import record_features, safe_name
from lorien.features.targets import local_target_features, relative_knob_features

MODEL_FORMAT = "lorien-costmodel"
MODEL_FILE = "model.json"


@dataclass
class TemplateModel:
    """The estimator of one template and the metadata that turns raw features into its input."""

    meta: FeatureMeta
    estimator: Any
    info: dict[str, Any] = field(default_factory=dict)

    def score(self, raw_features: Iterable[Mapping[str, Any]]) -> np.ndarray:
        matrix = self.meta.transform(raw_features)
        if matrix.shape[0] == 0:
            return np.zeros(0)
        return np.asarray(self.estimator.predict(matrix), dtype=np.float64)


@dataclass
class CostModel:
    """Per-template cost models under one name (``record.source`` of proposals is ``model:<name>``)."""

    name: str
    templates: dict[str, TemplateModel] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def template(self, name: str) -> TemplateModel:
        if name not in self.templates:
            raise LorienError(f"model {self.name!r} has no template {name!r} "
                              f"(trained templates: {sorted(self.templates) or 'none'})")
        return self.templates[name]

    def score_features(self, template: str, raw_features: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """Scores (higher is faster) of raw phase-1 feature dicts of one template."""
        return self.template(template).score(raw_features)

    def score_configs(self, task_name: str, args: Sequence[Any], configs: Iterable[Any],
                      target: str | None = None, dialect: str | None = None) -> np.ndarray:
        """Scores of configs (in the forms the workload's dialect takes, e.g. AutoTVM entity
        lists, config dicts or config objects) of one workload on ``target`` (default this
        host: the target features records measured here for it would carry). ``dialect``: as
        for :func:`lorien.costmodel.spaces.proposal_space`."""
        from lorien.costmodel.spaces import proposal_space

        self.template(task_name)  # fail early, naming the trained templates
        space = proposal_space(task_name=task_name, args=args, dialect=dialect)
        return self.score_features(task_name, space_features(space, list(configs), target))

    def score_records(self, records: Iterable[Any]) -> np.ndarray:
        """Scores of tuning records (any templates the model knows), in input order."""
        records = list(records)
        scores = np.zeros(len(records))
        by_template: dict[str, list[int]] = {}
        for i, record in enumerate(records):
            by_template.setdefault(record.task_name, []).append(i)
        for template, indices in by_template.items():
            rows = [record_features(records[i]) for i in indices]
            scores[indices] = self.score_features(template, rows)
        return scores

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        templates = {}
        for name, model in self.templates.items():
            if isinstance(model.estimator, XGBCostModel):
                state = model.estimator.save(folder / f"{safe_name(name)}.ubj")
            else:
                state = model.estimator.save(folder / safe_name(name))
            templates[name] = {"meta": model.meta.to_dict(), "estimator": state, "info": model.info}
        document = {"format": MODEL_FORMAT, "version": 1, "lorien_version": __version__, "name": self.name,
                    "created": time.time(), "templates": templates, "info": self.info}
        path = folder / MODEL_FILE
        path.write_text(json.dumps(document, indent=2, default=str))
        return path

    @classmethod
    def load(cls, folder: str | Path) -> CostModel:
        folder = Path(folder)
        path = folder / MODEL_FILE if folder.is_dir() else folder
        if not path.is_file():
            raise LorienError(f"no cost model at {folder} (expected {MODEL_FILE})")
        try:
            document = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise LorienError(f"{path}: not a cost model file ({exc})") from exc
        if document.get("format") != MODEL_FORMAT:
            raise LorienError(f"{path}: format {document.get('format')!r} is not {MODEL_FORMAT!r}")
        model = cls(document["name"], info=document.get("info", {}))
        for name, entry in document["templates"].items():
            try:
                estimator = load_estimator(entry["estimator"], path.parent)
            except ConfigError as exc:
                raise LorienError(f"{path}: template {name!r}: {exc}") from exc
            model.templates[name] = TemplateModel(FeatureMeta.from_dict(entry["meta"]), estimator,
                                                  entry.get("info", {}))
        return model


def space_features(space: Any, configs: Sequence[Any], target: str | None = None) -> list[dict[str, Any]]:
    """Raw features of configs of a proposal space on ``target`` (default this host), as
    featurization gives records of them measured there."""
    target_part = local_target_features(target)
    rows = []
    for features in space.features(configs):
        row = {**features, **target_part}
        rows.append({**row, **relative_knob_features(row)})
    return rows


def load_cost_model(path: str | Path) -> CostModel:
    """Load a saved cost model directory (or its ``model.json``)."""
    return CostModel.load(path)


def warm_start_scores(model: CostModel | str | Path, task_name: str, args: Sequence[Any],
                      configs: Iterable[Any], target: str | None = None) -> np.ndarray:
    """Scores a model-based tuner can start from: higher means predicted faster on ``target``
    (default this host).

    ``model`` is a :class:`CostModel` or the path of a saved one; ``configs`` are entity
    lists, config dicts or config objects with ``to_json_entity()``.
    """
    if not isinstance(model, CostModel):
        model = CostModel.load(model)
    return model.score_configs(task_name, args, configs, target)
