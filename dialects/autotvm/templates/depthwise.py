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
    path_knob,
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
    """Channel blocks in parallel; tile_ow[-1] output columns vectorized in registers.

    Knob ``path``: ``channel_tile`` (the above: a ``tile_c[-1] x tile_ow[-1]`` register tile)
    or ``row_tile`` (:func:`lorien.engine.x86.schedule_depthwise_nchw`: parallel over
    channels, each channel's padded plane made just before its tiles read it, ``tile_ow[-1]``
    output columns of one row per tile with the kernel window unrolled; ``unroll_kw`` there
    inlines the padding into the tile instead; ``tile_c`` is not used there)."""
    d = _dims(list(args))
    oc = d["c"] * d["mult"]
    cfg.define_split("tile_c", cfg.axis(oc), num_outputs=2, filter=lambda e: e.size[-1] <= 16)
    cfg.define_split("tile_ow", cfg.axis(d["ow"]), num_outputs=2, filter=lambda e: e.size[-1] <= 64)
    cfg.define_knob("unroll_kw", [True, False])
    data = te.placeholder((d["n"], d["c"], d["h"], d["w"]), d["dtype"], name="data")
    kernel = te.placeholder((d["c"], d["mult"], d["kh"], d["kw"]), d["dtype"], name="kernel")
    if path_knob(cfg, ["channel_tile", "row_tile"]) == "row_tile":
        from lorien.engine import ops
        from lorien.engine.x86 import schedule_depthwise_nchw

        out = ops.depthwise_conv2d_nchw(data, kernel, (d["sh"], d["sw"]), d["pads"], (d["dh"], d["dw"]),
                                        name="depthwise_conv2d_nchw")
        s = create_schedule(out)
        schedule_depthwise_nchw(s, out, cfg["tile_ow"].size[-1], 1, pad_inline=not cfg["unroll_kw"].val)
        return s, [data, kernel, out]

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


# ---- depthwise_conv2d_NCHWc.x86 --------------------------------------------------------------


def _nchwc_dims(args: list[Any]) -> dict[str, Any]:
    data_shape, dtype = tensor_arg(args[0], "depthwise_conv2d_NCHWc data")
    kernel_shape, _ = tensor_arg(args[1], "depthwise_conv2d_NCHWc kernel")
    if len(data_shape) == 4 and len(kernel_shape) == 4:
        n, c, h, w = data_shape
        c2, mult, kh, kw = kernel_shape
        if c2 != c:
            raise ValueError(f"depthwise_conv2d_NCHWc: data has {c} channels, kernel {c2}")
    elif len(data_shape) == 5 and len(kernel_shape) == 6:
        n, cc, h, w, cb = data_shape
        occ, _, kh, kw, _, ocb = kernel_shape
        c = cc * cb
        if (occ * ocb) % c:
            raise ValueError(f"depthwise_conv2d_NCHWc: {occ * ocb} output channels are not a multiple of {c}")
        mult = occ * ocb // c
    else:
        raise ValueError(f"depthwise_conv2d_NCHWc: data {data_shape} / kernel {kernel_shape} are neither "
                         "NCHW/[C, multiplier, KH, KW] nor packed")
    return dict(n=n, c=c, h=h, w=w, mult=mult, kh=kh, kw=kw, dtype=dtype, **conv_window(args, h, w, kh, kw))


