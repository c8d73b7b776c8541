"""Cost models: train and evaluate on featurized records, score configs, propose schedules.

``train_cost_model(features_dir, out_dir)`` evaluates with workloads held out and saves a
:class:`CostModel` (``transfer_from=`` trains on another target's records plus a fraction of
this one's: :mod:`lorien.costmodel.transfer`); ``load_cost_model(path)`` reads it back;
``warm_start_scores`` gives a model-based tuner scores for candidate configs;
:mod:`lorien.costmodel.zeroshot` proposes configs for workloads nobody has tuned.
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
from lorien.costmodel.splits import group_kfold, sample_by_workload, target_rows
from lorien.costmodel.train import train_cost_model
from lorien.costmodel.transfer import transfer_cross_validate
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
    "sample_by_workload",
    "spearman",
    "target_rows",
    "topk_score",
    "train_cost_model",
    "transfer_cross_validate",
    "warm_start_scores",
    "warm_start_tuner",
    "zero_shot",
]
