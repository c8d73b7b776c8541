"""Workloads: readable AutoTVM workload keys, JSON workload keys (``[func_name_or_hash, args...]``),
layout inference and FLOP counting.

An AutoTVM workload is ``(task_name, args)`` exactly as a TVM log line carries it, e.g.
``("conv2d_NCHWc.x86", [["TENSOR", [1, 3, 224, 224], "float32"], ..., "float32"])``.

Conventions (see docs/formats.md):

- **Layout** is the data layout of the operator's input tensor: ``NCHW``, ``NHWC``,
  ``HWCN``, ``NCW``, ``NCDHW``, ``NDHWC``, packed forms such as ``NCHW8c`` or ``NCHW1n16c``.
  Operators without a data layout (dense, batch_matmul, matmul) and operators whose layout
  cannot be told from their arguments get :data:`LAYOUT_NA` (``"NA"``). A layout is never
  the empty string, so it can always name a partition.
- **FLOP** counts 2 per multiply-accumulate of the main computation (padding and layout
  packing count nothing); Winograd convolutions count as the direct convolution they compute;
  transposed convolutions count every input pixel times every kernel tap. An operator Lorien
  cannot count gets ``None`` ("unknown") and one warning per task name, never a guess.
  The count of a computation the engine's DSL describes is :func:`lorien.engine.te.flop`;
  :func:`compute_flop` gives the same number from a log's arguments alone, for the TopHub
  operators that have no compute definition here (Winograd, VTA, conv3d, transposed), and a
  test holds it equal to the DSL count for the operators that have one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from lorien.errors import DialectError, WorkloadError

logger = logging.getLogger(__name__)

#: Layout of operators that have no data layout, or whose layout cannot be inferred.
LAYOUT_NA = "NA"

_warned_task_names: set[str] = set()
#: The text every "FLOPs unknown" warning starts with (lorien.workload and lorien.formats.tir).
FLOP_UNKNOWN = "flop unknown for "


def warn_unknown_flop(task_name: str, reason: str) -> None:
    """Log once per task name that its FLOP count is unknown, and why."""
    if task_name not in _warned_task_names:
        _warned_task_names.add(task_name)
        logger.warning(FLOP_UNKNOWN + "task %r: %s", task_name, reason)


class _DropFlopUnknown(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(FLOP_UNKNOWN)


@contextlib.contextmanager
def flop_warnings_counted_by_caller() -> Iterator[None]:
    """Silence the per-workload "flop unknown" warnings in this process (and in processes it
    forks meanwhile), for a caller that counts the records without FLOPs and says so once
    (``lorien ingest`` does, per file)."""
    silencer = _DropFlopUnknown()
    loggers = [logging.getLogger(name) for name in (__name__, "lorien.formats.tir")]
    for each in loggers:
        each.addFilter(silencer)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(silencer)


# ---------------------------------------------------------------- argument helpers

def _tensor_shape(arg: Any) -> list[int] | None:
    """Shape of a ``["TENSOR", shape, dtype, ...]`` argument, or None."""
    if (isinstance(arg, (list, tuple)) and len(arg) >= 3 and arg[0] == "TENSOR"
            and isinstance(arg[1], (list, tuple)) and all(isinstance(d, int) for d in arg[1])):
        return list(arg[1])
    return None


def _pair(value: Any, default: int) -> tuple[int, ...]:
    if value is None:
        return (default, default)
    if isinstance(value, int):
        return (value, value)
    return tuple(int(v) for v in value)


def pad4(value: Any) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) padding from TVM's int / 2-list / 4-list forms."""
    if isinstance(value, int):
        return (value, value, value, value)
    values = [int(v) for v in value]
    if len(values) == 1:
        return (values[0],) * 4  # type: ignore[return-value]
    if len(values) == 2:
        return (values[0], values[1], values[0], values[1])
    if len(values) == 4:
        return (values[0], values[1], values[2], values[3])
    raise WorkloadError(f"padding {value!r} is not an int, a pair or four values")


