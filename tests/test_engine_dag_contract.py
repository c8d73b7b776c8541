"""The NumPy reference of a DAG contracts a sum of a product of two loads (matmuls, convolutions)
in one ``np.einsum`` (``lorien.engine.dag._contract_product``), with the generic evaluation's values."""

import numpy as np
import pytest

import lorien.builtin_workloads  # noqa: F401 - registers the layer workloads
from lorien import workload_registry
from lorien.engine import dag as dag_module
from lorien.engine import te
from lorien.engine.dag import ComputeDAG

LAYERS = {
    "conv2d_nchw": ("conv2d_nchw_layer", [1, 6, 9, 9, 8, 3, 3, [2, 2], [1, 1], [1, 1], True, True, "float32"]),
    "conv2d_nhwc": ("conv2d_nhwc_layer", [1, 4, 7, 7, 5, 3, 3, [1, 1], [1, 1], [1, 1], False, False, "float32"]),
    "depthwise": ("depthwise_conv2d_nchw_layer", [1, 6, 8, 8, 1, 3, 3, [1, 1], [1, 1], [1, 1], True, True,
                                                  "float32"]),
    "dense": ("dense_layer", [4, 12, 20, True, True, "float32"]),
    "batch_matmul": ("batch_matmul_layer", [2, 5, 7, 9, False, False, "float32"]),
}


def _inputs(dag: ComputeDAG) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.uniform(-1, 1, t.shape).astype(t.dtype) for t in dag.io_tensors if t not in dag.outputs]


def _generic(dag: ComputeDAG, inputs: list[np.ndarray], monkeypatch) -> list[np.ndarray]:
    with monkeypatch.context() as patch:
        patch.setattr(dag_module, "_contract_product", lambda *args: None)
        return dag.evaluate(*inputs)


def _reductions(dag: ComputeDAG) -> list[te.Tensor]:
    return [t for t in dag.ops if isinstance(t.op, te.ComputeOp) and isinstance(t.op.body, te.Reduce)]


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_reductions_are_contracted_with_the_generic_values(layer, monkeypatch):
    name, args = LAYERS[layer]
    dag = workload_registry.workload_dag(workload_registry.make_workload_key(name, args))
    inputs = _inputs(dag)
    contracted = []
    original = dag_module._contract_product

    def spy(tensor, values, budget):
        result = original(tensor, values, budget)
        contracted.append(result is not None)
        return result

    monkeypatch.setattr(dag_module, "_contract_product", spy)
    fast = dag.evaluate(*inputs)
    assert contracted and all(contracted), f"{layer}: a reduction took the generic path"
    for got, want in zip(fast, _generic(dag, inputs, monkeypatch), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_other_reductions_keep_the_generic_evaluation():
    x = te.placeholder((3, 10), name="x")
    k = te.reduce_axis(10, "k")
    row_max = te.compute((3,), lambda i: te.max(x[i, k], axis=[k]), name="row_max")
    k2 = te.reduce_axis(10, "k2")
    sum_of_squares_plus = te.compute((3,), lambda i: te.sum(x[i, k2] * x[i, k2] + 1.0, axis=[k2]), name="sq")
    dag = ComputeDAG([x, row_max, sum_of_squares_plus])
    values = {"x": _inputs(dag)[0]}
    assert all(dag_module._contract_product(t, values, 1 << 22) is None for t in _reductions(dag))
    data = values["x"]
    got_max, got_sq = dag.evaluate(data)
    np.testing.assert_allclose(got_max, data.max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(got_sq, (data * data + 1.0).sum(axis=1), rtol=1e-5)


def test_an_operand_larger_than_the_budget_is_left_to_the_chunked_evaluation(monkeypatch):
    name, args = LAYERS["conv2d_nchw"]
    dag = workload_registry.workload_dag(workload_registry.make_workload_key(name, args))
    inputs = _inputs(dag)
    (conv,) = _reductions(dag)
    values = {t.name: a for t, a in zip([t for t in dag.io_tensors if t not in dag.outputs], inputs, strict=True)}
    for tensor in dag.ops[:dag.ops.index(conv)]:  # the padded input the convolution reads
        if isinstance(tensor.op, te.ComputeOp):
            values[tensor.name] = dag_module._evaluate_op(tensor, values, 1 << 22)
    assert dag_module._contract_product(conv, values, 1 << 22) is not None
    assert dag_module._contract_product(conv, values, 16) is None
    (chunked,) = dag.evaluate(*inputs, budget=16)
    np.testing.assert_allclose(chunked, _generic(dag, inputs, monkeypatch)[0], rtol=1e-5, atol=1e-5)
