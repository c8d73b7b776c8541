"""Program features (lorien.features.program): one fixed-length vector of the lowered loop nest,
for records of every dialect, and `lorien featurize --features program`."""

from __future__ import annotations

import functools
import math
import operator

import numpy as np
import pandas as pd
import pytest

from lorien.cli import main
from lorien.engine import lower, ops, te
from lorien.engine.schedule import create_schedule
from lorien.features.program import FEATURE_NAMES, program_features, schedule_features, structure


def _dense(m=16, n=32, k=24):
    data, weight = te.placeholder((m, k), name="data"), te.placeholder((n, k), name="weight")
    out = ops.dense(data, weight)
    return data, weight, out


def _value(vector, name):
    return vector[FEATURE_NAMES.index(name)]


def _flops(program) -> float:
    """Trip-weighted float operations of a fully lowered program (unrolled loops expanded)."""
    trips, total = [1.0], 0.0
    for u in program.uops:
        if u.op == "LOOP":
            trips.append(trips[-1] * u.arg[1])
        elif u.op == "ENDLOOP":
            trips.pop()
        elif u.op == "ALU" and u.dtype.startswith("float"):
            total += trips[-1] * u.lanes * (2 if u.arg == "fma" else 1)
    return total


def test_structural_lowering_counts_the_work_of_real_lowering_without_expanding_unrolled_loops():
    data, weight, out = _dense()
    s = create_schedule(out)
    i, j = out.op.axis
    (k,) = out.op.reduce_axis
    jo, ji = s[out].split(j, factor=8)
    ko, ki = s[out].split(k, factor=4)
    s[out].reorder(i, jo, ko, ki, ji)
    s[out].unroll(ki)
    s[out].vectorize(ji)
    s[out].parallel(i)
    real = lower(s, [data, weight, out])
    kept = structure(s, [data, weight, out])
    assert any(u.op == "LOOP" and u.arg[2] == "unrolled" for u in kept.uops)
    assert len(kept.uops) < len(real.uops)
    vector = program_features(kept)
    assert _value(vector, "pg_flops") == pytest.approx(math.log2(1 + _flops(real)))
    assert _flops(real) == 2 * 16 * 32 * 24
    assert _value(vector, "pg_vector_lanes") == 8
    assert _value(vector, "pg_parallel_extent") == pytest.approx(math.log2(17))
    assert _value(vector, "pg_unrolled_loops") == 1


def test_vectorizing_and_loop_order_change_the_features_the_way_they_change_the_program():
    data, weight, out = _dense()
    plain = create_schedule(out)
    base = schedule_features(plain, [data, weight, out])
    assert base.shape == (len(FEATURE_NAMES),) and np.isfinite(base).all()
    assert _value(base, "pg_vector_flops_frac") == 0

    vec = create_schedule(out)
    i, j = out.op.axis
    (k,) = out.op.reduce_axis
    jo, ji = vec[out].split(j, factor=8)
    vec[out].reorder(i, jo, k, ji)
    vec[out].vectorize(ji)
    vectorized = schedule_features(vec, [data, weight, out])
    assert _value(vectorized, "pg_vector_flops_frac") == 1
    assert _value(vectorized, "pa_out_lanes") == pytest.approx(math.log2(9))
    # the same arithmetic either way
    assert _value(vectorized, "pg_flops") == pytest.approx(_value(base, "pg_flops"))

    # k innermost: data is read along k (stride 1), weight too; j innermost: weight strides by K
    swapped = create_schedule(out)
    swapped[out].reorder(out.op.reduce_axis[0], *out.op.axis)
    strided = schedule_features(swapped, [data, weight, out])
    strides = sorted(_value(strided, f"pa_load{r}_stride_inner") for r in range(2))
    assert strides[-1] == pytest.approx(math.log2(1 + 24))  # weight[j, k] stepped along j