def out_size(size: int, kernel: int, stride: int, pad_total: int, dilation: int) -> int:
    """Output extent of a convolution window along one axis."""
    return (size + pad_total - ((kernel - 1) * dilation + 1)) // stride + 1


def _arg(args: Sequence[Any], index: int, default: Any = None) -> Any:
    return args[index] if len(args) > index else default


def _conv2d_out_hw(args: Sequence[Any], h: int, w: int, kh: int, kw: int,
                   stride_i: int = 2, pad_i: int = 3, dil_i: int = 4) -> tuple[int, int]:
    sh, sw = _pair(_arg(args, stride_i), 1)[:2]
    top, left, bottom, right = pad4(_arg(args, pad_i, 0))
    dh, dw = _pair(_arg(args, dil_i), 1)[:2]
    return out_size(h, kh, sh, top + bottom, dh), out_size(w, kw, sw, left + right, dw)


def _shapes(args: Sequence[Any], ranks: tuple[int, int]) -> tuple[list[int], list[int]]:
    data, kernel = _tensor_shape(_arg(args, 0)), _tensor_shape(_arg(args, 1))
    if data is None or kernel is None or len(data) != ranks[0] or len(kernel) != ranks[1]:
        raise WorkloadError(f"expected a {ranks[0]}-d data and a {ranks[1]}-d kernel tensor, got {list(args[:2])!r}")
    return data, kernel


def shorthand_pair(value: Any, name: str) -> list[int]:
    """``[h, w]`` of a tuning-YAML shorthand's int-or-pair parameter (kernel, stride, ...)."""
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return list(value)
    raise DialectError(f"{name} must be an int or a pair of ints, got {value!r}")


def shorthand_params(params: dict[str, Any], op: str, required: tuple[str, ...],
                     optional: dict[str, Any]) -> dict[str, Any]:
    """The parameters of a tuning-YAML op shorthand with defaults filled in; required ones must
    be positive integers and no unknown key is allowed (DialectError names them)."""
    unknown = set(params) - set(required) - set(optional)
    missing = [key for key in required if key not in params]
    if unknown or missing:
        raise DialectError(f"{op}: missing {missing}, unknown {sorted(unknown)} "
                           f"(takes {list(required)} and optionally {sorted(optional)})")
    values = {**optional, **params}
    for key in required:
        if not isinstance(values[key], int) or values[key] < 1:
            raise DialectError(f"{op}: {key} must be a positive integer, got {values[key]!r}")
    return values


# ---------------------------------------------------------------- FLOP formulas

def _flop_conv2d_nchw(args: Sequence[Any]) -> float:
    (n, ci, h, w), (co, _, kh, kw) = _shapes(args, (4, 4))
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * co * oh * ow * ci * kh * kw


def _flop_conv2d_nhwc(args: Sequence[Any]) -> float:
    (n, h, w, ci), (kh, kw, _, co) = _shapes(args, (4, 4))
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * co * oh * ow * ci * kh * kw


def _flop_conv2d_hwcn(args: Sequence[Any]) -> float:
    (h, w, ci, n), (kh, kw, _, co) = _shapes(args, (4, 4))
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * co * oh * ow * ci * kh * kw


def _flop_conv2d_packed(args: Sequence[Any]) -> float:
    """NCHW[x]c (5-d data, 6-d kernel), VTA's NCHW[n]n[c]c (6-d), or plain NCHW/OIHW args."""
    data, kernel = _tensor_shape(_arg(args, 0)), _tensor_shape(_arg(args, 1))
    if data is not None and kernel is not None and len(data) == 4 and len(kernel) == 4:
        return _flop_conv2d_nchw(args)
    if data is not None and kernel is not None and len(data) == 5 and len(kernel) == 6:
        n, ci, h, w = data[0], data[1] * data[4], data[2], data[3]
        co, kh, kw = kernel[0] * kernel[5], kernel[2], kernel[3]
    elif data is not None and kernel is not None and len(data) == 6 and len(kernel) == 6:
        n, ci, h, w = data[0] * data[4], data[1] * data[5], data[2], data[3]
        co, kh, kw = kernel[0] * kernel[4], kernel[2], kernel[3]
    else:
        raise WorkloadError(f"packed conv2d needs 4-d/4-d, 5-d/6-d or 6-d/6-d tensors, got {list(args[:2])!r}")
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * co * oh * ow * ci * kh * kw


