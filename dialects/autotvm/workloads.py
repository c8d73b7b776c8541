"""Op shorthands of the tuning YAML -> AutoTVM (task_name, args), as TVM would write them."""

from __future__ import annotations

from typing import Any

from lorien.errors import DialectError, WorkloadError
from lorien.workload import pad4
from lorien.workload import shorthand_pair as _pair
from lorien.workload import shorthand_params as _take

#: Below this many rows, ``dense`` uses ``dense_nopack.x86`` (no weight packing).
SMALL_BATCH = 16

#: Template used for each shorthand (conv2d by layout; dense by batch, see SMALL_BATCH).
SHORTHAND_TEMPLATES = {
    "dense": "dense_pack.x86",
    "batch_matmul": "batch_matmul.x86",
    "conv2d": {"NCHWc": "conv2d_NCHWc.x86", "NCHW": "conv2d_nchw.x86", "NHWC": "conv2d_nhwc.x86"},
    "depthwise_conv2d": "depthwise_conv2d_nchw.x86",
}


def _tensor(shape: list[int], dtype: str) -> list[Any]:
    return ["TENSOR", [int(d) for d in shape], dtype]


def _padding(value: Any) -> list[int]:
    """(top, left, bottom, right) from an int, a (height, width) pair or four values."""
    try:
        return list(pad4(value))
    except (WorkloadError, TypeError, ValueError) as exc:
        raise DialectError(f"padding must be an int, a pair or four ints, got {value!r}") from exc


def expand_workload(op: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """(task_name, args) of a shorthand such as ``dense: {M: 64, N: 64, K: 64}``."""
    if op == "dense":
        p = _take(params, op, ("M", "N", "K"), {"bias": False, "dtype": "float32", "template": None})
        bias = _tensor([p["N"]], p["dtype"]) if p["bias"] else None
        # Packing the weight on every call costs as much as a matrix-vector product: small
        # batches read the weight as it is.
        template = p["template"] or ("dense_nopack.x86" if p["M"] < SMALL_BATCH else "dense_pack.x86")
        return template, [_tensor([p["M"], p["K"]], p["dtype"]), _tensor([p["N"], p["K"]], p["dtype"]),
                               bias, p["dtype"]]
    if op == "batch_matmul":
        p = _take(params, op, ("B", "M", "N", "K"), {"dtype": "float32"})
        return "batch_matmul.x86", [_tensor([p["B"], p["M"], p["K"]], p["dtype"]),
                                    _tensor([p["B"], p["N"], p["K"]], p["dtype"]), None]
    if op == "conv2d":
        p = _take(params, op, ("C", "H", "W", "K"), {"N": 1, "kernel": 3, "stride": 1, "padding": 0, "dilation": 1,
                                                     "groups": 1, "layout": "NCHWc", "dtype": "float32"})
        kh, kw = _pair(p["kernel"], "kernel")
        stride, dilation = _pair(p["stride"], "stride"), _pair(p["dilation"], "dilation")
        padding = _padding(p["padding"])
        layout, dtype = p["layout"], p["dtype"]
        if p["groups"] != 1:
            raise DialectError(f"conv2d: groups={p['groups']}: the autotvm dialect has no grouped convolution "
                               "template (a depthwise convolution, groups == C, is depthwise_conv2d)")
        templates = SHORTHAND_TEMPLATES["conv2d"]
        if layout not in templates:
            raise DialectError(f"conv2d: layout must be one of {sorted(templates)}, got {layout!r}")
        if layout == "NHWC":
            data, kernel = _tensor([p["N"], p["H"], p["W"], p["C"]], dtype), _tensor([kh, kw, p["C"], p["K"]], dtype)
        else:
            data, kernel = _tensor([p["N"], p["C"], p["H"], p["W"]], dtype), _tensor([p["K"], p["C"], kh, kw], dtype)
        if layout == "NCHWc":
            return templates[layout], [data, kernel, stride, padding, dilation, "NCHW", "NCHW", dtype]
        return templates[layout], [data, kernel, stride, padding, dilation, dtype]
    if op == "depthwise_conv2d":
        p = _take(params, op, ("C", "H", "W"), {"N": 1, "kernel": 3, "stride": 1, "padding": 0, "dilation": 1,
                                               "multiplier": 1, "dtype": "float32", "layout": "NCHW"})
        kh, kw = _pair(p["kernel"], "kernel")
        dtype = p["dtype"]
        if p["layout"] not in ("NCHW", "NCHWc"):
            raise DialectError(f"depthwise_conv2d: layout must be NCHW or NCHWc, got {p['layout']!r}")
        if p["layout"] == "NCHWc":  # packed channel blocks (tile_ic / tile_oc), TVM's task args
            return "depthwise_conv2d_NCHWc.x86", [
                _tensor([p["N"], p["C"], p["H"], p["W"]], dtype), _tensor([p["C"], p["multiplier"], kh, kw], dtype),
                list(_pair(p["stride"], "stride")), _padding(p["padding"]), list(_pair(p["dilation"], "dilation")),
                "NCHW", "NCHW", dtype]
        return SHORTHAND_TEMPLATES["depthwise_conv2d"], [
            _tensor([p["N"], p["C"], p["H"], p["W"]], dtype), _tensor([p["C"], p["multiplier"], kh, kw], dtype),
            _pair(p["stride"], "stride"), _padding(p["padding"]), _pair(p["dilation"], "dilation"), dtype]
    raise DialectError(f"unknown op shorthand {op!r} (known: {', '.join(sorted(SHORTHAND_TEMPLATES))})")
