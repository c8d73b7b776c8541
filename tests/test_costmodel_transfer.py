"""Cost models across targets: target features from records, the rows of one target, a
fraction of a target's data, and a model transferred from another target's records.

The records are synthetic: one dense template measured on two targets whose best tile width
follows their vector width (16 floats on the AVX2 source, 32 on the AVX-512 destination),
while the best reduction tile is the same on both, so a model can carry what the source
teaches to the destination.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from lorien.cli import main
from lorien.costmodel import (
    load_cost_model,
    sample_by_workload,
    target_rows,
    train_cost_model,
    transfer_cross_validate,
)
from lorien.costmodel.train import workload_groups
from lorien.errors import LorienError
from lorien.features import load_features
from lorien.features.targets import (
    TARGET_FEATURES,
    local_target_features,
    relative_knob_features,
    target_features,
)
from lorien.record import TuningRecord

TEMPLATE = "dense_nopack.x86"
SOURCE = "llvm -keys=cpu -mcpu=haswell -num-cores=1"
DESTINATION = "llvm -keys=cpu -mcpu=znver4"
BUILDS = {SOURCE: {"mcpu": "haswell", "vector_lanes": 8, "threads": 1, "l1d_kb": 32, "l2_kb": 1024, "l3_kb": 32768},
          DESTINATION: {"mcpu": "znver4", "vector_lanes": 16, "threads": 2, "l1d_kb": 32, "l2_kb": 1024,
                        "l3_kb": 32768}}
SHAPES = [(m, n, k) for m in (1, 8) for n in (256, 512, 1024) for k in (128, 256, 512, 1024)]
TILES = list(itertools.product((1, 2, 4, 8, 16, 32, 64), (1, 4, 16, 32, 64, 128)))


def synthetic_gflops(lanes: int, k: int, tile_x: int, tile_k: int) -> float:
    """Best with x tiles of two vectors and k tiles of an eighth of K."""
    return 50.0 * np.exp(-((np.log2(tile_x) - np.log2(2 * lanes)) ** 2) / 2) \
        * np.exp(-((np.log2(k / tile_k) - 3) ** 2) / 4)


def synthetic_records(seed: int = 0) -> list[TuningRecord]:
    rng = np.random.default_rng(seed)
    records = []
    for target, build in BUILDS.items():
        for m, n, k in SHAPES:
            args = [["TENSOR", [m, k], "float32"], ["TENSOR", [n, k], "float32"], None, "float32"]
            for tile_x, tile_k in TILES:
                gflops = synthetic_gflops(build["vector_lanes"], k, tile_x, tile_k) * rng.uniform(0.95, 1.05)
                flop = 2.0 * m * n * k
                entity = [["tile_y", "sp", [m, 1]], ["tile_x", "sp", [n // tile_x, tile_x]],
                          ["tile_k", "sp", [k // tile_k, tile_k]]]
                records.append(TuningRecord(
                    dialect="autotvm", target=target, target_key="llvm_cpu", workload_key=f"{TEMPLATE}#{m}_{n}_{k}",
                    task_name=TEMPLATE, args=json.dumps(args), layout="NC", build=json.dumps(build),
                    config=json.dumps({"index": 0, "code_hash": None, "entity": entity}),
                    costs=[flop / (gflops * 1e9)], flop=flop, timestamp=float(len(records))))
    return records


@pytest.fixture(scope="module")
def features_dir(featurized) -> Path:
    return featurized(synthetic_records(), "transfer")


@pytest.fixture(scope="module")
def dataset(features_dir):
    frame, meta = load_features(features_dir, TEMPLATE)
    return frame, frame[meta.names].to_numpy(dtype=np.float32), frame["thrpt"].to_numpy(), \
        workload_groups(frame, meta.names)


def test_target_features_come_from_the_build_fields_a_record_carries():
    features = target_features(SOURCE, json.dumps(BUILDS[SOURCE]))
    assert features == {"tg_vector_lanes": 8.0, "tg_cores": 1.0, "tg_l1d_kb": 32.0, "tg_l2_kb": 1024.0,
                        "tg_l3_kb": 32768.0}


def test_target_features_of_a_foreign_record_come_from_its_target_string():
    features = target_features("llvm -mcpu=skylake-avx512 -num-cores=4", "{}")
    assert (features["tg_vector_lanes"], features["tg_cores"]) == (16.0, 4.0)
    assert np.isnan(features["tg_l2_kb"])
    assert all(np.isnan(value) for value in target_features("cuda -model=v100", "").values())


def test_a_proposal_is_scored_with_the_features_records_measured_here_would_carry():
    from lorien.engine.cpu import cpu_target

    features = local_target_features("llvm -mcpu=haswell -num-cores=1")
    assert (features["tg_vector_lanes"], features["tg_cores"]) == (8.0, 1.0)
    assert local_target_features(None)["tg_cores"] == cpu_target(None).threads
    assert np.isnan(local_target_features("cuda -model=v100")["tg_vector_lanes"])


def test_featurized_rows_carry_their_target_and_its_features(dataset):
    frame, *_ = dataset
    assert set(frame["target"]) == {SOURCE, DESTINATION}
    assert set(TARGET_FEATURES) <= set(frame.columns)
    lanes = frame.groupby("target")["tg_vector_lanes"].nunique()
    assert (lanes == 1).all() and frame["tg_vector_lanes"].nunique() == 2


def test_split_knobs_are_also_described_by_the_vector_registers_their_innermost_factor_fills():
    features = relative_knob_features({"sp_tile_x_0": -1, "sp_tile_x_1": 24, "tg_vector_lanes": 8.0})
    assert features == {"tr_tile_x_vectors": 3.0, "tr_tile_x_whole": 1.0}
    assert relative_knob_features({"sp_tile_x_0": -1, "sp_tile_x_1": 24, "tg_vector_lanes": 16.0})[
        "tr_tile_x_whole"] == 0.0
    assert np.isnan(relative_knob_features({"sp_tile_x_1": 24})["tr_tile_x_vectors"])


def test_featurized_rows_carry_their_knobs_relative_to_their_target(dataset, features_dir):
    from lorien.features import FeatureMeta, output_paths

    frame, *_ = dataset
    columns = {c.name: c for c in FeatureMeta.read(output_paths(features_dir, TEMPLATE)["meta"]).columns}
    raw = {name: frame[name] * columns[name].std + columns[name].mean
           for name in ("sp_tile_x_1", "tg_vector_lanes", "tr_tile_x_vectors")}
    np.testing.assert_allclose(raw["tr_tile_x_vectors"], raw["sp_tile_x_1"] / raw["tg_vector_lanes"], rtol=1e-6)


def test_the_same_workload_on_two_targets_is_two_workloads(dataset):
    frame, _, _, groups = dataset
    assert len(np.unique(groups)) == 2 * len(SHAPES)


def test_target_rows_follow_the_query_rule(dataset):
    frame, *_ = dataset
    assert target_rows(frame, "llvm -mcpu=haswell").sum() == len(SHAPES) * len(TILES)
    assert target_rows(frame, "llvm").all()
    assert not target_rows(frame, "llvm -mcpu=znver3").any()


def test_a_fraction_is_taken_from_every_workload_and_never_below_a_pair():
    groups = np.repeat(np.array(["a", "b", "c"]), [40, 10, 1])
    rows = np.arange(groups.size)
    sample = sample_by_workload(groups, rows, 0.1, seed=1)
    assert [int((groups[sample] == g).sum()) for g in "abc"] == [4, 2, 1]
    assert sample_by_workload(groups, rows, 0.0).size == 0
    assert np.array_equal(sample_by_workload(groups, rows, 1.0), rows)
    with pytest.raises(LorienError, match="between 0 and 1, got 1.5"):
        sample_by_workload(groups, rows, 1.5)


def test_with_the_source_records_a_few_destination_records_rank_held_out_workloads_better(dataset):
    frame, X, y, groups = dataset
    curve = transfer_cross_validate("xgb-rank", {"n_estimators": 60}, X, y, groups, target_rows(frame, SOURCE),
                                    target_rows(frame, DESTINATION), fractions=(0.0, 0.05, 1.0), folds=3)
    assert curve[0.0]["own"] is None
    transferred, alone = curve[0.05]["transfer"], curve[0.05]["own"]
    assert transferred["workloads"] == len(SHAPES)
    assert transferred["top5"] > alone["top5"] and transferred["pairwise_accuracy"] > alone["pairwise_accuracy"]
    assert curve[1.0]["transfer"]["top1"] > 0.8


def test_source_and_destination_must_be_different_records(dataset):
    frame, X, y, groups = dataset
    everything = np.ones(len(y), dtype=bool)
    with pytest.raises(LorienError, match="match the same"):
        transfer_cross_validate("xgb-rank", {}, X, y, groups, everything, target_rows(frame, DESTINATION))


def test_training_with_transfer_reports_the_curve_and_saves_a_model_of_source_and_fraction(features_dir, tmp_path):
    report = train_cost_model(features_dir, tmp_path / "m", params={"n_estimators": 30}, folds=3, progress=False,
                              target=DESTINATION, transfer_from="llvm -mcpu=haswell", target_fraction=0.1,
                              curve=[0.0, 0.1])
    entry = report["templates"][TEMPLATE]
    assert set(entry["transfer_curve"]) == {"0", "0.1"}
    assert entry["cv"]["summary"] == entry["transfer_curve"]["0.1"]["transfer"]
    assert entry["own_cv"] == entry["transfer_curve"]["0.1"]["own"]
    assert (tmp_path / "m" / entry["plots"]["transfer"]).read_bytes()[:4] == b"\x89PNG"
    saved = load_cost_model(tmp_path / "m")
    rows_per_workload = round(0.1 * len(TILES))
    assert saved.template(TEMPLATE).info["rows"] == len(SHAPES) * (len(TILES) + rows_per_workload)
    assert saved.info["transfer_from"] == "llvm -mcpu=haswell"


@pytest.mark.parametrize("options, message", [
    ({"transfer_from": SOURCE}, "needs the destination target"),
    ({"target_fraction": 0.5}, "needs the target it is a fraction of"),
    ({"target": DESTINATION, "target_fraction": 0.0}, "nothing to train on"),
    ({"target": DESTINATION, "curve": [0.1]}, "needs --transfer-from"),
    ({"target": DESTINATION, "transfer_from": SOURCE, "target_fraction": 2.0}, "between 0 and 1, got 2.0"),
])
def test_transfer_options_that_do_not_fit_together_are_refused(features_dir, tmp_path, options, message):
    with pytest.raises(LorienError, match=message):
        train_cost_model(features_dir, tmp_path / "m", progress=False, **options)


def test_a_target_with_no_records_skips_the_template_and_says_so(features_dir, tmp_path):
    with pytest.raises(LorienError, match="no records of target 'llvm -mcpu=znver3'"):
        train_cost_model(features_dir, tmp_path / "m", progress=False, target="llvm -mcpu=znver3")


def test_cli_train_transfer_prints_the_curve(features_dir, tmp_path, capsys):
    code = main(["train", str(features_dir), "-o", str(tmp_path / "m"), "--folds", "2", "--n-estimators", "20",
                 "--no-plots", "--target", DESTINATION, "--transfer-from", SOURCE, "--target-fraction", "0.1",
                 "--curve", "0,0.1"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"0% of {DESTINATION}: with source top1=" in out
    assert f"10% of {DESTINATION}: with source top1=" in out and "; alone top1=" in out


def test_cli_curve_must_be_fractions(features_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", str(features_dir), "-o", str(tmp_path / "m"), "--curve", "a,b"])
    assert "expected comma-separated fractions" in capsys.readouterr().err