def _flop_group_conv2d_packed(args: Sequence[Any]) -> float:
    data, kernel = _shapes(args, (6, 6))
    n, h, w = data[0] * data[4], data[2], data[3]
    co, ci_per_group, kh, kw = kernel[0] * kernel[4], kernel[1] * kernel[5], kernel[2], kernel[3]
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * co * oh * ow * ci_per_group * kh * kw


def _flop_group_conv2d_nchw(args: Sequence[Any]) -> float:
    (n, _, h, w), (co, ci_per_group, kh, kw) = _shapes(args, (4, 4))
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * co * oh * ow * ci_per_group * kh * kw


def _flop_depthwise_nchw(args: Sequence[Any]) -> float:
    (n, c, h, w), (_, multiplier, kh, kw) = _shapes(args, (4, 4))
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * c * multiplier * oh * ow * kh * kw


def _flop_depthwise_nhwc(args: Sequence[Any]) -> float:
    (n, h, w, c), (kh, kw, _, multiplier) = _shapes(args, (4, 4))
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * c * multiplier * oh * ow * kh * kw


def _flop_depthwise_nchwc(args: Sequence[Any]) -> float:
    shapes = [_tensor_shape(_arg(args, i)) for i in (0, 1)]
    if [len(shape or ()) for shape in shapes] == [4, 4]:  # the task's NCHW data and [C, multiplier, KH, KW] kernel
        return _flop_depthwise_nchw(args)
    data, kernel = _shapes(args, (5, 6))
    n, h, w = data[0], data[2], data[3]
    co, kh, kw = kernel[0] * kernel[5], kernel[2], kernel[3]
    oh, ow = _conv2d_out_hw(args, h, w, kh, kw)
    return 2.0 * n * co * oh * ow * kh * kw


def _flop_transpose(args: Sequence[Any]) -> float:
    """Transposed convolution: every input pixel meets every kernel tap (any rank, any packing)."""
    data, kernel = _tensor_shape(_arg(args, 0)), _tensor_shape(_arg(args, 1))
    if data is None or kernel is None or len(data) not in (3, 4, 5, 6):
        raise WorkloadError(f"transposed convolution needs data and kernel tensors, got {list(args[:2])!r}")
    if len(data) == 6:  # VTA NCHW[n]n[c]c: batch = N * n, spatial = H, W
        batch, spatial = data[0] * data[4], data[2] * data[3]
    else:  # NCW / NCHW / NCDHW
        batch, spatial = data[0], math.prod(data[2:])
    return 2.0 * batch * spatial * math.prod(kernel)


def _flop_conv1d_ncw(args: Sequence[Any]) -> float:
    (n, ci, w), (co, _, kw) = _shapes(args, (3, 3))
    stride = _pair(_arg(args, 2), 1)[0]
    pad = _arg(args, 3, 0)
    pad_total = 2 * pad if isinstance(pad, int) else sum(pad) if len(pad) == 2 else 2 * pad[0]
    dilation = _pair(_arg(args, 4), 1)[0]
    return 2.0 * n * co * out_size(w, kw, stride, pad_total, dilation) * ci * kw


