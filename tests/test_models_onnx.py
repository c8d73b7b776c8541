"""lorien extract on ONNX graphs built with onnx.helper: tasks, weights, epilogues, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from lorien.cli import main
from lorien.models import ExtractError, extract_models
from lorien.models.bert import bert_encoder_layer
from lorien.tune.config import load_tune_config


def _save(model, path: Path) -> str:
    onnx.save(model, str(path))
    return str(path)


def _const(name: str, *shape: int, value: float = 0.0):
    return numpy_helper.from_array(np.full(shape, value, dtype=np.float32), name)


def _conv_model(nodes, initializers, out_shape, in_shape=(1, 8, 16, 16)):
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def bert_small(tmp_path_factory) -> str:
    """A BERT-style encoder block: hidden 64, 4 heads, feed-forward 128; batch and sequence dynamic."""
    return _save(bert_encoder_layer(hidden=64, heads=4, ffn=128), tmp_path_factory.mktemp("bert") / "bert.onnx")


def _by_op(extraction):
    return {(task.op, tuple(sorted(task.params.items()))): task for task in extraction.tasks}


def test_bert_block_projections_attention_and_feed_forward_are_tasks(bert_small):
    extraction = extract_models([bert_small], ["hidden_states:2x8x64"])
    found = {(task.op, *(task.params[k] for k in ("B", "M", "N", "K") if k in task.params)): task
             for task in extraction.tasks}
    # 2 sequences of 8 tokens: 16 rows; 2 x 4 heads of size 16 in attention
    assert list(found) == [("dense", 16, 64, 64), ("batch_matmul", 8, 8, 8, 16), ("batch_matmul", 8, 8, 16, 8),
                           ("dense", 16, 128, 64), ("dense", 16, 64, 128)]
    projections = found[("dense", 16, 64, 64)]
    assert projections.weight == 4  # query, key, value, output: MatMul + Add
    assert projections.epilogues == {"bias": 3, "bias+add": 1}
    assert found[("dense", 16, 128, 64)].epilogues == {"bias": 1}  # Gemm with its C input
    assert sum(task.weight for task in extraction.tasks) == 8


def test_bert_block_counts_every_other_operator_as_unsupported(bert_small):
    extraction = extract_models([bert_small], ["hidden_states:1x8x64"])
    unsupported = extraction.unsupported
    assert unsupported["Softmax"] == 1
    assert unsupported["ReduceMean"] == 4 and unsupported["Sqrt"] == 2 and unsupported["Pow"] == 2
    assert unsupported["Erf"] == 1 and unsupported["Transpose"] == 4 and unsupported["Reshape"] == 6
    assert "MatMul" not in unsupported and "Gemm" not in unsupported
    assert "Softmax x1" in extraction.summary()


def test_dynamic_dimension_without_a_value_is_an_error_naming_the_input(bert_small):
    with pytest.raises(ExtractError, match=r"input 'hidden_states' has dynamic dimensions batch .*seq"):
        extract_models([bert_small])


def test_batch_size_sets_dimension_zero(bert_small):
    extraction = extract_models([bert_small], ["hidden_states:1x8x64"], batch_size=4)
    assert extraction.models[0].inputs == {"hidden_states": [4, 8, 64]}
    assert any(task.op == "dense" and task.params["M"] == 32 for task in extraction.tasks)


def test_input_of_the_wrong_rank_or_unknown_name_is_an_error(bert_small):
    with pytest.raises(ExtractError, match="rank 2"):
        extract_models([bert_small], ["hidden_states:8x64"])
    with pytest.raises(ExtractError, match="images:1x3x8x8: no model has such an input"):
        extract_models([bert_small], ["hidden_states:1x8x64", "images:1x3x8x8"])


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_onnx_file_is_an_error_naming_the_file(bert_small, tmp_path, cut):
    data = Path(bert_small).read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[:int(len(data) * cut)])
    with pytest.raises(ExtractError, match=f"{truncated}: not a readable ONNX model"):
        extract_models([str(truncated)], ["hidden_states:1x8x64"])


def test_file_that_is_not_onnx_is_an_error_naming_the_file(tmp_path):
    bogus = tmp_path / "notes.onnx"
    bogus.write_text("this is not a protobuf\n")
    with pytest.raises(ExtractError, match=f"{bogus}: not"):
        extract_models([str(bogus)])
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ExtractError, match=f"{empty}: not an ONNX model"):
        extract_models([str(empty)])


def test_grouped_depthwise_strided_dilated_and_same_padded_convolutions(tmp_path):
    nodes = [
        helper.make_node("Conv", ["x", "w_dw"], ["a"], group=8, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w_group"], ["b"], group=2, kernel_shape=[3, 3], strides=[2, 2],
                         dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("Conv", ["b", "w_same"], ["y"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    ]
    inits = [_const("w_dw", 16, 1, 3, 3), _const("w_group", 16, 8, 3, 3), _const("w_same", 4, 16, 3, 3)]
    path = _save(_conv_model(nodes, inits, (1, 4, 4, 4)), tmp_path / "convs.onnx")
    tasks = extract_models([path]).tasks
    depthwise, grouped, same = tasks
    assert depthwise.op == "depthwise_conv2d"
    assert depthwise.params["multiplier"] == 2 and depthwise.params["C"] == 8
    assert grouped.op == "conv2d" and grouped.params["groups"] == 2 and grouped.params["dilation"] == (2, 2)
    assert (grouped.params["H"], grouped.params["stride"]) == (16, (2, 2))
    # 8x8 input, stride 2, 'same': output 4x4, total padding 1, the odd pixel at the end
    assert same.params["padding"] == (0, 0, 1, 1)


def test_bias_relu6_and_residual_add_are_fused_epilogues(tmp_path):
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Clip", ["c1", "zero", "six"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["c2", "b2"], ["c2b"]),
        helper.make_node("Add", ["c2b", "r1"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["y"]),
    ]
    inits = [_const("w1", 8, 8, 1, 1), _const("b1", 8), _const("w2", 8, 8, 1, 1), _const("b2", 1, 8, 1, 1),
             numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.float32(6), "six")]
    path = _save(_conv_model(nodes, inits, (1, 8, 16, 16)), tmp_path / "fused.onnx")
    extraction = extract_models([path])
    (task,) = extraction.tasks
    assert task.weight == 2
    assert task.epilogues == {"bias+relu6": 1, "bias+add+relu": 1}
    assert not extraction.unsupported


def test_add_of_a_non_channel_constant_ends_the_epilogue(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c", "row"], ["y"])]
    inits = [_const("w", 8, 8, 1, 1), _const("row", 16)]  # broadcasts along W, not channels
    extraction = extract_models([_save(_conv_model(nodes, inits, (1, 8, 16, 16)), tmp_path / "row.onnx")])
    assert not extraction.tasks[0].epilogues
    assert extraction.unsupported == {"Add": 1}


def test_identical_tasks_of_two_models_merge_and_add_weights(bert_small, tmp_path):
    copy = tmp_path / "bert_copy.onnx"
    copy.write_bytes(Path(bert_small).read_bytes())
    single = extract_models([bert_small], ["hidden_states:1x8x64"])
    both = extract_models([bert_small, str(copy)], ["hidden_states:1x8x64"])
    assert [task.key for task in both.tasks] == [task.key for task in single.tasks]
    for one, two in zip(single.tasks, both.tasks, strict=True):
        assert two.weight == 2 * one.weight
        assert two.models == ["bert", "bert_copy"]
        assert two.epilogues == one.epilogues + one.epilogues


def test_extract_cli_writes_a_config_tune_loads_with_weights_and_models(bert_small, tmp_path, capsys):
    out = tmp_path / "tasks.yaml"
    assert main(["extract", bert_small, "--input", "hidden_states:1x8x64", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "unsupported operators: 37" in printed
    text = out.read_text()
    assert text.startswith("# lorien extract: 5 tasks from 1 model(s).\n# Made by: lorien extract ")
    config = load_tune_config(out)
    assert [job["weight"] for job in config.jobs] == [4, 1, 1, 1, 1]
    assert [job["name"] for job in config.jobs][:3] == ["bert/attention.query", "bert/attention.scores",
                                                        "bert/attention.context"]
    assert {tuple(job["models"]) for job in config.jobs} == {("bert",)}
    assert config.jobs[0]["epilogue"] == {"bias": 3, "bias+add": 1}
    assert config.jobs[1]["task_name"] == "batch_matmul.x86"


def test_extract_cli_json_summary_needs_an_output_file(bert_small, tmp_path, capsys):
    import json

    out = tmp_path / "tasks.yaml"
    assert main(["extract", bert_small, "--input", "hidden_states:1x8x64", "--json"]) == 1
    assert "give the YAML a file with -o" in capsys.readouterr().err
    assert main(["extract", bert_small, "--input", "hidden_states:1x8x64", "--json", "-o", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["output"], report["tasks"], report["weight"]) == (str(out), 5, 8)
    assert report["models"][0]["unsupported"]["Softmax"] == 1


def test_extract_cli_error_names_the_file_and_writes_nothing(tmp_path, capsys):
    bogus = tmp_path / "broken.onnx"
    bogus.write_bytes(b"\x08\x07\x12\xff\xff")
    out = tmp_path / "tasks.yaml"
    assert main(["extract", str(bogus), "-o", str(out)]) == 1
    assert f"lorien extract: error: {bogus}" in capsys.readouterr().err
    assert not out.exists()


def test_extracted_config_is_tuned_and_committed(bert_small, tmp_path, capsys):
    out = tmp_path / "tasks.yaml"
    assert main(["extract", bert_small, "--input", "hidden_states:1x4x64", "-o", str(out)]) == 0
    store = f"parquet:{tmp_path / 'wh'}"
    assert main(["tune", str(out), "--trials", "2", "--store", store, "--no-progress"]) == 0
    from lorien.warehouse import open_store

    with open_store(store) as warehouse:
        assert warehouse.stats()["workloads"] == 5
        assert warehouse.stats()["valid_records"] >= 5
