"""2-d convolutions: ``conv2d_NCHWc.x86`` (TopHub's knobs), ``conv2d_nchw.x86``, ``conv2d_nhwc.x86``.

``conv2d_NCHWc.x86`` takes TopHub's task args ``[data NCHW, kernel OIHW, strides, padding,
dilation, layout, out_layout, out_dtype]`` (or already packed 5-d/6-d tensors) and keeps the
meaning of TopHub's knobs: ``ic_bn = tile_ic[-1]`` and ``oc_bn = tile_oc[-1]`` are the channel
blocks of the packed data ``[N, IC/ic_bn, H, W, ic_bn]`` and kernel
``[OC/oc_bn, IC/ic_bn, KH, KW, ic_bn, oc_bn]``; ``reg_n = tile_ow[-1]`` output columns are
accumulated in registers; ``unroll_kw`` unrolls the kernel-width loop (3x3 and larger), or
``tile_oh`` rows are computed together (1x1 kernels). The kernel's inputs and output are the
packed tensors, as in AutoTVM's tuning of this task.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dialects.autotvm.templates.common import (
    conv_nchw_numpy,
    conv_window,
    out_size,
    pad4,
    pad_nchw_like,
    pair,
    path_knob,
    scaled,
    schedule_nchw_output,
    tensor_arg,
    vectorize_by_lanes,
)
from dialects.autotvm.templates.registry import register_template
from lorien.engine import te
from lorien.engine.schedule import create_schedule

# ---- conv2d_NCHWc.x86 ----------------------------------------------------------------------


def _nchwc_dims(args: list[Any]) -> dict[str, Any]:
    data_shape, dtype = tensor_arg(args[0], "conv2d_NCHWc data")
    kernel_shape, _ = tensor_arg(args[1], "conv2d_NCHWc kernel")
    if len(data_shape) == 4 and len(kernel_shape) == 4:
        n, ic, h, w = data_shape
        oc, _, kh, kw = kernel_shape
    elif len(data_shape) == 5 and len(kernel_shape) == 6:
        n, icc, h, w, icb = data_shape
        occ, _, kh, kw, _, ocb = kernel_shape
        ic, oc = icc * icb, occ * ocb
    else:
        raise ValueError(f"conv2d_NCHWc: data {data_shape} / kernel {kernel_shape} are neither NCHW/OIHW nor packed")
    sh, sw = pair(args[2])
    pads = pad4(args[3])
    dh, dw = pair(args[4])
    oh = out_size(h, kh, sh, pads[0] + pads[2], dh)
    ow = out_size(w, kw, sw, pads[1] + pads[3], dw)
    return dict(n=n, ic=ic, h=h, w=w, oc=oc, kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw,
                pads=pads, oh=oh, ow=ow, dtype=dtype)


def _nchwc_reference(cfg: Any, args: list[Any], data: np.ndarray, kernel: np.ndarray) -> list[np.ndarray]:
    d = _nchwc_dims(args)
    ic_bn, oc_bn = cfg["tile_ic"].size[-1], cfg["tile_oc"].size[-1]
    data_nchw = data.transpose(0, 1, 4, 2, 3).reshape(d["n"], d["ic"], d["h"], d["w"])
    kernel_oihw = kernel.transpose(0, 5, 1, 4, 2, 3).reshape(d["oc"], d["ic"], d["kh"], d["kw"])
    out = conv_nchw_numpy(data_nchw, kernel_oihw, (d["sh"], d["sw"]), d["pads"], (d["dh"], d["dw"]))
    out = out.reshape(d["n"], d["oc"] // oc_bn, oc_bn, d["oh"], d["ow"]).transpose(0, 1, 3, 4, 2)
    del ic_bn
    return [out]


@register_template("conv2d_NCHWc.x86", _nchwc_reference)
def conv2d_nchwc(cfg: Any, *args: Any):
    """NCHW[x]c convolution with TopHub's knobs tile_ic, tile_oc, tile_ow, unroll_kw / tile_oh.
    A padded KxK convolution also has the knob ``path``: ``direct`` (TopHub's schedule: the padded
    input materialized in a parallel pass of its own, then parallel over (n, oc chunk, oh)) or
    ``pad_rows`` (parallel over (n, oh); each output row pads just the input rows it reads, for
    all channels, and every oc chunk then reads them from cache: no separate pass)."""
    d = _nchwc_dims(list(args))
    is_1x1 = d["kh"] == 1 and d["kw"] == 1
    cfg.define_split("tile_ic", cfg.axis(d["ic"]), num_outputs=2)
    cfg.define_split("tile_oc", cfg.axis(d["oc"]), num_outputs=2)
    cfg.define_split("tile_ow", cfg.axis(d["ow"]), num_outputs=2, filter=lambda e: e.size[-1] <= 64)
    if is_1x1:
        cfg.define_knob("tile_oh", [1, 2] if d["oh"] > 1 else [1])
    else:
        cfg.define_knob("unroll_kw", [True, False])
    padded_3x3 = not is_1x1 and any(d["pads"])
    rows_path = padded_3x3 and path_knob(cfg, ["direct", "pad_rows"]) == "pad_rows"

    ic_bn, oc_bn, reg_n = cfg["tile_ic"].size[-1], cfg["tile_oc"].size[-1], cfg["tile_ow"].size[-1]
    n, dtype = d["n"], d["dtype"]
    data = te.placeholder((n, d["ic"] // ic_bn, d["h"], d["w"], ic_bn), dtype, name="data")
    kernel = te.placeholder((d["oc"] // oc_bn, d["ic"] // ic_bn, d["kh"], d["kw"], ic_bn, oc_bn), dtype, name="kernel")
    top, left, bottom, right = d["pads"]
    padded = pad_nchw_like(data, [(0, 0), (0, 0), (top, bottom), (left, right), (0, 0)], "data_pad")
    icc = te.reduce_axis(d["ic"] // ic_bn, name="icc")
    icb = te.reduce_axis(ic_bn, name="icb")
    ry = te.reduce_axis(d["kh"], name="kh")
    rx = te.reduce_axis(d["kw"], name="kw")
    sh, sw, dh, dw = d["sh"], d["sw"], d["dh"], d["dw"]
    conv = te.compute(
        (n, d["oc"] // oc_bn, d["oh"], d["ow"], oc_bn),
        lambda b, occ, y, x, ocb: te.sum(
            padded[b, icc, scaled(y, sh) + scaled(ry, dh), scaled(x, sw) + scaled(rx, dw), icb] * kernel[occ, icc, ry, rx, icb, ocb],
            axis=[icc, icb, ry, rx]),
        name="conv2d_NCHWc")
    s = create_schedule(conv)
    if padded is not data and not rows_path:
        b, c, y, _, _ = s[padded].op.axis
        s[padded].parallel(s[padded].fuse(b, c, y))

    cache = s.cache_write(conv, "local")
    b, occ, y, x, ocb = s[conv].op.axis
    if is_1x1:
        yo, yi = s[conv].split(y, factor=cfg["tile_oh"].val)
        xo, xi = s[conv].split(x, factor=reg_n)
        s[conv].reorder(b, occ, yo, xo, yi, xi, ocb)
        s[conv].parallel(s[conv].fuse(b, occ, yo))
        vectorize_by_lanes(s[conv], ocb, oc_bn)
        s[cache].compute_at(s[conv], xo)
        _, _, y, x, ocb = s[cache].op.axis
        icc, icb, ry, rx = s[cache].op.reduce_axis
        s[cache].reorder(icc, ry, rx, icb, y, x, ocb)
        s[cache].unroll(y)
        s[cache].unroll(x)
    else:
        xo, xi = s[conv].split(x, factor=reg_n)
        if rows_path:  # parallel over output rows; each pads the input rows it reads, for all chunks
            s[conv].reorder(b, y, occ, xo, xi, ocb)
            rows = s[conv].fuse(b, y)
            s[conv].parallel(rows)
            s[padded].compute_at(s[conv], rows)
            vectorize_by_lanes(s[padded], s[padded].op.axis[4], ic_bn)
        else:
            s[conv].reorder(b, occ, y, xo, xi, ocb)
            s[conv].parallel(s[conv].fuse(b, occ, y))
        s[conv].unroll(xi)
        vectorize_by_lanes(s[conv], ocb, oc_bn)
        s[cache].compute_at(s[conv], xo)
        _, _, y, x, ocb = s[cache].op.axis
        icc, icb, ry, rx = s[cache].op.reduce_axis
        if cfg["unroll_kw"].val:
            s[cache].reorder(icc, ry, icb, rx, x, ocb)
            s[cache].unroll(rx)
        else:
            s[cache].reorder(icc, ry, rx, icb, x, ocb)
        s[cache].unroll(x)
    vectorize_by_lanes(s[cache], ocb, oc_bn)
    return s, [data, kernel, conv]


# ---- conv2d_nchw.x86 -------------------------------------------------------------------------


def _plain_dims(args: list[Any], layout: str) -> dict[str, Any]:
    data_shape, dtype = tensor_arg(args[0], f"conv2d_{layout.lower()} data")
    kernel_shape, _ = tensor_arg(args[1], f"conv2d_{layout.lower()} kernel")
    if layout == "NCHW":
        n, ic, h, w = data_shape
        oc, ic2, kh, kw = kernel_shape
    else:
        n, h, w, ic = data_shape
        kh, kw, ic2, oc = kernel_shape
    if ic != ic2:
        raise ValueError(f"conv2d: data has {ic} channels but the kernel expects {ic2}")
    return dict(n=n, ic=ic, h=h, w=w, oc=oc, kh=kh, kw=kw, dtype=dtype, **conv_window(args, h, w, kh, kw))


def _nchw_reference(cfg: Any, args: list[Any], data: np.ndarray, kernel: np.ndarray) -> list[np.ndarray]:
    d = _plain_dims(args, "NCHW")
    if data.ndim == 2:  # the matmul path: data [C, H*W], kernel [O, C], output [O, H*W]
        return [kernel.astype(np.float64) @ data.astype(np.float64)]
    return [conv_nchw_numpy(data, kernel, (d["sh"], d["sw"]), d["pads"], (d["dh"], d["dw"]))]


def _matmul_1x1(d: dict[str, Any]) -> bool:
    """A 1x1, stride-1, unpadded convolution of one image: a matmul on the NCHW tensors as they are."""
    return (d["n"] == 1 and d["kh"] == 1 and d["kw"] == 1 and (d["sh"], d["sw"]) == (1, 1)
            and not any(d["pads"]))


@register_template("conv2d_nchw.x86", _nchw_reference)
def conv2d_nchw(cfg: Any, *args: Any):
    """Direct NCHW convolution: a register tile of (tile_oc[-1] channels x tile_ow[-1] columns).

    A 1x1 stride-1 unpadded convolution of one image also has the knob ``path``: ``direct`` or
    ``matmul`` (:func:`lorien.engine.x86.schedule_matmul` on the tensors as they are: kernel
    ``[O, C]`` x data ``[C, H*W]`` -> output ``[O, H*W]``, reshaped views of OIHW / NCHW, in
    ``tile_oc[-1] x tile_ow[-1]`` register tiles; ``tile_ic`` and ``unroll_kw`` are not used
    there). On the matmul path the kernel's tensors are those 2-d views."""
    d = _plain_dims(list(args), "NCHW")
    cfg.define_split("tile_ic", cfg.axis(d["ic"]), num_outputs=2)
    cfg.define_split("tile_oc", cfg.axis(d["oc"]), num_outputs=2, filter=lambda e: e.size[-1] <= 16)
    cfg.define_split("tile_ow", cfg.axis(d["ow"]), num_outputs=2, filter=lambda e: e.size[-1] <= 64)
    cfg.define_knob("unroll_kw", [True, False])
    if _matmul_1x1(d) and path_knob(cfg, ["direct", "matmul"]) == "matmul":
        from lorien.engine import ops
        from lorien.engine.x86 import schedule_matmul

        kernel2 = te.placeholder((d["oc"], d["ic"]), d["dtype"], name="kernel")
        data2 = te.placeholder((d["ic"], d["h"] * d["w"]), d["dtype"], name="data")
        out = ops.matmul(kernel2, data2, name="conv2d_nchw")
        s = create_schedule(out)
        schedule_matmul(s, out, cfg["tile_oc"].size[-1], cfg["tile_ow"].size[-1])
        return s, [data2, kernel2, out]

    data = te.placeholder((d["n"], d["ic"], d["h"], d["w"]), d["dtype"], name="data")
    kernel = te.placeholder((d["oc"], d["ic"], d["kh"], d["kw"]), d["dtype"], name="kernel")
    top, left, bottom, right = d["pads"]
    padded = pad_nchw_like(data, [(0, 0), (0, 0), (top, bottom), (left, right)], "data_pad")
    rc = te.reduce_axis(d["ic"], name="rc")
    ry = te.reduce_axis(d["kh"], name="kh")
    rx = te.reduce_axis(d["kw"], name="kw")
    sh, sw, dh, dw = d["sh"], d["sw"], d["dh"], d["dw"]
    conv = te.compute(
        (d["n"], d["oc"], d["oh"], d["ow"]),
        lambda b, f, y, x: te.sum(padded[b, rc, scaled(y, sh) + scaled(ry, dh), scaled(x, sw) + scaled(rx, dw)] * kernel[f, rc, ry, rx],
                                  axis=[rc, ry, rx]),
        name="conv2d_nchw")
    s = create_schedule(conv)
    cache = schedule_nchw_output(s, conv, data, padded, cfg["tile_oc"], cfg["tile_ow"])
    tile_ow = cfg["tile_ow"].size[-1]
    _, f, y, x = s[cache].op.axis
    rc, ry, rx = s[cache].op.reduce_axis
    rco, rci = cfg["tile_ic"].apply(s, cache, rc)
    if cfg["unroll_kw"].val:
        s[cache].reorder(rco, ry, rci, rx, f, x)
        s[cache].unroll(rx)
    else:
        s[cache].reorder(rco, ry, rx, rci, f, x)
    s[cache].unroll(f)
    vectorize_by_lanes(s[cache], x, tile_ow)
    return s, [data, kernel, conv]


