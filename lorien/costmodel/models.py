"""Cost-model estimators, following scikit-learn's conventions.

Each estimator learns a score per candidate from normalized features; a higher score means a
faster candidate. ``fit(X, y, groups=...)`` takes the measured throughput ``y`` (GFLOPS) and
the workload of each row: the regression target is the throughput relative to the best of
its workload (TenSet's normalization), and the ranking objective compares candidates only
within a workload. Hyper-parameters are constructor arguments; learned state ends in ``_``.

Saved state is JSON (plus XGBoost's own model format), never pickle, so loading a model
file cannot run code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from lorien.costmodel.metrics import relative_to_group_best
from lorien.errors import ConfigError

MODEL_KINDS = ("xgb-reg", "xgb-rank", "ridge", "random-forest")


def _groups_or_single(groups: np.ndarray | None, n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int64) if groups is None else np.asarray(groups)


def _check_xy(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2:
        raise ConfigError(f"features must be a 2-D matrix, got shape {X.shape}")
    if X.shape[0] != y.shape[0]:
        raise ConfigError(f"{X.shape[0]} feature rows but {y.shape[0]} targets")
    if X.shape[0] == 0:
        raise ConfigError("no training rows")
    if not np.isfinite(y).all():
        raise ConfigError(f"{int((~np.isfinite(y)).sum())} targets are NaN or infinite")
    return X, y


class XGBCostModel(RegressorMixin, BaseEstimator):
    """XGBoost cost model: ``objective="reg"`` (squared error on relative throughput) or
    ``"rank"`` (pairwise ranking within each workload). ``parallel_trees``: trees grown in every
    boosting round, each on its own row and column sample, and averaged (XGBoost's
    ``num_parallel_tree``; 1: plain boosting): a boosted forest, steadier where the training
    workloads are few and the model must rank programs of a workload it never saw."""

    def __init__(self, objective: str = "rank", n_estimators: int = 300, max_depth: int = 6,
                 learning_rate: float = 0.1, subsample: float = 0.9, colsample_bytree: float = 0.9,
                 min_child_weight: float = 1.0, n_jobs: int = 1, random_state: int = 0, parallel_trees: int = 1):
        self.objective = objective
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.parallel_trees = parallel_trees

    def _xgb_params(self) -> dict[str, Any]:
        if self.objective not in ("reg", "rank"):
            raise ConfigError(f"unknown objective {self.objective!r} (use 'reg' or 'rank')")
        if int(self.parallel_trees) < 1:
            raise ConfigError(f"parallel_trees must be at least 1, got {self.parallel_trees}")
        return {"objective": "reg:squarederror" if self.objective == "reg" else "rank:pairwise",
                "max_depth": self.max_depth, "eta": self.learning_rate, "subsample": self.subsample,
                "colsample_bytree": self.colsample_bytree, "min_child_weight": self.min_child_weight,
                "nthread": self.n_jobs, "seed": self.random_state, "verbosity": 0,
                "tree_method": "hist", "num_parallel_tree": int(self.parallel_trees)}

    def fit(self, X: Any, y: Any, groups: Any = None) -> XGBCostModel:
        """Train on features ``X``, throughput ``y`` and the workload of each row."""
        import xgboost as xgb

        X, y = _check_xy(X, y)
        params = self._xgb_params()
        group_values = _groups_or_single(groups, len(y))
        target = relative_to_group_best(y, group_values)
        if self.objective == "rank":
            _, qid = np.unique(group_values, return_inverse=True)
            order = np.argsort(qid, kind="stable")
            matrix = xgb.DMatrix(X[order], label=target[order], qid=qid[order])
        else:
            matrix = xgb.DMatrix(X, label=target)
        self.booster_ = xgb.train(params, matrix, num_boost_round=self.n_estimators)
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: Any) -> np.ndarray:
        """Scores of candidates (higher is faster)."""
        import xgboost as xgb

        check_is_fitted(self, "booster_")
        X = np.asarray(X, dtype=np.float32)
        if X.shape[1] != self.n_features_in_:
            raise ConfigError(f"model expects {self.n_features_in_} features, got {X.shape[1]}")
        return self.booster_.predict(xgb.DMatrix(X))

    def save(self, path: str | Path) -> dict[str, Any]:
        """Write the booster (XGBoost's UBJSON format); returns what :meth:`load` needs."""
        check_is_fitted(self, "booster_")
        self.booster_.save_model(str(path))
        return {"kind": f"xgb-{self.objective}", "params": self.get_params(), "file": Path(path).name,
                "n_features": self.n_features_in_}

    @classmethod
    def load(cls, state: dict[str, Any], folder: str | Path) -> XGBCostModel:
        import xgboost as xgb

        model = cls(**state["params"])
        model.booster_ = xgb.Booster()
        model.booster_.load_model(str(Path(folder) / state["file"]))
        model.n_features_in_ = int(state["n_features"])
        return model


class SklearnCostModel(RegressorMixin, BaseEstimator):
    """A scikit-learn baseline on relative throughput: ``"ridge"`` or ``"random-forest"``."""

    def __init__(self, estimator: str = "random-forest", n_estimators: int = 100, max_depth: int | None = None,
                 alpha: float = 1.0, n_jobs: int = 1, random_state: int = 0):
        self.estimator = estimator
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.alpha = alpha
        self.n_jobs = n_jobs
        self.random_state = random_state

    def _make(self) -> Any:
        if self.estimator == "ridge":
            from sklearn.linear_model import Ridge

            return Ridge(alpha=self.alpha)
        if self.estimator == "random-forest":
            from sklearn.ensemble import RandomForestRegressor

            return RandomForestRegressor(n_estimators=self.n_estimators, max_depth=self.max_depth,
                                         n_jobs=self.n_jobs, random_state=self.random_state)
        raise ConfigError(f"unknown baseline {self.estimator!r} (use 'ridge' or 'random-forest')")

    def fit(self, X: Any, y: Any, groups: Any = None) -> SklearnCostModel:
        X, y = _check_xy(X, y)
        target = relative_to_group_best(y, _groups_or_single(groups, len(y)))
        self.model_ = self._make().fit(X, target)
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "model_")
        return self.model_.predict(np.asarray(X, dtype=np.float32))

    def save(self, path: str | Path) -> dict[str, Any]:
        """Ridge saves its coefficients as JSON; a random forest cannot be saved without pickle."""
        check_is_fitted(self, "model_")
        if self.estimator != "ridge":
            raise ConfigError(f"a {self.estimator!r} baseline cannot be saved (pickle-free formats only); "
                              "save an XGBoost or ridge model")
        return {"kind": "ridge", "params": self.get_params(), "n_features": self.n_features_in_,
                "coef": self.model_.coef_.tolist(), "intercept": float(self.model_.intercept_)}

    @classmethod
    def load(cls, state: dict[str, Any], folder: str | Path) -> SklearnCostModel:
        from sklearn.linear_model import Ridge

        model = cls(**state["params"])
        ridge = Ridge(alpha=model.alpha)
        ridge.coef_ = np.asarray(state["coef"], dtype=np.float64)
        ridge.intercept_ = float(state["intercept"])
        ridge.n_features_in_ = int(state["n_features"])
        model.model_ = ridge
        model.n_features_in_ = int(state["n_features"])
        return model


def make_model(kind: str, **params: Any) -> XGBCostModel | SklearnCostModel:
    """An unfitted estimator by short name: xgb-reg, xgb-rank, ridge, random-forest."""
    if kind == "xgb-reg":
        return XGBCostModel(objective="reg", **params)
    if kind == "xgb-rank":
        return XGBCostModel(objective="rank", **params)
    if kind in ("ridge", "random-forest"):
        return SklearnCostModel(estimator=kind, **params)
    raise ConfigError(f"unknown model kind {kind!r} (known: {', '.join(MODEL_KINDS)})")


def load_estimator(state: dict[str, Any], folder: str | Path) -> XGBCostModel | SklearnCostModel:
    kind = state.get("kind")
    if kind in ("xgb-reg", "xgb-rank"):
        return XGBCostModel.load(state, folder)
    if kind == "ridge":
        return SklearnCostModel.load(state, folder)
    raise ConfigError(f"cannot load a model of kind {kind!r} (known: xgb-reg, xgb-rank, ridge)")
