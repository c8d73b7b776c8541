"""The TVM adapter's ``module_equality``, as TVM's own databases take it: which modules share records."""

from __future__ import annotations

import numpy as np
import pytest

from dialects.meta_schedule.tvm_database import MODULE_EQUALITIES, module_equality_name
from lorien.errors import DialectError

N = 16


def test_module_equality_takes_tvm_s_names_and_the_older_ignore_ndarray():
    assert [module_equality_name(name) for name in MODULE_EQUALITIES] == list(MODULE_EQUALITIES)
    assert module_equality_name("ignore-ndarray") == "ignore-tensor"
    with pytest.raises(DialectError, match=r"module_equality must be one of .*anchor-block.*'by-name'"):
        module_equality_name("by-name")


def _tvm():
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    return tvm, ms


def _matmul_with(epilogue: str):
    """C = A @ B, then D = relu(C) or D = C + 1: one anchor block, two epilogues."""
    tvm, _ = _tvm()
    from tvm import te, tirx

    a, b = te.placeholder((N, N), "float32", name="A"), te.placeholder((N, N), "float32", name="B")
    k = te.reduce_axis((0, N), name="k")
    c = te.compute((N, N), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    if epilogue == "relu":
        d = te.compute((N, N), lambda i, j: tirx.max(c[i, j], tirx.const(0, "float32")), name="D")
    else:
        d = te.compute((N, N), lambda i, j: c[i, j] + tirx.const(1, "float32"), name="D")
    return tvm.IRModule({"main": te.create_prim_func([a, b, d])})


def _with_weights(value: float):
    """A small module carrying a tensor constant (as a module attribute) of ``value``s."""
    tvm, _ = _tvm()
    from tvm import te

    a = te.placeholder((4,), "float32", name="A")
    b = te.compute((4,), lambda i: a[i] * 2, name="B")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
    return mod.with_attr("weights", tvm.runtime.tensor(np.full(4, value, "float32")))


def _commit_split_record(database, mod, block: str, target) -> None:
    """A record of ``mod`` whose trace splits ``block``'s outer loop and parallelizes it."""
    _, ms = _tvm()
    from tvm import s_tir

    schedule = s_tir.Schedule(mod)
    outer, _ = schedule.split(schedule.get_loops(schedule.get_sblock(block))[0], [None, 4])
    schedule.parallel(outer)
    workload = database.commit_workload(mod)
    database.commit_tuning_record(ms.database.TuningRecord(
        schedule.trace, workload, [1e-5], target, ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


@pytest.mark.tvm
def test_structural_equality_keys_a_workload_by_tvm_s_structural_hash_and_answers_equal_modules_only(store_uri):
    tvm, ms = _tvm()
    from dialects.meta_schedule.tvm_database import warehouse_database
    from lorien.warehouse import open_store

    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    relu, add = _matmul_with("relu"), _matmul_with("add")
    database = warehouse_database(store_uri, module_equality="structural")
    _commit_split_record(database, relu, "C", target)
    assert database.query_tuning_record(_matmul_with("relu"), target, "main") is not None  # equal, not the same
    assert database.query_tuning_record(add, target, "main") is None
    assert not database.has_workload(_with_weights(1.0))
    database.lorien.close()
    with open_store(store_uri) as store:
        keys = set(store.scan({"dialect": "meta_schedule"}).column("workload_key").to_pylist())
    assert keys == {str(ms.database.Workload(relu).as_json()[0])}


@pytest.mark.tvm
@pytest.mark.parametrize("name", ["ignore-tensor", "ignore-ndarray"])
def test_ignore_tensor_equality_shares_records_between_modules_that_differ_in_tensor_data_only(store_uri, name):
    tvm, _ = _tvm()
    from dialects.meta_schedule.tvm_database import warehouse_database

    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    ones, fives = _with_weights(1.0), _with_weights(5.0)
    structural = warehouse_database(f"{store_uri}-structural")
    _commit_split_record(structural, ones, "B", target)
    assert structural.query_tuning_record(fives, target, "main") is None
    ignoring = warehouse_database(store_uri, module_equality=name)
    _commit_split_record(ignoring, ones, "B", target)
    assert ignoring.has_workload(fives)
    found = ignoring.query_tuning_record(fives, target, "main")
    assert found is not None and [float(s) for s in found.run_secs] == [1e-5]
    structural.lorien.close()
    ignoring.lorien.close()


@pytest.mark.tvm
def test_anchor_block_equality_schedules_another_epilogue_of_a_tuned_anchor_block_in_tvm_s_build(store_uri):
    tvm, ms = _tvm()
    from tvm import relax

    from dialects.meta_schedule.tvm_database import warehouse_database

    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    relu, add = _matmul_with("relu"), _matmul_with("add")
    model = tvm.IRModule({"matmul_relu": relu["main"].with_attr("global_symbol", "matmul_relu"),
                          "matmul_add": add["main"].with_attr("global_symbol", "matmul_add")})

    def scheduled(database) -> dict[str, object]:
        with target, database, tvm.transform.PassContext(opt_level=3):
            applied = relax.transform.MetaScheduleApplyDatabase()(model)
        return {gv.name_hint: func for gv, func in applied.functions.items()
                if "tirx.is_scheduled" in (func.attrs or {})}

    structural = warehouse_database(f"{store_uri}-structural")
    _commit_split_record(structural, relu, "C", target)
    assert "matmul_add" not in scheduled(structural)

    database = warehouse_database(store_uri, module_equality="anchor-block")
    _commit_split_record(database, relu, "C", target)
    anchor_key = str(ms.database.MemoryDatabase(module_equality="anchor-block").commit_workload(add).as_json()[0])
    assert str(database.commit_workload(add).as_json()[0]) == anchor_key
    functions = scheduled(database)
    assert set(functions) == {"matmul_relu", "matmul_add"}
    kernel = tvm.compile(tvm.IRModule({"main": functions["matmul_add"]}), target=target)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (N, N)).astype("float32"), rng.uniform(-1, 1, (N, N)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((N, N), "float32"))
    kernel(tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
    assert np.allclose(out.numpy(), x @ y + 1, atol=1e-4)  # the anchor's schedule, this module's epilogue
    structural.lorien.close()
    database.lorien.close()