def test_parallel_balance_vector_waste_and_serial_share_follow_the_schedule():
    data, weight, out = _dense(m=3, n=48, k=8)
    plain = schedule_features(create_schedule(out), [data, weight, out])
    assert _value(plain, "pg_serial_flops_frac") == 1
    assert _value(plain, "pg_parallel_balance_2") == 0.5  # one iteration: one of two cores busy
    assert _value(plain, "pg_scalar_mem_frac") == 1

    s = create_schedule(out)
    i, j = out.op.axis
    (k,) = out.op.reduce_axis
    jo, ji = s[out].split(j, factor=24)
    s[out].reorder(i, jo, k, ji)
    s[out].vectorize(ji)
    s[out].parallel(i)
    tiled = schedule_features(s, [data, weight, out])
    assert _value(tiled, "pg_serial_flops_frac") == 0
    assert _value(tiled, "pg_parallel_balance_2") == pytest.approx(3 / 4)  # 3 iterations on 2 cores: 2 rounds
    assert _value(tiled, "pg_parallel_balance_16") == pytest.approx(3 / 16)
    assert _value(tiled, "pg_vector_waste_16") == pytest.approx(1 - 24 / 32)  # 24 lanes fill 1.5 registers of 16
    assert _value(tiled, "pg_vector_waste_8") == 0
    assert _value(tiled, "pg_out_vector_frac") == 1
    assert _value(tiled, "pg_scalar_mem_frac") < 1
    assert _value(tiled, "pr_mem_ops") < _value(plain, "pr_mem_ops")  # a vector access moves 24 floats at once


def test_records_of_all_three_dialects_get_one_vector_each(shared_data):
    from lorien.dialect import get_dialect
    from lorien.features.program import record_program_features
    from lorien.formats import read_log

    paths = {"autotvm": shared_data / "tophub" / "llvm_v0.04.log",
             "auto_scheduler": shared_data / "ansor" / "conv2d.json",
             "meta_schedule": shared_data / "meta_schedule" / "matmul_128"}
    for dialect, path in paths.items():
        records = [r for r in read_log(path).records if r.dialect == dialect][:5]
        assert records, path
        vectors = [record_program_features(get_dialect(dialect), r) for r in records]
        for vector in vectors:
            assert vector.shape == (len(FEATURE_NAMES),) and np.isfinite(vector).all()
            assert _value(vector, "pg_flops") > 10


def test_featurize_program_writes_one_csv_for_every_dialect(tmp_path, shared_data, capsys):
    out = tmp_path / "features"
    code = main(["featurize", "--features", "program", "--quiet", "--json", "--jobs", "2", "-o", str(out),
                 str(shared_data / "tophub" / "llvm_v0.04.log"), str(shared_data / "ansor" / "conv2d.json"),
                 str(shared_data / "meta_schedule" / "matmul_128")])
    assert code == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert list(report["templates"]) == ["program"]
    assert report["records_featurized"] == report["records_read"] > 20  # every record lowered, none dropped
    frame = pd.read_csv(out / "program.csv")
    assert set(FEATURE_NAMES) <= set(frame.columns)
    assert len(frame) == report["records_read"]
    assert (out / "program.meta").is_file()


def test_featurize_program_from_a_store_lowers_records_of_every_dialect_tuned_here(tmp_path):
    """A store keeps each record's extra (a MetaSchedule record's workload entry): program
    featurization reads it, so records of all three dialects tuned here are lowered, none dropped."""
    from lorien.dialect import get_dialect
    from lorien.features import featurize
    from lorien.target import host_target
    from lorien.tune.loop import tune_job

    uri = f"parquet:{tmp_path / 'store'}"
    for dialect in ("autotvm", "auto_scheduler", "meta_schedule"):
        task_name, args = get_dialect(dialect).expand_workload("dense", {"M": 8, "N": 16, "K": 16})
        tune_job({"dialect": dialect, "task_name": task_name, "args": args, "tuner": "random", "trials": 3,
                  "batch_size": 3, "target": host_target().canonical}, uri)
    report = featurize(tmp_path / "features", store=uri, extractor="program", jobs=1, progress=False)
    assert report.records_read == 9
    assert report.records_featurized == 9, report.examples
    assert list(report.templates) == ["program"]
    # labelled by each record's fastest repeat, not the mean a wake-up spike in one repeat moves
    from lorien.warehouse import open_store

    with open_store(uri) as store:
        table = store.scan({})
    fastest = sorted(round(flop / min(costs) / 1e9, 6) for flop, costs, error in
                     zip(table["flop"].to_pylist(), table["costs"].to_pylist(), table["error_no"].to_pylist(), strict=True)
                     if error == 0)
    written = pd.read_parquet(tmp_path / "features" / "program.parquet")["thrpt"]
    assert sorted(written[written > 0]) == pytest.approx(fastest)