def _conv3d_out(args: Sequence[Any], spatial: Sequence[int], kernel: Sequence[int]) -> list[int]:
    strides = _arg(args, 2, 1)
    strides = [strides] * 3 if isinstance(strides, int) else list(strides)
    pad = _arg(args, 3, 0)
    pad = [pad] * 3 if isinstance(pad, int) else list(pad)
    totals = [2 * p for p in pad] if len(pad) == 3 else [pad[i] + pad[i + 3] for i in range(3)]
    dil = _arg(args, 4, 1)
    dil = [dil] * 3 if isinstance(dil, int) else list(dil)
    return [out_size(spatial[i], kernel[i], strides[i], totals[i], dil[i]) for i in range(3)]


def _flop_conv3d_ncdhw(args: Sequence[Any]) -> float:
    (n, ci, *spatial), (co, _, *taps) = _shapes(args, (5, 5))
    return 2.0 * n * co * math.prod(_conv3d_out(args, spatial, taps)) * ci * math.prod(taps)


def _flop_conv3d_ndhwc(args: Sequence[Any]) -> float:
    data, kernel = _shapes(args, (5, 5))
    n, spatial, ci = data[0], data[1:4], data[4]
    taps, co = kernel[0:3], kernel[4]
    return 2.0 * n * co * math.prod(_conv3d_out(args, spatial, taps)) * ci * math.prod(taps)


def _flop_dense(args: Sequence[Any]) -> float:
    (m, k), (n, _) = _shapes(args, (2, 2))
    return 2.0 * m * n * k


def _flop_dense_packed(args: Sequence[Any]) -> float:
    (b_outer, k_outer, b_inner, k_inner), (n_outer, _, n_inner, _) = _shapes(args, (4, 4))
    return 2.0 * b_outer * b_inner * n_outer * n_inner * k_outer * k_inner


def _flop_batch_matmul(args: Sequence[Any]) -> float:
    x, y = _shapes(args, (3, 3))
    transpose_a = _arg(args, 4, False) is True
    transpose_b = _arg(args, 5, True) is not False
    batch = max(x[0], y[0])
    m, k = (x[2], x[1]) if transpose_a else (x[1], x[2])
    n = y[1] if transpose_b else y[2]
    return 2.0 * batch * m * n * k


# ---------------------------------------------------------------- the operator table

#: What a layout argument looks like (``NCHW``, ``NCHW8c``, ``OIHW16i16o``); records are
#: partitioned by layout, so anything else (a damaged log's text) is not taken as one.
_LAYOUT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]{0,31}")


def _layout_from_arg(index: int, fallback: str) -> Callable[[Sequence[Any]], str]:
    def infer(args: Sequence[Any]) -> str:
        value = _arg(args, index)
        return value if isinstance(value, str) and _LAYOUT_NAME.fullmatch(value) else fallback
    return infer


def _layout_nchwc(args: Sequence[Any]) -> str:
    data = _tensor_shape(_arg(args, 0))
    if data is not None and len(data) == 5:
        return f"NCHW{data[4]}c"
    return _layout_from_arg(5, "NCHW")(args)


def _layout_vta(args: Sequence[Any]) -> str:
    data = _tensor_shape(_arg(args, 0))
    if data is not None and len(data) == 6:
        return f"NCHW{data[4]}n{data[5]}c"
    return LAYOUT_NA


def _fixed(layout: str) -> Callable[[Sequence[Any]], str]:
    return lambda args: layout


_NCHW, _NHWC, _NA = _fixed("NCHW"), _fixed("NHWC"), _fixed(LAYOUT_NA)

