"""Readable AutoTVM workload keys, layout inference and FLOP counting."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lorien.workload import (
    LAYOUT_NA,
    autotvm_workload_key,
    compute_flop,
    infer_layout,
    parse_autotvm_workload_key,
)

RESNET_CONV1_ARGS = [["TENSOR", [1, 3, 224, 224], "float32"], ["TENSOR", [64, 3, 7, 7], "float32"],
                     [2, 2], [3, 3, 3, 3], [1, 1], "NCHW", "NCHW", "float32"]


def tophub_workloads(shared_data: Path) -> dict[str, list]:
    """First (task_name -> args) of every task name in the shared TopHub logs."""
    found: dict[str, list] = {}
    for path in sorted((shared_data / "tophub").glob("*.log")):
        for line in path.read_text().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            task_name, args = json.loads(line)["input"][1:3]
            found.setdefault(task_name, args)
    return found


def test_autotvm_key_follows_lorien_readable_form():
    key = autotvm_workload_key("conv2d_NCHWc.x86", RESNET_CONV1_ARGS)
    assert key == ("conv2d_NCHWc.x86#_TENSOR__1_3_224_224__float32_#_TENSOR__64_3_7_7__float32_"
                   "#_2_2_#_3_3_3_3_#_1_1_#NCHW#NCHW#float32")


def test_autotvm_key_writes_none_and_scalars_as_text():
    key = autotvm_workload_key("dense_nopack.x86", [["TENSOR", [1, 512], "float32"], None, 3, 1.5, True])
    assert key == "dense_nopack.x86#_TENSOR__1_512__float32_#None#3#1.5#True"


def test_parse_autotvm_key_inverts_every_shared_tophub_workload(shared_data):
    for path in sorted((shared_data / "tophub").glob("*.log")):
        for line in path.read_text().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            task_name, args = json.loads(line)["input"][1:3]
            assert parse_autotvm_workload_key(autotvm_workload_key(task_name, args)) == (task_name, args)


def test_parse_autotvm_key_restores_nested_and_empty_lists():
    args = [[[1, 2], 3], [], ["TENSOR", [4], "int8", [0, 0]], -1, None]
    assert parse_autotvm_workload_key(autotvm_workload_key("op.x86", args)) == ("op.x86", args)


def test_parse_autotvm_key_refuses_an_unbalanced_list():
    from lorien.errors import WorkloadError

    with pytest.raises(WorkloadError, match="_1_2"):
        parse_autotvm_workload_key("dense.x86#_1_2")


@pytest.mark.parametrize(("task_name", "args", "layout"), [
    ("conv2d_NCHWc.x86", RESNET_CONV1_ARGS, "NCHW"),
    ("conv2d_NCHWc.x86", [["TENSOR", [1, 4, 56, 56, 16], "float32"], ["TENSOR", [4, 4, 3, 3, 16, 16], "float32"],
                          [1, 1], [1, 1, 1, 1], [1, 1], "NCHW16c", "NCHW16c", "float32"], "NCHW16c"),
    ("conv2d_nchw.cuda", [["TENSOR", [1, 64, 56, 56], "float32"], ["TENSOR", [64, 64, 3, 3], "float32"],
                          [1, 1], [1, 1, 1, 1], [1, 1], "float32"], "NCHW"),
    ("conv2d_nhwc.x86", [["TENSOR", [1, 56, 56, 64], "float32"], ["TENSOR", [3, 3, 64, 64], "float32"],
                         [1, 1], [1, 1, 1, 1], [1, 1], "float32"], "NHWC"),
    ("conv2d_hwcn.cuda", [["TENSOR", [56, 56, 64, 1], "float32"], ["TENSOR", [3, 3, 64, 64], "float32"],
                          [1, 1], [1, 1, 1, 1], [1, 1], "float32"], "HWCN"),
    ("group_conv2d_packed.vta", [["TENSOR", [1, 2, 112, 112, 1, 16], "int8"], ["TENSOR", [2, 1, 3, 3, 16, 16], "int8"],
                                 [1, 1], [1, 1, 1, 1], [1, 1], 2, "int32"], "NCHW1n16c"),
    ("dense_nopack.x86", [["TENSOR", [1, 512], "float32"], ["TENSOR", [1000, 512], "float32"], None, "float32"], LAYOUT_NA),
    ("batch_matmul.cuda", [["TENSOR", [1, 128, 20], "float32"], ["TENSOR", [1, 64, 20], "float32"]], LAYOUT_NA),
    ("softmax.x86", [["TENSOR", [1, 1000], "float32"]], LAYOUT_NA),
])
def test_infer_layout_names_the_data_layout(task_name, args, layout):
    assert infer_layout(task_name, args) == layout


def test_conv2d_flop_counts_two_per_multiply_accumulate():
    # ResNet's first layer: 64 x 112 x 112 outputs, 3 x 7 x 7 taps each.
    assert compute_flop("conv2d_NCHWc.x86", RESNET_CONV1_ARGS) == 2 * 64 * 112 * 112 * 3 * 7 * 7


def test_packed_nchwc_conv2d_counts_like_its_unpacked_form():
    packed = [["TENSOR", [1, 4, 56, 56, 16], "float32"], ["TENSOR", [8, 4, 3, 3, 16, 16], "float32"],
              [1, 1], [1, 1, 1, 1], [1, 1], "NCHW16c", "NCHW16c", "float32"]
    plain = [["TENSOR", [1, 64, 56, 56], "float32"], ["TENSOR", [128, 64, 3, 3], "float32"],
             [1, 1], [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"]
    assert compute_flop("conv2d_NCHWc.x86", packed) == compute_flop("conv2d_NCHWc.x86", plain) == 2 * 128 * 56 * 56 * 64 * 9


def test_winograd_counts_as_the_direct_convolution_it_computes():
    args = [["TENSOR", [1, 96, 35, 35], "float32"], ["TENSOR", [96, 96, 3, 3], "float32"], [1, 1], [1, 1, 1, 1], [1, 1], "float32"]
    assert compute_flop("conv2d_nchw_winograd.cuda", args) == compute_flop("conv2d_nchw.cuda", args) == 2 * 96 * 35 * 35 * 96 * 9


def test_strided_dilated_padding_shapes_the_output():
    args = [["TENSOR", [1, 16, 32, 32], "float32"], ["TENSOR", [8, 16, 3, 3], "float32"], [2, 2], [0, 0], [2, 2], "float32"]
    # dilated kernel spans 5, (32 - 5) // 2 + 1 = 14
    assert compute_flop("conv2d_nchw.cuda", args) == 2 * 8 * 14 * 14 * 16 * 9


def test_depthwise_flop_has_no_input_channel_reduction():
    args = [["TENSOR", [1, 512, 14, 14], "float32"], ["TENSOR", [512, 1, 3, 3], "float32"], [2, 2], [1, 1, 1, 1], [1, 1], "float32"]
    assert compute_flop("depthwise_conv2d_nchw.cuda", args) == 2 * 512 * 7 * 7 * 9


def test_group_conv_reduces_over_the_channels_of_one_group():
    packed = [["TENSOR", [1, 2, 112, 112, 1, 16], "int8"], ["TENSOR", [2, 1, 3, 3, 16, 16], "int8"],
              [1, 1], [1, 1, 1, 1], [1, 1], 2, "int32"]
    assert compute_flop("group_conv2d_packed.vta", packed) == 2 * 32 * 112 * 112 * 16 * 9
    plain = [["TENSOR", [1, 32, 56, 56], "float32"], ["TENSOR", [64, 8, 3, 3], "float32"], [1, 1], [1, 1], [1, 1], 4, "float32"]
    assert compute_flop("group_conv2d_nchw.x86", plain) == 2 * 64 * 56 * 56 * 8 * 9


def test_transposed_convolutions_count_every_input_pixel_times_every_tap():
    conv2d_t = [["TENSOR", [1, 512, 9, 4], "float32"], ["TENSOR", [512, 256, 3, 3], "float32"], [2, 2], [1, 1, 1, 1], "float32", [1, 1]]
    assert compute_flop("conv2d_transpose_nchw.cuda", conv2d_t) == 2 * 9 * 4 * 512 * 256 * 9
    conv1d_t = [["TENSOR", [1, 257, 128], "float32"], ["TENSOR", [257, 1, 512], "float32"], [128], [256], "float32", [0]]
    assert compute_flop("conv1d_transpose_nchw.cuda", conv1d_t) == 2 * 128 * 257 * 512


def test_dense_and_batch_matmul_count_2mnk():
    dense = [["TENSOR", [4, 512], "float32"], ["TENSOR", [1000, 512], "float32"], None, "float32"]
    assert compute_flop("dense_nopack.x86", dense) == 2 * 4 * 1000 * 512
    packed = [["TENSOR", [4, 16, 1, 16], "int8"], ["TENSOR", [8, 16, 16, 16], "int8"], None, "int32"]
    assert compute_flop("dense_packed.vta", packed) == 2 * 4 * 128 * 256
    bmm = [["TENSOR", [2, 9216, 128], "float32"], ["TENSOR", [2, 64, 128], "float32"]]
    assert compute_flop("batch_matmul.cuda", bmm) == 2 * 2 * 9216 * 64 * 128


def test_conv3d_counts_three_spatial_dimensions():
    args = [["TENSOR", [1, 4, 8, 8, 8], "float32"], ["TENSOR", [16, 4, 3, 3, 3], "float32"], [1, 1, 1], [1, 1, 1], [1, 1, 1], "float32"]
    assert compute_flop("conv3d_ncdhw.x86", args) == 2 * 16 * 8 * 8 * 8 * 4 * 27


def test_every_operator_in_the_shared_tophub_logs_is_counted(shared_data):
    for task_name, args in tophub_workloads(shared_data).items():
        flop = compute_flop(task_name, args)
        assert flop is not None and flop > 0, task_name


def test_unknown_operator_has_unknown_flop_and_warns_once(caplog):
    with caplog.at_level(logging.WARNING, logger="lorien.workload"):
        assert compute_flop("mystery_op.x86", [["TENSOR", [1, 2], "float32"]]) is None
        assert compute_flop("mystery_op.x86", [["TENSOR", [3, 4], "float32"]]) is None
    assert [r.getMessage() for r in caplog.records].count(
        "flop unknown for task 'mystery_op.x86': no FLOP formula for this operator") == 1


def test_arguments_that_do_not_fit_the_formula_give_unknown_flop():
    assert compute_flop("conv2d_nchw.broken", [["TENSOR", [1, 2], "float32"], 7]) is None
    zero_stride = [["TENSOR", [1, 3, 8, 8], "float32"], ["TENSOR", [4, 3, 3, 3], "float32"], [0, 0], [1, 1], [1, 1], "float32"]
    assert compute_flop("conv2d_nchw.zero_stride", zero_stride) is None


@pytest.mark.parametrize("task_name, data, weight, window", [
    ("dense_pack.x86", (16, 64), (32, 64), None),
    ("batch_matmul.x86", (3, 16, 24), (3, 20, 24), None),
    ("conv2d_NCHWc.x86", (1, 8, 15, 17), (12, 8, 3, 5), (2, (1, 2), 1)),
    ("depthwise_conv2d_nchw.x86", (2, 8, 14, 14), (8, 2, 3, 3), (1, 1, 2)),
])
def test_flop_of_log_arguments_equals_the_dsl_count_of_the_same_computation(task_name, data, weight, window):
    from lorien.engine import ops, te

    build = {"dense_pack.x86": ops.dense, "batch_matmul.x86": ops.batch_matmul,
             "conv2d_NCHWc.x86": ops.conv2d_nchw, "depthwise_conv2d_nchw.x86": ops.depthwise_conv2d_nchw}[task_name]
    output = build(te.placeholder(data, name="data"), te.placeholder(weight, name="weight"), *(window or ()))
    tensors = [["TENSOR", list(data), "float32"], ["TENSOR", list(weight), "float32"]]
    if window is None:
        args = [*tensors, None, "float32"]
    else:
        stride, padding, dilation = window
        pad_h, pad_w = padding if isinstance(padding, tuple) else (padding, padding)
        args = [*tensors, [stride, stride], [pad_h, pad_w, pad_h, pad_w], [dilation, dilation], "float32"]
    assert compute_flop(task_name, args) == te.flop([output]) > 0
