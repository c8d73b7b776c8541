"""The workload registry (lorien.workload_registry) and the built-in workloads: keys, tensors,
Ansor's stage order, FLOPs, hashed DAGs, shorthands; and the auto_scheduler's TVM-named re-export."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from lorien import builtin_workloads, workload_registry
from lorien.dialect import get_dialect
from lorien.engine import ops, reference, te
from lorien.engine.dag import ComputeDAG
from lorien.errors import DialectError, WorkloadError
from lorien.formats import read_log

MATMUL_KEY = '["matmul_add", 1024, 1024, 1024, "float32"]'
CONV_KEY = '["conv2d_layer", 1, 7, 7, 512, 512, 3, 3, [1, 1], [1, 1]]'


def test_registered_function_gives_the_workload_key_tvm_writes():
    assert workload_registry.make_workload_key(builtin_workloads.matmul_add, (1024, 1024, 1024, "float32")) == MATMUL_KEY
    assert workload_registry.make_workload_key("conv2d_layer", [1, 7, 7, 512, 512, 3, 3, (1, 1), (1, 1)]) == CONV_KEY


def test_workload_key_gives_back_the_input_and_output_tensors_in_order():
    tensors = workload_registry.workload_key_to_tensors(MATMUL_KEY)
    assert [t.name for t in tensors] == ["A", "B", "C", "out"]
    assert [t.shape for t in tensors] == [(1024, 1024)] * 4


@pytest.mark.parametrize(("key", "stages"), [
    (MATMUL_KEY, ["A", "B", "matmul", "C", "out"]),
    (CONV_KEY, ["data", "conv2d.pad", "kernel", "conv2d", "bias", "T_add", "T_relu"]),
])
def test_stages_are_numbered_in_ansors_topological_order(key, stages):
    # TVM's logs name these stages by these numbers (matmul is stage 2, T_relu stage 6).
    assert workload_registry.workload_dag(key).stage_names == stages


def test_flops_are_counted_from_the_dag_with_epilogues():
    assert workload_registry.workload_dag(MATMUL_KEY).flop() == 2.0 * 1024**3 + 1024**2
    conv = workload_registry.workload_dag(CONV_KEY)
    assert conv.flop() == 2.0 * 512 * 7 * 7 * 512 * 9 + 2.0 * 512 * 7 * 7  # conv, then bias add and relu
    assert conv.layout() == "NCHW"


def test_an_unregistered_function_name_is_an_error_naming_it():
    with pytest.raises(workload_registry.UnregisteredWorkloadError, match="'no_such_workload' is not registered"):
        workload_registry.workload_key_to_tensors('["no_such_workload", 1]')


def test_a_dag_hash_nobody_registered_is_reported_with_its_hash_never_guessed():
    key = '["d7b65649a4dd54becea0a52aabbc5af5", 1, 1000, 1, 1000]'
    with pytest.raises(workload_registry.UnregisteredWorkloadError,
                       match="d7b65649a4dd54becea0a52aabbc5af5.*register_workload_tensors"):
        workload_registry.workload_key_to_tensors(key)


def _softmax_tensors(n: int = 6):
    x = te.placeholder((2, n), name="x")
    k = te.reduce_axis(n, name="k")
    peak = te.compute((2,), lambda i: te.max(x[i, k], axis=k), name="peak")
    exp = te.compute((2, n), lambda i, j: te.exp(x[i, j] - peak[i]), name="exp")
    k2 = te.reduce_axis(n, name="k2")
    total = te.compute((2,), lambda i: te.sum(exp[i, k2], axis=k2), name="total")
    out = te.compute((2, n), lambda i, j: exp[i, j] / total[i], name="out")
    return [x, out]


def test_hashed_key_is_lorien_dag_hash_and_io_shapes_and_registers_tensors(monkeypatch):
    monkeypatch.setattr(workload_registry, "WORKLOAD_FUNC_REGISTRY", dict(workload_registry.WORKLOAD_FUNC_REGISTRY))
    dag = ComputeDAG(_softmax_tensors())
    key = dag.workload_key()
    name, args = workload_registry.parse_workload_key(key)
    assert workload_registry.is_hashed(name) and args == [2, 6, 2, 6]
    assert ComputeDAG(_softmax_tensors()).workload_key() == key  # structural: fresh tensors, same hash
    assert ComputeDAG(_softmax_tensors(7)).workload_key() != key
    workload_registry.register_workload_tensors(key, dag.io_tensors)
    assert [t.name for t in workload_registry.workload_key_to_tensors(key)] == ["x", "out"]


def test_dag_json_round_trips_to_the_same_hash_and_computes_the_same():
    dag = ComputeDAG(_softmax_tensors())
    again = ComputeDAG.from_json(json.loads(json.dumps(dag.to_json())))
    assert again.hash_key() == dag.hash_key() and again.stage_names == dag.stage_names
    x = np.random.default_rng(0).standard_normal((2, 6)).astype("float32")
    (out,) = again.evaluate(x)
    expected = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, expected / expected.sum(axis=1, keepdims=True), rtol=1e-5)


def test_generic_numpy_evaluation_matches_the_operator_reference():
    key = workload_registry.make_workload_key("conv2d_nhwc_layer", [1, 6, 9, 9, 4, 3, 3, [2, 2], [1, 1], [1, 1], True, True,
                                                           "float32"])
    rng = np.random.default_rng(1)
    data, kernel, bias = (rng.standard_normal(t.shape).astype("float32")
                          for t in workload_registry.workload_key_to_tensors(key)[:3])
    (generic,) = workload_registry.workload_dag(key).evaluate(data, kernel, bias, budget=64)  # chunked reductions
    expected = workload_registry.reference_of(key)(data, kernel, bias)
    np.testing.assert_allclose(generic, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(expected, reference.conv2d_nhwc(data, kernel, 2, 1, bias=bias, relu=True), rtol=1e-6)


def test_registry_saves_and_loads_functions_and_hashed_dags(tmp_path, monkeypatch):
    monkeypatch.setattr(workload_registry, "WORKLOAD_FUNC_REGISTRY", dict(workload_registry.WORKLOAD_FUNC_REGISTRY))
    monkeypatch.setattr(workload_registry, "REFERENCES", dict(workload_registry.REFERENCES))
    hashed = workload_registry.register_workload_tensors(ComputeDAG(_softmax_tensors()).workload_key(), _softmax_tensors())
    path = tmp_path / "workload_registry.json"
    written = workload_registry.save_workload_func_registry(path)
    workload_registry.WORKLOAD_FUNC_REGISTRY.clear()
    workload_registry.REFERENCES.clear()
    assert workload_registry.load_workload_func_registry(path) == written
    assert workload_registry.WORKLOAD_FUNC_REGISTRY["matmul_add"] is builtin_workloads.matmul_add
    assert workload_registry.reference_of(CONV_KEY) is not None
    assert workload_registry.workload_dag(hashed).hash_key() == workload_registry.parse_workload_key(hashed)[0]


def test_entries_serialize_as_plain_data_for_other_processes(monkeypatch):
    name, entry = workload_registry.serialize_workload_registry_entry(MATMUL_KEY)
    assert (name, entry["function"]) == ("matmul_add", "lorien.builtin_workloads:matmul_add")
    monkeypatch.setattr(workload_registry, "WORKLOAD_FUNC_REGISTRY", {})
    workload_registry.deserialize_workload_registry_entry(json.loads(json.dumps([name, entry])))
    assert workload_registry.workload_key_to_tensors(MATMUL_KEY)[-1].name == "out"


def test_the_auto_scheduler_keeps_tvms_registry_names_as_the_core_registry():
    from dialects.auto_scheduler import registry

    for name in registry.__all__:
        assert getattr(registry, name) is getattr(workload_registry, name), name
    assert registry.make_workload_key(builtin_workloads.matmul_add, (1024, 1024, 1024, "float32")) == MATMUL_KEY


def test_a_lambda_workload_cannot_be_serialized(monkeypatch):
    monkeypatch.setattr(workload_registry, "WORKLOAD_FUNC_REGISTRY", dict(workload_registry.WORKLOAD_FUNC_REGISTRY))
    workload_registry.register_workload("lambda_workload", lambda n: [te.placeholder((n,), name="a")])
    with pytest.raises(WorkloadError, match="cannot be serialized"):
        workload_registry.serialize_workload_registry_entry('["lambda_workload", 4]')


def test_registering_another_function_under_a_taken_name_needs_override(monkeypatch):
    monkeypatch.setattr(workload_registry, "WORKLOAD_FUNC_REGISTRY", dict(workload_registry.WORKLOAD_FUNC_REGISTRY))

    def matmul_add(n):
        return [ops.matmul(te.placeholder((n, n), name="a"), te.placeholder((n, n), name="b"))]

    with pytest.raises(WorkloadError, match="already registered"):
        workload_registry.register_workload(matmul_add)
    workload_registry.register_workload(matmul_add, override=True)
    assert workload_registry.WORKLOAD_FUNC_REGISTRY["matmul_add"] is matmul_add


def test_ingested_logs_know_flops_of_registered_workloads_and_warn_only_for_unregistered(shared_data, caplog,
                                                                                       monkeypatch):
    import lorien.formats.ansor
    import lorien.workload

    monkeypatch.setattr(lorien.workload, "_warned_task_names", set())
    monkeypatch.setattr(lorien.formats.ansor, "_workload_cache", {})
    with caplog.at_level(logging.WARNING, logger="lorien.workload"):
        matmul = read_log(shared_data / "ansor" / "matmul.json").records[0]
        conv = read_log(shared_data / "ansor" / "conv2d.json").records[0]
        resnet = read_log(shared_data / "ansor" / "resnet-50-NHWC-B1-llvm.json").records
    assert matmul.flop == 2.0 * 1024**3 + 1024**2 and conv.flop == 2.0 * 512 * 49 * 512 * 9 + 2.0 * 512 * 49
    assert conv.layout == "NCHW" and all(r.flop is None for r in resnet)
    warned = [r.getMessage() for r in caplog.records if "flop unknown" in r.getMessage()]
    assert not any("matmul_add" in m or "conv2d_layer" in m for m in warned)
    assert any("d7b65649a4dd54becea0a52aabbc5af5" in m for m in warned)


def test_dialect_expands_shorthands_to_registered_workloads():
    dialect = get_dialect("auto_scheduler")
    name, args = dialect.expand_workload("conv2d", {"C": 64, "H": 56, "W": 56, "K": 64, "padding": 1,
                                                    "bias": True, "relu": True})
    key = dialect.workload_key(name, args)
    assert key == '["conv2d_nhwc_layer", 1, 64, 56, 56, 64, 3, 3, [1, 1], [1, 1], [1, 1], true, true, "float32"]'
    layout, flop = dialect.describe_workload(key)
    assert layout == "NHWC" and flop == 2.0 * 56 * 56 * 64 * 64 * 9 + 2.0 * 56 * 56 * 64
    for op, params, layout in [("dense", {"M": 1, "N": 10, "K": 8}, "NA"),
                               ("batch_matmul", {"B": 2, "M": 4, "N": 4, "K": 4}, "NA"),
                               ("conv2d", {"C": 4, "H": 8, "W": 8, "K": 4, "layout": "NCHW"}, "NCHW"),
                               ("depthwise_conv2d", {"C": 4, "H": 8, "W": 8, "padding": 1}, "NCHW")]:
        name, args = dialect.expand_workload(op, params)
        assert dialect.describe_workload(dialect.workload_key(name, args))[0] == layout


@pytest.mark.parametrize(("op", "params", "message"), [
    ("conv2d", {"C": 4, "H": 8, "W": 8, "K": 4, "layout": "NCHWc"}, "have layouts"),
    ("dense", {"M": 1, "N": 10, "K": 8, "relu": "yes"}, "relu must be true or false"),
    ("dense", {"M": 1, "N": 10}, "missing"),
    ("softmax", {}, "unknown op shorthand 'softmax'"),
])
def test_bad_shorthands_are_errors_naming_the_value(op, params, message):
    with pytest.raises(DialectError, match=message):
        get_dialect("auto_scheduler").expand_workload(op, params)


def test_conv2d_shorthand_takes_four_paddings_and_refuses_groups():
    dialect = get_dialect("auto_scheduler")
    name, args = dialect.expand_workload("conv2d", {"C": 4, "H": 7, "W": 7, "K": 8, "padding": [1, 0, 2, 1]})
    assert args[8] == [1, 0, 2, 1]
    assert workload_registry.workload_key_to_tensors(dialect.workload_key(name, args))[-1].shape == (1, 8, 6, 8)
    with pytest.raises(DialectError, match="groups=2: no grouped convolution"):
        dialect.expand_workload("conv2d", {"C": 4, "H": 7, "W": 7, "K": 8, "groups": 2})