#: Operator stem (task name before the first ".") -> (layout inference, FLOP formula).
OPERATORS: dict[str, tuple[Callable[[Sequence[Any]], str], Callable[[Sequence[Any]], float]]] = {
    "conv2d_nchw": (_NCHW, _flop_conv2d_nchw),
    "conv2d_nchw_winograd": (_NCHW, _flop_conv2d_nchw),
    "conv2d_nchw_spatial_pack": (_NCHW, _flop_conv2d_nchw),
    "conv2d_nchw_int8": (_NCHW, _flop_conv2d_nchw),
    "conv2d_nchw_direct": (_NCHW, _flop_conv2d_nchw),
    "conv2d_nhwc": (_NHWC, _flop_conv2d_nhwc),
    "conv2d_nhwc_spatial_pack": (_NHWC, _flop_conv2d_nhwc),
    "conv2d_nhwc_winograd_direct": (_NHWC, _flop_conv2d_nhwc),
    "conv2d_hwcn": (_fixed("HWCN"), _flop_conv2d_hwcn),
    "conv2d_NCHWc": (_layout_nchwc, _flop_conv2d_packed),
    "conv2d_NCHWc_int8": (_layout_nchwc, _flop_conv2d_packed),
    "conv2d_packed": (_layout_vta, _flop_conv2d_packed),
    "group_conv2d_packed": (_layout_vta, _flop_group_conv2d_packed),
    "group_conv2d_nchw": (_NCHW, _flop_group_conv2d_nchw),
    "depthwise_conv2d_nchw": (_NCHW, _flop_depthwise_nchw),
    "depthwise_conv2d_nhwc": (_NHWC, _flop_depthwise_nhwc),
    "depthwise_conv2d_NCHWc": (_layout_nchwc, _flop_depthwise_nchwc),
    "conv2d_transpose_nchw": (_NCHW, _flop_transpose),
    "conv2d_transpose_packed": (_layout_vta, _flop_transpose),
    "conv1d_transpose_nchw": (_fixed("NCW"), _flop_transpose),
    "conv1d_transpose_ncw": (_fixed("NCW"), _flop_transpose),
    "conv1d_ncw": (_fixed("NCW"), _flop_conv1d_ncw),
    "conv3d_ncdhw": (_fixed("NCDHW"), _flop_conv3d_ncdhw),
    "conv3d_ndhwc": (_fixed("NDHWC"), _flop_conv3d_ndhwc),
    "dense": (_NA, _flop_dense),
    "dense_nopack": (_NA, _flop_dense),
    "dense_gemv": (_NA, _flop_dense),
    "dense_pack": (_NA, _flop_dense),
    "dense_small_batch": (_NA, _flop_dense),
    "dense_large_batch": (_NA, _flop_dense),
    "dense_tensorcore": (_NA, _flop_dense),
    "dense_int8": (_NA, _flop_dense),
    "dense_packed": (_NA, _flop_dense_packed),
    "batch_matmul": (_NA, _flop_batch_matmul),
    "batch_matmul_tensorcore": (_NA, _flop_batch_matmul),
    "batch_matmul_int8": (_NA, _flop_batch_matmul),
}


def operator_stem(task_name: str) -> str:
    """``conv2d_NCHWc.x86`` -> ``conv2d_NCHWc`` (the operator, without the strategy suffix)."""
    return task_name.split(".", 1)[0]


def infer_layout(task_name: str, args: Sequence[Any]) -> str:
    """Data layout of an AutoTVM workload's input (``"NA"`` when none applies or is known)."""
    entry = OPERATORS.get(operator_stem(task_name))
    if entry is None:
        return LAYOUT_NA
    return entry[0](args)


def _countable(flop: float) -> float:
    """A FLOP count a formula gave, if it is one: finite and not negative (arguments past what a
    double holds, or sizes that make a negative output extent, give none)."""
    if not math.isfinite(flop) or flop < 0:
        raise ValueError(f"the formula gives {flop} FLOP")
    return flop


def compute_flop(task_name: str, args: Sequence[Any]) -> float | None:
    """FLOP count of an AutoTVM workload, or None (with one warning per task name) if unknown."""
    entry = OPERATORS.get(operator_stem(task_name))
    if entry is None:
        warn_unknown_flop(task_name, "no FLOP formula for this operator")
        return None
    try:
        return _countable(entry[1](args))
    except (WorkloadError, TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError) as exc:
        warn_unknown_flop(task_name, f"arguments {list(args)!r} do not fit its formula ({exc})")
        return None