# ---- conv2d_nhwc.x86 -------------------------------------------------------------------------


def _nhwc_reference(cfg: Any, args: list[Any], data: np.ndarray, kernel: np.ndarray) -> list[np.ndarray]:
    d = _plain_dims(args, "NHWC")
    out = conv_nchw_numpy(data.transpose(0, 3, 1, 2), kernel.transpose(3, 2, 0, 1),
                          (d["sh"], d["sw"]), d["pads"], (d["dh"], d["dw"]))
    return [out.transpose(0, 2, 3, 1)]


@register_template("conv2d_nhwc.x86", _nhwc_reference)
def conv2d_nhwc(cfg: Any, *args: Any):
    """NHWC data, HWIO kernel: output channels are contiguous and vectorized."""
    d = _plain_dims(list(args), "NHWC")
    cfg.define_split("tile_ic", cfg.axis(d["ic"]), num_outputs=2)
    cfg.define_split("tile_oc", cfg.axis(d["oc"]), num_outputs=2, filter=lambda e: e.size[-1] <= 64)
    cfg.define_split("tile_ow", cfg.axis(d["ow"]), num_outputs=2, filter=lambda e: e.size[-1] <= 16)
    cfg.define_knob("unroll_kw", [True, False])

    data = te.placeholder((d["n"], d["h"], d["w"], d["ic"]), d["dtype"], name="data")
    kernel = te.placeholder((d["kh"], d["kw"], d["ic"], d["oc"]), d["dtype"], name="kernel")
    top, left, bottom, right = d["pads"]
    padded = pad_nchw_like(data, [(0, 0), (top, bottom), (left, right), (0, 0)], "data_pad")
    rc = te.reduce_axis(d["ic"], name="rc")
    ry = te.reduce_axis(d["kh"], name="kh")
    rx = te.reduce_axis(d["kw"], name="kw")
    sh, sw, dh, dw = d["sh"], d["sw"], d["dh"], d["dw"]
    conv = te.compute(
        (d["n"], d["oh"], d["ow"], d["oc"]),
        lambda b, y, x, f: te.sum(padded[b, scaled(y, sh) + scaled(ry, dh), scaled(x, sw) + scaled(rx, dw), rc] * kernel[ry, rx, rc, f],
                                  axis=[rc, ry, rx]),
        name="conv2d_nhwc")
    s = create_schedule(conv)
    if padded is not data:
        b, y, _, _ = s[padded].op.axis
        s[padded].parallel(s[padded].fuse(b, y))
    cache = s.cache_write(conv, "local")
    b, y, x, f = s[conv].op.axis
    xo, xi = cfg["tile_ow"].apply(s, conv, x)
    fo, fi = cfg["tile_oc"].apply(s, conv, f)
    s[conv].reorder(b, y, xo, fo, xi, fi)
    s[conv].parallel(s[conv].fuse(b, y))
    tile_oc = cfg["tile_oc"].size[-1]
    vectorize_by_lanes(s[conv], fi, tile_oc)
    s[cache].compute_at(s[conv], fo)
    _, y, x, f = s[cache].op.axis
    rc, ry, rx = s[cache].op.reduce_axis
    rco, rci = cfg["tile_ic"].apply(s, cache, rc)
    if cfg["unroll_kw"].val:
        s[cache].reorder(rco, ry, rci, rx, x, f)
        s[cache].unroll(rx)
    else:
        s[cache].reorder(rco, ry, rx, rci, x, f)
    s[cache].unroll(x)
    vectorize_by_lanes(s[cache], f, tile_oc)
    return s, [data, kernel, conv]
