"""Cost models: train and evaluate on featurized records, score configs, propose schedules.

``train_cost_model(features_dir, out_dir)`` evaluates with workloads held out and saves a
:class:`CostModel`; ``load_cost_model(path)`` reads it back; ``warm_start_scores`` gives a
model-based tuner scores for candidate configs; :mod:`lorien.costmodel.zeroshot` proposes
configs for workloads nobody has tuned.
"""

from lorien.costmodel.bundle import CostModel, TemplateModel, load_cost_model, warm_start_scores
from lorien.costmodel.metrics import (
    evaluate_by_workload,
    pairwise_accuracy,
    r2_score,
    spearman,
    topk_score,
)
from lorien.costmodel.models import SklearnCostModel, XGBCostModel, make_model
from lorien.costmodel.train import group_kfold, train_cost_model
from lorien.costmodel.zeroshot import propose, warm_start_tuner, zero_shot

__all__ = [
    "CostModel",
    "SklearnCostModel",
    "TemplateModel",
    "XGBCostModel",
    "evaluate_by_workload",
    "group_kfold",
    "load_cost_model",
    "make_model",
    "pairwise_accuracy",
    "propose",
    "r2_score",
    "spearman",
    "topk_score",
    "train_cost_model",
    "warm_start_scores",
    "warm_start_tuner",
    "zero_shot",
]
