"""Tasks found in models, tuned by the template-free dialects (auto_scheduler, meta_schedule):
the model's NCHW convolution with its bias/relu epilogue as given, or an error naming the op,
layout and epilogue they cannot compute; never NHWC or the anchor op alone in silence. No TVM."""

from __future__ import annotations

import numpy as np
import pytest

from lorien.errors import ConfigError
from lorien.tune.config import parse_tune_config

CONV = {"C": 8, "H": 8, "W": 8, "K": 16, "kernel": 3, "padding": 1}


def _job(dialect: str, entry: dict) -> dict:
    return parse_tune_config({"dialect": dialect, "workloads": [entry]}, "t.yaml").jobs[0]


def _computes_conv_bias_relu(dag) -> None:
    """The DAG computes an NCHW 3x3 conv (padding 1) + per-channel bias + relu, as NumPy does."""
    data, kernel, bias = (t.shape for t in dag.io_tensors[:3])
    rng = np.random.default_rng(0)
    x, w, b = (rng.uniform(-1, 1, shape).astype("float32") for shape in (data, kernel, bias))
    (out,) = dag.evaluate(x, w, b)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # n c y x kh kw
    want = np.maximum(np.einsum("ncyxij,kcij->nkyx", windows, w) + b[None, :, None, None], 0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def _dag(job: dict):
    from lorien import workload_registry

    return workload_registry.workload_dag(workload_registry.make_workload_key(job["task_name"], job["args"]))


@pytest.mark.parametrize("dialect", ["auto_scheduler", "meta_schedule"])
def test_a_model_s_conv_with_bias_relu_is_tuned_nchw_with_its_epilogue(dialect):
    job = _job(dialect, {"conv2d": CONV, "models": ["net"], "epilogue": {"bias+relu": 3}})
    assert job["task_name"] == "conv2d_nchw_layer"
    dag = _dag(job)
    assert dag.layout() == "NCHW"
    data, kernel, bias = (t.shape for t in dag.io_tensors[:3])
    assert data == (1, 8, 8, 8) and kernel == (16, 8, 3, 3) and bias == (16,)  # NCHW data, OIHW kernel, a bias
    _computes_conv_bias_relu(dag)

    dense = _job(dialect, {"dense": {"M": 4, "N": 8, "K": 16}, "models": ["net"], "epilogue": {"bias": 1}})
    assert dense["args"][3:5] == [True, False]  # bias, no relu
    plain = _job(dialect, {"conv2d": CONV, "models": ["net"]})  # no epilogue in the model: the conv alone, NCHW
    assert plain["task_name"] == "conv2d_nchw_layer" and plain["args"][-3:-1] == [False, False]


@pytest.mark.parametrize("dialect", ["auto_scheduler", "meta_schedule"])
@pytest.mark.parametrize(("op", "params", "epilogue", "message"), [
    ("conv2d", CONV, {"bias+add+relu": 2},
     r"conv2d \{C=8, H=8, W=8, K=16, kernel=3, padding=1\} \(layout NCHW\): epilogue 'bias\+add\+relu': the {d} "
     r"dialect's built-in conv2d workloads fuse bias and relu only, not add"),
    ("depthwise_conv2d", {"C": 8, "H": 8, "W": 8}, {"bias+relu6": 1},
     r"depthwise_conv2d \{C=8, H=8, W=8\} \(layout NCHW\): epilogue 'bias\+relu6'.*not relu6"),
    ("conv2d", CONV, {"bias+relu": 2, "bias": 1},
     r"conv2d .* \(layout NCHW\): the models have 2 different epilogues after it \(bias\+relu x2, bias x1\); the {d} dialect"),
])
def test_an_epilogue_a_dialect_cannot_fuse_is_an_error_naming_op_layout_and_epilogue(dialect, op, params, epilogue,
                                                                                      message):
    with pytest.raises(ConfigError, match=r"t\.yaml: workloads\[0\]: " + message.replace("{d}", dialect)):
        _job(dialect, {op: params, "models": ["net"], "epilogue": epilogue})


@pytest.mark.parametrize("dialect", ["auto_scheduler", "meta_schedule"])
def test_what_the_entry_says_is_taken_as_given(dialect):
    job = _job(dialect, {"conv2d": {**CONV, "layout": "NHWC", "bias": True, "relu": False}, "models": ["net"],
                         "epilogue": {"bias+add+relu": 2, "bias": 1}})
    assert job["task_name"] == "conv2d_nhwc_layer" and job["args"][-3:-1] == [True, False]
    shorthand = _job(dialect, {"conv2d": CONV})  # not from a model: the shorthand's defaults (NHWC, no epilogue)
    assert shorthand["task_name"] == "conv2d_nhwc_layer"


def test_autotvm_tunes_the_anchor_op_of_a_model_task_whatever_its_epilogue():
    job = _job("autotvm", {"conv2d": CONV, "models": ["net"], "epilogue": {"bias+add+relu": 2, "bias": 1}})
    assert job["task_name"] == "conv2d_NCHWc.x86"


def test_extract_then_tune_meta_schedule_tunes_the_onnx_conv_nchw_with_bias_relu(tmp_path, capsys):
    """A user's steps without TVM: lorien extract (op shorthands), dialect meta_schedule, lorien tune."""
    import onnx
    import yaml
    from onnx import TensorProto, helper, numpy_helper

    from lorien.cli import main
    from lorien.record import TuningRecord
    from lorien.warehouse import open_store

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.uniform(-1, 1, (16, 8, 3, 3)).astype("float32"), "w"),
               numpy_helper.from_array(rng.uniform(-1, 1, (16,)).astype("float32"), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], weights)
    model = tmp_path / "convnet.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    config = tmp_path / "tasks" / "convnet.yaml"
    assert main(["extract", str(model), "-o", str(config)]) == 0
    spec = yaml.safe_load(config.read_text())
    assert spec["workloads"][0]["epilogue"] == {"bias+relu": 1}
    spec["dialect"] = "meta_schedule"
    config.write_text(yaml.safe_dump(spec))
    store = f"parquet:{tmp_path / 'store'}"
    assert main(["tune", str(config), "--store", store, "--trials", "2", "--tuner", "random", "--no-progress"]) == 0
    capsys.readouterr()
    with open_store(store) as opened:
        records = [TuningRecord.from_row(row) for row in opened.scan({}).to_pylist()]
    assert records and all(record.layout == "NCHW" for record in records)
    from dialects.meta_schedule.compile import workload_dag

    dag = workload_dag(records[0])
    assert [t.shape for t in dag.io_tensors] == [(1, 8, 8, 8), (16, 8, 3, 3), (16,), (1, 16, 8, 8)]
    _computes_conv_bias_relu(dag)


