"""Tasks: canonical parameters, their YAML form, shapes of matmuls and convolutions, configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorien.errors import ConfigError
from lorien.models.tasks import Task, conv_task, matmul_task, merge_tasks, same_pads
from lorien.tune.config import load_tune_config, parse_tune_config

MODELS = Path(__file__).resolve().parent.parent / "configs" / "models"


def test_parameters_equal_in_any_spelling_are_one_task():
    short = Task("conv2d", {"C": 64, "H": 56, "W": 56, "K": 64, "padding": 1})
    long = Task("conv2d", {"N": 1, "C": 64, "H": 56, "W": 56, "K": 64, "kernel": [3, 3], "stride": 1,
                           "padding": [1, 1, 1, 1], "dilation": [1, 1], "groups": 1})
    assert short.key == long.key
    merged = merge_tasks([Task("dense", {"M": 1, "N": 8, "K": 8}, models=["a"]), short,
                          Task("dense", {"M": 1, "N": 8, "K": 8}, weight=2, models=["b"]), long])
    assert [(task.op, task.weight) for task in merged] == [("dense", 3), ("conv2d", 2)]
    assert merged[0].models == ["a", "b"]


def test_yaml_form_writes_pairs_and_paddings_as_short_as_they_go():
    task = Task("conv2d", {"C": 8, "H": 9, "W": 9, "K": 8, "kernel": [1, 7], "padding": [0, 3, 0, 3]})
    assert task.to_entry()["conv2d"] == {"N": 1, "C": 8, "H": 9, "W": 9, "K": 8, "kernel": [1, 7], "stride": 1,
                                         "padding": [0, 3]}
    odd = Task("conv2d", {"C": 8, "H": 9, "W": 9, "K": 8, "padding": [0, 0, 1, 1], "dilation": 2, "groups": 2})
    assert odd.to_entry()["conv2d"]["padding"] == [0, 0, 1, 1]
    assert odd.to_entry()["conv2d"]["groups"] == 2 and odd.to_entry()["conv2d"]["dilation"] == 2


def test_matmul_shapes_follow_numpy_semantics():
    assert matmul_task([1, 128, 768], [768, 3072], "float32") == ("dense", {"M": 128, "N": 3072, "K": 768,
                                                                           "dtype": "float32"})
    assert matmul_task([2, 12, 128, 64], [2, 12, 64, 128], "float32")[1] == {"B": 24, "M": 128, "N": 128, "K": 64,
                                                                             "dtype": "float32"}
    assert matmul_task([8, 1, 4, 5], [3, 5, 6], "float16")[1]["B"] == 24  # broadcast batch dimensions


def test_every_input_channel_its_own_group_is_depthwise():
    assert conv_task([1, 32, 8, 8], [64, 1, 3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 32, "float32")[0] == \
        "depthwise_conv2d"
    assert conv_task([1, 32, 8, 8], [64, 8, 3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4, "float32")[0] == "conv2d"


def test_same_padding_puts_the_odd_pixel_at_the_end_or_the_start():
    assert same_pads([8, 8], [3, 3], [2, 2], [1, 1], upper=True) == (0, 0, 1, 1)
    assert same_pads([8, 8], [3, 3], [2, 2], [1, 1], upper=False) == (1, 1, 0, 0)
    assert same_pads([7, 7], [3, 3], [1, 1], [1, 1], upper=True) == (1, 1, 1, 1)


@pytest.mark.parametrize("weight", [0, -1, "4", True])
def test_tune_config_refuses_a_weight_that_is_not_a_positive_number(weight):
    with pytest.raises(ConfigError, match=r"workloads\[0\]: 'weight' must be a positive number"):
        parse_tune_config({"workloads": [{"dense": {"M": 1, "N": 8, "K": 8}, "weight": weight}]}, "t.yaml")


def test_tune_config_carries_weight_models_and_epilogue_into_jobs():
    config = parse_tune_config({"workloads": [
        {"dense": {"M": 1, "N": 8, "K": 8}, "weight": 2.5, "models": ["a"], "epilogue": {"bias+relu": 2}},
        {"dense": {"M": 2, "N": 8, "K": 8}}]})
    assert [job["weight"] for job in config.jobs] == [2.5, 1]
    assert config.jobs[0]["models"] == ["a"] and config.jobs[0]["epilogue"] == {"bias+relu": 2}
    with pytest.raises(ConfigError, match="epilogue pattern 'bias\\+gelu'"):
        parse_tune_config({"workloads": [{"dense": {"M": 1, "N": 8, "K": 8}, "epilogue": {"bias+gelu": 1}}]})


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "bert_base_layer", "all"])
def test_sample_model_configs_load_as_tuning_configs(name):
    config = load_tune_config(MODELS / f"{name}.yaml")
    assert all(job["weight"] >= 1 and job["models"] for job in config.jobs)
    header = (MODELS / f"{name}.yaml").read_text().splitlines()[0]
    assert header.startswith(f"# lorien extract: {len(config.jobs)} tasks")


def test_autotvm_convolutions_take_four_paddings_and_refuse_groups_plainly():
    config = parse_tune_config({"workloads": [{"conv2d": {"C": 8, "H": 8, "W": 8, "K": 8, "padding": [0, 0, 1, 1]}},
                                              {"depthwise_conv2d": {"C": 8, "H": 8, "W": 8, "padding": [1, 0]}}]})
    assert config.jobs[0]["args"][3] == [0, 0, 1, 1]
    assert config.jobs[1]["args"][3] == [1, 0, 1, 0]
    with pytest.raises(ConfigError, match=r"workloads\[0\]: conv2d: groups=2: the autotvm dialect has no grouped"):
        parse_tune_config({"workloads": [{"conv2d": {"C": 8, "H": 8, "W": 8, "K": 8, "groups": 2}}]}, "t.yaml")
