"""The engine's schedules for the layer classes the benchmark measures beyond 3x3 convolutions:
depthwise NCHW[x]c (op, reference, schedule), 1x1 convolutions in NCHW[x]c, the dense
register tile over data packed in row blocks, the batch_matmul register tile over y packed
per panel, the 1x1 convolution from NCHW as a matmul and the depthwise convolution in NCHW;
outputs checked against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from lorien.engine import build, lower, ops, reference, runtime, te
from lorien.engine.schedule import create_schedule
from lorien.engine.x86 import (
    batch_matmul_candidate,
    conv1x1_nchw_candidate,
    conv2d_NCHWc_candidate,
    dense_candidate,
    depthwise_nchw_candidate,
    depthwise_NCHWc_candidate,
    schedule_batch_matmul,
)
from lorien.errors import WorkloadError


@pytest.mark.parametrize("channels, size, stride, bn, tile_ow, tile_oh, pad_inline", [
    (32, 10, 1, 16, 4, 1, False), (32, 10, 1, 8, 5, 2, False), (48, 11, 2, 16, 3, 1, True), (24, 9, 2, 8, 4, 2, False)])
def test_depthwise_nchwc_matches_numpy(channels, size, stride, bn, tile_ow, tile_oh, pad_inline):
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    weight = rng.uniform(-1, 1, (channels, 1, 3, 3)).astype("float32")
    s, args = depthwise_NCHWc_candidate(channels, size, stride, bn, tile_ow, tile_oh, pad_inline=pad_inline)
    out = np.zeros(args[-1].shape, "float32")
    packed = [reference.pack_nchwc(data, bn), reference.pack_depthwise_kernel(weight, bn)]
    build(s, args)(*packed, out)
    expected = reference.depthwise_conv2d_nchw(data, weight, stride, 1)
    np.testing.assert_allclose(reference.unpack_nchwc(out), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, reference.depthwise_conv2d_NCHWc(*packed, stride, 1), rtol=1e-5, atol=1e-5)


def test_pack_depthwise_kernel_refuses_a_multiplier():
    with pytest.raises(ValueError, match="multiplier 2"):
        reference.pack_depthwise_kernel(np.zeros((8, 2, 3, 3), "float32"), 8)


@pytest.mark.parametrize("channels, size, out_channels, stride, tile_ow, tile_oh", [
    (32, 12, 16, 2, 3, 1), (16, 7, 32, 1, 7, 1), (16, 8, 16, 1, 4, 2)])
def test_1x1_conv_nchwc_matches_numpy(channels, size, out_channels, stride, tile_ow, tile_oh):
    rng = np.random.default_rng(1)
    data = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    weight = rng.uniform(-1, 1, (out_channels, channels, 1, 1)).astype("float32")
    s, args = conv2d_NCHWc_candidate(channels, size, out_channels, stride, 16, 16, tile_ow, True, kernel=1, pad=0,
                                     tile_oh=tile_oh)
    out = np.zeros(args[-1].shape, "float32")
    build(s, args)(reference.pack_nchwc(data, 16), reference.pack_kernel_oihwio(weight, 16, 16), out)
    np.testing.assert_allclose(reference.unpack_nchwc(out), reference.conv2d_nchw(data, weight, stride, 0),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels, size, out_channels, stride, oc_bn, tile_ow, tile_oh", [
    (32, 9, 32, 2, 16, 5, 1), (16, 8, 32, 1, 32, 4, 2), (16, 7, 16, 1, 16, 7, 1)])
def test_3x3_conv_nchwc_padding_per_output_row_matches_numpy(channels, size, out_channels, stride, oc_bn, tile_ow,
                                                             tile_oh):
    """``pad_rows``: parallel over output rows, each padding the input rows it reads inside that
    loop (no parallel pass of its own), with 2 threads claiming the rows."""
    rng = np.random.default_rng(3)
    data = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    weight = rng.uniform(-1, 1, (out_channels, channels, 3, 3)).astype("float32")
    s, args = conv2d_NCHWc_candidate(channels, size, out_channels, stride, 16, oc_bn, tile_ow, True, tile_oh=tile_oh,
                                     pad_rows=True)
    pad = s["conv2d_NCHWc.pad"]
    assert pad.attach is not None and "parallel" not in pad.annotations.values()
    out = np.zeros(args[-1].shape, "float32")
    with runtime.threads(2):
        build(s, args)(reference.pack_nchwc(data, 16), reference.pack_kernel_oihwio(weight, 16, oc_bn), out)
    np.testing.assert_allclose(reference.unpack_nchwc(out), reference.conv2d_nchw(data, weight, stride, 1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, n, k, mr, nr, order", [(16, 32, 24, 8, 16, "mn"), (12, 32, 9, 4, 32, "nm"),
                                                   (16, 16, 5, 16, 16, "mn")])
def test_dense_with_the_data_packed_in_row_blocks_matches_numpy(m, n, k, mr, nr, order):
    rng = np.random.default_rng(2)
    data = rng.uniform(-1, 1, (m, k)).astype("float32")
    weight = rng.uniform(-1, 1, (n, k)).astype("float32")
    s, args = dense_candidate(m, n, k, mr, nr, order, pack_data=True)
    assert any(stage.name == "dense.data_pack" for stage in s.stages)
    out = np.zeros((m, n), "float32")
    build(s, args)(data, weight, out)
    np.testing.assert_allclose(out, reference.dense(data, weight), rtol=1e-5, atol=1e-5)


def test_dense_data_packing_refuses_rows_that_do_not_divide_m():
    data, weight = te.placeholder((10, 8), name="data"), te.placeholder((16, 8), name="weight")
    with pytest.raises(WorkloadError, match="pack_mr=4"):
        ops.dense(data, weight, pack_nr=16, pack_mr=4)


@pytest.mark.parametrize("b, m, n, k, mr, nr", [(3, 16, 32, 24, 8, 16), (2, 12, 32, 9, 5, 32), (4, 7, 16, 5, 16, 16)])
def test_batch_matmul_register_tile_over_packed_y_panels_matches_numpy(b, m, n, k, mr, nr):
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (b, m, k)).astype("float32")
    y = rng.uniform(-1, 1, (b, n, k)).astype("float32")
    s, args = batch_matmul_candidate(b, m, n, k, mr, nr)
    out = np.zeros((b, m, n), "float32")
    build(s, args)(x, y, out)
    np.testing.assert_allclose(out, reference.batch_matmul(x, y), rtol=1e-5, atol=1e-5)


def test_batch_matmul_packs_each_y_panel_inside_its_one_parallel_loop():
    s, args = batch_matmul_candidate(2, 8, 32, 4, 4, 16)
    text = str(lower(s, args))
    assert text.count("'parallel'") == 1
    assert text.index("'parallel'") < text.index("batch_matmul.y_pack")


def test_batch_matmul_tile_with_bias_relu_and_a_shared_y_matches_numpy():
    rng = np.random.default_rng(4)
    x_np, y_np = rng.uniform(-1, 1, (3, 8, 6)).astype("float32"), rng.uniform(-1, 1, (1, 32, 6)).astype("float32")
    bias_np = rng.uniform(-1, 1, (32,)).astype("float32")
    x, y, bias = te.placeholder((3, 8, 6), name="x"), te.placeholder((1, 32, 6), name="y"), te.placeholder((32,), name="b")
    out = ops.batch_matmul(x, y, bias=bias, relu=True, pack_nr=16)
    s = create_schedule(out)
    schedule_batch_matmul(s, out, 4, 16)
    result = np.zeros((3, 8, 32), "float32")
    build(s, [x, y, bias, out])(x_np, y_np, bias_np, result)
    np.testing.assert_allclose(result, reference.batch_matmul(x_np, y_np, bias_np, relu=True), rtol=1e-5, atol=1e-5)


def test_batch_matmul_packing_refuses_panels_that_do_not_divide_n():
    x, y = te.placeholder((2, 4, 8), name="x"), te.placeholder((2, 24, 8), name="y")
    with pytest.raises(WorkloadError, match="pack_nr=16"):
        ops.batch_matmul(x, y, pack_nr=16)


@pytest.mark.parametrize("channels, size, out_channels, mr, nr", [(8, 8, 12, 6, 32), (5, 6, 16, 4, 16), (16, 4, 7, 3, 16)])
def test_1x1_conv_from_nchw_to_nchw_as_a_matmul_on_the_arrays_as_they_are_matches_numpy(channels, size, out_channels,
                                                                                     mr, nr):
    rng = np.random.default_rng(5)
    data = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    weight = rng.uniform(-1, 1, (out_channels, channels, 1, 1)).astype("float32")
    s, args = conv1x1_nchw_candidate(channels, size, out_channels, mr, nr)
    out = np.zeros((1, out_channels, size, size), "float32")
    build(s, args)(weight.reshape(out_channels, channels), data.reshape(channels, size * size),
                   out.reshape(out_channels, size * size))
    np.testing.assert_allclose(out, reference.conv2d_nchw(data, weight, 1, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels, size, stride, tile_ow, tile_oh, pad_inline", [
    (4, 10, 1, 16, 2, True), (4, 10, 1, 5, 4, False), (3, 11, 2, 8, 1, True), (5, 9, 2, 5, 2, False)])
def test_depthwise_from_nchw_to_nchw_matches_numpy(channels, size, stride, tile_ow, tile_oh, pad_inline):
    rng = np.random.default_rng(6)
    data = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    weight = rng.uniform(-1, 1, (channels, 1, 3, 3)).astype("float32")
    s, args = depthwise_nchw_candidate(channels, size, stride, tile_ow, tile_oh, pad_inline)
    out = np.zeros(args[-1].shape, "float32")
    build(s, args)(data, weight, out)
    np.testing.assert_allclose(out, reference.depthwise_conv2d_nchw(data, weight, stride, 1), rtol=1e-5, atol=1e-5)