def _resnet_block_onnx(path, residual: bool) -> str:
    """conv+bias+relu, then conv+bias (+ the block's input, when ``residual``) + relu; NCHW."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.uniform(-1, 1, shape).astype("float32"), name)
               for name, shape in (("w1", (8, 8, 3, 3)), ("b1", (8,)), ("w2", (8, 8, 3, 3)), ("b2", (8,)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2")]
    nodes += [helper.make_node("Add", ["c2", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])] if residual \
        else [helper.make_node("Relu", ["c2"], ["y"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_extract_for_auto_scheduler_writes_nchw_tasks_with_their_epilogue_or_names_what_it_cannot(tmp_path, capsys):
    from lorien.cli import main
    from lorien.tune.config import load_tune_config

    plain = _resnet_block_onnx(tmp_path / "plain.onnx", residual=False)
    out = tmp_path / "tasks" / "plain.yaml"
    assert main(["extract", plain, "--dialect", "auto_scheduler", "-o", str(out)]) == 0
    jobs = load_tune_config(out).jobs
    assert [job["dialect"] for job in jobs] == ["auto_scheduler"]  # both convs are one task: same shape, same epilogue
    assert jobs[0]["task_name"] == "conv2d_nchw_layer" and jobs[0]["args"][-3:-1] == [True, True]
    _computes_conv_bias_relu(_dag(jobs[0]))

    residual = _resnet_block_onnx(tmp_path / "residual.onnx", residual=True)
    bad = tmp_path / "residual.yaml"
    capsys.readouterr()
    assert main(["extract", residual, "--dialect", "auto_scheduler", "-o", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "task residual/conv1: conv2d {" in err and "(layout NCHW): the models have 2 different epilogues" in err
    assert "bias+add+relu x1, bias+relu x1" in err and not bad.exists()
    assert main(["extract", residual, "--dialect", "auto_scheduler", "--skip-untunable", "-o", str(bad)]) == 0
    assert "skipped residual/conv1" in capsys.readouterr().out and "workloads:\n" in bad.read_text()