def test_every_auto_scheduler_knob_that_changes_the_program_changes_its_features():
    """What a guided auto_scheduler run scores: two points whose lowered programs differ (another
    sketch, tile size, compute location, parallel depth or unroll step) get different program
    features (issue 22's follow-up checked this when the model ranked auto_scheduler programs
    barely above chance: they do). An unroll step that unrolls the same loops is the same program."""
    from dialects.auto_scheduler.tuning import tuning_context
    from lorien.dialect import get_dialect
    from lorien.target import host_target
    from lorien.tune.job import TuneJob

    task_name, args = get_dialect("auto_scheduler").expand_workload("dense", {"M": 16, "N": 32, "K": 64})
    job = TuneJob.from_spec({"dialect": "auto_scheduler", "task_name": task_name, "args": args, "tuner": "xgb",
                             "trials": 8, "target": host_target().canonical})
    context = tuning_context(job, None)
    space, rng = context.space, np.random.default_rng(0)

    def program_and_features(steps):
        schedule, tensors = context.schedule_of(steps)
        program = [(u.op, str(u.arg), u.dtype, u.lanes) for u in lower(schedule, tensors).uops]
        return program, schedule_features(*context.schedule_of(steps))

    moved = set()
    for _ in range(2):
        positions = space.knob_indices(space.sample(rng))
        program, features = program_and_features(space.get(space.index_of_knobs(positions)))
        for knob, dim in enumerate(space.dims):
            for value in rng.permutation(dim)[:3].tolist():
                if value != positions[knob]:
                    other = space.get(space.index_of_knobs([*positions[:knob], value, *positions[knob + 1:]]))
                    other_program, other_features = program_and_features(other)
                    if other_program != program:
                        assert not np.array_equal(other_features, features), (knob, value)
                        moved.add(knob)
    assert moved >= {k for k, dim in enumerate(space.dims) if dim > 1}  # every knob of more than one value


def test_points_featurized_in_the_build_workers_are_those_featurized_here():
    """A guide's pool is featurized in the engine's build workers: the same vectors (None for a
    point that does not lower) as here, in the order asked; a share a worker cannot answer is
    featurized here, so its error is the one it would be without workers."""
    from dialects.meta_schedule.space import TraceSpace
    from dialects.meta_schedule.tuning import _schedule_of
    from lorien.engine.dag import ComputeDAG
    from lorien.engine.measure import WorkerPool
    from lorien.features.program import point_features, point_features_in_workers

    data, weight, out = _dense(32, 48, 64)
    dag = ComputeDAG([data, weight, out])
    space = TraceSpace(dag)
    schedule_of = functools.partial(_schedule_of, space)
    rng = np.random.default_rng(0)
    indices = [int(i) for i in rng.choice(len(space), 24, replace=False)]
    pool = WorkerPool(2)
    try:
        here = point_features(space, schedule_of, indices)
        there = point_features_in_workers(space, schedule_of, indices, pool)
        assert len(there) == len(indices) and sum(row is not None for row in there) >= 20
        assert all((a is None and b is None) or np.array_equal(a, b) for a, b in zip(here, there, strict=True))

        def broken(config):  # does not pickle: every point featurized here, and its error raised here
            raise RuntimeError(f"no schedule for {len(config)} steps")

        with pytest.raises(RuntimeError, match="no schedule for"):
            point_features_in_workers(space, broken, indices, pool)
        # pickles, but fails in the workers with an error that is not "does not lower": raised here
        with pytest.raises(AttributeError, match="no_such_method"):
            point_features_in_workers(space, operator.methodcaller("no_such_method"), indices, pool)
    finally:
        pool.shutdown()


def test_a_rendered_trace_is_scheduled_by_the_state_that_rendered_it_as_a_replay_would():
    """``TraceSpace.replay`` of the trace ``get`` just rendered reuses the rendering's state (one
    replay where a guide made two): the same program as ``replay_trace``; a copy of the trace, or
    the same trace asked again, is replayed."""
    import copy

    from dialects.meta_schedule.space import TraceSpace
    from dialects.meta_schedule.trace import replay_trace
    from lorien.engine.dag import ComputeDAG

    data, weight, out = _dense(32, 48, 64)
    dag = ComputeDAG([data, weight, out])
    space = TraceSpace(dag)
    rng = np.random.default_rng(1)
    for index in rng.choice(len(space), 6, replace=False):
        trace = space.get(int(index))
        rendered = space.replay(trace)
        replayed = replay_trace(dag, trace)
        assert str(lower(rendered.schedule, rendered.args)) == str(lower(replayed.schedule, replayed.args))
        assert space.replay(trace).schedule is not rendered.schedule  # the state serves once
        assert space.replay(copy.deepcopy(space.get(int(index)))).schedule is not None
