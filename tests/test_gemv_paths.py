"""Dense at batch 1 and a few rows (GEMV): the engine's schedules, the autotvm template
dense_gemv.x86, the auto_scheduler's rfactor sketch and the meta_schedule rfactor rule; every
kernel is checked against NumPy, and tuning finds the path and names it in its records. Also
the meta_schedule rfactor of reductions that are not tiled (a layer norm's mean and variance)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import F32

import lorien.builtin_workloads  # noqa: F401 - registers dense_layer, batch_matmul_layer
from dialects.meta_schedule.compile import check_kernel
from dialects.meta_schedule.space import REDUCTION_RULES, RULES, TraceSpace
from dialects.meta_schedule.trace import replay_trace
from lorien import workload_registry
from lorien.engine import build, ops, reference, runtime, te
from lorien.engine.schedule import create_schedule
from lorien.engine.x86 import dense_candidate, dense_gemv_candidate, schedule_dense_gemv
from lorien.errors import WorkloadError
from lorien.tune.loop import tune_job

MEASURE = {"number": 1, "repeat": 1, "min_repeat_ms": 0}


def _text(config) -> str:
    return config if isinstance(config, str) else json.dumps(config, separators=(",", ":"))


@pytest.mark.parametrize("m, n, k, rows, k_vectors", [(1, 40, 64, 4, 1), (1, 37, 80, 8, 2), (3, 24, 96, 2, 1),
                                                     (2, 20, 48, 3, 2)])   # uneven blocks and K splits are guarded
def test_engine_gemv_matches_numpy(m, n, k, rows, k_vectors):
    rng = np.random.default_rng(0)
    data, weight = rng.uniform(-1, 1, (m, k)).astype("float32"), rng.uniform(-1, 1, (n, k)).astype("float32")
    s, args = dense_gemv_candidate(m, n, k, rows, k_vectors)
    assert any(step["kind"] == "rfactor" for step in s.steps)
    out = np.zeros((m, n), "float32")
    build(s, args)(data, weight, out)
    np.testing.assert_allclose(out, reference.dense(data, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, n, k, rows, parts", [(1, 40, 64, 2, 2), (1, 1000, 48, 3, 2), (2, 37, 80, 4, 3)])
def test_engine_gemv_in_one_weight_slice_per_thread_matches_numpy(m, n, k, rows, parts):
    rng = np.random.default_rng(3)
    data, weight = rng.uniform(-1, 1, (m, k)).astype("float32"), rng.uniform(-1, 1, (n, k)).astype("float32")
    s, args = dense_gemv_candidate(m, n, k, rows, 1, parts=parts)
    assert any(step["kind"] == "split" and step.get("nparts") == parts for step in s.steps)
    out = np.zeros((m, n), "float32")
    with runtime.threads(2):
        build(s, args)(data, weight, out)
    np.testing.assert_allclose(out, reference.dense(data, weight), rtol=1e-4, atol=1e-4)


def test_engine_gemv_with_bias_and_relu_matches_numpy():
    rng = np.random.default_rng(1)
    data, weight, bias = te.placeholder((1, 64), name="data"), te.placeholder((30, 64), name="weight"), \
        te.placeholder((30,), name="bias")
    out = ops.dense(data, weight, bias, relu=True)
    s = create_schedule(out)
    schedule_dense_gemv(s, out, rows=4)
    arrays = [rng.uniform(-1, 1, t.shape).astype("float32") for t in (data, weight, bias)]
    result = np.zeros((1, 30), "float32")
    build(s, [data, weight, bias, out])(*arrays, result)
    np.testing.assert_allclose(result, reference.dense(*arrays, relu=True), rtol=1e-4, atol=1e-4)


def test_panel_packed_small_m_tile_packs_one_panel_per_block_and_matches_numpy():
    from lorien.engine import lower

    rng = np.random.default_rng(2)
    m, n, k = 4, 64, 24
    s, args = dense_candidate(m, n, k, 4, 16, "nm", pack_inner=True)
    program = lower(s, args)
    (alloc,) = [u for u in program.uops if u.op == "ALLOC" and u.arg[0].endswith("weight_pack")]
    assert alloc.arg[1:] == (k * 16, "local")      # one K x 16 panel, not the whole weight
    data, weight = rng.uniform(-1, 1, (m, k)).astype("float32"), rng.uniform(-1, 1, (n, k)).astype("float32")
    out = np.zeros((m, n), "float32")
    build(s, args)(data, weight, out)
    np.testing.assert_allclose(out, reference.dense(data, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, args", [("dense_layer", [1, 40, 64, False, False, F32]),
                                        ("dense_layer", [3, 24, 48, False, False, F32]),
                                        ("dense_layer", [4, 8, 16, False, False, F32]),   # blocks of all N: a unit loop
                                        ("batch_matmul_layer", [2, 1, 24, 32, False, False, F32])])
def test_meta_schedule_rfactor_rule_traces_replay_and_match_numpy(name, args):
    dag = workload_registry.workload_dag(workload_registry.make_workload_key(name, args))
    space = TraceSpace(dag, cores=2)
    (tiled,) = space.tiled
    assert tiled.rule_knob >= 0
    rng = np.random.default_rng(4)
    for trial in range(6):
        positions = [int(rng.integers(d)) for d in space.dims]
        positions[tiled.rule_knob] = RULES.index("rfactor")
        whole = (1, int(dag.outputs[0].shape[-1]))
        if trial == 0 and whole in space.gemv_entities[1]:  # one block of all outputs: the block loop is a unit loop
            positions[tiled.gemv_knobs[1]] = space.gemv_entities[1].index(whole)
        trace = space.render(positions)
        assert "RFactor" in [inst[0] for inst in trace[0]]
        replay = replay_trace(dag, json.loads(json.dumps(trace)))
        assert check_kernel(build(replay.schedule, replay.args), dag) < 1e-3


def test_meta_schedule_offers_no_rfactor_rule_for_many_rows():
    dag = workload_registry.workload_dag(workload_registry.make_workload_key("dense_layer", [16, 32, 32, False, False, F32]))
    assert all(t.rule_knob < 0 for t in TraceSpace(dag, cores=2).tiled)


@pytest.mark.parametrize("dialect, task_name, args, names_path", [
    ("autotvm", "dense_gemv.x86", [["TENSOR", [1, 64], "float32"], ["TENSOR", [48, 64], "float32"], None, "float32"],
     lambda config: '["tile_k", "sp"' in _text(config) or '["tile_k","sp"' in _text(config)),
    ("auto_scheduler", "dense_layer", [1, 48, 64, False, False, F32], lambda config: '["RF",' in _text(config)),
    ("meta_schedule", "dense_layer", [1, 48, 64, False, False, F32], lambda config: '"RFactor"' in _text(config)),
])
def test_tuning_finds_the_gemv_path_and_the_records_name_it(store_uri, dialect, task_name, args, names_path):
    job = {"dialect": dialect, "task_name": task_name, "args": args, "target": "llvm", "trials": 12, "batch_size": 6,
           "measure": MEASURE, "seed": 0, "tuner": "random"}
    records = tune_job(job, store_uri).records
    valid = [r for r in records if r.error_no == 0]
    assert valid and len(valid) == len(records)         # every kernel passed the runner's NumPy check
    assert any(names_path(r.config) for r in valid)


@pytest.mark.parametrize("dialect, args, paths", [
    ("auto_scheduler", [1, 48, 64, False, False, F32], {"rfactor", "multi_level_tiling"}),
    ("meta_schedule", [1, 48, 64, False, False, F32], {"rfactor", "multi_level_tiling"}),
])
def test_the_first_batch_measures_both_rules_and_query_names_each_records_path(store_uri, capsys, dialect, args, paths):
    from lorien.cli import main

    # the xgb tuner's first batch (plan_size) is the only one not guided by a model: both rules in it
    job = {"dialect": dialect, "task_name": "dense_layer", "args": args, "target": "llvm", "trials": 6,
           "batch_size": 6, "measure": MEASURE, "seed": 0, "tuner": "xgb", "tuner_options": {"plan_size": 6}}
    result = tune_job(job, store_uri)
    valid = [r for r in result.records if r.error_no == 0]
    rfactor = {r.record_id for r in valid if names_path(dialect, r.config)}
    assert main(["query", "--store", store_uri, "--workload-key", valid[0].workload_key, "--target", "llvm",
                 "--nbest", "6", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {row["path"] for row in shown} == paths
    assert {row["record_id"] for row in shown if row["path"] == "rfactor"} == rfactor


def names_path(dialect: str, config) -> bool:
    """Whether a config took the rfactor path, by its own steps or instructions."""
    return ('["RF",' if dialect == "auto_scheduler" else '"RFactor"') in _text(config)


def test_query_names_the_path_knob_of_an_autotvm_record(store_uri, capsys):
    from lorien.cli import main

    args = [["TENSOR", [2, 8, 16], "float32"], ["TENSOR", [2, 24, 16], "float32"], None]
    job = {"dialect": "autotvm", "task_name": "batch_matmul.x86", "args": args, "target": "llvm", "trials": 6,
           "batch_size": 6, "measure": MEASURE, "seed": 0, "tuner": "random"}
    valid = [r for r in tune_job(job, store_uri).records if r.error_no == 0]
    assert main(["query", "--store", store_uri, "--workload-key", valid[0].workload_key, "--target", "llvm",
                 "--nbest", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[5] == "path"
    knob = {r.record_id: dict((name, value) for name, _, value in json.loads(_text(r.config))["entity"])["path"]
            for r in valid}
    assert sorted(line.split()[6] for line in lines[1:]) == sorted(knob.values())


@pytest.mark.tvm
def test_tvm_applies_and_builds_the_rfactor_rule_trace_and_it_computes_the_dense():
    tvm = pytest.importorskip("tvm")
    from tvm import s_tir

    from dialects.meta_schedule.tvm_database import tvm_block_names, tvm_module_of

    dag = workload_registry.workload_dag(workload_registry.make_workload_key("dense_layer", [1, 48, 64, False, False, F32]))
    space = TraceSpace(dag, cores=2)
    (tiled,) = space.tiled
    positions = [0] * len(space.dims)
    positions[tiled.rule_knob] = RULES.index("rfactor")
    schedule = s_tir.Schedule(tvm_module_of(dag))
    s_tir.schedule.Trace.apply_json_to_schedule(tvm_block_names(space.render(positions)), schedule)
    assert "dense_rf" in schedule.mod.script()
    kernel = tvm.tirx.build(schedule.mod, target=tvm.target.Target({"kind": "llvm"}))
    rng = np.random.default_rng(6)
    data, weight = rng.uniform(-1, 1, (1, 64)).astype("float32"), rng.uniform(-1, 1, (48, 64)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((1, 48), "float32"))
    kernel(tvm.runtime.tensor(data), tvm.runtime.tensor(weight), out)
    np.testing.assert_allclose(out.numpy(), reference.dense(data, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, n, k, nr, parts", [(1, 64, 48, 32, 2), (1, 96, 37, 16, None), (2, 64, 40, 16, 3)])
def test_dense_on_a_weight_packed_beforehand_matches_numpy(m, n, k, nr, parts):
    rng = np.random.default_rng(4)
    data, weight = rng.uniform(-1, 1, (m, k)).astype("float32"), rng.uniform(-1, 1, (n, k)).astype("float32")
    s, args = dense_candidate(m, n, k, m, nr, "nm", prepacked_weight=True, parts=parts)
    assert args[1].shape == (n // nr, k, nr) and not any(st.name.endswith("weight_pack") for st in s.stages)
    kernel = build(s, args)
    out = np.zeros((m, n), "float32")
    with runtime.threads(2):
        kernel(*kernel.pack_arguments(data, weight, out))
    np.testing.assert_allclose(out, reference.dense(data, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, n, k, mr, nr, order, pack_data", [(32, 96, 40, 8, 48, "nm", False),
                                                              (16, 64, 24, 8, 32, "mn", True),
                                                              (12, 64, 17, 4, 64, "mn", True)])
def test_small_m_dense_on_a_weight_packed_beforehand_matches_numpy(m, n, k, mr, nr, order, pack_data):
    """The small-M (BERT at M = 8-32) register tile over panels packed once, as a constant
    weight is at load time: no weight packing stage in the kernel."""
    rng = np.random.default_rng(5)
    data, weight = rng.uniform(-1, 1, (m, k)).astype("float32"), rng.uniform(-1, 1, (n, k)).astype("float32")
    s, args = dense_candidate(m, n, k, mr, nr, order, False, pack_data, prepacked_weight=True)
    stages = {st.name for st in s.stages}
    assert "dense.weight_pack" not in stages and ("dense.data_pack" in stages) == pack_data
    kernel = build(s, args)
    out = np.zeros((m, n), "float32")
    with runtime.threads(2):
        kernel(*kernel.pack_arguments(data, weight, out))
    np.testing.assert_allclose(out, reference.dense(data, weight), rtol=1e-5, atol=1e-5)


def test_dense_refuses_a_pack_nr_other_than_the_packed_weights():
    data = te.placeholder((1, 32), name="data")
    with pytest.raises(WorkloadError, match="panels of 16, not pack_nr=32"):
        ops.dense(data, ops.packed_dense_weight(64, 32, 16), pack_nr=32)
    with pytest.raises(WorkloadError, match="not a multiple of nr=48"):
        ops.packed_dense_weight(64, 32, 48)


def _layer_norm_dag():
    """A layer norm's reductions as the engine reads relax's task: the row sum, the mean, the
    sum of squared deviations, and the normalized output (two reductions that are not tiled)."""
    from lorien.engine.dag import ComputeDAG

    rows, width = 8, 96
    x = te.placeholder((rows, width), F32, "x")
    k, v = te.reduce_axis(width, "k"), te.reduce_axis(width, "v")
    total = te.compute((rows,), lambda i: te.sum(x[i, k], axis=k), name="x_sum")
    mean = te.compute((rows,), lambda i: total[i] * te.const(1 / width, F32), name="x_mean")
    var = te.compute((rows,), lambda i: te.sum((x[i, v] - mean[i]) * (x[i, v] - mean[i]), axis=v), name="x_var_sum")
    out = te.compute((rows, width), lambda i, j: (x[i, j] - mean[i]) * var[i] * te.const(1 / width, F32),
                     name="norm")
    return ComputeDAG([x, out])


def test_a_layer_norm_s_reductions_get_rfactor_points_that_replay_and_match_numpy():
    """TVM's AddRFactor for reductions that are not tiled: the split reduction's outer or inner
    part factored into ``<block>_rf``, placed by a sampled compute location."""
    dag = _layer_norm_dag()
    space = TraceSpace(dag, cores=2)
    assert [r.stage for r in space.reduced] == ["x_sum", "x_var_sum"]
    assert {p.stage for p in space.placed} >= {"x_sum", "x_var_sum"}     # the blocks' own locations
    rng = np.random.default_rng(7)
    seen = set()
    for trial in range(8):
        positions = [int(rng.integers(d)) for d in space.dims]
        rule = REDUCTION_RULES[1 + trial % 2]
        for reduced in space.reduced:
            positions[reduced.rule_knob] = REDUCTION_RULES.index(rule)
            positions[reduced.location_knob] = trial // 2 % 2     # root, then the row loop
        trace = space.render(positions)
        names = [inst[0] for inst in trace[0]]
        assert names.count("RFactor") == 2 and names.count("SampleComputeLocation") >= 2
        seen.add(rule)
        replay = replay_trace(dag, json.loads(json.dumps(trace)))
        assert {"x_sum.rf", "x_var_sum.rf"} <= {s.name for s in replay.schedule.stages}
        assert check_kernel(build(replay.schedule, replay.args), dag, rtol=1e-5, atol=1e-5) < 1e-5
    assert seen == {"rfactor_outer", "rfactor_inner"}
    # the first batch of a tuner holds each rule: the rule knobs are path knobs
    assert {r.rule_knob for r in space.reduced} <= set(space.path_knobs)


def test_a_reduction_no_longer_than_the_cores_and_a_tiled_one_get_no_reduction_rfactor():
    assert not TraceSpace(_layer_norm_dag(), cores=96).reduced
    dag = workload_registry.workload_dag(workload_registry.make_workload_key("dense_layer", [1, 48, 64, False, False, F32]))
    assert not TraceSpace(dag, cores=2).reduced


@pytest.mark.tvm
@pytest.mark.parametrize("rule", ["rfactor_outer", "rfactor_inner"])
def test_tvm_applies_and_builds_a_layer_norm_s_rfactor_traces_and_they_compute_it(rule):
    tvm = pytest.importorskip("tvm")
    from tvm import s_tir

    from dialects.meta_schedule.compile import reference_inputs
    from dialects.meta_schedule.tvm_database import tvm_block_names, tvm_module_of

    dag = _layer_norm_dag()
    space = TraceSpace(dag, cores=2)
    inputs = reference_inputs(dag, 0)
    (want,) = dag.evaluate(*inputs)
    rng = np.random.default_rng(8)
    for location in (0, 1):
        positions = [int(rng.integers(d)) for d in space.dims]
        for reduced in space.reduced:
            positions[reduced.rule_knob] = REDUCTION_RULES.index(rule)
            positions[reduced.location_knob] = location
        schedule = s_tir.Schedule(tvm_module_of(dag))
        s_tir.schedule.Trace.apply_json_to_schedule(tvm_block_names(space.render(positions)), schedule)
        assert "x_sum_rf" in schedule.mod.script() and "x_var_sum_rf" in schedule.mod.script()
        kernel = tvm.tirx.build(schedule.mod, target=tvm.target.Target({"kind": "llvm"}))
        out = tvm.runtime.tensor(np.zeros(want.shape, "float32"))
        kernel(*[tvm.runtime.tensor(a) for a in inputs], out)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