def negative_dimension(args: Sequence[Any]) -> list[Any] | None:
    """The first tensor argument (``["TENSOR", ...]``, AutoTVM's and MetaSchedule's form) whose
    shape has a negative dimension, or None: no tensor has one, so a record naming it is damaged."""
    for arg in args:
        if isinstance(arg, list) and arg[:1] == ["TENSOR"]:
            for part in arg[1:]:
                if isinstance(part, list) and any(type(dim) is int and dim < 0 for dim in part):
                    return arg
    return None


# ---------------------------------------------------------------- JSON workload keys

def json_workload_key(values: Sequence[Any]) -> str:
    """A workload key ``[func_name_or_hash, args...]`` as TVM's auto-scheduler writes it
    (``json.dumps`` with its default separators): the key of a registered workload function
    (:mod:`lorien.workload_registry`) and of a hashed compute DAG (:mod:`lorien.engine.dag`)."""
    return json.dumps(list(values))


# ---------------------------------------------------------------- readable AutoTVM keys

#: Lorien's key alphabet: brackets and commas become ``_``; spaces and quotes disappear.
_KEY_TRANSLATION = str.maketrans({"(": "_", ")": "_", "[": "_", "]": "_", ",": "_", " ": None, "'": None})


def _serialize_arg(arg: Any) -> str:
    """One argument as Lorien writes it in a key: ``str(arg)`` in the key alphabet."""
    return str(arg).translate(_KEY_TRANSLATION)


def autotvm_workload_key(task_name: str, args: Sequence[Any]) -> str:
    """Lorien's readable key ``task#arg#arg...``.

    ``["TENSOR", [1, 3], "float32"]`` becomes ``_TENSOR__1_3__float32_``, ``[2, 2]`` becomes
    ``_2_2_``, ``"NCHW"`` stays ``NCHW``.
    """
    return "#".join([task_name, *(_serialize_arg(arg) for arg in args)])


_INT = re.compile(r"-?\d+\Z")


def _atom(text: str) -> Any:
    if _INT.match(text):
        return int(text)
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return float(text)
    except ValueError:
        return text


def _parse_items(text: str, pos: int) -> Iterator[tuple[list[Any], int]]:
    """Every way to read list items from ``pos`` (just after an opening ``_``) to a closing ``_``."""
    if pos < len(text) and text[pos] == "_":
        yield [], pos + 1
    for first, after in _parse_item(text, pos):
        yield from _parse_rest(text, [first], after)


def _parse_rest(text: str, items: list[Any], pos: int) -> Iterator[tuple[list[Any], int]]:
    if pos >= len(text) or text[pos] != "_":
        return
    yield items, pos + 1  # this ``_`` closes the list ...
    for item, after in _parse_item(text, pos + 1):  # ... or separates the next item
        yield from _parse_rest(text, [*items, item], after)


def _parse_item(text: str, pos: int) -> Iterator[tuple[Any, int]]:
    if pos >= len(text):
        return
    if text[pos] == "_":
        yield from _parse_items(text, pos + 1)
        return
    end = text.find("_", pos)
    end = len(text) if end < 0 else end
    yield _atom(text[pos:end]), end


def _parse_arg(text: str) -> Any:
    if not text.startswith("_"):
        return _atom(text)
    for value, end in _parse_item(text, 0):
        if end == len(text):
            return value
    raise WorkloadError(f"workload key argument {text!r} is not a well-formed list")


def parse_autotvm_workload_key(key: str) -> tuple[str, list[Any]]:
    """Inverse of :func:`autotvm_workload_key`: ``(task_name, args)``.

    Numbers, ``None``, booleans and strings come back typed; nested lists of TVM's usual
    arguments (tensors, stride/padding tuples) come back as lists.
    """
    parts = key.split("#")
    if not parts[0]:
        raise WorkloadError(f"workload key {key!r} has no task name")
    return parts[0], [_parse_arg(part) for part in parts[1:]]
