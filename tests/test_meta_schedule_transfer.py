"""meta_schedule transfer seeds: a stored trace read back to its point, adapted to another
workload's space, and measured first by a job with ``transfer: true``."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from conftest import F32

import lorien.builtin_workloads  # noqa: F401 - registers the built-in workloads
from dialects.meta_schedule.space import TraceSpace
from lorien import workload_registry
from lorien.dialect import get_dialect
from lorien.tune.loop import tune_job
from lorien.warehouse import open_store

MEASURE = {"number": 1, "repeat": 1, "min_repeat_ms": 0}
DENSE_A = [8, 64, 32, False, False, F32]
DENSE_B = [16, 48, 96, False, False, F32]
CONV = [1, 8, 10, 10, 16, 3, 3, [1, 1], [1, 1], [1, 1], True, True, F32]


def _space(name: str, args: list) -> TraceSpace:
    return TraceSpace(workload_registry.workload_dag(workload_registry.make_workload_key(name, args)), cores=2)


@pytest.mark.parametrize(("name", "args"), [("dense_layer", DENSE_A), ("conv2d_nhwc_layer", CONV)])
def test_a_trace_reads_back_to_a_point_that_renders_it(name, args):
    space = _space(name, args)
    rng = np.random.default_rng(0)
    for index in rng.integers(len(space), size=8):
        trace = space.get(int(index))
        positions = space.positions_of(orjson.loads(orjson.dumps(trace)))  # as a record's config reads back
        assert positions is not None
        assert orjson.dumps(space.render(positions)) == orjson.dumps(trace)
    # a tile no factorization of this extent gives, or a trace of another workload: no point
    instructions, decisions = orjson.loads(orjson.dumps(space.get(0)))
    tile = next(i for i, inst in enumerate(instructions) if inst[0] == "SamplePerfectTile")
    bad = [[i, [3, 1, 1, 1] if i == tile else d] for i, d in decisions]
    assert space.positions_of([instructions, bad]) is None
    other = _space("dense_layer", DENSE_B if name == "conv2d_nhwc_layer" else [8, 64, 48, False, False, F32])
    assert space.positions_of(other.get(1)) is None


def test_a_point_of_one_dense_adapts_to_another_dense_and_not_to_a_conv2d():
    source, here = _space("dense_layer", DENSE_A), _space("dense_layer", DENSE_B)
    rng = np.random.default_rng(1)
    for index in rng.integers(len(source), size=6):
        positions = source.knob_indices(int(index))
        adapted = here.knob_indices(here.nearest_point(source, positions))
        for tiled_there, tiled_here in zip(source.tiled, here.tiled, strict=True):
            assert adapted[tiled_here.cache_knob] == positions[tiled_there.cache_knob]
            for n, (k_there, k_here) in enumerate(zip(tiled_there.tile_knobs, tiled_here.tile_knobs, strict=True)):
                wanted = np.log2(source.tile_entities[n][positions[k_there]][1:])
                distances = [np.abs(np.log2(entity[1:]) - wanted).sum() for entity in here.tile_entities[n]]
                assert distances[adapted[k_here]] == pytest.approx(min(distances))
        assert adapted[here.unroll_knob] == positions[source.unroll_knob]
        assert adapted[here.parallel_knob] == positions[source.parallel_knob]
    assert _space("conv2d_nhwc_layer", CONV).nearest_point(source, source.knob_indices(0)) is None


def test_transfer_measures_the_adapted_best_of_another_workload_first(store_uri):
    job = {"dialect": "meta_schedule", "task_name": "dense_layer", "args": DENSE_A, "target": "llvm",
           "trials": 6, "batch_size": 3, "measure": MEASURE, "seed": 0, "tuner": "random"}
    tune_job(job, store_uri)
    with open_store(store_uri) as store:
        key_a = get_dialect("meta_schedule").workload_key("dense_layer", DENSE_A)
        best = store.best(key_a, "llvm", k=1)[0]
    source, here = _space("dense_layer", DENSE_A), _space("dense_layer", DENSE_B)
    expected = here.get(here.nearest_point(source, source.positions_of(best.config_value())))

    job_b = {**job, "args": DENSE_B, "tuner": "xgb", "trials": 3, "transfer": True}
    records = tune_job(job_b, store_uri).records
    assert orjson.loads(records[0].config) == orjson.loads(orjson.dumps(expected))
    assert all(record.is_valid for record in records)
    # without transfer (the default) the job's first point is its own random pick
    with open_store(store_uri) as store:
        from lorien.tune.job import TuneJob

        context = get_dialect("meta_schedule").tuning_context(TuneJob.from_spec({**job_b, "transfer": False}), store)
        assert context.tuner.seeds == []
        context = get_dialect("meta_schedule").tuning_context(TuneJob.from_spec(job_b), store)
        assert context.tuner.seeds[0] == here.nearest_point(source, source.positions_of(best.config_value()))


def test_a_record_that_does_not_read_back_is_no_seed(store_uri):
    """A stored trace that is malformed, or whose workload entry is no Lorien DAG, is skipped; the
    other workloads still seed the job."""
    import pyarrow as pa

    from dialects.meta_schedule.tuning import transfer_seeds

    job = {"dialect": "meta_schedule", "task_name": "dense_layer", "args": DENSE_A, "target": "llvm",
           "trials": 3, "batch_size": 3, "measure": MEASURE, "seed": 0, "tuner": "random"}
    tune_job(job, store_uri)
    with open_store(store_uri) as store:
        table = store.scan({}, columns=["workload_key", "args", "config", "costs", "error_no", "extra", "task_name",
                                        "dialect", "target_key"])
    good = table.to_pylist()
    bad = [{**good[0], "workload_key": "1", "config": "[1, 2]", "costs": [1e-9]},
           {**good[0], "workload_key": "2", "extra": orjson.dumps({"workload": ["2", {"tvm": "module"}]}).decode(),
            "costs": [1e-9]}]

    class Store:
        def scan(self, filters=None, columns=None):
            return pa.Table.from_pylist(bad + good)

    here = _space("dense_layer", DENSE_B)
    key_b = get_dialect("meta_schedule").workload_key("dense_layer", DENSE_B)
    seeds = transfer_seeds(Store(), here, key_b, "dense_layer", "llvm", [["TENSOR", F32, [16, 96]]])
    source = _space("dense_layer", DENSE_A)
    best = min(good, key=lambda row: min(row["costs"]))
    assert seeds == [here.nearest_point(source, source.positions_of(orjson.loads(best["config"])))]
