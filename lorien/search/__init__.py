"""Tuners: grid, random (no repeats), genetic and XGBoost model-based, behind ``create(kind)``."""

from lorien.search.base import IndexedSpace, Tuner, available_tuners, create, result_cost

__all__ = ["IndexedSpace", "Tuner", "available_tuners", "create", "result_cost"]
