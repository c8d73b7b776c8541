"""Sketches, the sketch space and tuning of the auto_scheduler dialect: every program is checked against NumPy."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest
import yaml
from conftest import F32, LAYER_OPS
from conftest import auto_scheduler_job as _job

from dialects.auto_scheduler.compile import check_kernel, compile_default
from dialects.auto_scheduler.sketch import LOCATIONS
from dialects.auto_scheduler.space import DERIVED_FEATURES, SketchSpace, factorizations
from dialects.auto_scheduler.steps import replay_steps
from lorien import workload_registry
from lorien.engine import build
from lorien.errors import ConfigError
from lorien.formats import read_log
from lorien.tune.loop import tune_job
from lorien.warehouse import open_store

OPS = LAYER_OPS


def _key(op: str) -> str:
    return workload_registry.make_workload_key(*OPS[op])


def _space(op: str) -> SketchSpace:
    return SketchSpace(workload_registry.workload_dag(_key(op)))


def _check(key: str, steps: list) -> float:
    replay = replay_steps(workload_registry.workload_dag(key), steps)
    return check_kernel(build(replay.schedule, replay.args), key)


@pytest.mark.parametrize("op", list(OPS))
def test_every_sketch_of_every_listed_op_gives_programs_matching_numpy(op):
    space = _space(op)
    rng = np.random.default_rng(7)
    for sketch_id in range(len(space.sketches)):
        positions = [int(rng.integers(dim)) for dim in space.dims]
        positions[0] = sketch_id
        assert _check(_key(op), space.get(space.index_of_knobs(positions))) < 1e-3


def test_a_reduction_with_an_epilogue_is_tiled_and_fused_into_it_at_two_levels():
    descriptions = [s.description for s in _space("dense+bias+relu").sketches]
    assert descriptions == ["tile dense.acc SSRSRS, fused into dense at level 1",
                            "tile dense.acc SSRSRS, fused into dense at level 2",
                            "rfactor dense.acc (GEMV: the reduction split, factored and vectorized)"]  # M = 4


def test_a_reduction_without_an_epilogue_gets_a_cache_write_sketch_and_a_plain_one():
    descriptions = [s.description for s in _space("dense").sketches]
    assert descriptions == ["cache write dense; tile dense.local SSRSRS, fused into dense at level 1",
                            "cache write dense; tile dense.local SSRSRS, fused into dense at level 2",
                            "tile dense SSRSRS",
                            "rfactor dense (GEMV: the reduction split, factored and vectorized)"]


@pytest.mark.parametrize("m", [1, 3])
def test_dense_at_few_rows_gets_the_rfactor_sketch_whose_programs_match_numpy(m):
    key = workload_registry.make_workload_key("dense_layer", [m, 40, 48, True, False, F32])
    space = SketchSpace(workload_registry.workload_dag(key))
    sketch_id = next(i for i, s in enumerate(space.sketches) if s.description.startswith("rfactor"))
    rng = np.random.default_rng(3)
    for _ in range(4):
        positions = [int(rng.integers(dim)) for dim in space.dims]
        positions[0] = sketch_id
        steps = space.get(space.index_of_knobs(positions))
        assert any(step[0] == "RF" for step in steps)          # the record names the path: an RF step
        assert _check(key, steps) < 1e-3
    sampled = [space.get(space.sample(rng)) for _ in range(40)]
    rf_steps = [next(st for st in steps if st[0] == "SP" and st[2] == 2) for steps in sampled
                if any(st[0] == "RF" for st in steps)]
    assert rf_steps and all(st[4][0] % 8 == 0 for st in rf_steps)  # the sampler keeps whole vectors of K


def test_dense_with_many_rows_has_no_rfactor_sketch():
    key = workload_registry.make_workload_key("dense_layer", [16, 32, 16, False, False, F32])
    assert not any(s.description.startswith("rfactor") for s in SketchSpace(workload_registry.workload_dag(key)).sketches)


def test_tvm_tutorial_conv2d_sketch_inlines_padding_and_bias_add_and_fuses_into_relu():
    dag = workload_registry.workload_dag('["conv2d_layer", 1, 7, 7, 512, 512, 3, 3, [1, 1], [1, 1]]')
    sketch = SketchSpace(dag).sketches[1]
    assert sketch.description == ("inline T_add; tile conv2d SSRSRS, fused into T_relu at level 2; "
                                  "place conv2d.pad")
    # Ansor's own CPU steps for this structure: the SSRSRS reorder of 4 spatial and 3 reduce loops
    assert ["RE", 3, [0, 4, 8, 12, 1, 5, 9, 13, 16, 18, 20, 2, 6, 10, 14, 17, 19, 21, 3, 7, 11, 15]] in sketch.steps


@pytest.mark.parametrize("where", LOCATIONS)
def test_padding_is_placed_inline_at_the_root_or_at_a_level_of_its_tiled_reader(where):
    space = _space("conv2d NHWC+bias+relu")  # stages: data, pad (1), kernel, conv2d (3), bias, add, relu
    assert space.located == [1]
    positions = [0] * len(space.dims)
    positions[1 + len(space.tiles)] = LOCATIONS.index(where)
    positions[0] = 1  # fused into the epilogue at level 2: conv2d is the tiled reader, 4 spatial + 3 reduce loops
    steps = space.get(space.index_of_knobs(positions))
    placing = [step for step in steps if step[0] in ("CI", "CA") and step[1] == 1]
    expected = {"inline": [["CI", 1]], "root": [], "S0": [["CA", 1, 3, 3]], "S1": [["CA", 1, 3, 7]],
                "R0": [["CA", 1, 3, 10]]}[where]
    assert placing == expected
    assert space.index_of_steps(json.loads(json.dumps(steps))) == space.index_of_knobs(positions)
    assert _check(_key("conv2d NHWC+bias+relu"), steps) < 1e-3


def test_random_programs_keep_a_vector_wide_innermost_tile_on_the_vectorized_loop():
    space = SketchSpace(workload_registry.workload_dag(workload_registry.make_workload_key(
        "conv2d_nhwc_layer", [1, 8, 10, 10, 32, 3, 3, [1, 1], [1, 1], [1, 1], False, False, F32])))
    rng = np.random.default_rng(0)
    inner = []
    for _ in range(50):
        steps = space.get(space.sample(rng))
        # the output-channel split (the last spatial loop, extent 32) of the tiled stage
        (split,) = [step for step in steps if step[0] == "SP" and step[2] == 12 and step[3] == 32]
        inner.append(split[4][-1])
    assert min(inner) >= 8 and len(set(inner)) > 1
    uniform = [space.get(int(rng.integers(len(space)))) for _ in range(50)]
    assert any(step[4][-1] < 8 for steps in uniform for step in steps if step[0] == "SP" and step[2] == 12)


def test_factorizations_are_ordered_products_with_a_bounded_innermost_factor():
    found = factorizations(12, 3, max_innermost=4)
    assert all(math.prod(f) == 12 and f[-1] <= 4 for f in found)
    assert (1, 1, 12) not in found and (3, 1, 4) in found and len(set(found)) == len(found)


def test_tile_mutation_moves_one_prime_factor_between_levels():
    space = _space("conv2d NHWC+bias+relu")
    rng = np.random.default_rng(0)
    moved = 0
    for _ in range(200):
        index = int(rng.integers(len(space)))
        mutated = space.mutate(index, rng)
        before, after = space.knob_indices(index), space.knob_indices(mutated)
        changed = [k for k, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
        assert len(changed) == 1
        knob = changed[0] - 1
        if 0 <= knob < len(space.tiles):
            old, new = space.tiles[knob].entities[before[knob + 1]], space.tiles[knob].entities[after[knob + 1]]
            ratios = sorted(n / o for n, o in zip(new, old, strict=True) if n != o)
            moved += len(ratios) == 2 and ratios[0] * ratios[1] == pytest.approx(1.0)
    assert moved > 150  # most mutations are tile-size moves, and each moves one factor


def test_steps_of_a_point_map_back_to_a_point_with_the_same_program():
    space = _space("depthwise+bias+relu")
    rng = np.random.default_rng(3)
    for index in rng.integers(len(space), size=20).tolist():
        steps = json.loads(json.dumps(space.get(index)))
        assert space.get(space.index_of_steps(steps)) == steps


def test_a_record_made_elsewhere_is_not_a_point_of_the_space(shared_data):
    record = read_log(shared_data / "ansor" / "matmul.json").records[0]
    space = SketchSpace(workload_registry.workload_dag(record.workload_key))
    assert space.index_of_steps(orjson.loads(record.config)) is None


def test_default_schedule_of_a_workload_builds_and_matches_numpy():
    kernel = compile_default(_key("conv2d NCHW stride 2"))
    assert check_kernel(kernel, kernel.workload_key) < 1e-3


def test_tune_job_commits_each_batch_and_a_second_run_measures_only_new_programs(store_uri, tmp_path):
    batches = []
    first = tune_job(_job(), store_uri, log_path=tmp_path / "dense.json",
                     on_batch=lambda progress, records: batches.append(len(records)))
    assert batches == [4, 4] and first.trials == 8 and first.errors == 0 and first.committed == 8
    second = tune_job(_job(tuner="xgb", tuner_options={"plan_size": 4, "population": 32}), store_uri)
    assert second.trials == 8
    with open_store(store_uri) as store:
        configs = store.scan(columns=["config"]).column("config").to_pylist()
    assert len(configs) == len(set(configs)) == 16
    assert second.best_cost_s <= first.best_cost_s  # the first run's best is known from the start
    lines = (tmp_path / "dense.json").read_text().splitlines()
    assert len(lines) == 8 and json.loads(lines[0])["v"] == "v0.6"


def test_points_that_render_to_the_same_program_are_measured_once(store_uri):
    job = _job(args=[1, 2, 2, False, False, F32], trials=10_000, batch_size=64)
    space = SketchSpace(workload_registry.workload_dag(workload_registry.make_workload_key("dense_layer", job["args"])))
    programs = {json.dumps(space.get(i)) for i in range(len(space))}
    assert len(programs) < len(space)  # a parallel depth beyond what a sketch fuses changes nothing
    progress = tune_job(job, store_uri)
    assert progress.trials == len(programs)


def test_records_of_another_shape_give_features_in_this_spaces_layout():
    from lorien.search.xgb import KnobFeatures

    key = _key("conv2d NHWC+bias+relu")
    args = workload_registry.parse_workload_key(key)[1]
    space = SketchSpace(workload_registry.workload_dag(key), args)
    features = KnobFeatures(space)
    rng = np.random.default_rng(5)
    for index in rng.integers(len(space), size=10).tolist():
        index = space.index_of_steps(space.get(index))  # the canonical point of its program
        row = features.extend(space.features_of_steps(space.get(index), args).reshape(1, -1))[0]
        known = ~np.isnan(row)  # the parallel knob depends on a workload's extents: left unknown
        assert known.sum() == len(row) - 1
        assert len(row) == features.knob_width + len(DERIVED_FEATURES)
        np.testing.assert_allclose(row[known], features(np.array([index]))[0][known])
    other_args = [1, 8, 12, 12, 32, 3, 3, [1, 1], [1, 1], [1, 1], True, True, F32]
    other_key = workload_registry.make_workload_key("conv2d_nhwc_layer", other_args)
    other = SketchSpace(workload_registry.workload_dag(other_key), other_args)
    row = space.features_of_steps(other.get(0), other_args)
    assert row is not None and row[-len(space.shape_features):].tolist() == other.shape_features


def test_the_model_learns_from_other_workloads_of_the_same_function(store_uri):
    from dialects.auto_scheduler.tuning import cached_space, transfer_history

    tune_job(_job(trials=8), store_uri)
    other = workload_registry.make_workload_key("dense_layer", [4, 16, 16, True, True, F32])
    with open_store(store_uri) as store:
        features, scores = transfer_history(store, cached_space(other), other, "llvm -keys=cpu")
    assert features.shape[0] == 8 and scores.max() == 1.0 and scores.min() > 0


def test_autotvm_only_options_are_refused():
    with pytest.raises(ConfigError, match="'warm_start_model' is an option of autotvm"):
        tune_job(_job(warm_start_model="models/dense"), None)


def test_lorien_tune_writes_ansor_logs_that_export_unchanged_and_build(tmp_path, store_uri, capsys):
    from lorien.cli import main

    config = tmp_path / "tune.yaml"
    config.write_text(yaml.safe_dump({
        "dialect": "auto_scheduler", "tuner": "random", "trials": 4, "batch_size": 4, "target": "llvm -keys=cpu",
        "measure": {"repeat": 1},
        "workloads": [{"dense": {"M": 4, "N": 16, "K": 8, "bias": True, "relu": True}},
                      {"depthwise_conv2d": {"C": 4, "H": 6, "W": 6, "padding": 1}}]}))
    logs = tmp_path / "logs"
    assert main(["tune", str(config), "--store", store_uri, "--no-progress", "--log-dir", str(logs)]) == 0
    out = capsys.readouterr().out
    assert "dense_layer 4,16,8,true,true" in out and "depthwise_conv2d_nchw_layer" in out
    logged = [json.loads(line) for path in sorted(logs.glob("*.json")) for line in path.read_text().splitlines()]
    exported = tmp_path / "exported.json"
    assert main(["export", "--all", "--target", "llvm -keys=cpu", "--format", "ansor", "--store", store_uri,
                 "-o", str(exported)]) == 0
    again = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(logged) == 8 and sorted(map(json.dumps, logged)) == sorted(map(json.dumps, again))
    key = logged[0]["i"][0][0]
    assert main(["query", "--workload-key", key, "--target", "llvm", "--build", "--store", store_uri]) == 0
    assert "from the best stored config" in capsys.readouterr().out


def test_derived_features_are_the_tile_volumes_of_a_program():
    from lorien.search.xgb import KnobFeatures

    key = _key("conv2d NHWC+bias+relu")
    space = SketchSpace(workload_registry.workload_dag(key), workload_registry.parse_workload_key(key)[1])
    index = int(np.random.default_rng(2).integers(len(space)))
    steps = space.get(index)
    splits = [step for step in steps if step[0] == "SP"]
    spatial = [[step[3] // math.prod(step[4]), *step[4]] for step in splits if len(step[4]) == 3]
    reduce = [[step[3] // math.prod(step[4]), *step[4]] for step in splits if len(step[4]) == 1]
    assert len(spatial) == 4 and len(reduce) == 3  # n, h, w, co; rh, rw, rc
    tile = [math.prod(f[level] for f in spatial) for level in range(4)]
    red = [math.prod(f[level] for f in reduce) for level in range(2)]
    expected = [*tile, *red, tile[1] * tile[2] * tile[3], tile[2] * tile[3], tile[3] * red[1]]
    derived = dict(zip(DERIVED_FEATURES, KnobFeatures(space)(np.array([index]))[0][-len(DERIVED_FEATURES):],
                       strict=True))
    np.testing.assert_allclose(list(derived.values()), np.log2(expected))
    assert derived["tile_s0"] + derived["tile_below_s0"] == pytest.approx(math.log2(math.prod(  # the whole output
        step[3] for step in splits if len(step[4]) == 3)))


def test_the_nearest_point_of_another_shapes_program_keeps_its_tiles_where_this_extent_allows():
    key = _key("conv2d NHWC+bias+relu")
    space = SketchSpace(workload_registry.workload_dag(key), workload_registry.parse_workload_key(key)[1])
    for index in np.random.default_rng(3).integers(len(space), size=5).tolist():
        steps = space.get(index)
        assert space.get(space.nearest_point(steps)) == steps  # its own programs map to themselves
    other_args = [1, 24, 20, 20, 32, 3, 3, [1, 1], [1, 1], [1, 1], True, True, F32]
    other_key = workload_registry.make_workload_key("conv2d_nhwc_layer", other_args)
    other = SketchSpace(workload_registry.workload_dag(other_key), other_args)
    positions = [0] * len(other.dims)
    positions[0] = 1  # another sketch than the first
    for k, tile in enumerate(other.tiles):  # inner tiles (1, 1, 2) on spatial loops (n = 1: none), 3 on reduce loops
        wanted = ((1, 1, 2) if tile.key[1] > 1 else (1, 1, 1)) if tile.key[2] == 4 else (3,)
        positions[1 + k] = next(i for i, e in enumerate(tile.entities) if e[1:] == wanted)
    program = other.get(other.index_of_knobs(positions))
    adapted = space.get(space.nearest_point(program))
    assert _check(key, adapted) < 1e-3
    assert [s[0] for s in adapted[:len(space.sketches[1].steps)]] == [s[0] for s in space.sketches[1].steps]
    # n, h, w, co; rh, rw, rc: rc = 8 here cannot take 3, the nearest in log2 is 4
    assert [step[4] for step in adapted if step[0] == "SP"] == [[1, 1, 1], [1, 1, 2], [1, 1, 2], [1, 1, 2], [3], [3], [4]]
    assert space.nearest_point([["SP", 0, 0, 4, [4], 1]]) is None


def test_seeds_are_measured_first_a_few_per_plan():
    from types import SimpleNamespace

    from lorien.search.xgb import XGBTuner

    space = _space("dense")
    tuner = XGBTuner(space, seed=0, plan_size=8, optimizer="evolution", population=32, seed_quota=2)
    tuner.add_seeds([5, 7, 9])
    first = tuner.next_batch(8)
    assert first[:2] == [5, 7] and 9 not in first  # no model yet: in the given order, two per plan
    tuner.update(first, [SimpleNamespace(costs=[1e-3 * (1 + i)], error_no=0) for i in range(len(first))])
    assert tuner.booster_ is not None  # refit after a plan's measurements
    assert tuner.next_batch(8)[0] == 9  # the one seed left, first in the next plan
    tuner.add_seeds([7])  # measured already: never again
    assert 7 not in tuner.next_batch(8)


def test_a_job_measures_the_adapted_best_programs_of_other_shapes_early(store_uri):
    from dialects.auto_scheduler.tuning import cached_space, transfer_seeds

    tune_job(_job(trials=8), store_uri)  # dense_layer 8x16x16
    other = _job(args=[4, 16, 32, True, True, F32], tuner="xgb", trials=4, batch_size=4)
    key = workload_registry.make_workload_key("dense_layer", other["args"])
    with open_store(store_uri) as store:
        seeds = transfer_seeds(store, cached_space(key), key, "llvm -keys=cpu")
        tuned_key = workload_registry.make_workload_key("dense_layer", _job()["args"])
        rows = store.scan(filters={"workload_key": tuned_key}).to_pylist()
    fastest = min(np.mean(r["costs"]) for r in rows)
    assert len(seeds) == 1 and seeds[0] in {cached_space(key).nearest_point(json.loads(r["config"]))
                                            for r in rows if np.mean(r["costs"]) == fastest}
    tune_job(other, store_uri)
    with open_store(store_uri) as store:
        measured = [json.loads(r["config"]) for r in store.scan(filters={"workload_key": key}).to_pylist()]
    assert cached_space(key).get(seeds[0]) in measured
