"""The built-in workload functions (:mod:`lorien.workload_registry`), and the tuning-YAML op
shorthands that name them. Importing this module registers them.

``matmul_add`` and ``conv2d_layer`` are TVM's tutorial workloads, with the same arguments
and the same ops in the same order (so the steps of TVM's logs replay on them). The
``*_layer`` functions are Lorien's operators with optional fused epilogues (bias, relu)::

    dense_layer(M, N, K, bias, relu, dtype)                   data [M, K], weight [N, K]
    batch_matmul_layer(B, M, N, K, bias, relu, dtype)         x [B, M, K], y [B, N, K]
    conv2d_nchw_layer(N, C, H, W, K, KH, KW, stride, padding, dilation, bias, relu, dtype)
    conv2d_nhwc_layer(N, C, H, W, K, KH, KW, stride, padding, dilation, bias, relu, dtype)
    depthwise_conv2d_nchw_layer(N, C, H, W, multiplier, KH, KW, stride, padding, dilation, bias, relu, dtype)

``stride`` and ``dilation`` are ``[h, w]`` pairs, ``padding`` a pair (top/left = bottom/right)
or four values (top, left, bottom, right).
Each has a NumPy reference from :mod:`lorien.engine.reference`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from lorien.engine import ops, reference, te
from lorien.errors import DialectError, WorkloadError
from lorien.workload import pad4, shorthand_pair, shorthand_params
from lorien.workload_registry import register_workload

# ---------------------------------------------------------------- TVM's tutorial workloads

def _matmul_add_reference(n: int, l_: int, m: int, dtype: str):
    return _matmul_add_numpy


def _matmul_add_numpy(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return a @ b + c


@register_workload("matmul_add", reference=_matmul_add_reference)
def matmul_add(N: int, L: int, M: int, dtype: str) -> list[te.Tensor]:  # noqa: N803 - TVM's argument names
    """``out = A @ B + C`` with A [N, L], B [L, M], C [N, M] (TVM's auto-scheduler tutorial)."""
    a = te.placeholder((N, L), dtype, name="A")
    b = te.placeholder((L, M), dtype, name="B")
    c = te.placeholder((N, M), dtype, name="C")
    k = te.reduce_axis(L, name="k")
    matmul = te.compute((N, M), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul", tag="matmul")
    out = te.compute((N, M), lambda i, j: matmul[i, j] + c[i, j], name="out")
    return [a, b, c, out]


def _conv2d_layer_reference(n, h, w, co, ci, kh, kw, stride, padding):
    return functools.partial(_conv2d_layer_numpy, stride=_pair(stride), padding=_pair(padding))


def _conv2d_layer_numpy(data, kernel, bias, stride, padding) -> np.ndarray:
    return reference.conv2d_nchw(data, kernel, stride, padding, bias=bias.reshape(-1), relu=True)


@register_workload("conv2d_layer", reference=_conv2d_layer_reference)
def conv2d_layer(N, H, W, CO, CI, KH, KW, stride, padding) -> list[te.Tensor]:  # noqa: N803
    """``relu(conv2d_nchw(data, kernel) + bias)`` with bias [1, CO, 1, 1] (TVM's tutorial):
    stages data, pad_temp, kernel, conv, bias, add, relu."""
    data = te.placeholder((N, CI, H, W), name="data")
    kernel = te.placeholder((CO, CI, KH, KW), name="kernel")
    bias = te.placeholder((1, CO, 1, 1), name="bias")
    conv = ops.conv2d_nchw(data, kernel, _pair(stride), _pair(padding), name="conv2d")
    added = te.compute(conv.shape, lambda n, f, y, x: conv[n, f, y, x] + bias[0, f, 0, 0], name="T_add")
    out = te.compute(conv.shape, lambda n, f, y, x: te.maximum(added[n, f, y, x], 0.0), name="T_relu")
    return [data, kernel, bias, out]


# ---------------------------------------------------------------- Lorien's operators

def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[1])


def _bias(size: int, dtype: str, wanted: bool) -> te.Tensor | None:
    return te.placeholder((size,), dtype, name="bias") if wanted else None


def _io(*tensors: te.Tensor | None) -> list[te.Tensor]:
    return [t for t in tensors if t is not None]


def _op_numpy(name: str, with_bias: bool, relu: bool, params: dict[str, Any], *inputs: np.ndarray) -> np.ndarray:
    bias = inputs[2] if with_bias else None
    return getattr(reference, name)(inputs[0], inputs[1], bias=bias, relu=relu, **params)


def _dense_reference(M, N, K, bias, relu, dtype):  # noqa: N803
    return functools.partial(_op_numpy, "dense", bias, relu, {})


@register_workload("dense_layer", reference=_dense_reference)
def dense_layer(M: int, N: int, K: int, bias: bool, relu: bool, dtype: str) -> list[te.Tensor]:  # noqa: N803
    """``data [M, K] x weight [N, K]^T`` (+bias [N], relu)."""
    data, weight = te.placeholder((M, K), dtype, name="data"), te.placeholder((N, K), dtype, name="weight")
    b = _bias(N, dtype, bias)
    return _io(data, weight, b, ops.dense(data, weight, bias=b, relu=relu))


def _batch_matmul_reference(B, M, N, K, bias, relu, dtype):  # noqa: N803
    return functools.partial(_op_numpy, "batch_matmul", bias, relu, {})


@register_workload("batch_matmul_layer", reference=_batch_matmul_reference)
def batch_matmul_layer(B: int, M: int, N: int, K: int, bias: bool, relu: bool,  # noqa: N803
                       dtype: str) -> list[te.Tensor]:
    """``x [B, M, K] x y [B, N, K]^T`` per batch (+bias [N], relu)."""
    x, y = te.placeholder((B, M, K), dtype, name="x"), te.placeholder((B, N, K), dtype, name="y")
    b = _bias(N, dtype, bias)
    return _io(x, y, b, ops.batch_matmul(x, y, bias=b, relu=relu))


def _conv_params(stride, padding, dilation) -> dict[str, Any]:
    return {"stride": _pair(stride), "padding": tuple(padding) if isinstance(padding, list) else padding,
            "dilation": _pair(dilation)}


def _conv2d_nchw_reference(N, C, H, W, K, KH, KW, stride, padding, dilation, bias, relu, dtype):  # noqa: N803
    return functools.partial(_op_numpy, "conv2d_nchw", bias, relu, _conv_params(stride, padding, dilation))


def _window_layer(op: Any, data_shape: tuple, kernel_shape: tuple, channels: int, stride, padding, dilation,
                  bias: bool, relu: bool, dtype: str) -> list[te.Tensor]:
    """I/O tensors of a convolution op: data, kernel, optional bias [channels], output."""
    data = te.placeholder(data_shape, dtype, name="data")
    kernel = te.placeholder(kernel_shape, dtype, name="kernel")
    b = _bias(channels, dtype, bias)
    return _io(data, kernel, b, op(data, kernel, bias=b, relu=relu, **_conv_params(stride, padding, dilation)))


@register_workload("conv2d_nchw_layer", reference=_conv2d_nchw_reference)
def conv2d_nchw_layer(N, C, H, W, K, KH, KW, stride, padding, dilation, bias, relu, dtype):  # noqa: N803
    """conv2d, data NCHW [N, C, H, W], kernel OIHW [K, C, KH, KW] (+bias [K], relu)."""
    return _window_layer(ops.conv2d_nchw, (N, C, H, W), (K, C, KH, KW), K, stride, padding, dilation, bias, relu,
                         dtype)


def _conv2d_nhwc_reference(N, C, H, W, K, KH, KW, stride, padding, dilation, bias, relu, dtype):  # noqa: N803
    return functools.partial(_op_numpy, "conv2d_nhwc", bias, relu, _conv_params(stride, padding, dilation))


@register_workload("conv2d_nhwc_layer", reference=_conv2d_nhwc_reference)
def conv2d_nhwc_layer(N, C, H, W, K, KH, KW, stride, padding, dilation, bias, relu, dtype):  # noqa: N803
    """conv2d, data NHWC [N, H, W, C], kernel HWIO [KH, KW, C, K] (+bias [K], relu)."""
    return _window_layer(ops.conv2d_nhwc, (N, H, W, C), (KH, KW, C, K), K, stride, padding, dilation, bias, relu,
                         dtype)


def _depthwise_reference(N, C, H, W, multiplier, KH, KW, stride, padding, dilation, bias, relu, dtype):  # noqa: N803
    return functools.partial(_op_numpy, "depthwise_conv2d_nchw", bias, relu, _conv_params(stride, padding, dilation))


@register_workload("depthwise_conv2d_nchw_layer", reference=_depthwise_reference)
def depthwise_conv2d_nchw_layer(N, C, H, W, multiplier, KH, KW, stride, padding, dilation, bias,  # noqa: N803
                                relu, dtype):
    """Depthwise conv2d, data NCHW, kernel [C, multiplier, KH, KW] (+bias [C*multiplier], relu)."""
    return _window_layer(ops.depthwise_conv2d_nchw, (N, C, H, W), (C, multiplier, KH, KW), C * multiplier, stride,
                         padding, dilation, bias, relu, dtype)


# ---------------------------------------------------------------- tuning-YAML shorthands

#: Layouts the ``conv2d`` shorthand takes, and the workload function of each.
CONV2D_LAYOUTS = {"NHWC": "conv2d_nhwc_layer", "NCHW": "conv2d_nchw_layer"}
SHORTHANDS = ("dense", "batch_matmul", "conv2d", "depthwise_conv2d")
_EPILOGUE = {"bias": False, "relu": False, "dtype": "float32"}
_WINDOW = {"N": 1, "kernel": 3, "stride": 1, "padding": 0, "dilation": 1}


def _padding(value: Any) -> list[int]:
    """``[h, w]`` of an int or a pair, or the four values (top, left, bottom, right) as given."""
    if isinstance(value, list) and len(value) == 4:
        try:
            return list(pad4(value))
        except (WorkloadError, TypeError, ValueError) as exc:
            raise DialectError(f"padding must be an int, a pair or four ints, got {value!r}") from exc
    return shorthand_pair(value, "padding")


def _flag(params: dict[str, Any], op: str, key: str) -> bool:
    if not isinstance(params[key], bool):
        raise DialectError(f"{op}: {key} must be true or false, got {params[key]!r}")
    return params[key]


def expand_workload(op: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """(workload function, args) of a shorthand such as ``conv2d: {C: 64, H: 56, W: 56, K: 64}``.

    ``conv2d`` is NHWC unless ``layout: NCHW`` (NHWC suits template-free CPU schedules: the
    innermost output axis is the channel, contiguous in the kernel). Every op takes
    ``bias`` and ``relu`` (a fused epilogue) and ``dtype``.
    """
    if op == "dense":
        p = shorthand_params(params, op, ("M", "N", "K"), _EPILOGUE)
        return "dense_layer", [p["M"], p["N"], p["K"], _flag(p, op, "bias"), _flag(p, op, "relu"), p["dtype"]]
    if op == "batch_matmul":
        p = shorthand_params(params, op, ("B", "M", "N", "K"), _EPILOGUE)
        return "batch_matmul_layer", [p["B"], p["M"], p["N"], p["K"], _flag(p, op, "bias"), _flag(p, op, "relu"),
                                      p["dtype"]]
    if op == "conv2d":
        p = shorthand_params(params, op, ("C", "H", "W", "K"), {**_WINDOW, **_EPILOGUE, "layout": "NHWC",
                                                                "groups": 1})
        if p["groups"] != 1:
            raise DialectError(f"conv2d: groups={p['groups']}: no grouped convolution workload yet (a depthwise "
                               "convolution, groups == C, is depthwise_conv2d)")
        if p["layout"] not in CONV2D_LAYOUTS:
            raise DialectError(f"conv2d: the built-in conv2d workloads have layouts {sorted(CONV2D_LAYOUTS)}, "
                               f"got {p['layout']!r}")
        kh, kw = shorthand_pair(p["kernel"], "kernel")
        return CONV2D_LAYOUTS[p["layout"]], [
            p["N"], p["C"], p["H"], p["W"], p["K"], kh, kw, shorthand_pair(p["stride"], "stride"),
            _padding(p["padding"]), shorthand_pair(p["dilation"], "dilation"),
            _flag(p, op, "bias"), _flag(p, op, "relu"), p["dtype"]]
    if op == "depthwise_conv2d":
        p = shorthand_params(params, op, ("C", "H", "W"), {**_WINDOW, **_EPILOGUE, "multiplier": 1})
        kh, kw = shorthand_pair(p["kernel"], "kernel")
        return "depthwise_conv2d_nchw_layer", [
            p["N"], p["C"], p["H"], p["W"], p["multiplier"], kh, kw, shorthand_pair(p["stride"], "stride"),
            _padding(p["padding"]), shorthand_pair(p["dilation"], "dilation"),
            _flag(p, op, "bias"), _flag(p, op, "relu"), p["dtype"]]
    raise DialectError(f"unknown op shorthand {op!r} (known: {', '.join(SHORTHANDS)})")


#: The layout of the convolutions ``lorien extract`` finds in ONNX and torch models.
MODEL_CONV_LAYOUT = "NCHW"
#: Epilogue parts the built-in workloads fuse (``bias``, ``relu`` flags).
FUSED_EPILOGUE_PARTS = ("bias", "relu")


def expand_model_task(op: str, params: dict[str, Any], epilogue: dict[str, int], dialect: str) -> tuple[str, list[Any]]:
    """(workload function, args) of a task ``lorien extract`` found in models, for a dialect that
    fuses epilogues into its tasks (auto_scheduler, meta_schedule): the op in the model's layout
    (a ``conv2d`` is NCHW unless the entry gives ``layout``) with the one epilogue pattern the
    model has after it (``bias``, ``relu``, ``bias+relu``). What the built-in workloads cannot
    compute as the model does is a DialectError naming the op, its layout and the epilogue:
    a part they do not fuse (a residual ``add``, ``relu6``), or several different patterns in
    one task (the occurrences differ: one computation each). ``bias``/``relu`` given in the
    entry say what to tune and are taken as given."""
    params = dict(params)
    layout = ""
    if op == "conv2d":
        params.setdefault("layout", MODEL_CONV_LAYOUT)
        layout = f" (layout {params['layout']})"
    elif op == "depthwise_conv2d":
        layout = f" (layout {MODEL_CONV_LAYOUT})"
    if "bias" in params or "relu" in params or not epilogue:
        return expand_workload(op, params)
    shape = ", ".join(f"{key}={value}" for key, value in params.items() if key != "layout")
    what = f"{op} {{{shape}}}{layout}"
    ways = ("give the entry's bias and relu to choose the one computation tuned for every occurrence, or use "
            "lorien extract --dialect meta_schedule (TVM's fused tasks; needs apache-tvm)")
    if len(epilogue) > 1:
        seen = ", ".join(f"{pattern} x{count}" for pattern, count in
                         sorted(epilogue.items(), key=lambda item: (-item[1], item[0])))
        raise DialectError(f"{what}: the models have {len(epilogue)} different epilogues after it ({seen}); the "
                           f"{dialect} dialect tunes an op with its epilogue fused, one computation per task: {ways}")
    (pattern,) = epilogue
    parts = pattern.split("+")
    unfused = [part for part in parts if part not in FUSED_EPILOGUE_PARTS]
    if unfused:
        raise DialectError(f"{what}: epilogue {pattern!r}: the {dialect} dialect's built-in {op} workloads fuse "
                           f"{' and '.join(FUSED_EPILOGUE_PARTS)} only, not {', '.join(unfused)}: {ways}")
    params.update(bias="bias" in parts, relu="relu" in parts)
    return expand_workload(op, params)
