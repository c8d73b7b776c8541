"""Depthwise convolution, NCHW data and ``[C, multiplier, KH, KW]`` kernel: ``depthwise_conv2d_nchw.x86``.

Task args as in AutoTVM: ``[data, kernel, strides, padding, dilation, out_dtype]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dialects.autotvm.templates.common import (
    conv_nchw_numpy,
    conv_window,
    pad_nchw_like,
    scaled,
    schedule_nchw_output,
    tensor_arg,
    vectorize_by_lanes,
)
from dialects.autotvm.templates.registry import register_template
from lorien.engine import te
from lorien.engine.schedule import create_schedule


def _dims(args: list[Any]) -> dict[str, Any]:
    (n, c, h, w), dtype = tensor_arg(args[0], "depthwise data")
    (c2, mult, kh, kw), _ = tensor_arg(args[1], "depthwise kernel")
    if c != c2:
        raise ValueError(f"depthwise_conv2d: data has {c} channels, kernel {c2}")
    return dict(n=n, c=c, h=h, w=w, mult=mult, kh=kh, kw=kw, dtype=dtype, **conv_window(args, h, w, kh, kw))


def _reference(cfg: Any, args: list[Any], data: np.ndarray, kernel: np.ndarray) -> list[np.ndarray]:
    d = _dims(args)
    oihw = kernel.reshape(d["c"] * d["mult"], 1, d["kh"], d["kw"])
    return [conv_nchw_numpy(data, oihw, (d["sh"], d["sw"]), d["pads"], (d["dh"], d["dw"]), groups=d["c"])]


@register_template("depthwise_conv2d_nchw.x86", _reference)
def depthwise_conv2d_nchw(cfg: Any, *args: Any):
    """Channel blocks in parallel; tile_ow[-1] output columns vectorized in registers."""
    d = _dims(list(args))
    oc = d["c"] * d["mult"]
    cfg.define_split("tile_c", cfg.axis(oc), num_outputs=2, filter=lambda e: e.size[-1] <= 16)
    cfg.define_split("tile_ow", cfg.axis(d["ow"]), num_outputs=2, filter=lambda e: e.size[-1] <= 64)
    cfg.define_knob("unroll_kw", [True, False])

    data = te.placeholder((d["n"], d["c"], d["h"], d["w"]), d["dtype"], name="data")
    kernel = te.placeholder((d["c"], d["mult"], d["kh"], d["kw"]), d["dtype"], name="kernel")
    top, left, bottom, right = d["pads"]
    padded = pad_nchw_like(data, [(0, 0), (0, 0), (top, bottom), (left, right)], "data_pad")
    ry = te.reduce_axis(d["kh"], name="kh")
    rx = te.reduce_axis(d["kw"], name="kw")
    mult, sh, sw, dh, dw = d["mult"], d["sh"], d["sw"], d["dh"], d["dw"]
    def channel(f):  # input channel and multiplier index of output channel f
        return (f, 0) if mult == 1 else (f // mult, f % mult)

    conv = te.compute(
        (d["n"], oc, d["oh"], d["ow"]),
        lambda b, f, y, x: te.sum(
            padded[b, channel(f)[0], scaled(y, sh) + scaled(ry, dh), scaled(x, sw) + scaled(rx, dw)]
            * kernel[channel(f)[0], channel(f)[1], ry, rx],
            axis=[ry, rx]),
        name="depthwise_conv2d_nchw")
    s = create_schedule(conv)
    cache = schedule_nchw_output(s, conv, data, padded, cfg["tile_c"], cfg["tile_ow"])
    tile_ow = cfg["tile_ow"].size[-1]
    _, f, y, x = s[cache].op.axis
    ry, rx = s[cache].op.reduce_axis
    if cfg["unroll_kw"].val:
        s[cache].reorder(ry, rx, f, x)
        s[cache].unroll(rx)
    else:
        s[cache].reorder(ry, f, rx, x)
    s[cache].unroll(f)
    vectorize_by_lanes(s[cache], x, tile_ow)
    return s, [data, kernel, conv]
