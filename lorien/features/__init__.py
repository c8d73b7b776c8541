"""Featurization: tuning records -> normalized per-template features (CSV, Parquet, .meta).

``featurize(out_dir, store=URI)`` or ``featurize(out_dir, paths=[LOG, ...])`` runs both
phases; ``load_features(out_dir, template)`` reads one template back for training;
``record_features(record)`` gives one record's raw features as featurization does. The
features of a record come from its dialect (:meth:`lorien.dialect.Dialect.featurize` and
``featurize_batch``); nothing here knows a dialect's configs.
"""

from lorien.features.meta import TARGET_COLUMN, FeatureColumn, FeatureMeta
from lorien.features.pipeline import (
    FeaturizeReport,
    featurize,
    featurize_table,
    list_templates,
    load_features,
    output_paths,
    record_features,
)

__all__ = [
    "TARGET_COLUMN",
    "FeatureColumn",
    "FeatureMeta",
    "FeaturizeReport",
    "featurize",
    "featurize_table",
    "list_templates",
    "load_features",
    "output_paths",
    "record_features",
]
