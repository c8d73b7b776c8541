"""Batched matmul ``x[B, M, K] x y[B, N, K]^T``: ``batch_matmul.x86``.

Task args as in AutoTVM: ``[x, y, out_shape_or_None, ...]`` (later TVM versions append the
output dtype and transpose flags; they are accepted and must keep the NT form).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dialects.autotvm.templates.common import path_knob, tensor_arg, vectorize_by_lanes
from dialects.autotvm.templates.registry import register_template
from lorien.engine import te
from lorien.engine.schedule import create_schedule


def _reference(cfg: Any, args: list[Any], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    return [np.einsum("bmk,bnk->bmn", x.astype(np.float64), y.astype(np.float64))]


@register_template("batch_matmul.x86", _reference)
def batch_matmul(cfg: Any, x_arg: Any, y_arg: Any, *rest: Any):
    """Register tiles over (M, N) with y packed by column blocks. Knob ``path``: ``packed_y``
    (y packed whole first, then batch and row blocks in parallel) or ``panel``
    (:func:`lorien.engine.x86.schedule_batch_matmul`: one parallel loop over (batch, column
    panel), each ``tile_x[-1]``-column panel of y packed just before its ``tile_y[-1] x
    tile_x[-1]`` tiles use it; ``tile_k`` is not used there)."""
    (b, m, k_len), dtype = tensor_arg(x_arg, "batch_matmul x")
    (b2, n, k2), _ = tensor_arg(y_arg, "batch_matmul y")
    if k_len != k2 or b2 not in (1, b):
        raise ValueError(f"batch_matmul: incompatible shapes {[b, m, k_len]} and {[b2, n, k2]}")
    if len(rest) >= 4 and (rest[2] or not rest[3]):
        raise ValueError(f"batch_matmul: only transpose_a=False, transpose_b=True is supported, got {rest[2:4]}")
    x = te.placeholder((b, m, k_len), dtype, name="x")
    y = te.placeholder((b2, n, k_len), dtype, name="y")
    cfg.define_split("tile_y", cfg.axis(m), num_outputs=2)
    cfg.define_split("tile_x", cfg.axis(n), num_outputs=2, filter=lambda e: e.size[-1] <= 64)
    cfg.define_split("tile_k", cfg.axis(k_len), num_outputs=2)
    path = path_knob(cfg, ["packed_y", "panel"])
    if path == "panel":
        from lorien.engine import ops
        from lorien.engine.x86 import schedule_batch_matmul

        nr = cfg["tile_x"].size[-1]
        out = ops.batch_matmul(x, y, pack_nr=nr)
        s = create_schedule(out)
        schedule_batch_matmul(s, out, cfg["tile_y"].size[-1], nr)
        return s, [x, y, out]

    bn = cfg["tile_x"].size[-1]
    # y packed to [B, N/bn, K, bn]: the bn output columns of one k load as one vector.
    packed = te.compute((b2, n // bn, k_len, bn), lambda pb, xo, kk, xi: y[pb, xo * bn + xi, kk], name="packed_y")
    k = te.reduce_axis(k_len, name="k")
    if b2 == 1:
        out = te.compute((b, m, n), lambda bb, i, j: te.sum(x[bb, i, k] * packed[0, j // bn, k, j % bn], axis=k),
                         name="batch_matmul")
    else:
        out = te.compute((b, m, n), lambda bb, i, j: te.sum(x[bb, i, k] * packed[bb, j // bn, k, j % bn], axis=k),
                         name="batch_matmul")
    s = create_schedule(out)
    pb, pxo, _, pxi = s[packed].op.axis
    s[packed].parallel(s[packed].fuse(pb, pxo))
    vectorize_by_lanes(s[packed], pxi, bn)
    cache = s.cache_write(out, "local")
    bb, i, j = s[out].op.axis
    io, ii = cfg["tile_y"].apply(s, out, i)
    jo, ji = cfg["tile_x"].apply(s, out, j)
    s[out].reorder(bb, io, jo, ii, ji)
    s[out].parallel(s[out].fuse(bb, io))
    tile_x = cfg["tile_x"].size[-1]
    vectorize_by_lanes(s[out], ji, tile_x)
    s[cache].compute_at(s[out], jo)
    _, i, j = s[cache].op.axis
    (k,) = s[cache].op.reduce_axis
    ko, ki = cfg["tile_k"].apply(s, cache, k)
    s[cache].reorder(ko, ki, i, j)
    s[cache].unroll(i)
    vectorize_by_lanes(s[cache], j, tile_x)
    return s, [x, y, out]
