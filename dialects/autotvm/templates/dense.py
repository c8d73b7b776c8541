"""Dense (``data[M, K] x weight[N, K]^T (+ bias)``): ``dense_pack.x86`` and ``dense_nopack.x86``.

Task args as in AutoTVM: ``[data, weight, bias_or_None, out_dtype]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dialects.autotvm.templates.common import tensor_arg, vectorize_by_lanes
from dialects.autotvm.templates.registry import register_template
from lorien.engine import te
from lorien.engine.schedule import create_schedule


def _inputs(data_arg: Any, weight_arg: Any, bias_arg: Any) -> tuple[te.Tensor, te.Tensor, te.Tensor | None]:
    (m, k), dtype = tensor_arg(data_arg, "dense data")
    (n, k2), _ = tensor_arg(weight_arg, "dense weight")
    if k != k2:
        raise ValueError(f"dense: data K={k} but weight K={k2}")
    data = te.placeholder((m, k), dtype, name="data")
    weight = te.placeholder((n, k), dtype, name="weight")
    bias = None
    if bias_arg is not None:
        (nb,), _ = tensor_arg(bias_arg, "dense bias")
        bias = te.placeholder((nb,), dtype, name="bias")
    return data, weight, bias


def _reference(cfg: Any, args: list[Any], data: np.ndarray, weight: np.ndarray, *rest: np.ndarray) -> list[np.ndarray]:
    out = data.astype(np.float64) @ weight.astype(np.float64).T
    if rest:
        out = out + rest[0]
    return [out]


def _with_bias(out: te.Tensor, bias: te.Tensor | None) -> te.Tensor:
    if bias is None:
        return out
    return te.compute(out.shape, lambda i, j: out[i, j] + bias[j], name="dense_bias")


@register_template("dense_pack.x86", _reference)
def dense_pack(cfg: Any, data_arg: Any, weight_arg: Any, bias_arg: Any = None, out_dtype: str = "float32"):
    """Weight packed to ``[N/bn, K, bn]`` so the inner ``bn`` columns load as one vector."""
    data, weight, bias = _inputs(data_arg, weight_arg, bias_arg)
    m, k_len = data.shape
    n = weight.shape[0]
    cfg.define_split("tile_y", cfg.axis(m), num_outputs=3)
    cfg.define_split("tile_x", cfg.axis(n), num_outputs=3, filter=lambda e: e.size[-1] <= 64)
    cfg.define_split("tile_k", cfg.axis(k_len), num_outputs=2)

    bn = cfg["tile_x"].size[-1]
    packed = te.compute((n // bn, k_len, bn), lambda xo, kk, xi: weight[xo * bn + xi, kk], name="packed_weight")
    k = te.reduce_axis(k_len, name="k")
    out = te.compute((m, n), lambda y, x: te.sum(data[y, k] * packed[x // bn, k, x % bn], axis=k), name="dense_pack")
    final = _with_bias(out, bias)
    s = create_schedule(final)

    # Weight packing: parallel over column blocks, vector stores.
    # The register tile of the accumulation is tile_y[-1] x tile_x[-1].
    xo, kk, xi = s[packed].op.axis
    s[packed].parallel(xo)
    vectorize_by_lanes(s[packed], xi, bn)

    cache = s.cache_write(out, "local")
    if bias is not None:
        s[out].compute_inline()
        target = final
    else:
        target = out
    y, x = s[target].op.axis
    yt, yo, yi = cfg["tile_y"].apply(s, target, y)
    xt, xo, xi = cfg["tile_x"].apply(s, target, x)
    s[target].reorder(xt, yt, yo, xo, yi, xi)
    xyt = s[target].fuse(xt, yt)
    s[target].parallel(xyt)
    s[target].unroll(yi)
    vectorize_by_lanes(s[target], xi, bn)
    s[cache].compute_at(s[target], xo)

    y, x = s[cache].op.axis
    (k,) = s[cache].op.reduce_axis
    ko, ki = cfg["tile_k"].apply(s, cache, k)
    s[cache].reorder(ko, ki, y, x)
    s[cache].unroll(y)
    vectorize_by_lanes(s[cache], x, bn)
    inputs = [data, weight] + ([bias] if bias is not None else [])
    return s, [*inputs, final]


@register_template("dense_nopack.x86", _reference)
def dense_nopack(cfg: Any, data_arg: Any, weight_arg: Any, bias_arg: Any = None, out_dtype: str = "float32"):
    """Weight read as it is (no packing): the reduction is split by ``tile_k[-1]`` lanes that
    accumulate contiguous products of a data row and a weight row, summed at the end (TVM's
    rfactor form; good for small batches). Output tiles ``tile_y[-1] x tile_x[-1]`` run in parallel."""
    data, weight, bias = _inputs(data_arg, weight_arg, bias_arg)
    m, k_len = data.shape
    n = weight.shape[0]
    cfg.define_split("tile_y", cfg.axis(m), num_outputs=2)
    cfg.define_split("tile_x", cfg.axis(n), num_outputs=2, filter=lambda e: e.size[-1] <= 64)
    cfg.define_split("tile_k", cfg.axis(k_len), num_outputs=2, filter=lambda e: e.size[-1] <= 64)

    lanes = cfg["tile_k"].size[-1]
    ko = te.reduce_axis(k_len // lanes, name="ko")
    partial = te.compute(
        (m, n, lanes), lambda y, x, kl: te.sum(data[y, ko * lanes + kl] * weight[x, ko * lanes + kl], axis=ko),
        name="dense_partial")
    kl = te.reduce_axis(lanes, name="kl")
    out = te.compute((m, n), lambda y, x: te.sum(partial[y, x, kl], axis=kl), name="dense_nopack")
    final = _with_bias(out, bias)
    s = create_schedule(final)
    y, x = s[final].op.axis
    yo, yi = cfg["tile_y"].apply(s, final, y)
    xo, xi = cfg["tile_x"].apply(s, final, x)
    s[final].reorder(yo, xo, yi, xi)
    s[final].parallel(s[final].fuse(yo, xo))
    if bias is not None:
        s[out].compute_at(s[final], xi)
    s[partial].compute_at(s[out] if bias is not None else s[final], s[out].op.axis[1] if bias is not None else xi)
    (pko,) = s[partial].op.reduce_axis
    pl = s[partial].op.axis[2]
    s[partial].reorder(pko, pl)
    vectorize_by_lanes(s[partial], pl, lanes)
    inputs = [data, weight] + ([bias] if bias is not None else [])
    return s, [*inputs, final]


def _gemv_k_filter(k_len: int):
    """Inner K tiles that are whole 8-lane vectors (up to 128), or any up to 64 when K has none."""
    if any(f % 8 == 0 for f in range(8, min(k_len, 128) + 1) if k_len % f == 0):
        return lambda e: e.size[-1] % 8 == 0 and e.size[-1] <= 128
    return lambda e: e.size[-1] <= 64


@register_template("dense_gemv.x86", _reference)
def dense_gemv(cfg: Any, data_arg: Any, weight_arg: Any, bias_arg: Any = None, out_dtype: str = "float32"):
    """Dense at batch 1 (a GEMV) or a few rows, the weight read as it is ``[N, K]``: K split by
    ``tile_k[-1]`` (whole vectors) and factored (rfactor), so each output accumulates vectors
    along K and sums them once at the end; ``tile_x[-1]`` weight rows are accumulated at once
    (each data vector loaded once for them), blocks of outputs run in parallel; ``unroll_sum``
    unrolls the final horizontal sums."""
    from lorien.engine.x86 import schedule_gemv_stages

    data, weight, bias = _inputs(data_arg, weight_arg, bias_arg)
    m, k_len = data.shape
    n = weight.shape[0]
    cfg.define_split("tile_x", cfg.axis(n), num_outputs=2, filter=lambda e: e.size[-1] <= 16 and e.size[-1] * m <= 32)
    cfg.define_split("tile_k", cfg.axis(k_len), num_outputs=2, filter=_gemv_k_filter(k_len))
    cfg.define_knob("unroll_sum", [True, False])

    k = te.reduce_axis(k_len, name="k")
    out = te.compute((m, n), lambda y, x: te.sum(data[y, k] * weight[x, k], axis=k), name="dense_gemv")
    final = _with_bias(out, bias)
    s = create_schedule(final)
    schedule_gemv_stages(s, s[final], s[out], cfg["tile_x"].size[-1], cfg["tile_k"].size[-1], cfg["unroll_sum"].val)
    inputs = [data, weight] + ([bias] if bias is not None else [])
    return s, [*inputs, final]
