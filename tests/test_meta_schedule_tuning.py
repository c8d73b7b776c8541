"""The meta_schedule dialect tunes: a design space from schedule rules, mutators, evolutionary
search with XGBoost, records committed in MetaSchedule's form and exported as a JSONDatabase."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from conftest import F32, LAYER_OPS

import lorien
from dialects.meta_schedule.compile import check_kernel, replay_database
from dialects.meta_schedule.space import TraceSpace
from dialects.meta_schedule.trace import replay_trace
from dialects.meta_schedule.tuning import tune_dag
from lorien import workload_registry
from lorien.cli import main
from lorien.dialect import get_dialect
from lorien.engine.build import build
from lorien.tune.loop import tune_job
from lorien.warehouse import open_store

OPS = {op: case for op, case in LAYER_OPS.items() if not op.startswith("depthwise")}  # what this dialect tunes
MEASURE = {"number": 1, "repeat": 1, "min_repeat_ms": 0}


def _dag(op: str):
    name, args = OPS[op]
    return workload_registry.workload_dag(workload_registry.make_workload_key(name, args))


@pytest.mark.parametrize("op", sorted(OPS))
def test_random_and_mutated_points_of_the_space_build_kernels_that_match_numpy(op):
    dag = _dag(op)
    space = TraceSpace(dag, cores=2)
    rng = np.random.default_rng(0)
    index = int(rng.integers(len(space)))
    for _ in range(4):
        replay = replay_trace(dag, space.get(index))
        assert check_kernel(build(replay.schedule, replay.args), dag) < 1e-3
        index = space.mutate(index, rng)


def test_the_space_tiles_reductions_and_places_padding_by_compute_location():
    space = TraceSpace(_dag("conv2d NHWC+bias+relu"), cores=2)
    assert [t.stage for t in space.tiled] == ["conv2d.acc"]
    assert space.tiled[0].epilogue == "conv2d"
    assert [p.stage for p in space.placed] == ["conv2d.pad"]
    assert space.placed[0].choices == [-1, *range(2 * 4)]


def test_a_rendered_trace_is_tvm_s_instruction_form_with_its_decisions():
    space = TraceSpace(_dag("dense"), cores=2)
    instructions, decisions = space.get(0)
    names = [inst[0] for inst in instructions]
    assert names[:3] == ["GetSBlock", "GetSBlock", "Annotate"]
    assert "EnterPostproc" in names and names[-1] == "DecomposeReduction"
    by_index = dict((index, value) for index, value in decisions)
    tiles = [by_index[i] for i, name in enumerate(names) if name == "SamplePerfectTile"]
    assert [math.prod(t) for t in tiles] == [4, 32, 16]
    assert all(len(inst) == 4 for inst in instructions)


def test_a_batch_1_nest_is_parallel_over_the_loop_after_its_unit_batch_loop_as_in_tvm():
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    x = te.placeholder((1, 64, 8, 8), "float32", "x")
    y = te.compute((1, 64, 8, 8), lambda n, c, h, w: x[n, c, h, w] * 2.0, name="y")
    dag = ComputeDAG([x, y])
    space = TraceSpace(dag, cores=2)
    for index in range(len(space)):
        instructions, _ = space.get(index)
        post = instructions[[inst[0] for inst in instructions].index("EnterPostproc"):]
        fused = next(inst for inst in post if inst[0] == "Fuse")
        # 1 x 64 passes every parallel extent (8, 32, 128 jobs on 2 cores): TVM fuses the unit
        # batch loop with the channels and stops, it does not leave one thread a parallel loop of 1
        assert len(fused[1]) >= 2, fused
        replay = replay_trace(dag, space.get(index))
        assert check_kernel(build(replay.schedule, replay.args), dag) < 1e-3


def test_an_epilogue_behind_element_wise_stages_runs_inside_the_tile_after_they_are_inlined():
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    a, b = te.placeholder((16, 32), "float32", "A"), te.placeholder((32, 24), "float32", "B")
    bias = te.placeholder((24,), "float32", "bias")
    k = te.reduce_axis(32, "k")
    c = te.compute((16, 24), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    added = te.compute((16, 24), lambda i, j: c[i, j] + bias[j], name="added")
    low = te.compute((16, 24), lambda i, j: te.maximum(added[i, j], 0.0), name="low")
    clipped = te.compute((16, 24), lambda i, j: te.minimum(low[i, j], 6.0), name="clipped")
    dag = ComputeDAG([a, b, bias, clipped])
    space = TraceSpace(dag, cores=2)
    (tiled,) = space.tiled
    assert (tiled.epilogue, tiled.chain) == ("clipped", ["added", "low"])  # relax's conv + bias + Clip(0, 6)
    assert not {"added", "low"} & set(space.inlined)
    rng = np.random.default_rng(0)
    for index in [int(i) for i in rng.integers(len(space), size=6)]:
        instructions, _ = space.get(index)
        names = [inst[0] for inst in instructions]
        assert names.index("ComputeInline") < names.index("SamplePerfectTile")
        replay = replay_trace(dag, space.get(index))
        assert check_kernel(build(replay.schedule, replay.args), dag) < 1e-3


def test_mutation_moves_one_prime_factor_between_tile_levels():
    space = TraceSpace(_dag("dense"), cores=2)
    rng = np.random.default_rng(1)
    index = space.index_of_knobs([1] * len(space.dims))
    moved = [space.mutate(index, rng) for _ in range(20)]
    assert any(m != index for m in moved)
    for m in moved:
        diff = [k for k, (a, b) in enumerate(zip(space.knob_indices(index), space.knob_indices(m), strict=True)) if a != b]
        assert len(diff) <= 1


def test_tune_job_commits_meta_schedule_records_that_compile_from_the_store(store_uri):
    job = {"dialect": "meta_schedule", "task_name": "dense_layer", "args": [8, 16, 16, True, True, F32],
           "target": "llvm", "trials": 8, "batch_size": 4, "measure": MEASURE, "seed": 0}
    progress = tune_job(job, store_uri)
    assert progress.trials == 8 and progress.committed == 8 and math.isfinite(progress.best_cost_s)
    key = get_dialect("meta_schedule").workload_key("dense_layer", job["args"])
    with open_store(store_uri) as store:
        best = store.best(key, "llvm", k=1)
    assert best[0].dialect == "meta_schedule" and best[0].flop == 2 * 8 * 16 * 16 + 2 * 8 * 16
    kernel = lorien.compile(key, "llvm", store=store_uri)
    data, weight, bias = (np.random.default_rng(0).uniform(-1, 1, s).astype(F32) for s in ((8, 16), (16, 16), (16,)))
    out = np.zeros((8, 16), F32)
    kernel(data, weight, bias, out)
    assert np.allclose(out, np.maximum(data @ weight.T + bias, 0), atol=1e-4)


@pytest.mark.parametrize(("target", "threads"), [("llvm", 1), ("llvm -num-cores=2", 2)])
def test_the_engine_times_a_job_on_the_threads_tvm_will_run_the_model_with(store_uri, monkeypatch, target, threads):
    monkeypatch.setenv("TVM_NUM_THREADS", "1")  # what TVM's runtime will use, unless the target names -num-cores
    job = {"dialect": "meta_schedule", "task_name": "dense_layer", "args": [8, 16, 16, True, True, F32],
           "target": target, "trials": 2, "batch_size": 2, "measure": MEASURE, "seed": 0, "tuner": "random"}
    records = tune_job(job, store_uri).records
    assert records and {orjson.loads(record.build)["threads"] for record in records} == {threads}


@pytest.mark.parametrize(("environ", "machine", "threads"), [
    ({}, "x86_64", 4), ({}, "aarch64", 8), ({"OMP_NUM_THREADS": "3"}, "x86_64", 3),
    ({"TVM_NUM_THREADS": "2", "OMP_NUM_THREADS": "3"}, "x86_64", 2), ({"TVM_NUM_THREADS": "64"}, "x86_64", 8)])
def test_tvm_runtime_threads_follows_tvms_rule_on_an_8_cpu_machine(monkeypatch, environ, machine, threads):
    from dialects.meta_schedule import tvm_measure

    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(tvm_measure.os, "sysconf", lambda name: 8)
    monkeypatch.setattr(tvm_measure.platform, "machine", lambda: machine)
    assert tvm_measure.tvm_runtime_threads() == threads


def test_a_thread_count_tvm_cannot_take_is_an_error_naming_it(monkeypatch):
    from dialects.meta_schedule.tvm_measure import tvm_runtime_threads
    from lorien.errors import ConfigError

    monkeypatch.setenv("TVM_NUM_THREADS", "all")
    with pytest.raises(ConfigError, match="TVM_NUM_THREADS is 'all'"):
        tvm_runtime_threads()


def test_any_computation_in_the_dsl_tunes(store_uri):
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    a, b = te.placeholder((16, 8), F32, "A"), te.placeholder((8, 24), F32, "B")
    k = te.reduce_axis(8, "k")
    c = te.compute((16, 24), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    progress = tune_dag(ComputeDAG([a, b, c]), {"trials": 4, "batch_size": 4, "measure": MEASURE}, store_uri)
    assert progress.trials == 4 and math.isfinite(progress.best_cost_s)
    assert progress.records[0].task_name == "C" and progress.records[0].source.startswith("lorien-job:")


def test_tuning_again_measures_no_trace_twice(store_uri):
    job = {"dialect": "meta_schedule", "task_name": "batch_matmul_layer", "args": [2, 8, 16, 12, False, False, F32],
           "target": "llvm", "trials": 6, "batch_size": 3, "measure": MEASURE, "seed": 0, "tuner": "random"}
    first = tune_job(job, store_uri)
    second = tune_job(job, store_uri)
    configs = [r.config for r in first.records + second.records]
    assert len(configs) == len(set(configs)) == 12


def test_lorien_tune_and_export_give_a_json_database_that_replays(tmp_path, store_uri, capsys):
    config = yaml.safe_load(Path("configs/samples/meta_schedule.yaml").read_text())
    config.update(trials=4, batch_size=4, measure=MEASURE)
    config["workloads"] = [{"conv2d": {"C": 4, "H": 6, "W": 6, "K": 8, "kernel": 3, "padding": 1}},
                           {"conv2d": {"C": 4, "H": 6, "W": 6, "K": 8, "kernel": 3, "padding": 1, "layout": "NCHW"}}]
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["tune", str(path), "--store", store_uri, "--no-progress"]) == 0
    assert "measured by Lorien's engine, runtime " in capsys.readouterr().out
    database = tmp_path / "db"
    assert main(["export", "--all", "--target", "llvm", "--format", "meta_schedule", "--lorien-workloads",
                 "--store", store_uri, "-o", str(database)]) == 0
    workloads = (database / "database_workload.json").read_text().splitlines()
    assert len(workloads) == 2
    lines = (database / "database_tuning_record.json").read_text().splitlines()
    assert len(lines) == 8 and all(orjson.loads(line)[0] in (0, 1) for line in lines)
    outcomes = replay_database(database)
    assert [o.status for o in outcomes] == ["ok"] * 8


def test_exporting_workloads_tuned_here_without_tvm_names_them_and_writes_nothing(tmp_path, store_uri, shared_data,
                                                                                  monkeypatch, capsys):
    job = {"dialect": "meta_schedule", "task_name": "dense_layer", "args": [4, 8, 16, False, False, F32], "target": "llvm", "trials": 2,
           "batch_size": 2, "measure": MEASURE, "tuner": "random"}
    key = tune_job(job, store_uri).records[0].workload_key
    assert main(["ingest", str(shared_data / "meta_schedule" / "matmul_128"), "--store", store_uri]) == 0
    for name in [m for m in sys.modules if m == "tvm" or m.startswith("tvm.")] + ["tvm"]:
        monkeypatch.setitem(sys.modules, name, None)  # apache-tvm not installed
    capsys.readouterr()
    database = tmp_path / "db"
    assert main(["export", "--all", "--target", "llvm", "--format", "meta_schedule", "--store", store_uri,
                 "-o", str(database)]) == 1
    err = capsys.readouterr().err
    assert f"dense_layer ({key})" in err and "matmul" not in err
    assert "pip install 'lorien[tvm]'" in err and "--lorien-workloads" in err
    assert not database.exists()


def test_lorien_workloads_is_only_for_meta_schedule_exports(tmp_path, store_uri, capsys):
    assert main(["export", "--target", "llvm", "--format", "autotvm", "--lorien-workloads", "--store", store_uri,
                 "-o", str(tmp_path / "x.log")]) == 1
    assert "--lorien-workloads is for formats whose records name their workload by hash" in capsys.readouterr().err


def test_the_tune_summary_names_who_measured_the_jobs():
    from lorien.cli import measured_by_phrase

    assert measured_by_phrase([{"measure_with": "tvm"}], "llvm") == "measured by TVM's builder and runner"
    assert measured_by_phrase([{}, {"measure_with": "lorien"}], "llvm") == "measured by Lorien's engine, runtime llvm"
    mixed = measured_by_phrase([{"measure_with": "tvm"}, {}], "c")
    assert mixed.startswith("1 of 2 jobs measured by TVM") and "runtime c" in mixed


def _relu_dag():
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    a = te.placeholder((64, 64), F32, "A")
    b = te.compute((64, 64), lambda i, j: te.max(a[i, j], te.const(0.0, F32)), name="B")
    return ComputeDAG([a, b])


def test_points_of_a_small_space_that_lower_to_one_program_are_measured_once(store_uri):
    from dialects.meta_schedule.tuning import program_keys

    dag = _relu_dag()
    space = TraceSpace(dag)
    program_of = program_keys(dag, space, None)  # trace -> the first trace giving its program
    programs = set(program_of.values())
    assert len(space) == 12 and len(programs) < 8  # nothing to tile: unroll step x parallel extent
    job = {"trials": 8, "batch_size": 4, "measure": MEASURE, "tuner": "random", "seed": 0}
    first = tune_dag(dag, job, store_uri)
    assert first.trials == len(first.records) == len(programs)
    assert {program_of[orjson.dumps(orjson.loads(r.config))] for r in first.records} == programs
    assert tune_dag(dag, job, store_uri).trials == 0  # every program is in the store


def test_a_large_space_keeps_every_trace_its_own_identity():
    from dialects.meta_schedule.tuning import DEDUP_SPACE_MAX, program_keys

    dag = _dag("dense")
    space = TraceSpace(dag, cores=2)
    assert len(space) > DEDUP_SPACE_MAX and program_keys(dag, space, None) == {}


def _mean_subtract_dag():
    """A layer norm's first part: each row minus its mean (a reduction that is not tiled)."""
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    a = te.placeholder((64, 256), F32, "A")
    k = te.reduce_axis(256, "k")
    total = te.compute((64,), lambda i: te.sum(a[i, k], axis=k), name="total")
    out = te.compute((64, 256), lambda i, j: a[i, j] - total[i] * te.const(1 / 256, F32), name="centered")
    return ComputeDAG([a, out])


