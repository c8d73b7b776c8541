"""Helpers shared by the templates: TVM argument forms, tensors, padding, NumPy references."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lorien.engine import te
from lorien.engine.x86 import vectorize_by_lanes
from lorien.errors import WorkloadError
from lorien.workload import out_size, pad4

__all__ = ["conv_nchw_numpy", "conv_window", "out_size", "pad4", "pad_nchw_like", "pair", "scaled",
           "schedule_nchw_output", "tensor_arg", "vectorize_by_lanes"]


def tensor_arg(arg: Any, what: str) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of a ``["TENSOR", shape, dtype]`` task argument."""
    if not (isinstance(arg, (list, tuple)) and len(arg) >= 3 and arg[0] == "TENSOR"):
        raise WorkloadError(f"{what}: expected ['TENSOR', shape, dtype], got {arg!r}")
    return tuple(int(d) for d in arg[1]), str(arg[2])


def pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    values = [int(v) for v in value]
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def conv_window(args: Sequence[Any], h: int, w: int, kh: int, kw: int) -> dict[str, Any]:
    """Strides, padding, dilation (default 1) and output size of a conv task's ``args[2:5]``."""
    sh, sw = pair(args[2])
    pads = pad4(args[3])
    dh, dw = pair(args[4]) if len(args) > 4 else (1, 1)
    return dict(sh=sh, sw=sw, dh=dh, dw=dw, pads=pads,
                oh=out_size(h, kh, sh, pads[0] + pads[2], dh), ow=out_size(w, kw, sw, pads[1] + pads[3], dw))


def scaled(index: Any, factor: int) -> Any:
    """``index * factor`` without a multiplication by 1 (keeps the lowered indices simple)."""
    return index if factor == 1 else index * factor


def schedule_nchw_output(s: Any, conv: te.Tensor, data: te.Tensor, padded: te.Tensor,
                         tile_channel: Any, tile_ow: Any) -> te.Tensor:
    """The NCHW output schedule conv2d_nchw and depthwise conv2d share: padding parallel over
    (n, c, y); output tiled by ``tile_channel`` x ``tile_ow``, parallel over (n, channel outer,
    y), ow vectorized; a register accumulator computed at the ow outer loop, which is returned."""
    if padded is not data:
        b, c, y, _ = s[padded].op.axis
        s[padded].parallel(s[padded].fuse(b, c, y))
    cache = s.cache_write(conv, "local")
    b, f, y, x = s[conv].op.axis
    fo, fi = tile_channel.apply(s, conv, f)
    xo, xi = tile_ow.apply(s, conv, x)
    s[conv].reorder(b, fo, y, xo, fi, xi)
    s[conv].parallel(s[conv].fuse(b, fo, y))
    vectorize_by_lanes(s[conv], xi, tile_ow.size[-1])
    s[cache].compute_at(s[conv], xo)
    return cache


def pad_nchw_like(data: te.Tensor, pads: Sequence[tuple[int, int]], name: str) -> te.Tensor:
    """Zero-pad ``data`` by (before, after) per dimension; ``data`` itself when nothing pads."""
    if all(before == 0 and after == 0 for before, after in pads):
        return data
    shape = [d + before + after for d, (before, after) in zip(data.shape, pads, strict=True)]

    def body(*idx):
        conds = []
        src = []
        for i, d, (before, _after) in zip(idx, data.shape, pads, strict=True):
            if before == 0 and _after == 0:
                src.append(i)
                continue
            conds += [i >= before, i < before + d]
            src.append(i - before)
        return te.if_then_else(te.all(*conds), data[tuple(src)], 0.0)

    return te.compute(shape, body, name=name)


def conv_nchw_numpy(data: np.ndarray, kernel: np.ndarray, stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int = 1) -> np.ndarray:
    """Direct convolution, NCHW data and OIHW kernel (``groups`` == channels for depthwise)."""
    n, c, h, w = data.shape
    o, cg, kh, kw = kernel.shape
    top, left, bottom, right = pads
    padded = np.zeros((n, c, h + top + bottom, w + left + right), dtype=np.float64)
    padded[:, :, top:top + h, left:left + w] = data
    oh = out_size(h, kh, stride[0], top + bottom, dilation[0])
    ow = out_size(w, kw, stride[1], left + right, dilation[1])
    out = np.zeros((n, o, oh, ow), dtype=np.float64)
    og = o // groups
    for g in range(groups):
        for y in range(kh):
            for x in range(kw):
                y0, x0 = y * dilation[0], x * dilation[1]
                patch = padded[:, g * cg:(g + 1) * cg,
                               y0:y0 + stride[0] * (oh - 1) + 1:stride[0],
                               x0:x0 + stride[1] * (ow - 1) + 1:stride[1]]
                weights = kernel[g * og:(g + 1) * og, :, y, x]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, weights)
    return out


def path_knob(cfg: Any, candidates: Sequence[str]) -> str:
    """Define the ``path`` knob (which schedule the template builds) and return its value.
    ``candidates[0]`` is the template's path from before the knob existed: the knob is optional,
    so an older record's config (without it) still replays, on that path."""
    cfg.define_knob("path", list(candidates), optional=True)
    return cfg["path"].val if "path" in cfg else candidates[0]
