"""NumPy references for every operator in ``lorien.engine.ops`` (same conventions and epilogues).

All functions are module-level so they pickle (measurement workers receive them by reference).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from lorien.engine.ops import _padding, _pair


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


#: NumPy of the DSL's elementwise calls (``max``, ``min`` and :data:`lorien.engine.te.INTRINSICS`).
NUMPY_CALLS = {
    "max": np.maximum, "min": np.minimum, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh, "erf": _erf,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "fabs": np.abs, "pow": np.power,
}


def _epilogue(out: np.ndarray, bias: np.ndarray | None, bias_shape: tuple, relu: bool,
              residual: np.ndarray | None) -> np.ndarray:
    if bias is not None:
        out = out + bias.reshape(bias_shape)
    if residual is not None:
        out = out + residual
    if relu:
        out = np.maximum(out, 0)
    return out.astype(np.float32, copy=False)


def dense(data: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, relu: bool = False,
          residual: np.ndarray | None = None) -> np.ndarray:
    return _epilogue(data @ weight.T, bias, (1, -1), relu, residual)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


def batch_matmul(x: np.ndarray, y: np.ndarray, bias: np.ndarray | None = None, relu: bool = False) -> np.ndarray:
    return _epilogue(x @ np.swapaxes(y, 1, 2), bias, (1, 1, -1), relu, None)


def _windows(data_nchw: np.ndarray, kh: int, kw: int, stride, padding, dilation) -> np.ndarray:
    """[N, C, OH, OW, KH, KW] view of the padded input."""
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _pair(stride), _pair(dilation), _padding(padding)
    padded = np.pad(data_nchw, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = sliding_window_view(padded, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    return win[:, :, ::sh, ::sw, ::dh, ::dw]


def conv2d_nchw(data: np.ndarray, kernel: np.ndarray, stride=1, padding=0, dilation=1,
                bias: np.ndarray | None = None, relu: bool = False, residual: np.ndarray | None = None) -> np.ndarray:
    win = _windows(data, kernel.shape[2], kernel.shape[3], stride, padding, dilation)
    out = np.einsum("ncyxhw,ochw->noyx", win, kernel, optimize=True)
    return _epilogue(out, bias, (1, -1, 1, 1), relu, residual)


def conv2d_nhwc(data: np.ndarray, kernel: np.ndarray, stride=1, padding=0, dilation=1,
                bias: np.ndarray | None = None, relu: bool = False, residual: np.ndarray | None = None) -> np.ndarray:
    out = conv2d_nchw(data.transpose(0, 3, 1, 2), kernel.transpose(3, 2, 0, 1), stride, padding, dilation)
    return _epilogue(out.transpose(0, 2, 3, 1), bias, (1, 1, 1, -1), relu, residual)


def pack_nchwc(data: np.ndarray, bn: int) -> np.ndarray:
    """NCHW -> NCHW{bn}c."""
    n, c, h, w = data.shape
    return np.ascontiguousarray(data.reshape(n, c // bn, bn, h, w).transpose(0, 1, 3, 4, 2))


def unpack_nchwc(data: np.ndarray) -> np.ndarray:
    """NCHW{bn}c -> NCHW."""
    n, cc, h, w, bn = data.shape
    return np.ascontiguousarray(data.transpose(0, 1, 4, 2, 3).reshape(n, cc * bn, h, w))


def pack_kernel_oihwio(kernel: np.ndarray, ic_bn: int, oc_bn: int) -> np.ndarray:
    """OIHW -> OIHW{ic_bn}i{oc_bn}o."""
    o, i, kh, kw = kernel.shape
    k = kernel.reshape(o // oc_bn, oc_bn, i // ic_bn, ic_bn, kh, kw)
    return np.ascontiguousarray(k.transpose(0, 2, 4, 5, 3, 1))


def conv2d_NCHWc(data: np.ndarray, kernel: np.ndarray, stride=1, padding=0, dilation=1,
                 bias: np.ndarray | None = None, relu: bool = False, residual: np.ndarray | None = None) -> np.ndarray:
    oc_chunk, ic_chunk, kh, kw, ic_bn, oc_bn = kernel.shape
    kernel_oihw = kernel.transpose(0, 5, 1, 4, 2, 3).reshape(oc_chunk * oc_bn, ic_chunk * ic_bn, kh, kw)
    out = pack_nchwc(conv2d_nchw(unpack_nchwc(data), kernel_oihw, stride, padding, dilation), oc_bn)
    return _epilogue(out, bias, (1, oc_chunk, 1, 1, oc_bn), relu, residual)


def depthwise_conv2d_nchw(data: np.ndarray, kernel: np.ndarray, stride=1, padding=0, dilation=1,
                          bias: np.ndarray | None = None, relu: bool = False) -> np.ndarray:
    c, mult, kh, kw = kernel.shape
    win = _windows(data, kh, kw, stride, padding, dilation)
    out = np.einsum("ncyxhw,cmhw->ncmyx", win, kernel, optimize=True)
    n, _, _, oh, ow = out.shape
    return _epilogue(out.reshape(n, c * mult, oh, ow), bias, (1, -1, 1, 1), relu, None)


def pack_depthwise_kernel(kernel: np.ndarray, bn: int) -> np.ndarray:
    """[C, 1, KH, KW] -> [C/bn, 1, KH, KW, 1, bn] (depthwise NCHWc)."""
    c, mult, kh, kw = kernel.shape
    if mult != 1:
        raise ValueError(f"pack_depthwise_kernel: multiplier {mult}, only 1 is packed")
    return np.ascontiguousarray(kernel.reshape(c // bn, bn, kh, kw).transpose(0, 2, 3, 1)
                                .reshape(c // bn, 1, kh, kw, 1, bn))


def depthwise_conv2d_NCHWc(data: np.ndarray, kernel: np.ndarray, stride=1, padding=0, dilation=1,
                           bias: np.ndarray | None = None, relu: bool = False) -> np.ndarray:
    chunks, _, kh, kw, _, bn = kernel.shape
    plain = kernel.reshape(chunks, kh, kw, bn).transpose(0, 3, 1, 2).reshape(chunks * bn, 1, kh, kw)
    out = pack_nchwc(depthwise_conv2d_nchw(unpack_nchwc(data), plain, stride, padding, dilation), bn)
    return _epilogue(out, bias, (1, chunks, 1, 1, bn), relu, None)
