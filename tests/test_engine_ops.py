"""Every operator in lorien.engine.ops, built with a default schedule, matches its NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from lorien.engine import build, ops, reference, te
from lorien.engine.schedule import create_schedule

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _run(out, inputs, arrays):
    kernel = build(create_schedule(out), [*inputs, out])
    result = np.zeros(out.shape, "float32")
    kernel(*arrays, result)
    return result


def test_dense_matches_numpy():
    d, w = te.placeholder((5, 7), name="d"), te.placeholder((3, 7), name="w")
    a, b = _rand(5, 7), _rand(3, 7)
    np.testing.assert_allclose(_run(ops.dense(d, w), [d, w], [a, b]), reference.dense(a, b), rtol=1e-5, atol=1e-5)


def test_dense_with_bias_relu_and_residual_epilogue_matches_numpy():
    d, w = te.placeholder((4, 6), name="d"), te.placeholder((8, 6), name="w")
    bias, res = te.placeholder((8,), name="bias"), te.placeholder((4, 8), name="res")
    out = ops.dense(d, w, bias=bias, relu=True, residual=res)
    arrays = [_rand(4, 6), _rand(8, 6), _rand(8), _rand(4, 8)]
    expected = reference.dense(arrays[0], arrays[1], arrays[2], relu=True, residual=arrays[3])
    np.testing.assert_allclose(_run(out, [d, w, bias, res], arrays), expected, rtol=1e-5, atol=1e-5)


def test_dense_with_packed_weight_matches_numpy():
    d, w = te.placeholder((6, 5), name="d"), te.placeholder((8, 5), name="w")
    a, b = _rand(6, 5), _rand(8, 5)
    out = ops.dense(d, w, pack_nr=4)
    np.testing.assert_allclose(_run(out, [d, w], [a, b]), reference.dense(a, b), rtol=1e-5, atol=1e-5)


def test_batch_matmul_matches_numpy():
    x, y = te.placeholder((2, 3, 4), name="x"), te.placeholder((2, 5, 4), name="y")
    a, b = _rand(2, 3, 4), _rand(2, 5, 4)
    np.testing.assert_allclose(_run(ops.batch_matmul(x, y), [x, y], [a, b]), reference.batch_matmul(a, b),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 1, 1), (1, 0, 2), (2, (1, 0, 2, 1), 1)])
def test_conv2d_nchw_matches_numpy(stride, padding, dilation):
    data, kern = te.placeholder((1, 3, 9, 8), name="data"), te.placeholder((4, 3, 3, 3), name="kernel")
    a, k = _rand(1, 3, 9, 8), _rand(4, 3, 3, 3)
    out = ops.conv2d_nchw(data, kern, stride, padding, dilation)
    np.testing.assert_allclose(_run(out, [data, kern], [a, k]), reference.conv2d_nchw(a, k, stride, padding, dilation),
                               rtol=1e-4, atol=1e-4)


def test_conv2d_nchw_with_bias_relu_residual_matches_numpy():
    data, kern = te.placeholder((1, 2, 6, 6), name="data"), te.placeholder((3, 2, 3, 3), name="kernel")
    bias, res = te.placeholder((3,), name="bias"), te.placeholder((1, 3, 6, 6), name="res")
    out = ops.conv2d_nchw(data, kern, 1, 1, bias=bias, relu=True, residual=res)
    arrays = [_rand(1, 2, 6, 6), _rand(3, 2, 3, 3), _rand(3), _rand(1, 3, 6, 6)]
    expected = reference.conv2d_nchw(arrays[0], arrays[1], 1, 1, bias=arrays[2], relu=True, residual=arrays[3])
    np.testing.assert_allclose(_run(out, [data, kern, bias, res], arrays), expected, rtol=1e-4, atol=1e-4)


def test_conv2d_nhwc_matches_numpy():
    data, kern = te.placeholder((1, 7, 7, 3), name="data"), te.placeholder((3, 3, 3, 5), name="kernel")
    a, k = _rand(1, 7, 7, 3), _rand(3, 3, 3, 5)
    out = ops.conv2d_nhwc(data, kern, 2, 1)
    np.testing.assert_allclose(_run(out, [data, kern], [a, k]), reference.conv2d_nhwc(a, k, 2, 1), rtol=1e-4, atol=1e-4)


def test_conv2d_NCHWc_matches_unpacked_numpy_conv():
    ic_bn, oc_bn = 2, 4
    data = te.placeholder((1, 2, 6, 6, ic_bn), name="data")
    kern = te.placeholder((2, 2, 3, 3, ic_bn, oc_bn), name="kernel")
    bias = te.placeholder((2, oc_bn), name="bias")
    a_nchw, k_oihw, b = _rand(1, 4, 6, 6), _rand(8, 4, 3, 3), _rand(8)
    a, k = reference.pack_nchwc(a_nchw, ic_bn), reference.pack_kernel_oihwio(k_oihw, ic_bn, oc_bn)
    out = ops.conv2d_NCHWc(data, kern, 1, 1, bias=bias, relu=True)
    got = _run(out, [data, kern, bias], [a, k, b.reshape(2, oc_bn)])
    expected = reference.pack_nchwc(reference.conv2d_nchw(a_nchw, k_oihw, 1, 1, bias=b, relu=True), oc_bn)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_depthwise_conv2d_nchw_matches_numpy():
    data, kern = te.placeholder((1, 4, 7, 7), name="data"), te.placeholder((4, 2, 3, 3), name="kernel")
    a, k = _rand(1, 4, 7, 7), _rand(4, 2, 3, 3)
    out = ops.depthwise_conv2d_nchw(data, kern, 2, 1)
    np.testing.assert_allclose(_run(out, [data, kern], [a, k]), reference.depthwise_conv2d_nchw(a, k, 2, 1),
                               rtol=1e-4, atol=1e-4)
