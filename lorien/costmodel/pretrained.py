"""Pre-trained cost models in tuning, for every dialect.

A model trained on program features (``lorien featurize --features program`` then ``lorien
train``: template ``program``) scores any candidate whose schedule the engine can lower, so
one model guides the autotvm, auto_scheduler and meta_schedule tuners alike. A job names it
with ``cost_model: PATH`` (``lorien tune --cost-model PATH``); then the xgb tuner

- picks its first batch by the model: a pool of candidates from the space (random, or the
  tuner's own search once it has measured something) is lowered, featurized and ranked, the
  best measured, kept apart in feature space so one region the model likes does not take the
  whole plan (:meth:`ProgramGuide.choose`, :meth:`lorien.search.xgb.XGBTuner.set_guide`);
- keeps learning online: after every batch the pre-trained booster is boosted further on the
  run's own measurements (its throughput relative to the run's best), and a model of the
  run's measurements alone (same program features) is fitted beside it; a candidate's score
  blends the two by rank, each weighed by how well it ordered this run's batches before it
  had learned them (:meth:`ProgramModel.weights`: Kendall's tau over the pairs each new batch
  makes with itself and the points measured before, none below chance), so the guide starts
  from the warehouse, ends on this workload's evidence, and drops a model that ranks this
  workload no better than chance; when neither does, the tuner plans as it would without a
  guide (:attr:`ProgramGuide.informative`);
- stamps every record it measured with the model (``build`` JSON: ``cost_model`` with the
  model's name, path and content digest).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lorien.errors import ConfigError, LorienError
from lorien.features.program import (
    FEATURE_NAMES,
    PROGRAM_TEMPLATE,
    feature_dict,
    point_features,
    point_features_in_workers,
)

_UNROLL_WORK, _UOPS = FEATURE_NAMES.index("pg_unroll_work"), FEATURE_NAMES.index("pg_uops")
#: Boosting rounds added to the pre-trained model after each measured batch.
ONLINE_ROUNDS = 20
#: Measurements before the run's own model is fitted.
MIN_LOCAL = 8
#: A guided plan's picks keep this fraction of the candidate pool's median feature distance
#: apart while enough candidates allow (:meth:`ProgramGuide.choose`; 0: the model's top-k as is).
DIVERSITY = 0.25


def check_cost_model_path(path: Any, where: str = "job") -> Path:
    """The model.json of a job's ``cost_model``; ConfigError names the job, the path and what is wrong."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}: 'cost_model' must be the path of a model directory (lorien train -o), "
                          f"got {path!r:.80}")
    folder = Path(path)
    model_file = folder / "model.json" if folder.is_dir() else folder
    if not model_file.is_file():
        raise ConfigError(f"{where}: cost_model {path}: no cost model there (expected a directory with model.json "
                          f"written by lorien train)")
    try:
        document = json.loads(model_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: cost_model {model_file}: not a cost model file ({exc})") from exc
    templates = document.get("templates") if isinstance(document, dict) else None
    if not isinstance(templates, dict) or PROGRAM_TEMPLATE not in templates:
        raise ConfigError(f"{where}: cost_model {model_file} was not trained on program features (templates: "
                          f"{sorted(templates or {})}); train it on `lorien featurize --features program` output")
    return model_file


class ProgramModel:
    """A saved program-feature model: scores feature vectors, and learns online from a run."""

    def __init__(self, path: str | Path, target: str | None = None):
        from lorien.costmodel.bundle import CostModel
        from lorien.costmodel.models import XGBCostModel
        from lorien.features.targets import local_target_features

        model_file = check_cost_model_path(str(path), "cost_model")
        bundle = CostModel.load(model_file)
        template = bundle.template(PROGRAM_TEMPLATE)
        if not isinstance(template.estimator, XGBCostModel):
            raise LorienError(f"cost_model {model_file}: its estimator is {type(template.estimator).__name__}; "
                              f"tuning needs an XGBoost model (lorien train --kind xgb-rank or xgb-reg)")
        self.path = str(Path(model_file).parent.resolve())
        self.name = bundle.name
        self.meta = template.meta
        self.base = template.estimator.booster_
        self.objective = template.estimator.objective
        self.booster = self.base
        self.target_part = local_target_features(target)
        digest = hashlib.sha256(Path(model_file).read_bytes())
        for entry in sorted(Path(model_file).parent.glob("*.ubj")):
            digest.update(entry.read_bytes())
        self.digest = digest.hexdigest()[:16]
        self.online_rounds = ONLINE_ROUNDS
        self.local = None  # a booster of the run's measurements alone
        self.measured = 0
        #: (concordant, discordant) pairs of the measured batches' points, as each model ordered a
        #: batch before learning it (:meth:`judge`): ``prior`` the pre-trained booster as updated
        #: so far, ``own`` the model of the run's measurements alone.
        self.pairs = {"prior": [0, 0], "own": [0, 0]}

    def describe(self) -> dict[str, Any]:
        """What a record guided by this model says about it (its build JSON's ``cost_model``)."""
        return {"name": self.name, "path": self.path, "digest": self.digest}

    def matrix(self, vectors: np.ndarray) -> np.ndarray:
        return self.meta.transform([{**feature_dict(row), **self.target_part} for row in vectors])

    def score(self, vectors: np.ndarray) -> np.ndarray:
        """Scores (higher: predicted faster) of program feature vectors: the pre-trained model as
        updated so far, blended by rank with the run's own model once it has one."""
        import xgboost as xgb

        if len(vectors) == 0:
            return np.zeros(0)
        matrix = self.matrix(np.asarray(vectors))
        prior = self.booster.predict(xgb.DMatrix(matrix))
        prior_weight, own_weight = self.weights()
        if self.local is None or own_weight == 0 or len(prior) < 2:
            return prior
        local = self.local.predict(xgb.DMatrix(matrix))
        if prior_weight == 0:
            return local
        return (prior_weight * _ranks(prior) + own_weight * _ranks(local)) / (prior_weight + own_weight)

    def skill(self, which: str) -> float | None:
        """Kendall's tau of a model's order (``prior`` or ``own``) of this run's measured batches,
        each scored before the model learned it, over the pairs a batch's points make (:meth:`judge`):
        1 every pair in the measured order, 0 chance, -1 reversed; None before it ordered any pair."""
        concordant, discordant = self.pairs[which]
        total = concordant + discordant
        return (concordant - discordant) / total if total else None

    def weights(self) -> tuple[float, float]:
        """Blend weights of (the pre-trained model, the run's own model): each its :meth:`skill`,
        0 at or below chance. The pre-trained model weighs 1 until it has ordered a batch; the
        run's own model 0 until it has (fitted on a handful of points, it is often worse than
        the prior it would replace: on the BERT dense layer in meta_schedule, docs/costmodel.md)."""
        prior, own = self.skill("prior"), self.skill("own")
        prior_weight = 1.0 if prior is None else max(0.0, prior)
        own_weight = 0.0 if own is None or self.local is None else max(0.0, own)
        return prior_weight, own_weight

    @property
    def informative(self) -> bool:
        """False when neither model has ordered this run's measurements better than chance."""
        return sum(self.weights()) > 0

    def judge(self, vectors: np.ndarray, costs: Sequence[float], new: int) -> None:
        """Count how the models, as they are before learning them, order the ``new`` last of a
        run's measurements: every pair with a new point in it, among themselves and against the
        points measured before (which span the run's range, where a batch holds only what was
        picked together; failed points: throughput 0; pairs measured alike are left out).
        A run's first batch is not judged: it is all the prior's favourites, close together, so
        its 28 pairs order a good model near chance as often as not (Kendall's tau of 8 points
        spreads about +-0.3), which dropped the prior after one batch in most guided runs; from
        the second batch on, the new points pair with the first ones as well."""
        import xgboost as xgb

        throughput = _throughput(np.asarray(costs, dtype=float))
        if new < 1 or len(throughput) <= new:
            return
        fresh = np.zeros(len(throughput), dtype=bool)
        fresh[-new:] = True
        matrix = xgb.DMatrix(self.matrix(np.asarray(vectors)))
        _count_pairs(self.pairs["prior"], self.booster.predict(matrix), throughput, fresh)
        if self.local is not None:
            _count_pairs(self.pairs["own"], self.local.predict(matrix), throughput, fresh)

    def learn(self, vectors: np.ndarray, costs: Sequence[float]) -> None:
        """Boost the pre-trained model further on a run's measurements (failed: throughput 0)."""
        import xgboost as xgb

        costs = np.asarray(costs, dtype=float)
        if len(costs) < 2:
            return
        throughput = _throughput(costs)
        if throughput.max() <= 0:
            return
        label = throughput / throughput.max()
        params = {"objective": "rank:pairwise" if self.objective == "rank" else "reg:squarederror",
                  "max_depth": 4, "eta": 0.1, "nthread": 1, "verbosity": 0, "tree_method": "hist", "seed": 0}
        if self.objective == "rank":
            matrix = xgb.DMatrix(self.matrix(vectors), label=label, qid=np.zeros(len(label), dtype=np.int64))
        else:
            matrix = xgb.DMatrix(self.matrix(vectors), label=label)
        self.booster = xgb.train(params, matrix, num_boost_round=self.online_rounds, xgb_model=self.base.copy())
        self.measured = len(label)
        if len(label) >= MIN_LOCAL:
            local = {"objective": "reg:squarederror", "max_depth": 6, "eta": 0.3, "nthread": 1, "verbosity": 0,
                     "tree_method": "hist", "seed": 0}
            self.local = xgb.train(local, xgb.DMatrix(self.matrix(vectors), label=label), num_boost_round=60)


def _throughput(costs: np.ndarray) -> np.ndarray:
    """1 / cost of each measurement, 0 for a failed one (cost not finite or not positive)."""
    good = np.isfinite(costs) & (costs > 0)
    return np.where(good, 1.0 / np.where(good, costs, 1.0), 0.0)


def _count_pairs(counts: list[int], scores: np.ndarray, throughput: np.ndarray, fresh: np.ndarray) -> None:
    """Add the concordant and discordant pairs of ``scores`` against ``throughput`` that hold a
    ``fresh`` point to ``counts`` (pairs tied in either are left out)."""
    score_sign = np.sign(scores[:, None] - scores[None, :])
    truth_sign = np.sign(throughput[:, None] - throughput[None, :])
    upper = np.triu(np.ones_like(score_sign, dtype=bool), 1) & (fresh[:, None] | fresh[None, :])
    product = (score_sign * truth_sign)[upper]
    counts[0] += int((product > 0).sum())
    counts[1] += int((product < 0).sum())


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1]; ties share the lowest (a model that scores points alike does not
    order them by where they stand in the pool)."""
    from scipy.stats import rankdata

    return (rankdata(values, method="min") - 1) / max(1, len(values) - 1)


class ProgramGuide:
    """What the xgb tuner asks of a pre-trained model: scores of points of its space, learning
    from the points it measured. Points are lowered once (features cached by index)."""

    def __init__(self, model: ProgramModel, space: Any, schedule_of: Callable[[Any], tuple[Any, list[Any]]]):
        self.model, self.space, self.schedule_of = model, space, schedule_of
        self.cache: dict[int, np.ndarray | None] = {}
        self.measured: dict[int, float] = {}

    def features(self, index: int) -> np.ndarray | None:
        """A point's features (None: it does not lower, and is never preferred)."""
        index = int(index)
        if index not in self.cache:
            self.cache[index] = point_features(self.space, self.schedule_of, [index])[0]
        return self.cache[index]

    def prefetch(self, indices: Sequence[int]) -> None:
        """Featurize the points not featurized yet, together, in the engine's build workers
        (:func:`~lorien.features.program.point_features_in_workers`)."""
        missing = list(dict.fromkeys(int(i) for i in indices if int(i) not in self.cache))
        if missing:
            self.cache.update(zip(missing, point_features_in_workers(self.space, self.schedule_of, missing),
                                  strict=True))

    def build_cost(self, index: int) -> float:
        """How long a point's build will take, roughly, to order a batch's builds longest first:
        the unrolled work plus the instruction count of its program (both log2), which the
        guide has featurized already (0 for a point that does not lower: it fails at once). On
        ResNet-18's 256 guided candidates, replaying their batches' build times on 2 workers:
        29.6 s in the plan's order, 27.1 s longest-first by this guess, 26.8 s by the true times."""
        row = self.features(index)
        return 0.0 if row is None else float(row[_UNROLL_WORK] + row[_UOPS])

    def score(self, indices: Sequence[int]) -> np.ndarray:
        """Model scores of points (``-inf`` for a point that does not lower)."""
        self.prefetch(indices)
        rows = [self.features(i) for i in indices]
        good = [j for j, row in enumerate(rows) if row is not None]
        scores = np.full(len(rows), -math.inf)
        if good:
            scores[good] = self.model.score(np.vstack([rows[j] for j in good]))
        return scores

    def choose(self, indices: Sequence[int], k: int) -> list[int]:
        """The ``k`` points of ``indices`` to measure: the best scored first, but spread out: a
        point nearer than :data:`DIVERSITY` x the pool's median distance to one already chosen
        (features standardized over the pool) waits until the spread-out ones run out, so a
        batch is not spent on one region the model likes (when it is wrong there, on one bad
        region). Points that do not lower come last."""
        indices = [int(i) for i in indices]
        if k <= 0 or not indices:
            return []
        scores = self.score(indices)
        order = [j for j in np.argsort(-scores, kind="stable")]
        lowered = [j for j in order if np.isfinite(scores[j])]
        if len(lowered) > 2 and DIVERSITY > 0:
            rows = np.vstack([self.features(indices[j]) for j in lowered]).astype(float)
            rows = (rows - rows.mean(axis=0)) / np.where(rows.std(axis=0) > 0, rows.std(axis=0), 1.0)
            sample = rows[: min(len(rows), 256)]
            distances = np.sqrt(((sample[:, None, :] - sample[None, :, :]) ** 2).sum(-1))
            radius = DIVERSITY * float(np.median(distances[np.triu_indices(len(sample), 1)]))
            picked: list[int] = []
            waiting: list[int] = []
            for position in range(len(lowered)):
                if len(picked) >= k:
                    break
                near = picked and np.min(np.sqrt(((rows[picked] - rows[position]) ** 2).sum(-1))) < radius
                (waiting if near else picked).append(position)
            ranked = [lowered[p] for p in picked + waiting]
        else:
            ranked = lowered
        ranked += [j for j in order if not np.isfinite(scores[j])]
        return [indices[j] for j in ranked[:k]]

    @property
    def informative(self) -> bool:
        """Whether the model still ranks this run's points better than chance (:meth:`ProgramModel.weights`)."""
        return self.model.informative

    def learn(self, indices: Sequence[int], costs: Sequence[float]) -> None:
        """Record measurements, let the model's order of the new ones (before it learns them) tell
        how far to trust it, and update it on every lowered point measured so far."""
        new = {int(i): float(c) for i, c in zip(indices, costs, strict=True) if self.features(i) is not None}
        known = [(i, c) for i, c in self.measured.items() if i not in new and self.features(i) is not None]
        known += list(new.items())
        if new and len(known) >= 2:
            self.model.judge(np.vstack([self.features(i) for i, _ in known]), [c for _, c in known], len(new))
        for index, cost in zip(indices, costs, strict=True):
            self.measured[int(index)] = float(cost)
        known = [(i, c) for i, c in self.measured.items() if self.features(i) is not None]
        if known:
            self.model.learn(np.vstack([self.features(i) for i, _ in known]), [c for _, c in known])


def guide_tuner(context: Any, job: Any) -> dict[str, Any]:
    """Give a tuning context's tuner the job's pre-trained model; returns what records say of it.
    ConfigError when the tuner cannot be guided or the dialect cannot lower its candidates."""
    if not hasattr(context.tuner, "set_guide"):
        raise ConfigError(f"job {job.name or job.task_name}: cost_model guides the xgb tuner, got tuner {job.tuner!r}")
    if context.schedule_of is None:
        raise ConfigError(f"job {job.name or job.task_name}: dialect {job.dialect!r} cannot lower its candidates "
                          f"for a cost_model to score")
    from lorien.target import parse_target

    # the target the candidates are timed for: the model scores them with its target features
    # (threads, vector width, caches), as its training records carry the build that measured them
    model = ProgramModel(job.cost_model, context.measure_target or parse_target(job.target).canonical)
    context.tuner.set_guide(ProgramGuide(model, context.space, context.schedule_of))
    return model.describe()


__all__ = ["FEATURE_NAMES", "ProgramGuide", "ProgramModel", "check_cost_model_path", "guide_tuner"]
