"""Pre-trained program-feature models in tuning (lorien.costmodel.pretrained): every dialect's
xgb tuner ranks its first batch with a model trained on other workloads (the shared logs of
TopHub, Ansor and MetaSchedule: none of them the tiny dense layer tuned here), keeps learning,
and stamps its records; bad models are clear errors."""

from __future__ import annotations

import functools
import json
import math
import pickle
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import load_benchmark

from lorien.errors import ConfigError

DENSE = {"M": 16, "N": 32, "K": 32}


@pytest.fixture(scope="module")
def program_model(tmp_path_factory, shared_data):
    """A model trained on program features of the shared logs of all three dialects."""
    from lorien.costmodel.train import train_cost_model
    from lorien.features import featurize

    folder = tmp_path_factory.mktemp("program-model")
    featurize(folder / "features", paths=[shared_data / "tophub" / "llvm_v0.04.log", shared_data / "ansor",
                                          shared_data / "meta_schedule"], extractor="program", jobs=1, progress=False)
    train_cost_model(folder / "features", folder / "model", templates=["program"], folds=2, baseline=None,
                     plots=False, progress=False)
    return str(folder / "model")


def test_the_program_model_is_a_boosted_forest(program_model):
    """`lorien train --template program` grows PROGRAM_PARALLEL_TREES trees a round, and the
    guide's online updates continue that booster."""
    from lorien.costmodel.pretrained import FEATURE_NAMES, ProgramModel
    from lorien.costmodel.train import PROGRAM_PARALLEL_TREES

    report = json.loads((Path(program_model) / "report.json").read_text())
    assert report["templates"]["program"]["params"] == {"parallel_trees": PROGRAM_PARALLEL_TREES}
    model = ProgramModel(program_model)
    trees = len(model.base.get_dump())
    assert trees == PROGRAM_PARALLEL_TREES * model.base.num_boosted_rounds()
    rows = np.random.default_rng(0).uniform(0, 4, size=(6, len(FEATURE_NAMES)))
    model.learn(rows, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert model.booster.num_boosted_rounds() == model.base.num_boosted_rounds() + model.online_rounds
    assert np.isfinite(model.score(rows)).all()


def _job(dialect: str, model: str | None, trials: int = 4, **extra) -> dict:
    from lorien.dialect import get_dialect
    from lorien.target import host_target

    task_name, args = get_dialect(dialect).expand_workload("dense", DENSE)
    job = {"dialect": dialect, "task_name": task_name, "args": args, "tuner": "xgb", "trials": trials,
           "batch_size": 4, "seed": 3, "target": host_target().canonical, **extra}
    if model is not None:
        job["cost_model"] = model
    return job


@pytest.mark.parametrize("dialect", ["autotvm", "auto_scheduler", "meta_schedule"])
def test_the_first_batch_is_the_models_choice_in_every_dialect(dialect, program_model):
    from lorien.costmodel.pretrained import ProgramModel
    from lorien.dialect import get_dialect
    from lorien.features.program import schedule_features
    from lorien.tune.job import TuneJob
    from lorien.tune.loop import tune_job

    batches = []
    progress = tune_job(_job(dialect, program_model), None, on_batch=lambda state, records: batches.append(records))
    first = batches[0]
    assert progress.trials == 4 and len(first) == 4
    model = ProgramModel(program_model)
    for record in first:  # every record says which model chose it
        assert orjson.loads(record.build)["cost_model"] == model.describe()

    # Score the chosen batch and random points of the same space with the model as trained
    context = get_dialect(dialect).tuning_context(TuneJob.from_spec(_job(dialect, None)), None)
    rng = np.random.default_rng(11)
    indices = [int(i) for i in rng.choice(len(context.space), size=min(64, len(context.space)), replace=False)]
    random_rows = [schedule_features(*context.schedule_of(context.space.get(i))) for i in indices]
    chosen_rows = [schedule_features(*get_dialect(dialect).schedule_record(record)) for record in first]
    random_scores, chosen_scores = model.score(np.vstack(random_rows)), model.score(np.vstack(chosen_rows))
    assert np.ptp(random_scores) > 0  # the model tells these points apart
    # the batch is what the model likes best of a large pool: above the median of random points,
    # and above their mean on average (an unguided first batch is random: about half of it below)
    assert chosen_scores.min() >= np.median(random_scores)
    assert chosen_scores.mean() > random_scores.mean()


def test_without_the_model_the_first_batch_is_not_the_models_choice(program_model):
    """The check above fails for an unguided run: its first batch scores like random points."""
    from lorien.costmodel.pretrained import ProgramModel
    from lorien.dialect import get_dialect
    from lorien.features.program import schedule_features
    from lorien.tune.loop import tune_job

    model = ProgramModel(program_model)
    guided, plain = [], []
    tune_job(_job("auto_scheduler", program_model, trials=8, batch_size=8), None,
             on_batch=lambda state, records: guided.extend(records))
    tune_job(_job("auto_scheduler", None, trials=8, batch_size=8), None,
             on_batch=lambda state, records: plain.extend(records))
    dialect = get_dialect("auto_scheduler")

    def scores(records):
        return model.score(np.vstack([schedule_features(*dialect.schedule_record(r)) for r in records]))

    assert scores(guided).mean() > scores(plain).mean()
    assert all("cost_model" not in orjson.loads(record.build) for record in plain)


def test_the_guide_keeps_learning_from_the_runs_measurements(program_model):
    from lorien.costmodel.pretrained import ProgramGuide, ProgramModel
    from lorien.dialect import get_dialect
    from lorien.tune.job import TuneJob

    context = get_dialect("meta_schedule").tuning_context(TuneJob.from_spec(_job("meta_schedule", None)), None)
    guide = ProgramGuide(ProgramModel(program_model), context.space, context.schedule_of)
    points = list(range(min(12, len(context.space))))
    before = guide.score(points)
    # pretend the points the model likes least were measured fastest
    order = np.argsort(before)
    costs = np.empty(len(points))
    costs[order] = np.linspace(1e-4, 1e-3, len(points))
    guide.learn(points, costs.tolist())
    after = guide.score(points)
    assert not np.allclose(before, after)
    # the update moves the ranking towards the measurements
    from scipy.stats import spearmanr

    truth = -costs
    assert spearmanr(after, truth).statistic > spearmanr(before, truth).statistic


def test_rank_blending_gives_tied_scores_one_rank():
    """Points a model scores alike share a rank, whatever their place in the pool."""
    from lorien.costmodel.pretrained import _ranks

    assert _ranks(np.array([1.0, 1.0, 0.0, 2.0])).tolist() == [1 / 3, 1 / 3, 0.0, 1.0]


def test_guided_records_round_trip_through_their_native_log(program_model, tmp_path):
    from lorien.formats import encode_record, read_log
    from lorien.tune.loop import tune_job

    records = []
    tune_job(_job("auto_scheduler", program_model), None, on_batch=lambda state, batch: records.extend(batch))
    path = tmp_path / "log.json"
    path.write_text("".join(encode_record(r, "ansor") + "\n" for r in records))
    again = read_log(path).records
    assert [r.config for r in again] == [r.config for r in records]
    assert [r.costs for r in again] == [r.costs for r in records]


def test_a_bad_cost_model_is_a_clear_error(tmp_path, program_model):
    from lorien.tune.job import TuneJob

    with pytest.raises(ConfigError, match="no cost model there"):
        TuneJob.from_spec(_job("autotvm", str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="guides the xgb tuner"):
        TuneJob.from_spec({**_job("autotvm", program_model), "tuner": "random"})
    other = tmp_path / "knob-model"
    other.mkdir()
    (other / "model.json").write_text(json.dumps({"format": "lorien-costmodel", "templates": {"dense_pack.x86": {}}}))
    with pytest.raises(ConfigError, match="not trained on program features"):
        TuneJob.from_spec(_job("autotvm", str(other)))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a cost model file"):
        TuneJob.from_spec(_job("meta_schedule", str(broken)))


def test_lorien_tune_cost_model_flag(tmp_path, program_model, capsys):
    from lorien.cli import main
    from lorien.warehouse import open_store

    config = tmp_path / "tune.yaml"
    config.write_text("dialect: meta_schedule\ntrials: 4\nbatch_size: 4\nworkloads:\n  - dense: {M: 16, N: 32, K: 32}\n")
    store = f"parquet:{tmp_path / 'store'}"
    assert main(["tune", str(config), "--store", store, "--tuner", "xgb", "--cost-model", program_model,
                 "--no-progress"]) == 0
    with open_store(store) as opened:
        rows = opened.scan({}).to_pylist()
    assert len(rows) == 4 and all("cost_model" in orjson.loads(row["build"]) for row in rows)
    capsys.readouterr()
    assert main(["tune", str(config), "--store", store, "--tuner", "xgb", "--cost-model", str(tmp_path / "nope"),
                 "--no-progress"]) != 0
    assert f"cost_model {tmp_path / 'nope'}: no cost model there" in capsys.readouterr().err
    assert main(["tune", str(config), "--store", store, "--cost-model", program_model, "--no-progress"]) != 0
    assert "guides the xgb tuner" in capsys.readouterr().err


class _LinearModel:
    """A stand-in scorer for ProgramGuide.choose: the score is the first feature."""

    def score(self, vectors):
        return np.asarray(vectors, dtype=float)[:, 0]


def _guide_with(rows):
    from lorien.costmodel.pretrained import ProgramGuide

    guide = ProgramGuide(_LinearModel(), space=None, schedule_of=None)
    guide.cache = {i: (None if row is None else np.asarray(row, dtype=float)) for i, row in enumerate(rows)}
    return guide


def test_the_guides_picks_are_spread_out(monkeypatch):
    """Ten near-copies the model likes best, ten distinct points it likes less: a plan of four
    takes one of the copies, then the best distinct ones; without diversity it takes four copies."""
    import lorien.costmodel.pretrained as pretrained

    rng = np.random.default_rng(0)
    cluster = [[10.0 + 0.001 * i, 5.0, 5.0, 5.0] for i in range(10)]
    spread = [[float(9 - i), *rng.uniform(-20, 20, size=3)] for i in range(10)]
    guide = _guide_with([*cluster, *spread, None])
    picks = guide.choose(range(21), 4)
    assert picks[0] == 9  # the model's best comes first
    assert sum(p < 10 for p in picks) == 1 and picks[1:] == [10, 11, 12]
    assert guide.choose(range(21), 21)[-1] == 20  # the point that does not lower comes last
    monkeypatch.setattr(pretrained, "DIVERSITY", 0.0)
    assert guide.choose(range(21), 4) == [9, 8, 7, 6]


@pytest.mark.parametrize("dialect", ["autotvm", "meta_schedule"])
def test_the_benchmarks_held_out_ranking_check_runs_on_tuned_records(dialect, program_model):
    """benchmarks/costmodel.py ranking_quality: NDCG@8 of the model's order of a run's configs,
    beside the chance level of random orders of the same configs."""
    from lorien.tune.loop import tune_job

    bench = load_benchmark("costmodel.py", "bench_costmodel_ranking")
    records = []
    tune_job(_job(dialect, None, trials=12, batch_size=12), None, on_batch=lambda state, batch: records.extend(batch))
    quality = bench.ranking_quality(program_model, dialect, records, k=4, permutations=50)
    distinct = len({r.config for r in records if r.is_valid})
    assert quality["configs"] == distinct >= 2
    assert 0 < quality["ndcg"] <= 1 and 0 < quality["ndcg_random"] < 1 and 0 < quality["top1"] <= 1


def test_a_guided_plan_is_ranked_again_after_every_batch():
    """The guide learns from the first batch; the second batch of the same plan is its new
    choice, not the rest of the ranking it made before it had measured anything."""
    from types import SimpleNamespace

    from lorien.search.base import MixedRadixSpace
    from lorien.search.xgb import XGBTuner

    class Line(MixedRadixSpace):
        dims = [64]

    class FlippingGuide:
        """Likes high indices until it has measured something, then low ones."""

        def __init__(self):
            self.learned = 0

        def score(self, indices):
            indices = np.asarray(indices, dtype=float)
            return -indices if self.learned else indices

        def learn(self, indices, costs):
            self.learned += len(indices)

    tuner = XGBTuner(Line(), seed=0, plan_size=16)
    tuner.set_guide(FlippingGuide(), pool=4)
    first = tuner.next_batch(4)
    assert min(first) >= 48  # the guide's choice before learning: the highest of the pool
    tuner.update(first, [SimpleNamespace(costs=[1e-3], error_no=0) for _ in first])
    second = tuner.next_batch(4)
    assert max(second) < 16  # ranked again after learning: the lowest, within the same 16-point plan


class _RecordingChooser:
    """A guide that likes low indices and remembers every pool it chose from and every pick."""

    def __init__(self):
        self.pools: list[list[int]] = []
        self.picked: set[int] = set()

    def score(self, indices):
        return -np.asarray(indices, dtype=float)

    def choose(self, indices, k):
        self.pools.append(list(indices))
        picks = sorted(indices)[:k]
        self.picked.update(picks)
        return picks

    def learn(self, indices, costs):
        pass


def _guided_run(tuner, batches: int, batch_size: int = 8) -> list[int]:
    from types import SimpleNamespace

    measured = []
    for _ in range(batches):
        batch = tuner.next_batch(batch_size)
        tuner.update(batch, [SimpleNamespace(costs=[1e-3 * (1 + i % 7)], error_no=0) for i in batch])
        measured += batch
    return measured


def test_a_guided_run_measures_its_exploration_share():
    """A guided plan is made again after every batch, so random points kept at its tail (where an
    unguided plan keeps them) are never measured: once the tuner's own model is trained (16
    points here), a quarter of what the run measures (epsilon 0.25) is random all the same (no
    share for the unguided plan here: its picks are not the guide's either)."""
    from lorien.search.base import MixedRadixSpace
    from lorien.search.xgb import XGBTuner

    class Grid(MixedRadixSpace):
        dims = [16, 16, 16, 16]

    guide = _RecordingChooser()
    tuner = XGBTuner(Grid(), seed=0, plan_size=16, epsilon=0.25, optimizer="evolution", population=32,
                     generations=1, unguided_share=0.0)
    tuner.set_guide(guide, pool=4)
    measured = _guided_run(tuner, 12)
    explored = [i for i in measured[16:] if i not in guide.picked]
    assert all(i in guide.picked for i in measured[:16])  # no model of its own yet: the guide's picks
    assert 0.2 * len(measured[16:]) <= len(explored) <= 0.35 * len(measured[16:])


def test_a_guided_plans_pool_stays_its_size():
    """The guide ranks ``pool`` x plan size random points plus the search's fresh candidates each
    plan; the search's leftovers of earlier plans do not pile up in the pool (a pool that grows
    with the run is a different choice: the extremes of a larger pool are more often the
    model's errors)."""
    from lorien.search.base import MixedRadixSpace
    from lorien.search.xgb import XGBTuner

    class Grid(MixedRadixSpace):
        dims = [16, 16, 16, 16]

    guide = _RecordingChooser()
    tuner = XGBTuner(Grid(), seed=0, plan_size=16, optimizer="evolution", population=32, generations=1)
    tuner.set_guide(guide, pool=4)
    _guided_run(tuner, 12)
    limit = 4 * 16 + tuner.rerank_factor * 16
    assert len(guide.pools) == 12 and max(len(pool) for pool in guide.pools) <= limit
    assert len(guide.pools[-1]) > 4 * 16  # the search's candidates are in it


def test_online_updates_learn_the_label_training_used():
    """A record's label cost is its fastest repeat both when program features are written for
    training and when the guide learns a run's measurements online: point 1 (repeats 0.9 ms and
    0.2 ms) is the faster one to both, though by the mean of its repeats it is the slower."""
    from types import SimpleNamespace

    import pyarrow as pa

    from lorien.features.pipeline import throughput_gflops
    from lorien.search.base import LABEL_STATISTIC, MixedRadixSpace, label_cost
    from lorien.search.xgb import XGBTuner

    class Line(MixedRadixSpace):
        dims = [8]

    class RecordingGuide:
        def __init__(self):
            self.learned = {}

        def score(self, indices):
            return np.zeros(len(indices))

        def learn(self, indices, costs):
            self.learned.update(zip(indices, costs, strict=True))

    repeats = [[0.5e-3, 0.5e-3], [0.9e-3, 0.2e-3], [1e-3, float("nan")], [0.0, 1e-3]]
    guide = RecordingGuide()
    tuner = XGBTuner(Line(), seed=0, plan_size=16)
    tuner.set_guide(guide, pool=1)
    tuner.update([0, 1, 2, 3], [SimpleNamespace(costs=c, error_no=0) for c in repeats])
    assert guide.learned == {0: 0.5e-3, 1: 0.2e-3, 2: float("inf"), 3: float("inf")}
    assert min(guide.learned, key=guide.learned.get) == 1

    table = pa.table({"costs": pa.array(repeats, type=pa.list_(pa.float64())), "error_no": [0, 0, 0, 0],
                      "flop": [1e6, 1e6, 1e6, 1e6]})
    thrpt, _ = throughput_gflops(table, LABEL_STATISTIC)
    online = [label_cost(SimpleNamespace(costs=c, error_no=0)) for c in repeats]
    assert np.allclose(thrpt, [1e6 / c / 1e9 if np.isfinite(c) else 0.0 for c in online])
    assert label_cost(SimpleNamespace(costs=[1e-3], error_no=4)) == float("inf")


class _DistanceGuide:
    """A guide that knows the answer: it scores a point by minus its knob distance to ``OPTIMUM``."""

    OPTIMUM = (21, 3, 17, 29, 9)

    def __init__(self, space):
        self.space = space

    def distance(self, index) -> int:
        return int(np.abs(np.array(self.space.knob_indices(int(index))) - np.array(self.OPTIMUM)).sum())

    def score(self, indices):
        return -np.array([self.distance(i) for i in indices], dtype=float)

    def learn(self, indices, costs):
        pass


def _distance_guided_tuner(seed: int, **options):
    """An evolution xgb tuner on a 32^5 grid, guided by a :class:`_DistanceGuide` (pool 4 x plan
    size 16); ``options`` go to the tuner (``guide_refine``, ``guide_first_refine``)."""
    from lorien.search.base import MixedRadixSpace
    from lorien.search.xgb import XGBTuner

    class Grid(MixedRadixSpace):
        dims = [32] * 5

    space = Grid()
    guide = _DistanceGuide(space)
    tuner = XGBTuner(space, seed=seed, plan_size=16, optimizer="evolution", population=32, generations=1,
                     **options)
    tuner.set_guide(guide, pool=4)
    return tuner, guide


def test_a_guided_run_refines_its_best_measured_programs():
    """With ``guide_refine`` a guided plan's pool also holds an evolution on the guide's score from
    the run's best measured points (Ansor's search), so a run closes in on what the model likes
    best; the guide's pick among fresh random points alone (``guide_refine`` 0, and the search
    on the tuner's own knob model once trained) stays far from it in a large space. Same seeds,
    same guide: only the refinement differs."""
    from types import SimpleNamespace

    def best_after(refine: int, seed: int, batches: int = 3) -> int:
        tuner, guide = _distance_guided_tuner(seed, guide_refine=refine)
        best = math.inf
        for _ in range(batches):
            batch = tuner.next_batch(8)
            tuner.update(batch, [SimpleNamespace(costs=[1e-3 * (1 + guide.distance(i))], error_no=0) for i in batch])
            best = min(best, *(guide.distance(i) for i in batch))
        return best

    refined = [best_after(64, seed) for seed in range(5)]
    picked = [best_after(0, seed) for seed in range(5)]
    assert sum(refined) < 0.75 * sum(picked), (refined, picked)


def test_a_guided_first_batch_is_picked_from_an_evolution_on_the_guide_with_guide_first_refine():
    """With ``guide_first_refine`` the first plan's pool also holds an evolution on the guide's
    score started from its favourites of the random pool, before anything is measured, so the
    first batch is already closer to what the model likes best than any random pool's pick;
    without it (``guide_refine`` alone needs a measured point) the first batch is the guide's
    pick of random points. Same seeds, same guide: only the option differs."""
    def first_batch_best(first: int, seed: int) -> int:
        tuner, guide = _distance_guided_tuner(seed, guide_refine=64, guide_first_refine=first)
        return min(guide.distance(i) for i in tuner.next_batch(8))

    refined = [first_batch_best(128, seed) for seed in range(5)]
    picked = [first_batch_best(0, seed) for seed in range(5)]
    assert sum(refined) < 0.75 * sum(picked), (refined, picked)


def test_guide_refine_is_a_tuner_option_on_by_default_in_meta_schedule_only():
    """``guide_refine`` reaches the xgb tuner from a job's tuner_options; meta_schedule turns it on
    (its guided runs stalled without it), autotvm and auto_scheduler do not (measured without a
    gain: docs/costmodel.md); a negative value is a clear error."""
    from lorien.dialect import get_dialect
    from lorien.tune.job import TuneJob

    def tuner_of(dialect: str, **extra):
        return get_dialect(dialect).tuning_context(TuneJob.from_spec(_job(dialect, None, **extra)), None).tuner

    for dialect in ("autotvm", "auto_scheduler"):
        assert tuner_of(dialect).guide_refine == 0
    assert tuner_of("meta_schedule").guide_refine == 64
    assert tuner_of("meta_schedule").guide_first_refine == 256
    assert [tuner_of(d).guide_first_refine for d in ("autotvm", "auto_scheduler")] == [0, 0]
    assert tuner_of("meta_schedule", tuner_options={"guide_refine": 0}).guide_refine == 0
    assert tuner_of("auto_scheduler", tuner_options={"guide_refine": 64}).guide_refine == 64
    with pytest.raises(ConfigError, match="guide_refine"):
        tuner_of("auto_scheduler", tuner_options={"guide_refine": -1})
    with pytest.raises(ConfigError, match="guide_first_refine"):
        tuner_of("meta_schedule", tuner_options={"guide_first_refine": -4})
    with pytest.raises(ConfigError, match="guide_first_generations"):
        tuner_of("meta_schedule", tuner_options={"guide_first_generations": 0})


def test_a_prior_that_ranks_the_run_inversely_is_dropped_after_two_batches(program_model):
    """The guide weighs the pre-trained model by how well it ordered this run's measurements
    before learning them, not by how many there are: a workload whose programs run in the
    reverse of the model's order (costs made so here) drops the model after its second batch
    (the first, its favourites alone, is not judged: it keeps the model for the second); the
    guide then ranks nothing (the next batch is the unguided plan's) until the run's own
    model has ordered a batch better than chance, and from then on ranks by that model alone."""
    from types import SimpleNamespace

    import xgboost as xgb
    from scipy.stats import spearmanr

    from lorien.costmodel.pretrained import guide_tuner
    from lorien.dialect import get_dialect
    from lorien.tune.job import TuneJob

    # without the refinements' evolutions on the (online-updated) model: the batches here are to
    # be the pre-trained model's picks, or not, by its weight alone
    job = TuneJob.from_spec(_job("meta_schedule", program_model, trials=32, batch_size=8,
                                 tuner_options={"guide_refine": 0, "guide_first_refine": 0}))
    context = get_dialect("meta_schedule").tuning_context(job, None)
    guide_tuner(context, job)
    tuner, guide = context.tuner, context.tuner.guide
    model = guide.model

    def prior(indices):  # the model's scores as trained
        return model.base.predict(xgb.DMatrix(model.matrix(np.vstack([guide.features(i) for i in indices]))))

    def measure(batch):  # the model's least liked points are the fastest
        costs = 1e-4 * np.exp(np.clip(prior(batch), -30, 30))
        tuner.update(batch, [SimpleNamespace(costs=[cost], error_no=0) for cost in costs.tolist()])

    rng = np.random.default_rng(5)
    sample = [int(i) for i in rng.choice(len(context.space), size=120, replace=False)]
    sample = [i for i in sample if guide.features(i) is not None]
    median = np.median(prior(sample))
    first = tuner.next_batch(8)
    assert prior(first).min() > median  # the model's choice: what it likes
    measure(first)
    assert guide.model.skill("prior") is None and guide.model.weights() == (1.0, 0.0)  # not judged yet
    second = tuner.next_batch(8)
    assert prior(second).min() > median  # still the model's choice
    measure(second)
    assert guide.model.skill("prior") < 0 and guide.model.weights()[0] == 0.0
    third = tuner.next_batch(8)
    assert prior(third).min() < median  # no longer the model's choice
    measure(third)
    assert guide.model.skill("own") > 0 and guide.model.weights()[0] == 0.0 and guide.informative
    rest = [i for i in sample if i not in tuner.visited]
    assert spearmanr(guide.score(rest), -prior(rest)).statistic > 0.5  # the run's order, not the model's


def test_a_guided_run_measures_the_unguided_plans_share():
    """Once the tuner's own model is trained (16 points here), a quarter of what a guided run
    measures (``unguided_share`` 0.25, the default) is the unguided plan's choice, the best of
    the search on that model, whatever the guide likes; with ``unguided_share`` 0 the guide
    picks everything but the exploration share (epsilon 0 here: nothing)."""
    from lorien.search.base import MixedRadixSpace
    from lorien.search.xgb import XGBTuner

    class Grid(MixedRadixSpace):
        dims = [16, 16, 16, 16]

    def unguided(share: float | None) -> tuple[float, list[int]]:
        guide = _RecordingChooser()
        options = {} if share is None else {"unguided_share": share}
        tuner = XGBTuner(Grid(), seed=0, plan_size=16, epsilon=0.0, optimizer="evolution", population=32,
                         generations=1, **options)
        tuner.set_guide(guide, pool=4)
        measured = _guided_run(tuner, 12)
        assert all(i in guide.picked for i in measured[:16])  # no model of its own yet: the guide's picks
        later = measured[16:]
        return sum(i not in guide.picked for i in later) / len(later), later

    share, _ = unguided(None)
    assert 0.2 <= share <= 0.35
    assert unguided(0.0)[0] == 0.0
    with pytest.raises(ValueError, match="unguided_share"):
        XGBTuner(Grid(), unguided_share=1.5)


def test_a_guided_run_measures_seeds_in_its_first_batch_only():
    """Seeds (a dialect's adaptation of similar workloads' best programs) lead a guided run's
    first batch (``seed_quota``, 2); after that they are candidates in the guide's pool like any
    other, measured when the guide picks them, not two a batch whatever it thinks of them
    (on the benchmark's held-out layers, the transfer seeds after a run's first ran at 0.03-0.74
    of the run's best, two a batch over its first batches: docs/costmodel.md). ``sources`` says which part of each plan proposed each measured point."""
    from lorien.search.base import MixedRadixSpace
    from lorien.search.xgb import XGBTuner

    class Grid(MixedRadixSpace):
        dims = [16, 16, 16, 16]

    seeds = [65535 - 7 * k for k in range(8)]  # the guide likes low indices: it never picks these
    guide = _RecordingChooser()
    tuner = XGBTuner(Grid(), seed=0, plan_size=16, epsilon=0.05, optimizer="evolution", population=32,
                     generations=1)
    tuner.set_guide(guide, pool=4)
    tuner.add_seeds(seeds)
    measured = _guided_run(tuner, 8)
    assert measured[:2] == seeds[:2]
    assert not set(measured[2:]) & set(seeds)
    assert all(set(seeds[2:]) <= set(pool) for pool in guide.pools[1:])  # the guide weighs the rest
    assert [tuner.sources[i] for i in measured[:8]] == ["seed", "seed"] + ["guide"] * 6
    later = [tuner.sources[i] for i in measured[16:]]
    assert set(later) <= {"guide", "unguided", "explore"} and "unguided" in later and "explore" in later
    assert later.count("unguided") == sum(i not in guide.picked for i in measured[16:]) - later.count("explore")


def test_unguided_share_is_a_tuner_option_in_every_dialect():
    """``unguided_share`` reaches the xgb tuner from a job's tuner_options (default 0.25 in every
    dialect); a value outside [0, 1] is a clear error."""
    from lorien.dialect import get_dialect
    from lorien.tune.job import TuneJob

    def tuner_of(dialect: str, **extra):
        return get_dialect(dialect).tuning_context(TuneJob.from_spec(_job(dialect, None, **extra)), None).tuner

    for dialect in ("autotvm", "auto_scheduler", "meta_schedule"):
        assert tuner_of(dialect).unguided_share == 0.25
    assert tuner_of("meta_schedule", tuner_options={"unguided_share": 0.5}).unguided_share == 0.5
    with pytest.raises(ConfigError, match="unguided_share"):
        tuner_of("meta_schedule", tuner_options={"unguided_share": -0.1})


RELAX_BERT = Path(__file__).parent / "data" / "relax_bert_layer" / "database_workload.json"
# TVM relax tasks of a BERT-style layer (int64 shapes, fused epilogues), by structural hash
RELAX_TASKS = {
    "matmul + bias + GELU (erf) fused": "3489386783212461910",
    "softmax": "11693078973378363919",
    "layer norm": "13513769216420307533",
    "reshape + transposes (12 points)": "2927331570692492373",
}


@pytest.mark.parametrize("task", list(RELAX_TASKS))
def test_a_guided_run_scores_the_candidates_of_relax_tasks(task, program_model):
    """A model trained on other workloads guides meta_schedule's xgb tuner on TVM's relax tasks
    (what ``lorien extract --dialect meta_schedule`` gives, what benchmarks/model_tvm.py
    ``--cost-model`` tunes): every candidate of the space lowers to a program the model scores,
    and the first batch is the model's choice."""
    from lorien.costmodel.pretrained import ProgramGuide, ProgramModel
    from lorien.dialect import get_dialect
    from lorien.features.program import schedule_features
    from lorien.tune.job import TuneJob
    from lorien.tune.loop import tune_job

    spec = {"dialect": "meta_schedule", "workload_file": str(RELAX_BERT), "workload_key": RELAX_TASKS[task],
            "tuner": "xgb", "trials": 4, "batch_size": 4, "seed": 3, "measure": {"number": 1, "repeat": 1,
                                                                                  "min_repeat_ms": 0}}
    progress = tune_job({**spec, "cost_model": program_model}, None)
    model = ProgramModel(program_model)
    assert progress.records and all(record.error_no == 0 for record in progress.records)
    assert all(orjson.loads(record.build)["cost_model"] == model.describe() for record in progress.records)

    context = get_dialect("meta_schedule").tuning_context(TuneJob.from_spec(spec), None)
    rng = np.random.default_rng(5)
    indices = [int(i) for i in rng.choice(len(context.space), size=min(32, len(context.space)), replace=False)]
    scores = ProgramGuide(model, context.space, context.schedule_of).score(indices)
    assert np.isfinite(scores).all()  # no candidate falls back to "does not lower"
    if len(context.space) > 12:  # the tiny spaces' points lower to one or two programs: tied scores
        chosen = model.score(np.vstack([schedule_features(*get_dialect("meta_schedule").schedule_record(record))
                                        for record in progress.records]))
        assert chosen.min() >= np.median(scores)


@pytest.mark.parametrize("task", ["softmax", "layer norm"])
def test_every_mutation_of_a_space_without_tiled_blocks_is_a_point(task):
    """A relax task without a tiled block (softmax, layer norm) has no cache level to mutate: the
    space's cache mutation falls back to another knob (it drew from an empty list, and the first
    evolution on such a space, the guide's refinement before the first batch, failed)."""
    from lorien.dialect import get_dialect
    from lorien.tune.job import TuneJob

    spec = {"dialect": "meta_schedule", "workload_file": str(RELAX_BERT), "workload_key": RELAX_TASKS[task],
            "tuner": "xgb", "trials": 4}
    space = get_dialect("meta_schedule").tuning_context(TuneJob.from_spec(spec), None).space
    assert not space.tiled
    rng = np.random.default_rng(0)
    index = 0
    for _ in range(400):  # the cache mutation is drawn 2 % of the time
        index = space.mutate(index, rng)
        assert 0 <= index < len(space)


def test_a_guided_batch_keeps_its_order_and_its_builds_start_longest_first(monkeypatch):
    """The guide chooses a batch and its order (the order it is measured in, which trial counts
    read); the build workers get its builds longest first by the guide's guess."""
    from lorien.engine import measure as engine_measure
    from lorien.search.base import MixedRadixSpace
    from lorien.search.xgb import XGBTuner

    class Line(MixedRadixSpace):
        dims = [64]

    class Guessing(_RecordingChooser):
        def build_cost(self, index):
            return float((index * 37) % 11)  # unrelated to the guide's choice

    batches = {}
    for guide in (_RecordingChooser(), Guessing()):
        tuner = XGBTuner(Line(), seed=0, plan_size=16)
        tuner.set_guide(guide, pool=4)
        batches[type(guide).__name__] = (tuner.next_batch(8), tuner.build_costs(list(range(8))))
    (plain, no_costs), (guided, costs) = batches["_RecordingChooser"], batches["Guessing"]
    assert plain == guided == sorted(plain) and no_costs is None  # the guide's picks, in its order
    assert costs == [Guessing().build_cost(index) for index in range(8)]

    submitted = []
    builder = engine_measure.LocalBuilder(n_parallel=2)
    monkeypatch.setattr(builder.pool, "map", lambda kind, payloads, timeout: submitted.extend(payloads) or
                        [("error", 1, "not built here")] * len(payloads))
    inputs = [engine_measure.MeasureInput(functools.partial(divmod, index, 1), name=f"c{index}") for index in range(5)]
    builder.build(inputs, engine_measure.MeasureOption(), costs=[1.0, 5.0, 3.0, 5.0, 0.5])
    assert [pickle.loads(payload).name for payload in submitted] == ["c1", "c3", "c2", "c0", "c4"]
    with pytest.raises(ValueError, match="2 build costs for 5 inputs"):
        builder.build(inputs, engine_measure.MeasureOption(), costs=[1.0, 2.0])


def test_a_guided_meta_schedule_job_hands_the_builder_its_build_time_guesses(program_model, monkeypatch):
    """End to end: each batch of a guided engine job reaches the builder with one guess per
    candidate (its measurements in the guide's order); an unguided job's with none."""
    from lorien.engine import measure as engine_measure
    from lorien.tune.loop import tune_job

    seen, plan = [], engine_measure.LocalBuilder._plan

    def recording(self, inputs, ahead, costs):  # what every build of a batch starts from, overlapped or not
        seen.append((len(inputs), costs))
        return plan(self, inputs, ahead, costs)

    monkeypatch.setattr(engine_measure.LocalBuilder, "_plan", recording)
    tune_job(_job("meta_schedule", program_model, trials=8), None)
    assert len(seen) == 2 and all(costs is not None and len(costs) == size == 4 for size, costs in seen)
    assert any(len(set(costs)) > 1 for _, costs in seen)
    seen.clear()
    tune_job(_job("meta_schedule", None, trials=8), None)
    assert seen and all(costs is None for _, costs in seen)


def test_the_guides_build_time_guess_ranks_programs_by_the_size_of_the_ir_llvm_compiles():
    """LLVM's time on a candidate grows with its IR (unrolled loops above all); the guess, from
    the guide's features alone, orders 40 random dense programs as their rendered IR's size does."""
    from scipy.stats import spearmanr

    from dialects.meta_schedule.space import TraceSpace
    from dialects.meta_schedule.tuning import _schedule_of
    from lorien.costmodel.pretrained import ProgramGuide
    from lorien.engine import ops, te
    from lorien.engine.codegen import llvm as llvm_codegen
    from lorien.engine.dag import ComputeDAG
    from lorien.engine.lower import lower

    data, weight = te.placeholder((64, 64), name="data"), te.placeholder((64, 64), name="weight")
    dag = ComputeDAG([data, weight, ops.dense(data, weight)])
    space = TraceSpace(dag)
    guide = ProgramGuide(None, space, functools.partial(_schedule_of, space))
    guesses, sizes = [], []
    for index in np.random.default_rng(0).choice(len(space), 40, replace=False):
        schedule, args = _schedule_of(space, space.get(int(index)))
        guesses.append(guide.build_cost(int(index)))
        sizes.append(len(llvm_codegen.render(lower(schedule, list(args), "kernel"), "kernel")))
    assert spearmanr(guesses, sizes).statistic > 0.8


@pytest.mark.parametrize("dialect, threads", [("meta_schedule", 1), ("autotvm", None)])
def test_the_guide_scores_candidates_for_the_threads_they_are_timed_on(dialect, threads, program_model, monkeypatch):
    """A meta_schedule job times on TVM's runtime threads (here forced to 1): its records' build
    says threads 1, and the guide scores its candidates with the same target features (tg_cores 1),
    not with every CPU's; the other dialects time and score on every CPU."""
    from lorien.costmodel.pretrained import guide_tuner
    from lorien.dialect import get_dialect
    from lorien.engine.cpu import cpu_target
    from lorien.tune.job import TuneJob

    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    job = TuneJob.from_spec(_job(dialect, program_model, trials=4, batch_size=4))
    context = get_dialect(dialect).tuning_context(job, None)
    guide_tuner(context, job)
    cores = context.tuner.guide.model.target_part["tg_cores"]
    assert cores == (threads or cpu_target(None).threads)
    if threads is not None:
        assert context.measure_target.endswith(f"-num-cores={threads}")
        record = context.to_records([context.space.get(0)], context.measure([context.space.get(0)]), "test")[0]
        assert orjson.loads(record.build)["threads"] == cores
