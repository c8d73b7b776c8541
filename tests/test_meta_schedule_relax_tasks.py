"""Tasks as TVM's relax pipeline makes them: Lorien's workloads hash as TVM's tasks, and a model
extracted for TVM is tuned by Lorien and built by TVM with every task's record (needs apache-tvm)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.tvm

TARGET = {"kind": "llvm", "num-cores": 2}


def convnet_onnx(path: Path) -> Path:
    """The issue's small conv net: conv+bias+relu x2 (NCHW, 3x8x8 input), flatten, two Gemms."""
    rng = np.random.default_rng(0)

    def const(name: str, *shape: int):
        return numpy_helper.from_array(rng.uniform(-0.5, 0.5, shape).astype("float32"), name)

    weights = [const("w1", 8, 3, 3, 3), const("b1", 8), const("w2", 16, 8, 3, 3), const("b2", 16),
               const("fw1", 32, 1024), const("fb1", 32), const("fw2", 10, 32), const("fb2", 10)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "fw1", "fb1"], ["g1"], transB=1),
             helper.make_node("Relu", ["g1"], ["r3"]),
             helper.make_node("Gemm", ["r3", "fw2", "fb2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def relax_tasks(onnx_path: Path) -> list:
    """TVM's own tasks of an ONNX model: relax ONNX frontend, the passes before tuning, extract_tasks."""
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(onnx.load(onnx_path), keep_params_in_input=False)
    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
              relax.transform.FuseOps(), relax.transform.FuseTIR()]
    return ms.relax_integration.extract_tasks(tvm.transform.Sequential(passes)(mod), tvm.target.Target(TARGET))


def test_a_conv_bias_relu_layer_in_lorien_dsl_has_the_structural_hash_of_tvms_relax_task(tmp_path):
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    from dialects.meta_schedule.tvm_database import tvm_module_of
    from lorien.engine import ops, te
    from lorien.engine.dag import ComputeDAG

    tasks = {task.task_name: task for task in relax_tasks(convnet_onnx(tmp_path / "convnet.onnx"))}
    theirs = ms.database.Workload(tasks["fused_conv2d1_add1_relu1"].dispatched[0]).as_json()[0]

    data = te.placeholder((1, 8, 8, 8), "float32", name="data")
    kernel = te.placeholder((16, 8, 3, 3), "float32", name="kernel")
    bias = te.placeholder((1, 16, 1, 1), "float32", name="bias")  # relax reshapes a Conv's bias to [1, K, 1, 1]
    conv = ops.conv2d_nchw(data, kernel, padding=1)
    added = te.compute(conv.shape, lambda n, f, y, x: conv[n, f, y, x] + bias[n, f, 0, 0], name="T_add")
    out = te.compute(conv.shape, lambda n, f, y, x: ops.relu(added[n, f, y, x]), name="compute")
    ours = ms.database.Workload(tvm_module_of(ComputeDAG([data, kernel, bias, out]))).as_json()[0]
    assert ours == theirs


def test_extracted_relax_tasks_tuned_by_lorien_are_all_applied_by_tvm_and_the_build_computes_the_same(
        tmp_path, capsys):
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    from tvm import relax

    from dialects.meta_schedule.relax_tasks import fused_relax_module, relax_module
    from lorien.cli import main

    model = convnet_onnx(tmp_path / "convnet.onnx")
    config, store, exported = tmp_path / "tasks" / "convnet.yaml", f"parquet:{tmp_path / 'store'}", tmp_path / "db"
    config.parent.mkdir()
    assert main(["extract", str(model), "--dialect", "meta_schedule", "-o", str(config)]) == 0
    text = config.read_text()
    assert "workload_file: database_workload.json" in text and text.count("workload_key:") == 5
    assert main(["tune", str(config), "--store", store, "--trials", "2", "--tuner", "random", "--no-progress"]) == 0
    assert main(["export", "--format", "meta_schedule", "--target", "llvm", "--alternate-key", "-o", str(exported),
                 "--store", store]) == 0
    capsys.readouterr()

    target = tvm.target.Target(TARGET)
    mod = fused_relax_module(str(model))
    tasks = ms.relax_integration.extract_tasks(mod, target)
    database = ms.database.JSONDatabase(work_dir=str(exported), allow_missing=False)
    found = [task.task_name for task in tasks if database.query_tuning_record(task.dispatched[0], target, task.task_name)]
    assert len(found) == len(tasks) == 5
    with target, database, tvm.transform.PassContext(opt_level=3):
        applied = relax.transform.MetaScheduleApplyDatabase()(mod)
    scheduled = [gv.name_hint for gv, func in applied.functions.items()
                 if isinstance(func, tvm.tirx.PrimFunc) and "tirx.is_scheduled" in (func.attrs or {})]
    assert len(scheduled) == 5

    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 8, 8)).astype("float32")

    def run(executable) -> np.ndarray:
        return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()

    raw = relax_module(str(model))  # compile_relax fuses it as extract_tasks' module was fused
    untuned = run(relax.build(raw, target=target))
    tuned = run(ms.relax_integration.compile_relax(database, raw, target, params=None))
    np.testing.assert_allclose(tuned, untuned, rtol=1e-4, atol=1e-5)


