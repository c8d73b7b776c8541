"""Featurization: tuning records -> normalized per-template features (CSV, Parquet, .meta).

``featurize(out_dir, store=URI)`` or ``featurize(out_dir, paths=[LOG, ...])`` runs both
phases; ``load_features(out_dir, template)`` reads one template back for training;
``record_features(record)`` gives one record's raw features as featurization does.
"""

from lorien.features.extract import (
    FeatureError,
    config_features,
    record_features,
    workload_features,
)
from lorien.features.meta import TARGET_COLUMN, FeatureColumn, FeatureMeta
from lorien.features.pipeline import (
    FeaturizeReport,
    featurize,
    featurize_table,
    list_templates,
    load_features,
    output_paths,
)

__all__ = [
    "TARGET_COLUMN",
    "FeatureColumn",
    "FeatureError",
    "FeatureMeta",
    "FeaturizeReport",
    "config_features",
    "featurize",
    "featurize_table",
    "list_templates",
    "load_features",
    "output_paths",
    "record_features",
    "workload_features",
]