def _pool_subtract_dag():
    """Each channel minus its sum over two axes (a pool): a reduction that is not tiled and
    over more than one axis, which the space leaves its 12 points (no rfactor rule)."""
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    a = te.placeholder((16, 8, 8), F32, "A")
    h, w = te.reduce_axis(8, "h"), te.reduce_axis(8, "w")
    total = te.compute((16,), lambda c: te.sum(a[c, h, w], axis=[h, w]), name="total")
    out = te.compute((16, 8, 8), lambda c, i, j: a[c, i, j] - total[c] * te.const(1 / 64, F32), name="centered")
    return ComputeDAG([a, out])


@pytest.mark.tvm
@pytest.mark.parametrize("make_dag", [_relu_dag, _pool_subtract_dag])
def test_the_engine_groups_a_small_space_as_tvm_s_structural_hash_of_the_scheduled_module(make_dag):
    pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    from tvm import s_tir

    from dialects.meta_schedule.tuning import program_keys
    from dialects.meta_schedule.tvm_database import tvm_block_names, tvm_module_of

    dag = make_dag()
    space = TraceSpace(dag)
    program_of = program_keys(dag, space, None)
    module = tvm_module_of(dag)
    by_program: dict[bytes, set[int]] = {}
    by_module: dict[str, set[int]] = {}
    for index in range(len(space)):
        trace = space.get(index)
        schedule = s_tir.Schedule(module)
        s_tir.schedule.Trace.apply_json_to_schedule(tvm_block_names(trace), schedule)
        by_program.setdefault(program_of[orjson.dumps(trace)], set()).add(index)
        by_module.setdefault(str(ms.database.Workload(schedule.mod).as_json()[0]), set()).add(index)
    assert len(by_program) < len(space)
    assert sorted(map(sorted, by_program.values())) == sorted(map(sorted, by_module.values()))