def test_relax_tasks_tuned_on_the_engine_and_remeasured_by_tvm_export_tvm_latencies_and_build(tmp_path, capsys):
    """remeasure_with_tvm on TVM's own task modules: every task gets TVM-measured records, the
    export writes those (no engine latency), and compile_relax builds the model from it."""
    import json

    import yaml

    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    from tvm import relax

    from dialects.meta_schedule.relax_tasks import fused_relax_module, relax_module
    from lorien.cli import main
    from lorien.record import MEASURED_BY_TVM, TuningRecord
    from lorien.warehouse import open_store

    model = convnet_onnx(tmp_path / "convnet.onnx")
    config, store, exported = tmp_path / "tasks" / "convnet.yaml", f"parquet:{tmp_path / 'store'}", tmp_path / "db"
    assert main(["extract", str(model), "--dialect", "meta_schedule", "-o", str(config)]) == 0
    spec = yaml.safe_load(config.read_text())
    spec.update({"remeasure_with_tvm": 1, "measure": {"number": 2, "repeat": 2}})
    config.write_text(yaml.safe_dump(spec))
    cpus = os.sched_getaffinity(0)
    assert main(["tune", str(config), "--store", store, "--trials", "2", "--tuner", "random", "--no-progress"]) == 0
    assert os.sched_getaffinity(0) == cpus  # TVM's pool pinned this thread while it timed; given back
    with open_store(store) as opened:
        records = [TuningRecord.from_row(row) for row in opened.scan({}).to_pylist()]
    timed = {record.workload_key for record in records if record.measured_by == MEASURED_BY_TVM}
    assert len(timed) == 5 == len({record.workload_key for record in records})
    capsys.readouterr()
    assert main(["export", "--format", "meta_schedule", "--target", "llvm", "--alternate-key", "-o", str(exported),
                 "--store", store, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == 5 and summary["engine_measured_records"] == 0

    target = tvm.target.Target(TARGET)
    mod = fused_relax_module(str(model))
    database = ms.database.JSONDatabase(work_dir=str(exported), allow_missing=False)
    assert all(database.query_tuning_record(task.dispatched[0], target, task.task_name)
               for task in ms.relax_integration.extract_tasks(mod, target))
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 8, 8)).astype("float32")

    def run(executable) -> np.ndarray:
        return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()

    raw = relax_module(str(model))
    np.testing.assert_allclose(run(ms.relax_integration.compile_relax(database, raw, target, params=None)),
                               run(relax.build(raw, target=target)), rtol=1e-4, atol=1e-5)


def test_compile_relax_fuses_the_module_it_is_given_so_it_takes_the_unfused_one(tmp_path):
    """compile_relax runs LegalizeOps ... FuseTIR itself: on relax_module its functions are those
    the tasks were extracted from (same hashes); on the already fused module it fuses again and
    the convolutions' and dense layers' do not match."""
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    from tvm import relax

    from dialects.meta_schedule.relax_tasks import fused_relax_module, relax_module

    model = str(convnet_onnx(tmp_path / "convnet.onnx"))
    fuse = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                     relax.transform.FoldConstant(), relax.transform.FuseOps(),
                                     relax.transform.FuseTIR()])

    def hashes(mod) -> set[str]:
        return {ms.database.Workload(tvm.IRModule({"main": func})).as_json()[0]
                for func in mod.functions.values() if isinstance(func, tvm.tirx.PrimFunc)}

    once = hashes(fused_relax_module(model))  # the functions extract_tasks makes the tasks of
    assert len(once) == 5
    assert hashes(fuse(relax_module(model))) == once
    assert len(hashes(fuse(fused_relax_module(model))) & once) <= 1  # the convs and dense differ; a reshape may not


def test_extract_for_meta_schedule_names_a_model_that_is_not_onnx(tmp_path, capsys):
    pytest.importorskip("tvm")
    from lorien.cli import main

    assert main(["extract", "torchvision.models:resnet18", "--dialect", "meta_schedule",
                 "-o", str(tmp_path / "t.yaml")]) == 1
    assert "reads ONNX files only" in capsys.readouterr().err
    assert not (tmp_path / "t.yaml").exists()
