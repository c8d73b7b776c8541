"""Every template computes what NumPy computes, for several configs; TopHub configs apply."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_template

from dialects.autotvm.templates import instantiate, template_names

T = "TENSOR"
SMALL_WORKLOADS = {
    "dense_pack.x86": [[T, [16, 24], "float32"], [T, [32, 24], "float32"], None, "float32"],
    "dense_nopack.x86": [[T, [12, 16], "float32"], [T, [20, 16], "float32"], [T, [20], "float32"], "float32"],
    "dense_gemv.x86": [[T, [1, 48], "float32"], [T, [20, 48], "float32"], [T, [20], "float32"], "float32"],
    "batch_matmul.x86": [[T, [2, 8, 16], "float32"], [T, [2, 12, 16], "float32"], None],
    "conv2d_nchw.x86": [[T, [1, 4, 9, 9], "float32"], [T, [8, 4, 3, 3], "float32"], [2, 2], [1, 1, 1, 1], [1, 1], "float32"],
    "conv2d_nhwc.x86": [[T, [1, 8, 8, 4], "float32"], [T, [3, 3, 4, 8], "float32"], [1, 1], [1, 1, 1, 1], [1, 1], "float32"],
    "depthwise_conv2d_nchw.x86": [[T, [1, 4, 8, 8], "float32"], [T, [4, 2, 3, 3], "float32"], [1, 1], [1, 1, 1, 1],
                                  [1, 1], "float32"],
    "depthwise_conv2d_NCHWc.x86": [[T, [1, 16, 9, 9], "float32"], [T, [16, 1, 3, 3], "float32"], [2, 2],
                                   [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"],
    "conv2d_NCHWc.x86": [[T, [1, 8, 8, 8], "float32"], [T, [16, 8, 3, 3], "float32"], [1, 1], [1, 1, 1, 1], [1, 1],
                         "NCHW", "NCHW", "float32"],
}
CONV_1X1 = [[T, [1, 8, 6, 6], "float32"], [T, [8, 8, 1, 1], "float32"], [1, 1], [0, 0, 0, 0], [1, 1],
            "NCHW", "NCHW", "float32"]


def run_config(task, index, rng):
    output, expected, _, _ = run_template(task, task.config(index), rng)
    return output, expected


def test_every_registered_template_has_a_small_workload_here():
    assert set(template_names()) == set(SMALL_WORKLOADS)


@pytest.mark.parametrize("task_name", sorted(SMALL_WORKLOADS))
def test_template_matches_numpy_on_first_last_and_random_configs(task_name):
    task = instantiate(task_name, SMALL_WORKLOADS[task_name])
    rng = np.random.default_rng(7)
    indices = {0, len(task.space) - 1, *rng.choice(len(task.space), size=2).tolist()}
    for index in sorted(indices):
        output, expected = run_config(task, int(index), rng)
        np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4, err_msg=f"{task_name} config {index}")


def test_conv2d_nchwc_1x1_uses_tile_oh_and_matches_numpy():
    task = instantiate("conv2d_NCHWc.x86", CONV_1X1)
    assert list(task.space.space_map) == ["tile_ic", "tile_oc", "tile_ow", "tile_oh"]
    rng = np.random.default_rng(1)
    for index in (0, len(task.space) - 1):
        output, expected = run_config(task, index, rng)
        np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4)


def test_conv2d_nchwc_knobs_keep_tophub_meaning():
    """ic_bn = tile_ic[-1], oc_bn = tile_oc[-1] block the packed data and kernel."""
    task = instantiate("conv2d_NCHWc.x86", SMALL_WORKLOADS["conv2d_NCHWc.x86"])
    config = task.space.from_json_entity([["tile_ic", "sp", [2, 4]], ["tile_oc", "sp", [2, 8]],
                                          ["tile_ow", "sp", [4, 2]], ["unroll_kw", "ot", True]])
    _, (data, kernel, out) = task.instantiate(config)
    assert data.shape == (1, 2, 8, 8, 4)
    assert kernel.shape == (2, 2, 3, 3, 4, 8)
    assert out.shape == (1, 2, 8, 8, 8)


def test_bad_args_name_the_template():
    from lorien.errors import WorkloadError

    with pytest.raises(WorkloadError, match="dense_pack.x86"):
        instantiate("dense_pack.x86", [[T, [4, 4], "float32"]])


def tophub_line(shared_data, index):
    lines = [line for line in (shared_data / "tophub" / "llvm_v0.04.log").read_text().splitlines()
             if line.startswith("{")]
    return json.loads(lines[index])


@pytest.mark.slow
def test_tophub_config_builds_and_matches_numpy(shared_data):
    """The TopHub config of ResNet's last 3x3 layer, built by our engine, computes the conv."""
    row = tophub_line(shared_data, 9)  # [1, 512, 7, 7] x [512, 512, 3, 3]
    _, task_name, args, _ = row["input"]
    task = instantiate(task_name, args)
    config = task.space.from_json_entity(row["config"]["entity"])
    assert config.index == row["config"]["index"]
    output, expected = run_config(task, config.index, np.random.default_rng(0))
    np.testing.assert_allclose(output, expected, rtol=1e-3, atol=1e-3)


