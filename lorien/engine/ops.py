"""Common operators as compute definitions, with fused epilogues.

Conventions follow TVM: ``dense(data[M,K], weight[N,K])``, ``batch_matmul(x[B,M,K], y[B,N,K])``
(both multiply by the transposed second operand), conv2d kernels OIHW (NCHW), HWIO (NHWC),
OIHW{ic_bn}i{oc_bn}o (NCHW[x]c, as TVM's conv2d_NCHWc.x86), depthwise kernel [C, multiplier, KH, KW].
Epilogues: ``bias`` (per output channel / column), ``relu``, ``residual`` (same shape as the
output) are fused as one elementwise stage named after the op; the reduction stage is
``<name>.acc`` then. Padding is its own stage ``<name>.pad`` that a schedule may inline.
"""

from __future__ import annotations

from collections.abc import Sequence

from lorien.engine import te
from lorien.errors import WorkloadError
from lorien.workload import out_size


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _padding(padding: int | Sequence[int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, (h, w) or (top, left, bottom, right)."""
    if isinstance(padding, int):
        return (padding,) * 4
    padding = [int(p) for p in padding]
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    if len(padding) == 4:
        return tuple(padding)
    raise WorkloadError(f"padding must be an int, (h, w) or (top, left, bottom, right), got {padding}")


def relu(x: te.Expr) -> te.Expr:
    return te.maximum(x, 0.0)


def pad(data: te.Tensor, before: Sequence[int], after: Sequence[int], name: str, value: float = 0.0) -> te.Tensor:
    """Zero-pad ``data``; a no-op (returns ``data``) when all pads are 0."""
    if not any(before) and not any(after):
        return data
    shape = [n + b + a for n, b, a in zip(data.shape, before, after, strict=True)]

    def fpad(*idx):
        src = [i - b if b else i for i, b in zip(idx, before, strict=True)]
        cond = _bounds_condition(idx, before, after, data.shape)
        if cond is None:
            return data[tuple(src)]
        return te.if_then_else(cond, data[tuple(src)], te.const(value, data.dtype))

    return te.compute(shape, fpad, name=name, tag="pad")


def _bounds_condition(idx, before, after, sizes) -> te.Expr | None:
    conds = []
    for i, b, a, n in zip(idx, before, after, sizes, strict=True):
        if b:
            conds.append(i >= b)
        if a:
            conds.append(i < b + n)
    return te.all(*conds) if conds else None


def _epilogue(acc: te.Tensor, name: str, bias: te.Tensor | None, bias_axes: tuple[int, ...], relu_: bool,
              residual: te.Tensor | None) -> te.Tensor:
    if bias is None and not relu_ and residual is None:
        return acc

    def f(*idx):
        value = acc[idx]
        if bias is not None:
            value = value + bias[tuple(idx[a] for a in bias_axes)]
        if residual is not None:
            value = value + residual[idx]
        return relu(value) if relu_ else value

    return te.compute(acc.shape, f, name=name, tag="epilogue")


def _acc_name(name: str, fused: bool) -> str:
    return f"{name}.acc" if fused else name


def packed_dense_weight(n: int, k: int, nr: int, name: str = "weight", dtype: str = "float32") -> te.Tensor:
    """A dense weight ``[N, K]`` that the kernel takes already packed in panels ``[N/nr, K, nr]``
    (its ``packing`` says how: ``kernel.pack_arguments`` packs it), for a constant weight packed
    once outside the kernel, as TVM's layout rewrite does; :func:`dense` reads it as such."""
    from lorien.engine.arrays import Packing

    if n % nr:
        raise WorkloadError(f"packed_dense_weight: N={n} is not a multiple of nr={nr}")
    packing = Packing((n, k), (n // nr, nr, k), (0, 2, 1))
    return te.Tensor(packing.shape, dtype, name, te.PlaceholderOp(name, packing))


def dense(data: te.Tensor, weight: te.Tensor, bias: te.Tensor | None = None, relu: bool = False,
          residual: te.Tensor | None = None, pack_nr: int | None = None, name: str = "dense",
          pack_mr: int | None = None) -> te.Tensor:
    """``out[i, j] = sum_k data[i, k] * weight[j, k]`` (+bias[j], +residual, relu).

    ``pack_nr`` packs the weight into panels ``[N/nr, K, nr]`` (stage ``<name>.weight_pack``)
    so a register tile reads contiguous vectors. ``pack_mr`` (with ``pack_nr``) packs the data
    into row blocks ``[M/mr, K, mr]`` (stage ``<name>.data_pack``): the ``mr`` values a tile
    broadcasts at one k are adjacent, instead of ``mr`` rows K floats apart (with K a multiple of
    1024 those rows fall in one L1 set and evict each other). A 3-d ``weight`` is already in
    panels ``[N/nr, K, nr]`` (:func:`packed_dense_weight`): no packing stage, ``pack_nr`` is nr.
    """
    (m, k_dim), prepacked = data.shape, len(weight.shape) == 3
    if prepacked:
        panels, k2, nr = weight.shape
        if pack_nr not in (None, nr):
            raise WorkloadError(f"dense: the weight is packed in panels of {nr}, not pack_nr={pack_nr}")
        n, pack_nr = panels * nr, nr
    else:
        n, k2 = weight.shape
    if k_dim != k2:
        raise WorkloadError(f"dense: data {data.shape} and weight {weight.shape} disagree on K")
    if pack_nr and n % pack_nr:
        raise WorkloadError(f"dense: N={n} is not a multiple of pack_nr={pack_nr}")
    if pack_mr and not pack_nr:
        raise WorkloadError("dense: pack_mr needs pack_nr (the packed data feeds the register tile)")
    if pack_mr and m % pack_mr:
        raise WorkloadError(f"dense: M={m} is not a multiple of pack_mr={pack_mr}")
    fused = bias is not None or relu or residual is not None
    k = te.reduce_axis(k_dim, name="k")
    if prepacked:
        packed = weight
    elif pack_nr:
        packed = te.compute((n // pack_nr, k_dim, pack_nr), lambda jo, kk, ji: weight[jo * pack_nr + ji, kk],
                            name=f"{name}.weight_pack", tag="layout_pack")
    if pack_mr:
        rows = te.compute((m // pack_mr, k_dim, pack_mr), lambda io, kk, ii: data[io * pack_mr + ii, kk],
                          name=f"{name}.data_pack", tag="layout_pack")

    def data_at(i, kk):
        return rows[i // pack_mr, kk, i % pack_mr] if pack_mr else data[i, kk]

    def weight_at(j, kk):
        return packed[j // pack_nr, kk, j % pack_nr] if pack_nr else weight[j, kk]

    acc = te.compute((m, n), lambda i, j: te.sum(data_at(i, k) * weight_at(j, k), axis=k),
                     name=_acc_name(name, fused), tag="dense")
    return _epilogue(acc, name, bias, (1,), relu, residual)


def matmul(a: te.Tensor, b: te.Tensor, name: str = "matmul") -> te.Tensor:
    """``out[i, j] = sum_k a[i, k] * b[k, j]``."""
    k = te.reduce_axis(a.shape[1], name="k")
    return te.compute((a.shape[0], b.shape[1]), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name=name, tag="matmul")


def batch_matmul(x: te.Tensor, y: te.Tensor, bias: te.Tensor | None = None, relu: bool = False,
                 name: str = "batch_matmul", pack_nr: int | None = None) -> te.Tensor:
    """``out[b, i, j] = sum_k x[b, i, k] * y[b, j, k]`` (TVM's batch_matmul with transposed y).

    ``pack_nr`` packs y into panels ``[B, N/nr, K, nr]`` (stage ``<name>.y_pack``), as
    ``dense(pack_nr=...)`` packs its weight: the ``nr`` columns of a register tile at one k are
    one contiguous load."""
    (batch, m, k_dim), (batch2, n, k2) = x.shape, y.shape
    if k_dim != k2 or batch2 not in (batch, 1):
        raise WorkloadError(f"batch_matmul: shapes {x.shape} and {y.shape} do not match")
    if pack_nr and n % pack_nr:
        raise WorkloadError(f"batch_matmul: N={n} is not a multiple of pack_nr={pack_nr}")
    k = te.reduce_axis(k_dim, name="k")
    fused = bias is not None or relu
    if pack_nr:
        packed = te.compute((batch2, n // pack_nr, k_dim, pack_nr),
                            lambda b, jo, kk, ji: y[b, jo * pack_nr + ji, kk], name=f"{name}.y_pack", tag="layout_pack")

    def y_at(b, j, kk):
        b = b if batch2 > 1 else 0
        return packed[b, j // pack_nr, kk, j % pack_nr] if pack_nr else y[b, j, kk]

    acc = te.compute((batch, m, n), lambda b, i, j: te.sum(x[b, i, k] * y_at(b, j, k), axis=k),
                     name=_acc_name(name, fused), tag="batch_matmul")
    return _epilogue(acc, name, bias, (2,), relu, None)


def _window(h: int, w: int, kh: int, kw: int, stride, padding, dilation) -> tuple:
    """((sh, sw), (dh, dw), (top, left, bottom, right), (oh, ow)) of a 2-d convolution window."""
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _pair(stride), _pair(dilation), _padding(padding)
    return (sh, sw), (dh, dw), (pt, pl, pb, pr), (out_size(h, kh, sh, pt + pb, dh), out_size(w, kw, sw, pl + pr, dw))


def conv2d_nchw(data: te.Tensor, kernel: te.Tensor, stride=1, padding=0, dilation=1,
                bias: te.Tensor | None = None, relu: bool = False, residual: te.Tensor | None = None,
                name: str = "conv2d") -> te.Tensor:
    """2-d convolution, data NCHW, kernel OIHW; bias per output channel."""
    (n, c, h, w), (o, c2, kh, kw) = data.shape, kernel.shape
    if c != c2:
        raise WorkloadError(f"conv2d_nchw: data {data.shape} and kernel {kernel.shape} disagree on channels")
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (oh, ow) = _window(h, w, kh, kw, stride, padding, dilation)
    padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), name=f"{name}.pad")
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    fused = bias is not None or relu or residual is not None
    acc = te.compute((n, o, oh, ow), lambda nn, ff, yy, xx: te.sum(
        padded[nn, rc, yy * sh + ry * dh, xx * sw + rx * dw] * kernel[ff, rc, ry, rx], axis=[rc, ry, rx]),
        name=_acc_name(name, fused), tag="conv2d_nchw")
    return _epilogue(acc, name, bias, (1,), relu, residual)


def conv2d_nhwc(data: te.Tensor, kernel: te.Tensor, stride=1, padding=0, dilation=1,
                bias: te.Tensor | None = None, relu: bool = False, residual: te.Tensor | None = None,
                name: str = "conv2d") -> te.Tensor:
    """2-d convolution, data NHWC, kernel HWIO; bias per output channel."""
    (n, h, w, c), (kh, kw, c2, o) = data.shape, kernel.shape
    if c != c2:
        raise WorkloadError(f"conv2d_nhwc: data {data.shape} and kernel {kernel.shape} disagree on channels")
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (oh, ow) = _window(h, w, kh, kw, stride, padding, dilation)
    padded = pad(data, (0, pt, pl, 0), (0, pb, pr, 0), name=f"{name}.pad")
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    fused = bias is not None or relu or residual is not None
    acc = te.compute((n, oh, ow, o), lambda nn, yy, xx, ff: te.sum(
        padded[nn, yy * sh + ry * dh, xx * sw + rx * dw, rc] * kernel[ry, rx, rc, ff], axis=[ry, rx, rc]),
        name=_acc_name(name, fused), tag="conv2d_nhwc")
    return _epilogue(acc, name, bias, (3,), relu, residual)


def conv2d_NCHWc(data: te.Tensor, kernel: te.Tensor, stride=1, padding=0, dilation=1,
                 bias: te.Tensor | None = None, relu: bool = False, residual: te.Tensor | None = None,
                 name: str = "conv2d_NCHWc") -> te.Tensor:
    """Packed conv2d: data [N, C/ic_bn, H, W, ic_bn], kernel [O/oc_bn, C/ic_bn, KH, KW, ic_bn, oc_bn].

    Output [N, O/oc_bn, OH, OW, oc_bn]; ``bias`` is [O/oc_bn, oc_bn] (or [O]).
    """
    (n, ic_chunk, h, w, ic_bn), (oc_chunk, ic_chunk2, kh, kw, ic_bn2, oc_bn) = data.shape, kernel.shape
    if (ic_chunk, ic_bn) != (ic_chunk2, ic_bn2):
        raise WorkloadError(f"conv2d_NCHWc: data {data.shape} and kernel {kernel.shape} disagree on channels")
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (oh, ow) = _window(h, w, kh, kw, stride, padding, dilation)
    padded = pad(data, (0, 0, pt, pl, 0), (0, 0, pb, pr, 0), name=f"{name}.pad")
    ic, ry, rx = te.reduce_axis(ic_chunk * ic_bn, "ic"), te.reduce_axis(kh, "kh"), te.reduce_axis(kw, "kw")
    fused = bias is not None or relu or residual is not None
    acc = te.compute((n, oc_chunk, oh, ow, oc_bn), lambda nn, oc, yy, xx, ob: te.sum(
        padded[nn, ic // ic_bn, yy * sh + ry * dh, xx * sw + rx * dw, ic % ic_bn]
        * kernel[oc, ic // ic_bn, ry, rx, ic % ic_bn, ob], axis=[ic, ry, rx]),
        name=_acc_name(name, fused), tag="conv2d_NCHWc")
    if bias is not None and bias.ndim == 1:
        raise WorkloadError("conv2d_NCHWc: pass bias packed as [O/oc_bn, oc_bn]")
    return _epilogue(acc, name, bias, (1, 4), relu, residual)


def depthwise_conv2d_nchw(data: te.Tensor, kernel: te.Tensor, stride=1, padding=0, dilation=1,
                          bias: te.Tensor | None = None, relu: bool = False,
                          name: str = "depthwise_conv2d") -> te.Tensor:
    """Depthwise conv2d: data NCHW, kernel [C, multiplier, KH, KW]; output channels C*multiplier."""
    (n, c, h, w), (c2, mult, kh, kw) = data.shape, kernel.shape
    if c != c2:
        raise WorkloadError(f"depthwise_conv2d_nchw: data {data.shape} and kernel {kernel.shape} disagree on channels")
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (oh, ow) = _window(h, w, kh, kw, stride, padding, dilation)
    padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), name=f"{name}.pad")
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    fused = bias is not None or relu
    acc = te.compute((n, c * mult, oh, ow), lambda nn, ch, yy, xx: te.sum(
        padded[nn, ch // mult, yy * sh + ry * dh, xx * sw + rx * dw] * kernel[ch // mult, ch % mult, ry, rx],
        axis=[ry, rx]), name=_acc_name(name, fused), tag="depthwise_conv2d_nchw")
    return _epilogue(acc, name, bias, (1,), relu, None)


def depthwise_conv2d_NCHWc(data: te.Tensor, kernel: te.Tensor, stride=1, padding=0, dilation=1,
                           bias: te.Tensor | None = None, relu: bool = False,
                           name: str = "depthwise_conv2d_NCHWc") -> te.Tensor:
    """Packed depthwise conv2d (multiplier 1): data [N, C/bn, H, W, bn], kernel
    [C/bn, 1, KH, KW, 1, bn] (TVM's layout); output [N, C/bn, OH, OW, bn]; ``bias`` [C/bn, bn]."""
    (n, chunks, h, w, bn), (chunks2, one, kh, kw, one2, bn2) = data.shape, kernel.shape
    if (chunks, bn, one, one2) != (chunks2, bn2, 1, 1):
        raise WorkloadError(f"depthwise_conv2d_NCHWc: data {data.shape} and kernel {kernel.shape} disagree "
                            "(kernel must be [C/bn, 1, KH, KW, 1, bn])")
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (oh, ow) = _window(h, w, kh, kw, stride, padding, dilation)
    padded = pad(data, (0, 0, pt, pl, 0), (0, 0, pb, pr, 0), name=f"{name}.pad")
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    fused = bias is not None or relu
    acc = te.compute((n, chunks, oh, ow, bn), lambda nn, c, yy, xx, b: te.sum(
        padded[nn, c, yy * sh + ry * dh, xx * sw + rx * dw, b] * kernel[c, 0, ry, rx, 0, b], axis=[ry, rx]),
        name=_acc_name(name, fused), tag="depthwise_conv2d_NCHWc")
    return _epilogue(acc, name, bias, (1, 4), relu, None)
