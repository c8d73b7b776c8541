"""Model-based search: an XGBoost cost model over config features, explored by annealing or evolution.

Every ``plan_size`` measurements the model is refit on (features, normalized throughput) of
all measured points (a point's cost is its fastest repeat, :func:`lorien.search.base.label_cost`)
— plus, with :meth:`XGBTuner.load_history`, points measured before on similar workloads
(transfer). The optimizer over the model picks the next plan:
``optimizer="sa"`` (simulated annealing, AutoTVM's) or ``"evolution"`` (Ansor's evolutionary
search, :mod:`lorien.search.evolution`: ``population`` points, ``generations`` rounds of
score-proportional selection and mutation). A small fraction ``epsilon`` of each plan is
random for exploration. ``weighted=True`` weights each training sample by its normalized
throughput, as Ansor's and MetaSchedule's cost models do. :meth:`XGBTuner.add_seeds` hands
the tuner points expected to be good (a dialect's adaptation of similar workloads' best
programs): each plan measures up to ``seed_quota`` of them, the rest start the search (with a
guide, :meth:`XGBTuner.set_guide`, the first plan only: later the guide weighs them among its
candidates).

Features: ``feature_type="knob"`` uses the space's knob feature tables (split factors, option
values, ...) or plain knob positions. ``feature_type="itervar"`` adds the features a
``feature_fn(indices) -> array`` computes (the autotvm dialect passes loop-nest features of
the lowered kernel): annealing runs over the knob model, and its best ``rerank_factor`` x
``plan_size`` candidates are re-ranked by a second model on knob + loop features, so the
costly loop features are computed only for a few hundred points per plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from lorien.search.base import IndexedSpace, MeasuredLike, Tuner, label_cost
from lorien.search.evolution import evolve
from lorien.search.random_search import cover_paths, sample_unvisited
from lorien.search.sa import anneal

OPTIMIZERS = ("sa", "evolution")
#: Smallest sample weight of a ``weighted`` model.
MIN_WEIGHT = 0.01


def history_by_workload(per_workload: dict[str, list[tuple[Sequence[float], float]]],
                        width: int) -> tuple[np.ndarray, np.ndarray]:
    """(features, scores) for :meth:`XGBTuner.load_history` from (features, throughput) pairs
    grouped by workload: throughput is normalized per workload (its best = 1), so workloads of
    different sizes teach which configs are good relative to each other."""
    xs, ys = [], []
    for items in per_workload.values():
        best = max(throughput for _, throughput in items)
        for features, throughput in items:
            xs.append(features)
            ys.append(throughput / best)
    return np.array(xs, dtype=float).reshape(len(xs), width), np.array(ys, dtype=float)


class KnobFeatures:
    """Vectorized features of config indices from per-knob tables, followed by the columns a
    space derives from them (``space.derived_features(knob_rows)``, when it has one: features
    that combine knobs, such as a tile's volume, which trees learn poorly from the parts)."""

    def __init__(self, space: IndexedSpace):
        tables = space.knob_feature_tables() if hasattr(space, "knob_feature_tables") else None
        if tables is None:
            tables = [np.arange(dim, dtype=float).reshape(-1, 1) for dim in space.dims]
        self.tables = [np.asarray(t, dtype=float) for t in tables]
        self.dims = np.array(space.dims, dtype=np.int64)
        self.derive: Callable[[np.ndarray], np.ndarray] | None = getattr(space, "derived_features", None)
        #: Width of the knob-table columns alone.
        self.knob_width = sum(table.shape[1] for table in self.tables)

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        columns = []
        for dim, table in zip(self.dims, self.tables, strict=True):
            columns.append(table[indices % dim])
            indices = indices // dim
        return self.extend(np.concatenate(columns, axis=1) if columns else np.zeros((len(indices), 0)))

    def extend(self, rows: np.ndarray) -> np.ndarray:
        """Knob-table rows (e.g. of another workload's records) with the derived columns appended;
        rows that have them already (as this object returns them) pass unchanged."""
        rows = np.asarray(rows, dtype=float)
        if self.derive is None or rows.shape[1] != self.knob_width or self.knob_width == 0:
            return rows
        derived = np.asarray(self.derive(rows), dtype=float)
        return np.concatenate([rows, derived if derived.ndim == 2 else derived[:, None]], axis=1)


class XGBTuner(Tuner):
    """XGBoost-guided tuner with a simulated-annealing or evolutionary optimizer over the model."""

    def __init__(self, space: IndexedSpace, seed: int | None = None, plan_size: int = 32,
                 feature_type: str = "knob", feature_fn: Callable[[np.ndarray], np.ndarray] | None = None,
                 epsilon: float = 0.05, sa_parallel_size: int = 128, sa_n_iter: int = 60,
                 num_boost_round: int = 80, rerank_factor: int = 2, optimizer: str = "sa",
                 population: int = 256, generations: int = 4, weighted: bool = False, seed_quota: int = 2,
                 guide_refine: int = 0, guide_generations: int = 2, unguided_share: float = 0.25,
                 guide_first_refine: int = 0, guide_first_generations: int = 4):
        super().__init__(space, seed)
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r} ({' or '.join(OPTIMIZERS)})")
        if feature_type not in ("knob", "itervar"):
            raise ValueError(f"unknown feature_type {feature_type!r} (knob or itervar)")
        if feature_type == "itervar" and feature_fn is None:
            raise ValueError("feature_type 'itervar' needs a feature_fn from the dialect")
        self.feature_fn = KnobFeatures(space)
        self.loop_feature_fn = feature_fn if feature_type == "itervar" else None
        self.rerank_factor = rerank_factor
        self.rerank_booster_ = None
        self.plan_size = plan_size
        self.epsilon = epsilon
        self.sa_parallel_size = sa_parallel_size
        self.sa_n_iter = sa_n_iter
        self.num_boost_round = num_boost_round
        self.optimizer = optimizer
        self.population = population
        self.generations = generations
        #: Weight every training sample by its normalized throughput (Ansor's and MetaSchedule's
        #: cost models do): the model fits the fast programs, the ones a plan is drawn from, best.
        self.weighted = bool(weighted)
        #: Seeds (:meth:`add_seeds`) measured per plan at most.
        self.seed_quota = int(seed_quota)
        self.seeds: list[int] = []
        self.measured: dict[int, float] = {}
        self.history_x: np.ndarray | None = None
        self.history_y: np.ndarray | None = None
        self.booster_ = None
        self._plan: list[int] = []
        self._pending = 0  # points proposed and not learned yet
        self._since_fit = 0
        #: A pre-trained model that ranks candidates (:meth:`set_guide`), or None.
        self.guide = None
        #: Candidates the guide ranks for a plan, per point of the plan.
        self.guide_pool = 8
        #: The last guided plan's random candidates: the unmeasured ones are ranked again by the
        #: next plan (at most ``guide_pool`` x plan size; the search's candidates are made afresh).
        self._guide_candidates: list[int] = []
        #: Random points a guided run measured for exploration, and the number of points it had
        #: measured when its own model was first trained (exploration counts from there).
        self._explored: set[int] = set()
        self._explore_from: int | None = None
        #: With a guide: the population of an evolution *on the guide's score* from the run's
        #: best measured points, made for every plan once something is measured (0: none; the
        #: search's candidates then come only from this tuner's own knob model, once trained).
        #: Its candidates join the guide's pool, so a guided run refines the programs it found
        #: good (Ansor's search) instead of only picking among fresh random ones.
        self.guide_refine = int(guide_refine)
        self.guide_generations = int(guide_generations)
        if self.guide_refine < 0 or self.guide_generations < 1:
            raise ValueError(f"guide_refine must be >= 0 and guide_generations >= 1, got {guide_refine}, "
                             f"{guide_generations}")
        #: With a guide, before anything is measured: the population of an evolution on the
        #: guide's score started from the guide's 16 favourites of the random pool (and the seeds
        #: this plan does not measure), over ``guide_first_generations`` rounds; its candidates
        #: join the first plan's pool. A random pool rarely holds a program near the best of a
        #: long run where fast programs are rare (meta_schedule: the best of 128 random traces
        #: of the BERT dense layer ran at 0.56 of a 300-trial run's best), so the first batch
        #: is the model's choice among programs the model itself has improved, as MetaSchedule's
        #: evolutionary search uses its cost model before measuring anything. 0: off.
        self.guide_first_refine = int(guide_first_refine)
        self.guide_first_generations = int(guide_first_generations)
        if self.guide_first_refine < 0 or self.guide_first_generations < 1:
            raise ValueError(f"guide_first_refine must be >= 0 and guide_first_generations >= 1, got "
                             f"{guide_first_refine}, {guide_first_generations}")
        #: With a guide, once this tuner's own model is trained: the share of what the run measures
        #: that is the unguided plan's choice (the search's best on this tuner's model, as a run
        #: without a guide measures it), so a guide that ranks this workload poorly cannot keep the
        #: run off what the search finds; the rest is the guide's.
        self.unguided_share = float(unguided_share)
        if not 0.0 <= self.unguided_share <= 1.0:
            raise ValueError(f"unguided_share must be within [0, 1], got {unguided_share}")
        #: The unguided plan's points a guided run measured (counted against ``unguided_share``).
        self._unguided: set[int] = set()
        #: Which part of a guided plan proposed each point it measured: ``seed``, ``explore``
        #: (random, owed to ``epsilon``), ``unguided`` (this tuner's own search), ``guide`` (the
        #: guide's picks) or ``random`` (a plan's fill); ``_plan_source`` holds the current plan's.
        self.sources: dict[int, str] = {}
        self._plan_source: dict[int, str] = {}

    def set_guide(self, guide, pool: int = 8) -> None:
        """A pre-trained model (:class:`lorien.costmodel.pretrained.ProgramGuide`: ``score(indices)``,
        ``learn(indices, costs)``) that ranks every plan's candidates, from the first plan on:
        ``pool`` x plan size candidates (random ones, plus the search's own once this tuner's
        model is trained) are scored and the best taken; it learns from every measured batch,
        and the plan is ranked again after every batch (not only every ``plan_size`` points),
        so what the first batch taught reaches the second."""
        self.guide = guide
        self.guide_pool = max(1, int(pool))
        self._plan = []
        self._guide_candidates = []
        self._explored = set()
        self._unguided = set()
        self._explore_from = None
        self.sources, self._plan_source = {}, {}

    def load_history(self, features: np.ndarray, scores: np.ndarray) -> None:
        """Transfer: prior (features in the layout of the space's knob tables, normalized
        throughput in [0, 1]) from similar workloads; derived columns are added here."""
        features = self.feature_fn.extend(np.asarray(features, dtype=float))
        scores = np.asarray(scores, dtype=float)
        if len(features) == 0:
            return
        if features.shape[0] != scores.shape[0]:
            raise ValueError(f"{features.shape[0]} feature rows but {scores.shape[0]} scores")
        self.history_x, self.history_y = features, scores
        self._fit()

    def replay(self, indices: Sequence[int], results: Sequence[MeasuredLike]) -> None:
        """Learn earlier measurements, then train the model on everything known, so the next
        plan comes from the model rather than from random exploration."""
        super().replay(indices, results)
        if self._since_fit:  # update() did not just refit
            self._fit()
            self._plan = []

    def next_batch(self, n: int) -> list[int]:
        batch: list[int] = []
        while len(batch) < n and self.has_next():
            if not self._plan:
                self._plan = self._make_plan()
                if not self._plan:
                    break
            index = self._plan.pop(0)
            if index not in self.visited:
                if self.guide is not None:
                    self.sources[int(index)] = self._plan_source.get(int(index), "random")
                batch.append(self._mark(index))
        self._pending += len(batch)
        return batch

    def build_costs(self, indices: Sequence[int]) -> list[float] | None:
        """The guide's guess at how long each point takes to build (:meth:`ProgramGuide.build_cost
        <lorien.costmodel.pretrained.ProgramGuide.build_cost>`), so a guided batch's builds can be
        started longest first (a guided batch has no later batch to build ahead, and its build
        workers otherwise wait on the one long build started last); None without a guide."""
        if self.guide is None or not hasattr(self.guide, "build_cost"):
            return None
        return [float(self.guide.build_cost(int(index))) for index in indices]

    def upcoming(self, n: int) -> list[int]:
        """The rest of the current plan, when learning the points proposed so far will not
        replace it: no guide (it ranks the plan again after every batch) and no refit due
        (fewer than ``plan_size`` points learned since the last one, those pending included).
        A plan that is used up is not made here: it would start from the points measured by then."""
        if self.guide is not None or self._since_fit + self._pending >= self.plan_size:
            return []
        return [index for index in self._plan if index not in self.visited][:n]

    def update(self, indices: Sequence[int], results: Sequence[MeasuredLike]) -> None:
        self._pending = max(0, self._pending - len(indices))
        super().update(indices, results)
        costs = [label_cost(r) for r in results]
        # the tuner's own model and its search's starting points learn the fastest repeat, as the
        # guide and the pre-trained model do: a repeat that lost a core to another job moves the
        # mean several-fold, never the fastest repeat below the program's own time
        for index, cost in zip(indices, costs, strict=True):
            self.measured[int(index)] = cost
        if self.guide is not None and len(indices):
            self.guide.learn([int(i) for i in indices], costs)
        self._since_fit += len(indices)
        if self._since_fit >= self.plan_size:
            self._fit()
            self._plan = []
        elif self.guide is not None:
            self._plan = []  # the guide learned from this batch: rank what is left again

    def add_seeds(self, indices: Sequence[int]) -> None:
        """Seeds: points expected to be good (e.g. the best programs of similar workloads,
        adapted to this space). Each plan measures up to ``seed_quota`` of the unmeasured ones,
        those the model scores highest first, and the rest join the search's starting points.
        With a guide, only the first plan measures them so; later plans put them in the guide's
        pool (:meth:`_guided_plan`)."""
        self.seeds = list(dict.fromkeys([*self.seeds, *(int(i) for i in indices)]))
        self._plan = []

    def _seeded(self) -> list[int]:
        """This plan's seeds, best scored first (all of them when no model is trained yet)."""
        seeds = [i for i in self.seeds if i not in self.visited]
        if seeds and self.booster_ is not None:
            scores = self.predict(np.array(seeds, dtype=np.int64))
            seeds = [seeds[i] for i in np.argsort(-scores, kind="stable")]
        return seeds

    def _make_plan(self) -> list[int]:
        if self.guide is not None:
            return self._guided_plan()
        seeds = self._seeded()
        first = seeds[: self.seed_quota]  # measured in this plan; the rest start the search
        if self.booster_ is None:
            plan = (first + [i for i in sample_unvisited(self, self.plan_size) if i not in seeds])[: self.plan_size]
            return cover_paths(self.space, plan, self.visited, start=len(first))
        n_random = int(math.ceil(self.epsilon * self.plan_size))
        best_measured = self._search_starts(seeds[len(first):])
        wanted = self.plan_size - n_random - len(first)
        pool = wanted * self.rerank_factor if self.rerank_booster_ is not None else wanted
        chosen = self._reranked(self._search(best_measured, pool), wanted)
        chosen = first + [i for i in chosen if i not in first]
        chosen += [i for i in sample_unvisited(self, n_random + self.plan_size) if i not in chosen]
        return chosen[: self.plan_size]

    def _search(self, starts: list[int], num: int) -> list[int]:
        """The ``num`` best points on this tuner's model found by its optimizer from ``starts``, best first."""
        if self.optimizer == "evolution":
            return evolve(self.space, self.predict, num, self.rng, exclude=self.visited, starts=starts,
                          population=self.population, generations=self.generations)
        return anneal(self.space, self.predict, num, self.rng, exclude=self.visited, starts=starts,
                      parallel_size=self.sa_parallel_size, n_iter=self.sa_n_iter)

    def _reranked(self, chosen: list[int], wanted: int) -> list[int]:
        """The search's ``wanted`` best: re-ranked by the loop-feature model where there is one."""
        if self.rerank_booster_ is None or not chosen:
            return chosen[:wanted]
        scores = self._predict_full(np.array(chosen, dtype=np.int64))
        return [chosen[i] for i in np.argsort(-scores)[:wanted]]

    def _guided_plan(self) -> list[int]:
        """A plan ranked by the pre-trained guide: the first plan's seeds first (``seed_quota``; a
        later plan's seeds join the guide's pool, and start the searches), then the random points exploration
        is owed (:meth:`_exploration_due`), then (once this tuner's own model is trained) the
        unguided plan's picks owed to ``unguided_share`` (:meth:`_unguided_due`), then the
        guide's best of a pool of ``guide_pool`` x plan size random points, the search's
        candidates (once this tuner's own model is trained) and (with ``guide_refine``, once
        something is measured) the candidates of an evolution on the guide's own score from the
        best measured points (with ``guide_first_refine``, before anything is measured: from the
        guide's favourites of the random pool). A guide that no longer ranks this run's
        measurements better than chance (``informative`` False) picks nothing: the rest is the
        unguided plan's choice (random until this tuner's own model is trained)."""
        seeds = self._seeded()
        # seeds lead the first plan only; later the guide weighs them with the rest of its pool
        first = seeds[: self.seed_quota] if not self.measured else []
        informative = getattr(self.guide, "informative", True)
        explore = [i for i in sample_unvisited(self, self._exploration_due()) if i not in first]
        self._explored.update(explore)
        taken = set(first) | set(explore)
        wanted = self.plan_size - len(first) - len(explore)
        random_part = [i for i in self._guide_candidates if i not in self.visited and i not in taken]
        random_part += sample_unvisited(self, self.guide_pool * self.plan_size - len(random_part))
        random_part = [i for i in dict.fromkeys(random_part) if i not in taken]
        self._guide_candidates = random_part
        pool = random_part
        unguided: list[int] = []
        if self.booster_ is not None and wanted > 0:
            starts = self._search_starts(seeds[len(first):])
            searched = self._search(starts, wanted * self.rerank_factor)
            due = wanted if not informative else min(wanted, self._unguided_due())
            if due:
                unguided = [i for i in self._reranked(searched, wanted) if i not in taken][:due]
                self._unguided.update(unguided)
                taken |= set(unguided)
                wanted -= len(unguided)
            pool = [i for i in dict.fromkeys([*searched, *random_part]) if i not in taken and i not in self.visited]
        if not informative:
            chosen = first + explore + unguided + [i for i in random_part if i not in taken]
            chosen += [i for i in sample_unvisited(self, self.plan_size) if i not in chosen]
            return self._tagged(chosen[: self.plan_size], first, explore, unguided, [])
        measured_any = any(math.isfinite(c) for c in self.measured.values())
        population = self.guide_refine if measured_any else self.guide_first_refine
        if population and wanted > 0:
            starts = self._search_starts(seeds[len(first):])
            generations = self.guide_generations
            if not measured_any:  # the first plan: from the guide's favourites of the random pool
                scores = np.asarray(self.guide.score(pool), dtype=float) if pool else np.zeros(0)
                starts = [pool[j] for j in np.argsort(-scores, kind="stable")[:16]] + starts
                generations = self.guide_first_generations
            refined = evolve(self.space, self._guide_fitness, population, self.rng, exclude=self.visited | taken,
                             starts=starts, population=population, generations=generations)
            pool = [i for i in dict.fromkeys([*refined, *pool]) if i not in taken and i not in self.visited]
        pool = [i for i in dict.fromkeys([*pool, *seeds]) if i not in taken and i not in self.visited]
        if hasattr(self.guide, "choose"):  # best scored, spread out (ProgramGuide.choose)
            picks = self.guide.choose(pool, max(0, wanted)) if pool else []
        else:
            scores = self.guide.score(pool) if pool else np.zeros(0)
            picks = [pool[j] for j in np.argsort(-scores, kind="stable")[:max(0, wanted)]]
        chosen = first + explore + unguided + picks
        chosen += [i for i in sample_unvisited(self, self.plan_size) if i not in chosen]
        return self._tagged(chosen[: self.plan_size], first, explore, unguided, picks)

    def _tagged(self, plan: list[int], seeds: list[int], explore: list[int], unguided: list[int],
                picks: list[int]) -> list[int]:
        """A guided plan, each point's source noted for :attr:`sources` when it is measured."""
        self._plan_source = {int(i): "random" for i in plan}
        for tag, part in (("guide", picks), ("unguided", unguided), ("explore", explore), ("seed", seeds)):
            self._plan_source.update((int(i), tag) for i in part if int(i) in self._plan_source)
        return plan

    def _search_starts(self, seeds: list[int]) -> list[int]:
        """Where a search over a model starts: the 16 fastest points measured so far, then
        ``seeds`` (those this plan does not measure itself)."""
        best = sorted((i for i, c in self.measured.items() if math.isfinite(c)), key=self.measured.__getitem__)
        return best[:16] + list(seeds)

    def _guide_fitness(self, indices: np.ndarray) -> np.ndarray:
        """The guide's scores as an evolution's fitness: a point that does not lower (``-inf``)
        scores below every point that does, but finitely (the evolution weighs parents by score)."""
        scores = np.asarray(self.guide.score([int(i) for i in indices]), dtype=float)
        finite = np.isfinite(scores)
        if not finite.any():
            return np.zeros(len(scores))
        floor = float(scores[finite].min())
        return np.where(finite, scores, floor - 1.0)

    def _since_own_model(self) -> int | None:
        """Points measured since this tuner's own model was first trained (None before)."""
        if self.booster_ is None:
            return None
        if self._explore_from is None:
            self._explore_from = len(self.visited)
        return len(self.visited) - self._explore_from

    def _exploration_due(self) -> int:
        """Random points the next guided plan owes: ``epsilon`` of the points measured since this
        tuner's own model was first trained, rounded up, less those already explored. A guided
        plan is made again after every batch, so a share kept at its tail (as an unguided plan
        keeps it) would never be measured; none before the model is trained, as unguided."""
        since = self._since_own_model()
        if since is None:
            return 0
        self._explored &= self.visited  # planned but dropped with a plan: not explored
        return max(0, math.ceil(self.epsilon * (since + 1)) - len(self._explored))

    def _unguided_due(self) -> int:
        """The unguided plan's points the next guided plan owes: ``unguided_share`` of the points
        measured since this tuner's own model was first trained, rounded up, less those measured."""
        since = self._since_own_model()
        if since is None:
            return 0
        self._unguided &= self.visited  # planned but dropped with a plan: not measured
        return max(0, math.ceil(self.unguided_share * (since + 1)) - len(self._unguided))

    def predict(self, indices: np.ndarray) -> np.ndarray:
        """Model score (predicted normalized throughput) of config indices."""
        import xgboost as xgb

        features = self.feature_fn(np.asarray(indices, dtype=np.int64))
        return self.booster_.predict(xgb.DMatrix(features))

    def _full_features(self, indices: np.ndarray) -> np.ndarray:
        return np.concatenate([self.feature_fn(indices), self.loop_feature_fn(indices)], axis=1)

    def _predict_full(self, indices: np.ndarray) -> np.ndarray:
        import xgboost as xgb

        return self.rerank_booster_.predict(xgb.DMatrix(self._full_features(indices)))

    def _matrix(self, x: np.ndarray, y: np.ndarray):
        """Training data; with ``weighted``, sample weights are the normalized throughputs (at
        least :data:`MIN_WEIGHT`, so failed programs still count a little)."""
        import xgboost as xgb

        weight = np.maximum(y, MIN_WEIGHT) if self.weighted else None
        return xgb.DMatrix(x, label=y, weight=weight)

    def _fit(self) -> None:
        import xgboost as xgb

        xs, ys = [], []
        if self.measured:
            indices = np.array(list(self.measured), dtype=np.int64)
            costs = np.array([self.measured[i] for i in indices.tolist()])
            finite = np.isfinite(costs)
            throughput = np.zeros_like(costs)
            throughput[finite] = 1.0 / costs[finite]
            if throughput.max() > 0:
                throughput /= throughput.max()
            xs.append(self.feature_fn(indices))
            ys.append(throughput)
        if self.history_x is not None:
            xs.append(self.history_x)
            ys.append(self.history_y)
        if not xs or sum(len(y) for y in ys) < 2:
            return
        x, y = np.concatenate(xs), np.concatenate(ys)
        params = {"max_depth": 6, "eta": 0.3, "subsample": 1.0, "min_child_weight": 1,
                  "objective": "reg:squarederror", "nthread": 1, "verbosity": 0,
                  "seed": int(self.rng.integers(1 << 30))}
        self.booster_ = xgb.train(params, self._matrix(x, y), num_boost_round=self.num_boost_round)
        if self.loop_feature_fn is not None and self.measured:
            measured_x = self._full_features(indices)
            self.rerank_booster_ = xgb.train(params, self._matrix(measured_x, ys[0]),
                                             num_boost_round=self.num_boost_round)
        self._since_fit = 0