def _nchwc_reference(cfg: Any, args: list[Any], data: np.ndarray, kernel: np.ndarray) -> list[np.ndarray]:
    d = _nchwc_dims(list(args))
    oc, oc_bn = d["c"] * d["mult"], cfg["tile_oc"].size[-1]
    data_nchw = data.transpose(0, 1, 4, 2, 3).reshape(d["n"], d["c"], d["h"], d["w"])
    kernel_oihw = kernel.transpose(0, 5, 1, 4, 2, 3).reshape(oc, 1, d["kh"], d["kw"])
    out = conv_nchw_numpy(data_nchw, kernel_oihw, (d["sh"], d["sw"]), d["pads"], (d["dh"], d["dw"]), groups=d["c"])
    return [out.reshape(d["n"], oc // oc_bn, oc_bn, d["oh"], d["ow"]).transpose(0, 1, 3, 4, 2)]


@register_template("depthwise_conv2d_NCHWc.x86", _nchwc_reference)
def depthwise_conv2d_nchwc(cfg: Any, *args: Any):
    """Depthwise convolution on packed channels, TVM's knobs: data ``[N, C/ic_bn, H, W, ic_bn]``
    and kernel ``[OC/oc_bn, 1, KH, KW, 1, oc_bn]`` (``ic_bn = tile_ic[-1]``, ``oc_bn =
    tile_oc[-1]``; equal blocks read the input as whole vectors); a register tile of
    ``tile_ow[-1]`` output columns x ``oc_bn`` channels; ``unroll_kw`` unrolls the kernel width;
    parallel over (n, channel block, output row)."""
    d = _nchwc_dims(list(args))
    oc, mult = d["c"] * d["mult"], d["mult"]
    cfg.define_split("tile_ic", cfg.axis(d["c"]), num_outputs=2)
    cfg.define_split("tile_oc", cfg.axis(oc), num_outputs=2)
    cfg.define_split("tile_ow", cfg.axis(d["ow"]), num_outputs=2, filter=lambda e: e.size[-1] <= 64)
    cfg.define_knob("unroll_kw", [True, False])

    ic_bn, oc_bn, reg_n = cfg["tile_ic"].size[-1], cfg["tile_oc"].size[-1], cfg["tile_ow"].size[-1]
    n, dtype = d["n"], d["dtype"]
    data = te.placeholder((n, d["c"] // ic_bn, d["h"], d["w"], ic_bn), dtype, name="data")
    kernel = te.placeholder((oc // oc_bn, 1, d["kh"], d["kw"], 1, oc_bn), dtype, name="kernel")
    top, left, bottom, right = d["pads"]
    padded = pad_nchw_like(data, [(0, 0), (0, 0), (top, bottom), (left, right), (0, 0)], "data_pad")
    ry, rx = te.reduce_axis(d["kh"], name="kh"), te.reduce_axis(d["kw"], name="kw")
    sh, sw, dh, dw = d["sh"], d["sw"], d["dh"], d["dw"]

    def channel(oco, oci):  # input channel of output channel oco * oc_bn + oci
        ch = oco * oc_bn + oci
        return ch if mult == 1 else ch // mult

    conv = te.compute(
        (n, oc // oc_bn, d["oh"], d["ow"], oc_bn),
        lambda b, oco, y, x, oci: te.sum(
            padded[b, channel(oco, oci) // ic_bn, scaled(y, sh) + scaled(ry, dh), scaled(x, sw) + scaled(rx, dw),
                   channel(oco, oci) % ic_bn] * kernel[oco, 0, ry, rx, 0, oci],
            axis=[ry, rx]),
        name="depthwise_conv2d_NCHWc")
    s = create_schedule(conv)
    if padded is not data:
        b, c, y, _, cb = s[padded].op.axis
        s[padded].parallel(s[padded].fuse(b, c, y))
        vectorize_by_lanes(s[padded], cb, ic_bn)
    cache = s.cache_write(conv, "local")
    b, oco, y, x, oci = s[conv].op.axis
    xo, xi = s[conv].split(x, factor=reg_n)
    s[conv].reorder(b, oco, y, xo, xi, oci)
    s[conv].parallel(s[conv].fuse(b, oco, y))
    s[conv].unroll(xi)
    vectorize_by_lanes(s[conv], oci, oc_bn)
    s[cache].compute_at(s[conv], xo)
    _, _, y, x, oci = s[cache].op.axis
    ry, rx = s[cache].op.reduce_axis
    if cfg["unroll_kw"].val:
        s[cache].reorder(ry, rx, y, x, oci)
        s[cache].unroll(rx)
    else:
        s[cache].reorder(ry, y, rx, x, oci)
    s[cache].unroll(x)
    vectorize_by_lanes(s[cache], oci, oc_bn)
    return s, [data, kernel, conv]
