"""Real TVM MetaSchedule tunes into a Lorien store and compiles from it (needs apache-tvm)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lorien.cli import main

pytestmark = pytest.mark.tvm


def test_tvm_tunes_a_matmul_into_a_parquet_store_and_compiles_from_it(tmp_path, store_uri, capsys):
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    from tvm import te

    from dialects.meta_schedule.tvm_database import warehouse_database
    from dialects.meta_schedule.tvm_measure import forked_builder

    n = 32
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    database = warehouse_database(store_uri)
    # Built in this process: TVM's LocalBuilder starts a worker per batch that spends 45-80 s importing
    # tensor intrinsics, and under load it ran past its timeout and left no valid record (a flaky failure).
    ms.tune_tir(mod, target, str(tmp_path / "work"), max_trials_global=2, num_trials_per_iter=2, database=database,
                builder=forked_builder(), runner=ms.runner.LocalRunner(timeout_sec=120), num_tuning_cores=1)
    assert len(database) == 2
    committed = database.get_all_tuning_records()
    valid = [record for record in committed if record.run_secs and all(float(s) < 1e9 for s in record.run_secs)]
    assert valid, f"TVM measured none of its candidates: {[record.run_secs for record in committed]}"

    shash = ms.database.Workload(mod).as_json()[0]
    capsys.readouterr()  # TVM's tuning report
    assert main(["query", "--workload-key", shash, "--target", "llvm", "--nbest", "2", "--format", "json",
                 "--store", store_uri]) == 0
    answers = json.loads(capsys.readouterr().out)
    assert len(answers) == len(valid) and all("SamplePerfectTile" in answer["config"] for answer in answers)

    schedule = ms.tir_integration.compile_tir(database, mod, target)
    kernel = tvm.compile(schedule.mod, target=target)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (n, n)).astype("float32"), rng.uniform(-1, 1, (n, n)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((n, n), "float32"))
    kernel(tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
    assert np.allclose(out.numpy(), x @ y, atol=1e-4)


def test_records_tuned_here_become_a_json_database_tvm_loads_and_compiles(tmp_path, store_uri):
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")

    from dialects.meta_schedule.compile import workload_dag
    from dialects.meta_schedule.tvm_database import tvm_module_of, write_tvm_database
    from lorien.formats.meta_schedule import pair_paths
    from lorien.tune.loop import tune_job

    measure = {"number": 1, "repeat": 1, "min_repeat_ms": 0}
    records = []
    for task_name, args in (("dense_layer", [8, 16, 16, True, True, "float32"]),
                            ("conv2d_nhwc_layer", [1, 4, 6, 6, 8, 3, 3, [1, 1], [1, 1], [1, 1], False, False,
                                                   "float32"])):
        job = {"dialect": "meta_schedule", "task_name": task_name, "args": args, "target": "llvm", "trials": 6, "batch_size": 6,
               "measure": measure, "tuner": "random"}
        records += tune_job(job, store_uri).records
    assert write_tvm_database(records, tmp_path / "db") == 12
    workload_file, record_file = pair_paths(tmp_path / "db")
    database = ms.database.JSONDatabase(path_workload=str(workload_file), path_tuning_record=str(record_file),
                                        allow_missing=False)
    assert len(database) == 12
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    for record in (records[0], records[6]):
        dag = workload_dag(record)
        mod = tvm_module_of(dag)
        schedule = ms.tir_integration.compile_tir(database, mod, target)
        kernel = tvm.compile(schedule.mod, target=target)
        rng = np.random.default_rng(0)
        inputs = [rng.uniform(-1, 1, t.shape).astype(t.dtype) for t in dag.io_tensors if t not in dag.outputs]
        expected = dag.evaluate(*inputs)[0]
        arrays = [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.tensor(np.zeros_like(expected))]
        kernel(*arrays)
        assert np.allclose(arrays[-1].numpy(), expected, atol=1e-4)


def test_lorien_export_gives_a_json_database_tvm_loads_and_compiles_for_workloads_tuned_here(
        tmp_path, store_uri, shared_data):
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    import orjson

    from dialects.meta_schedule.tuning import tune_dag
    from dialects.meta_schedule.tvm_database import tvm_module_of
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    a, b = te.placeholder((16, 8), "float32", "A"), te.placeholder((8, 24), "float32", "B")
    k = te.reduce_axis(8, "k")
    c = te.compute((16, 24), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    dag = ComputeDAG([a, b, c])
    progress = tune_dag(dag, {"trials": 4, "batch_size": 4, "measure": {"number": 1, "repeat": 3}, "seed": 0},
                        store_uri)
    theirs = shared_data / "meta_schedule" / "matmul_128"
    assert main(["ingest", str(theirs), "--store", store_uri]) == 0
    out = tmp_path / "db"
    assert main(["export", "--all", "--target", "llvm", "--format", "meta_schedule", "--store", store_uri,
                 "-o", str(out)]) == 0

    database = ms.database.JSONDatabase(work_dir=str(out))
    assert len(database) == 4 + 32
    their_entry = orjson.loads((theirs / "database_workload.json").read_text().splitlines()[0])
    assert orjson.loads((out / "database_workload.json").read_text().splitlines()[0]) == their_entry  # unchanged
    mod = tvm_module_of(dag)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    best = database.query_tuning_record(mod, target, "main")
    assert np.isclose(np.mean([float(s) for s in best.run_secs]), progress.best_cost_s, rtol=1e-6)
    kernel = tvm.compile(ms.tir_integration.compile_tir(database, mod, target).mod, target=target)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (16, 8)).astype("float32"), rng.uniform(-1, 1, (8, 24)).astype("float32")
    result = tvm.runtime.tensor(np.zeros((16, 24), "float32"))
    kernel(tvm.runtime.tensor(x), tvm.runtime.tensor(y), result)
    assert np.allclose(result.numpy(), x @ y, atol=1e-4)


def test_a_computation_with_float_division_becomes_a_tvm_module_that_runs_right():
    """A mean (a sum divided by a float constant) and a division of two loaded values: TVM 0.27
    types a loaded value as a ``PrimType`` and a constant by ``ty``; both must give a true
    division, not an integer floordiv or an error."""
    tvm = pytest.importorskip("tvm")

    from dialects.meta_schedule.tvm_database import tvm_module_of
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    a, b = te.placeholder((4, 8), "float32", "A"), te.placeholder((4, 8), "float32", "B")
    k = te.reduce_axis(8, "k")
    total = te.compute((4,), lambda i: te.sum(a[i, k], axis=k), name="total")
    out = te.compute((4, 8), lambda i, j: a[i, j] / b[i, j] + total[i] / 8.0, name="out")
    mod = tvm_module_of(ComputeDAG([a, b, out]))
    assert "T.Div" in mod.script() or " / " in mod.script()
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    kernel = tvm.compile(mod, target=target)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (4, 8)).astype("float32"), rng.uniform(1, 2, (4, 8)).astype("float32")
    result = tvm.runtime.tensor(np.zeros((4, 8), "float32"))
    kernel(tvm.runtime.tensor(x), tvm.runtime.tensor(y), result)
    np.testing.assert_allclose(result.numpy(), x / y + x.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
