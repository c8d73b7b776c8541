"""Training data generation and zero-shot proposals, with real measurements on the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorien.cli import main
from lorien.costmodel import load_cost_model, train_cost_model, warm_start_scores
from lorien.costmodel.generate import config_workload_keys, parse_workload_spec, training_jobs
from lorien.costmodel.zeroshot import propose, sample_indices
from lorien.errors import ConfigError, LorienError
from lorien.features import featurize
from lorien.workload import autotvm_workload_key

MODELS = Path(__file__).resolve().parent.parent / "configs" / "models"
TRAINING = ["dense:M=1,N=64,K=64", "dense:M=16,N=64,K=128", "dense:M=16,N=128,K=64"]
UNSEEN = ("dense", {"M": 8, "N": 96, "K": 64})


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory):
    from lorien.costmodel.generate import generate_training_set

    root = tmp_path_factory.mktemp("zeroshot")
    store_uri = f"parquet:{root / 'warehouse'}"
    summaries = generate_training_set(store_uri, size="none", workloads=TRAINING, trials=6, progress=False)
    assert [s.trials for s in summaries] == [6, 6, 6]
    featurize(root / "features", store=store_uri, jobs=1, progress=False)
    train_cost_model(root / "features", root / "model", folds=3, params={"n_estimators": 30}, baseline=None,
                     plots=False, progress=False, name="tiny")
    return store_uri, root / "model"


def unseen_workload():
    from lorien.dialect import get_dialect

    return get_dialect("autotvm").expand_workload(*UNSEEN)


def test_workload_spec_parses_op_and_integer_params():
    assert parse_workload_spec("dense:M=16,N=256,K=256") == ("dense", {"M": 16, "N": 256, "K": 256})
    assert parse_workload_spec("conv2d:C=3,H=8,W=8,K=4,layout=NCHW")[1]["layout"] == "NCHW"
    with pytest.raises(ConfigError, match="expected OP:KEY=VALUE"):
        parse_workload_spec("dense")


def test_small_spread_is_a_few_random_tuner_jobs_on_the_host():
    jobs = training_jobs("small")
    assert 2 <= len(jobs) <= 6
    assert {job["tuner"] for job in jobs} == {"random"} and {job["trials"] for job in jobs} == {8}
    assert {job["task_name"] for job in jobs} >= {"dense_pack.x86", "conv2d_NCHWc.x86"}
    assert len({json.dumps(job["args"]) for job in jobs}) == len(jobs)


def test_unknown_spread_size_is_rejected():
    with pytest.raises(ConfigError, match="unknown size 'huge'"):
        training_jobs("huge")


def test_the_spreads_cover_the_four_tunable_operators_for_this_host_by_default():
    from lorien.target import host_target

    jobs = training_jobs("medium")
    assert {job["task_name"] for job in jobs} == {"dense_pack.x86", "dense_nopack.x86", "conv2d_NCHWc.x86",
                                                  "depthwise_conv2d_nchw.x86", "batch_matmul.x86"}
    assert {job["target"] for job in jobs} == {host_target().canonical}
    assert {job["task_name"] for job in training_jobs("medium", ops=["batch_matmul"])} == {"batch_matmul.x86"}
    with pytest.raises(ConfigError, match=r"unknown op\(s\) \['gemm'\]"):
        training_jobs("medium", ops=["gemm"])


def test_no_spread_holds_a_task_of_the_extracted_models():
    from lorien.costmodel.generate import SPREADS, config_workload_keys

    networks = config_workload_keys([MODELS / "all.yaml"])  # ResNet-18, ResNet-50, MobileNetV2, a BERT-base layer
    for size in SPREADS:
        keys = {autotvm_workload_key(job["task_name"], job["args"]) for job in training_jobs(size, target="llvm")}
        assert not keys & networks, size


def test_exclude_leaves_out_the_spread_workloads_a_config_names(tmp_path):
    config = tmp_path / "net.yaml"
    config.write_text("workloads:\n  - {dense: {M: 1, N: 64, K: 64}}\n  - {dense: {M: 3, N: 3, K: 3}}\n")
    excluded = config_workload_keys([config])
    kept = training_jobs("small", exclude=excluded)
    assert len(kept) == len(training_jobs("small")) - 1
    assert not {autotvm_workload_key(job["task_name"], job["args"]) for job in kept} & excluded
    with pytest.raises(ConfigError, match="'dense:M=3,N=3,K=3' is a workload of an exclude config"):
        training_jobs("none", workloads=["dense:M=3,N=3,K=3"], exclude=excluded)


def test_exclude_leaves_a_config_workload_out_of_every_dialect_of_the_spread(tmp_path):
    """A config names its workloads in its own dialect (autotvm here); the spread tuned in another
    dialect leaves the same workload out too."""
    config = tmp_path / "net.yaml"
    config.write_text("workloads:\n  - {dense: {M: 1, N: 64, K: 64}}\n")
    excluded = config_workload_keys([config])
    for dialect in ("auto_scheduler", "meta_schedule"):
        every = training_jobs("small", dialect=dialect)
        kept = training_jobs("small", dialect=dialect, exclude=excluded)
        assert {job["dialect"] for job in kept} == {dialect} and len(kept) == len(every) - 1, dialect


def test_generate_tunes_the_spread_in_every_dialect_it_is_given(tmp_path, capsys):
    """lorien generate --dialect (repeatable) --tuner xgb: each dialect's jobs measured into the
    store, each record in its dialect; an unknown dialect fails before anything is measured."""
    from lorien.warehouse import open_store

    store = tmp_path / "train"
    dialects = ("autotvm", "auto_scheduler", "meta_schedule")
    argv = ["generate", "--size", "none", "--workload", "dense:M=4,N=32,K=16", "--trials", "3", "--tuner", "xgb",
            "--store", f"parquet:{store}", "--quiet"]
    assert main([*argv, "--dialect", "autotvm", "--dialect", "no_such_dialect"]) == 1
    assert "no_such_dialect" in capsys.readouterr().err and not store.exists()
    assert main([*argv, *(part for name in (*dialects, "autotvm") for part in ("--dialect", name))]) == 0
    assert "generated 9 measurements of 3 jobs (3 dialects)" in capsys.readouterr().out  # autotvm once
    with open_store(f"parquet:{store}") as opened:
        table = opened.scan({}).to_pandas()
    assert table.groupby("dialect").size().to_dict() == {name: 3 for name in dialects}


def test_the_same_seed_measures_the_same_configs_on_two_targets(tmp_path):
    from lorien.costmodel.generate import generate_training_set
    from lorien.warehouse import open_store

    uri = f"parquet:{tmp_path / 'w'}"
    for target in ("llvm -mcpu=haswell -num-cores=1", "llvm -mcpu=x86-64"):
        generate_training_set(uri, size="none", workloads=["depthwise_conv2d:C=8,H=8,W=8,padding=1"], trials=4,
                              target=target, progress=False)
    with open_store(uri) as store:
        rows = store.scan(columns=["target", "config"]).to_pylist()
    entities: dict[str, list[str]] = {}
    for row in rows:
        entities.setdefault(row["target"], []).append(json.dumps(json.loads(row["config"])["entity"]))
    haswell, generic = (sorted(configs) for configs in entities.values())
    assert len(haswell) == 4 and haswell == generic


def test_sampling_takes_every_index_of_a_small_space_and_distinct_ones_of_a_large_one():
    assert list(sample_indices(7, 100)) == list(range(7))
    picked = sample_indices(10**9, 500, seed=3)
    assert len(set(picked.tolist())) == 500 and picked.max() < 10**9


@pytest.mark.slow
def test_proposals_are_the_best_scored_configs_of_the_space(trained_model):
    _, model_dir = trained_model
    model = load_cost_model(model_dir)
    task_name, args = unseen_workload()
    proposals = propose(model, task_name=task_name, args=args, topk=5, samples=100_000)
    assert [p.rank for p in proposals] == [1, 2, 3, 4, 5]
    scores = [p.score for p in proposals]
    assert scores == sorted(scores, reverse=True)
    assert len({json.dumps(p.entity) for p in proposals}) == 5
    from dialects.autotvm.templates import instantiate

    space = instantiate(task_name, args).space
    all_scores = model.score_configs(task_name, args, [space.get(i).to_json_entity() for i in range(len(space))])
    assert scores[0] == pytest.approx(float(all_scores.max()), rel=1e-6)


@pytest.mark.slow
def test_query_predict_measures_and_commits_proposals_marked_as_model_made(trained_model, capsys):
    store_uri, model_dir = trained_model
    key = autotvm_workload_key(*unseen_workload())
    code = main(["query", "--predict", "--model", str(model_dir), "--workload-key", key, "--target", "llvm",
                 "--topk", "3", "--measure", "2", "--store", store_uri, "--format", "json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["proposals"]) == 3 and result["committed"] == 2
    assert all(p["gflops"] and p["gflops"] > 0 for p in result["proposals"][:2])
    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        committed = store.scan({"source": "model:tiny"}, columns=["workload_key", "source", "cost_s"])
    assert committed.num_rows == 2 and set(committed["workload_key"].to_pylist()) == {key}


@pytest.mark.slow
def test_predict_for_a_template_the_model_never_saw_names_the_trained_ones(trained_model, capsys):
    _, model_dir = trained_model
    key = autotvm_workload_key(*__import__("lorien.dialect", fromlist=["get_dialect"]).get_dialect(
        "autotvm").expand_workload("conv2d", {"C": 8, "H": 8, "W": 8, "K": 8}))
    assert main(["query", "--predict", "--model", str(model_dir), "--workload-key", key, "--target", "llvm"]) == 1
    assert "no template 'conv2d_NCHWc.x86'" in capsys.readouterr().err


def test_predict_without_a_model_is_an_error(capsys):
    assert main(["query", "--predict", "--workload-key", "dense_pack.x86#x", "--target", "llvm"]) == 1
    assert "--predict needs --model" in capsys.readouterr().err


@pytest.mark.slow
def test_warm_start_scores_accept_the_dialects_config_objects(trained_model):
    _, model_dir = trained_model
    task_name, args = unseen_workload()
    from dialects.autotvm.templates import instantiate

    space = instantiate(task_name, args).space
    configs = [space.get(i) for i in range(10)]
    scores = warm_start_scores(model_dir, task_name, args, configs)
    assert scores.shape == (10,)
    assert list(scores) == list(warm_start_scores(model_dir, task_name, args, [c.to_json_entity() for c in configs]))


def test_loading_a_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(LorienError, match="no cost model at"):
        load_cost_model(tmp_path)


@pytest.mark.slow
def test_warm_started_xgb_tuner_first_proposes_what_the_model_likes(trained_model):
    from dialects.autotvm.templates import instantiate
    from lorien.costmodel.zeroshot import warm_start_tuner
    from lorien.search import create

    _, model_dir = trained_model
    model = load_cost_model(model_dir)
    task_name, args = unseen_workload()
    space = instantiate(task_name, args).space
    warmed = create("xgb", space, seed=0)
    assert warm_start_tuner(warmed, model, task_name, args, samples=100) == min(100, len(space))
    cold = create("xgb", space, seed=0)

    def mean_score(tuner) -> float:
        batch = tuner.next_batch(16)
        return float(model.score_configs(task_name, args, [space.get(i) for i in batch]).mean())

    assert mean_score(warmed) > mean_score(cold)


def test_diverse_proposals_try_different_innermost_tiles_first():
    import numpy as np

    from lorien.costmodel.zeroshot import diverse_top

    def features(y, x, k):
        return {"in_0": 64, "sp_tile_y_0": -1, "sp_tile_y_1": 1, "sp_tile_y_2": y, "sp_tile_x_0": -1,
                "sp_tile_x_1": 2, "sp_tile_x_2": x, "sp_tile_k_0": -1, "sp_tile_k_1": k}

    configs = [features(4, 16, 8), features(4, 16, 8), features(8, 16, 8), features(4, 16, 8), features(8, 32, 8)]
    order = np.arange(len(configs))  # already best first
    assert diverse_top(order, configs, 3) == [0, 2, 4]
    assert diverse_top(order, configs, 5) == [0, 2, 4, 1, 3]


@pytest.fixture(scope="module")
def small_spread_model(tmp_path_factory):
    """A model of the small spread (one workload of each operator), measured here."""
    from lorien.costmodel.generate import generate_training_set

    root = tmp_path_factory.mktemp("spread")
    store_uri = f"parquet:{root / 'warehouse'}"
    generate_training_set(store_uri, size="small", trials=6, progress=False)
    featurize(root / "features", store=store_uri, jobs=1, progress=False)
    train_cost_model(root / "features", root / "model", params={"n_estimators": 20}, baseline=None, plots=False,
                     progress=False)
    return root / "model"


@pytest.mark.parametrize("op, params", [
    ("conv2d", {"C": 24, "H": 10, "W": 10, "K": 16, "kernel": 3, "padding": 1}),
    ("depthwise_conv2d", {"C": 24, "H": 10, "W": 10, "kernel": 3, "padding": 1}),
    ("batch_matmul", {"B": 3, "M": 24, "N": 16, "K": 16}),
])
def test_zero_shot_proposes_and_measures_for_every_tunable_operator(small_spread_model, op, params):
    from lorien.costmodel.zeroshot import zero_shot
    from lorien.dialect import get_dialect

    task_name, args = get_dialect("autotvm").expand_workload(op, params)
    result = zero_shot(small_spread_model, task_name=task_name, args=args, topk=3, measure_top=1,
                       store_uri=f"parquet:{small_spread_model.parent / 'proposed'}")
    assert len({json.dumps(p.entity) for p in result.proposals}) == 3
    assert result.proposals[0].error_no == 0 and result.proposals[0].gflops > 0
