"""Cost models: estimators, per-workload metrics, workload-held-out evaluation, saved models.

The training data is a small synthetic dense template whose throughput depends on how the
tiles fit the workload's shape, so a model that learns anything transferable ranks the
configs of held-out workloads well, and one that learns nothing does not.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone

from lorien.cli import main
from lorien.costmodel import (
    CostModel,
    SklearnCostModel,
    XGBCostModel,
    evaluate_by_workload,
    group_kfold,
    load_cost_model,
    pairwise_accuracy,
    topk_score,
    train_cost_model,
    warm_start_scores,
)
from lorien.errors import ConfigError, LorienError
from lorien.features import load_features
from lorien.record import TuningRecord

TEMPLATE = "dense_nopack.x86"
SHAPES = [(m, n, k) for m in (1, 16) for n in (256, 512, 1024) for k in (256, 512, 1024)]


def dense_args(m: int, n: int, k: int) -> list:
    return [["TENSOR", [m, k], "float32"], ["TENSOR", [n, k], "float32"], None, "float32"]


def dense_entity(m: int, n: int, k: int, tile_x: int, tile_k: int) -> list:
    return [["tile_y", "sp", [m, 1]], ["tile_x", "sp", [n // tile_x, tile_x]], ["tile_k", "sp", [k // tile_k, tile_k]]]


def synthetic_gflops(n: int, k: int, tile_x: int, tile_k: int) -> float:
    """Best with 16-wide x tiles and k tiles of an eighth of K: shape-relative, so it transfers."""
    return 50.0 * np.exp(-((np.log2(tile_x) - 4) ** 2) / 2) * np.exp(-((np.log2(k / tile_k) - 3) ** 2) / 4)


def synthetic_records(shapes=SHAPES, seed: int = 0) -> list[TuningRecord]:
    rng = np.random.default_rng(seed)
    records = []
    for m, n, k in shapes:
        for tile_x, tile_k in itertools.product((1, 2, 4, 8, 16, 32, 64), (1, 4, 16, 64, 128, 256)):
            gflops = float(synthetic_gflops(n, k, tile_x, tile_k) * rng.uniform(0.95, 1.05))
            flop = 2.0 * m * n * k
            args = dense_args(m, n, k)
            records.append(TuningRecord(
                dialect="autotvm", target="llvm -mcpu=znver3", target_key="llvm_cpu",
                workload_key=f"{TEMPLATE}#{m}_{n}_{k}", task_name=TEMPLATE, args=json.dumps(args),
                layout="NC", config=json.dumps({"index": 0, "code_hash": None,
                                                "entity": dense_entity(m, n, k, tile_x, tile_k)}),
                costs=[flop / (gflops * 1e9)], flop=flop, timestamp=float(len(records))))
    return records


@pytest.fixture(scope="module")
def features_dir(featurized) -> Path:
    return featurized(synthetic_records(), "costmodel")


@pytest.fixture(scope="module")
def dataset(features_dir):
    frame, meta = load_features(features_dir, TEMPLATE)
    X = frame[meta.names].to_numpy(dtype=np.float32)
    y = frame["thrpt"].to_numpy()
    groups = frame["workload_key"].to_numpy()
    return X, y, groups


@pytest.fixture(scope="module")
def trained(features_dir, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("model") / "dense"
    report = train_cost_model(features_dir, out, kind="xgb-rank", folds=3, params={"n_estimators": 60},
                              baseline="ridge", progress=False)
    return out, report


def test_topk_score_is_best_picked_over_best_measured():
    truth = np.array([10.0, 50.0, 40.0, 0.0])
    predicted = np.array([0.9, 0.1, 0.8, 0.0])
    assert topk_score(truth, predicted, 1) == pytest.approx(10 / 50)
    assert topk_score(truth, predicted, 2) == pytest.approx(40 / 50)
    assert topk_score(truth, predicted, 3) == 1.0


def test_pairwise_accuracy_counts_correctly_ordered_pairs():
    truth = np.array([1.0, 2.0, 3.0])
    assert pairwise_accuracy(truth, np.array([1.0, 2.0, 3.0])) == 1.0
    assert pairwise_accuracy(truth, np.array([3.0, 2.0, 1.0])) == 0.0
    assert pairwise_accuracy(truth, np.array([1.0, 3.0, 2.0])) == pytest.approx(2 / 3)


def test_evaluation_is_per_workload_not_across_workloads():
    truth = np.array([1.0, 2.0, 100.0, 200.0])
    groups = np.array(["a", "a", "b", "b"])
    # Ranks within each workload are right even though workload b scores below workload a.
    predicted = np.array([0.5, 0.6, 0.1, 0.2])
    summary = evaluate_by_workload(truth, predicted, groups)["summary"]
    assert summary["pairwise_accuracy"] == 1.0 and summary["top1"] == 1.0 and summary["workloads"] == 2


def test_group_kfold_holds_out_whole_workloads(dataset):
    _, _, groups = dataset
    folds = group_kfold(groups, 3)
    tested = np.concatenate([test for _, test in folds])
    assert sorted(tested) == list(range(len(groups)))
    for train_rows, test_rows in folds:
        assert not set(groups[train_rows]) & set(groups[test_rows])


def test_group_kfold_needs_two_workloads():
    with pytest.raises(LorienError, match="at least 2 workloads"):
        group_kfold(np.array(["a", "a"]), 5)


@pytest.mark.parametrize("model", [XGBCostModel(objective="rank", n_estimators=20),
                                   XGBCostModel(objective="reg", n_estimators=20),
                                   SklearnCostModel("ridge"), SklearnCostModel("random-forest", n_estimators=10)])
def test_estimators_follow_scikit_learn_conventions(model, dataset):
    X, y, groups = dataset
    copy = clone(model)
    assert copy.get_params() == model.get_params()
    assert copy.set_params(random_state=3) is copy and copy.random_state == 3
    assert copy.fit(X, y, groups=groups) is copy
    learned = [name for name in vars(copy) if name.endswith("_") and not name.startswith("_")]
    assert learned and not any(name.endswith("_") for name in vars(model))
    assert copy.predict(X).shape == (len(y),)


def test_xgb_ranking_model_ranks_held_out_workloads_well(trained):
    _, report = trained
    summary = report["templates"][TEMPLATE]["cv"]["summary"]
    assert summary["workloads"] == len(SHAPES)
    assert summary["top1"] > 0.8 and summary["top5"] > 0.95
    assert summary["pairwise_accuracy"] > 0.75 and summary["spearman"] > 0.6


def test_ridge_baseline_is_evaluated_beside_the_model_and_is_worse_here(trained):
    _, report = trained
    entry = report["templates"][TEMPLATE]
    assert entry["baseline_cv"]["pairwise_accuracy"] < entry["cv"]["summary"]["pairwise_accuracy"]


def test_training_writes_model_report_and_plots(trained):
    out, _ = trained
    written = json.loads((out / "report.json").read_text())
    assert written["templates"][TEMPLATE]["cv"]["summary"]["records"] == len(SHAPES) * 42
    for name in written["templates"][TEMPLATE]["plots"].values():
        if isinstance(name, str):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads((out / "model.json").read_text())
    assert document["format"] == "lorien-costmodel" and TEMPLATE in document["templates"]


def test_saved_model_scores_raw_records_as_it_scores_features(trained, features_dir):
    out, _ = trained
    model = load_cost_model(out)
    frame, meta = load_features(features_dir, TEMPLATE)
    from_features = model.template(TEMPLATE).estimator.predict(frame[meta.names].to_numpy(dtype=np.float32))
    from_records = model.score_records(synthetic_records())
    np.testing.assert_allclose(np.sort(from_records), np.sort(from_features), rtol=1e-5)


def test_model_files_contain_no_pickle(trained):
    out, _ = trained
    assert {p.suffix for p in out.iterdir()} <= {".json", ".ubj", ".png"}


def test_warm_start_scores_favor_the_configs_that_are_fast_on_an_unseen_shape(trained):
    out, _ = trained
    m, n, k = 8, 768, 768
    candidates = [(tx, tk) for tx in (1, 2, 4, 8, 16, 32, 64) for tk in (1, 4, 16, 64, 96, 256)]
    scores = warm_start_scores(out, TEMPLATE, dense_args(m, n, k),
                               [dense_entity(m, n, k, tx, tk) for tx, tk in candidates])
    truth = np.array([synthetic_gflops(n, k, tx, tk) for tx, tk in candidates])
    assert topk_score(truth, scores, 3) > 0.8


def test_scoring_an_unknown_template_names_the_trained_ones(trained):
    model = load_cost_model(trained[0])
    with pytest.raises(LorienError, match=r"no template 'conv2d_NCHWc.x86'.*dense_nopack.x86"):
        model.score_configs("conv2d_NCHWc.x86", [], [])


def test_ridge_model_saves_as_json_and_random_forest_refuses(dataset, tmp_path):
    X, y, groups = dataset
    ridge = SklearnCostModel("ridge").fit(X, y, groups=groups)
    state = ridge.save(tmp_path / "ridge")
    restored = SklearnCostModel.load(json.loads(json.dumps(state)), tmp_path)
    np.testing.assert_allclose(restored.predict(X), ridge.predict(X), rtol=1e-4, atol=1e-6)
    with pytest.raises(ConfigError, match="cannot be saved"):
        SklearnCostModel("random-forest", n_estimators=5).fit(X, y).save(tmp_path / "rf")


def test_non_finite_targets_are_rejected(dataset):
    X, y, _ = dataset
    bad = y.copy()
    bad[0] = np.nan
    with pytest.raises(ConfigError, match="1 targets are NaN or infinite"):
        XGBCostModel(n_estimators=2).fit(X, bad)


def test_parallel_trees_grow_a_forest_every_round_and_survive_saving(dataset, tmp_path):
    X, y, groups = dataset
    plain = XGBCostModel(n_estimators=4).fit(X, y, groups=groups)
    forest = XGBCostModel(n_estimators=4, parallel_trees=3).fit(X, y, groups=groups)
    assert len(plain.booster_.get_dump()) == 4 and len(forest.booster_.get_dump()) == 12
    assert plain.booster_.num_boosted_rounds() == forest.booster_.num_boosted_rounds() == 4
    state = forest.save(tmp_path / "forest.ubj")
    restored = XGBCostModel.load(json.loads(json.dumps(state)), tmp_path)
    assert restored.parallel_trees == 3
    np.testing.assert_allclose(restored.predict(X), forest.predict(X), rtol=1e-6)
    with pytest.raises(ConfigError, match="parallel_trees must be at least 1, got 0"):
        XGBCostModel(n_estimators=2, parallel_trees=0).fit(X, y, groups=groups)


def test_only_the_program_template_defaults_to_a_forest():
    from lorien.costmodel.train import PROGRAM_PARALLEL_TREES, template_params

    assert PROGRAM_PARALLEL_TREES > 1
    assert template_params("xgb-rank", "program", {"n_estimators": 9}) == {
        "n_estimators": 9, "parallel_trees": PROGRAM_PARALLEL_TREES}
    assert template_params("xgb-reg", "program", {"parallel_trees": 1}) == {"parallel_trees": 1}
    assert template_params("xgb-rank", TEMPLATE, {}) == {}
    assert template_params("ridge", "program", {}) == {}


def test_cli_train_parallel_trees(features_dir, tmp_path, capsys):
    code = main(["train", str(features_dir), "-o", str(tmp_path / "m"), "--folds", "2", "--n-estimators", "3",
                 "--parallel-trees", "2", "--baseline", "none", "--no-plots", "--quiet"])
    assert code == 0
    report = json.loads((tmp_path / "m" / "report.json").read_text())
    assert report["templates"][TEMPLATE]["params"] == {"n_estimators": 3, "parallel_trees": 2}
    assert len(load_cost_model(tmp_path / "m").template(TEMPLATE).estimator.booster_.get_dump()) == 6
    assert main(["train", str(features_dir), "-o", str(tmp_path / "z"), "--parallel-trees", "0", "--no-plots"]) != 0
    assert "--parallel-trees must be at least 1, got 0" in capsys.readouterr().err
    assert main(["train", str(features_dir), "-o", str(tmp_path / "r"), "--kind", "ridge", "--parallel-trees", "2",
                 "--no-plots"]) != 0
    assert "apply to XGBoost kinds only" in capsys.readouterr().err
    assert not (tmp_path / "z").exists() and not (tmp_path / "r").exists()


def test_loading_a_file_that_is_not_a_model_fails_clearly(tmp_path):
    (tmp_path / "model.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(LorienError, match="is not 'lorien-costmodel'"):
        CostModel.load(tmp_path)


def test_cli_train_prints_held_out_metrics(features_dir, tmp_path, capsys):
    code = main(["train", str(features_dir), "-o", str(tmp_path / "m"), "--folds", "2", "--n-estimators", "20",
                 "--baseline", "none", "--no-plots"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"{TEMPLATE}: {len(SHAPES) * 42} rows, {len(SHAPES)} workloads; held-out" in out
    assert (tmp_path / "m" / "model.json").is_file()