def test_vector_tiles_wider_than_the_registers_are_split_and_still_correct():
    from lorien.engine.x86 import vector_lanes

    wide = 2 * vector_lanes()
    rng = np.random.default_rng(3)
    conv = instantiate("conv2d_NCHWc.x86", [[T, [1, 4, 6, 6], "float32"], [T, [wide, 4, 3, 3], "float32"], [1, 1],
                                            [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"])
    config = conv.space.from_json_entity([["tile_ic", "sp", [-1, 4]], ["tile_oc", "sp", [-1, wide]],
                                          ["tile_ow", "sp", [-1, 3]], ["unroll_kw", "ot", True]])
    output, expected = run_config(conv, config.index, rng)
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4)
    dense = instantiate("dense_pack.x86", [[T, [4, 8], "float32"], [T, [wide, 8], "float32"], None, "float32"])
    config = dense.space.from_json_entity([["tile_y", "sp", [-1, 1, 2]], ["tile_x", "sp", [-1, 1, wide]],
                                           ["tile_k", "sp", [-1, 4]]])
    output, expected = run_config(dense, config.index, rng)
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k", [(1, 64), (3, 40), (1, 12)])  # 12: no whole 8-lane vector divides K
def test_dense_gemv_factors_the_reduction_and_matches_numpy_on_every_config(m, k):
    task = instantiate("dense_gemv.x86", [[T, [m, k], "float32"], [T, [24, k], "float32"], None, "float32"])
    assert list(task.space.space_map) == ["tile_x", "tile_k", "unroll_sum"]   # the records name the GEMV path
    rng = np.random.default_rng(2)
    for index in range(len(task.space)):
        schedule, _ = task.instantiate(task.config(index))
        assert any(step["kind"] == "rfactor" for step in schedule.steps)
        output, expected = run_config(task, index, rng)
        np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4, err_msg=f"config {index}")


@pytest.mark.parametrize("data, kernel, stride", [([1, 16, 8, 8], [16, 1, 3, 3], 1), ([1, 8, 7, 7], [8, 2, 3, 3], 2)])
def test_depthwise_nchwc_matches_numpy_with_equal_and_unequal_channel_blocks(data, kernel, stride):
    task = instantiate("depthwise_conv2d_NCHWc.x86", [[T, data, "float32"], [T, kernel, "float32"], [stride, stride],
                                                      [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"])
    assert list(task.space.space_map) == ["tile_ic", "tile_oc", "tile_ow", "unroll_kw"]
    rng = np.random.default_rng(5)
    blocks = {}
    for index in range(len(task.space)):
        config = task.config(index)
        key = (config["tile_ic"].size[-1] == config["tile_oc"].size[-1], config["unroll_kw"].val)
        blocks.setdefault(key, index)
    assert len(blocks) == 4
    for index in blocks.values():
        output, expected = run_config(task, index, rng)
        np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4, err_msg=f"config {index}")
