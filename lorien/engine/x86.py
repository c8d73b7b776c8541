"""Hand-written x86 schedules (register tiles, packing, parallel outer loops).

These are the engine's own fast schedules, used by the engine benchmark and as defaults;
tuners search the same knobs (tile sizes, unroll) through their own templates.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

from lorien.engine import te
from lorien.engine.schedule import Schedule, Stage, create_schedule


def vector_lanes() -> int:
    """float32 lanes of the widest vector register of the CPU schedules are built for (16 with
    AVX-512, 8 with AVX2; see :func:`lorien.engine.cpu.building_for`)."""
    from lorien.engine.cpu import current

    return current().lanes


def vector_registers() -> int:
    """Vector registers of the CPU schedules are built for: 32 with AVX-512 (zmm0-31), 16 with
    AVX/AVX2 or SSE on x86-64, 32 on AArch64 (v0-v31)."""
    from lorien.engine.cpu import current

    target = current()
    if target.lanes == 16 or platform.machine() in ("aarch64", "arm64"):
        return 32
    return 16


def dense_register_tiles(m: int, n: int, lanes: int | None = None, registers: int | None = None) -> list[tuple[int, int]]:
    """Register tiles ``(mr, nr)`` for a dense of M rows and N columns, widest first: ``nr`` is
    1-4 vectors of ``lanes`` floats (default: the CPU's vector width; pass a width measured to
    run at full rate, :mod:`lorien.engine.peak`) dividing N, and ``mr`` the most rows whose
    ``mr x nr / lanes`` accumulators, ``nr / lanes`` weight vectors and one broadcast fit
    ``registers`` (default: :func:`vector_registers`); then the largest ``mr`` dividing M (so
    the data can be packed in ``mr``-row blocks) and its half. ``mr`` is at most M."""
    lanes = lanes or vector_lanes()
    registers = registers or vector_registers()
    tiles = []
    for vectors in (1, 2, 3, 4):
        nr = vectors * lanes
        if n % nr:
            continue
        most = min(m, (registers - vectors - 1) // vectors)
        if most < 1:
            continue
        dividing = max(rows for rows in range(1, most + 1) if m % rows == 0)
        tiles += [(most, nr), (dividing, nr), (max(1, dividing // 2), nr)]
    return list(dict.fromkeys(tiles))


def vectorize_by_lanes(stage: Stage, axis: te.IterVar, extent: int) -> None:
    """Vectorize ``axis`` in native-width pieces: split it by the host's float32 lanes when
    its ``extent`` is a multiple, unrolling the pieces; otherwise vectorize it whole."""
    lanes = vector_lanes()
    if extent > lanes and extent % lanes == 0:
        outer, inner = stage.split(axis, factor=lanes)
        stage.unroll(outer)
        stage.vectorize(inner)
    else:
        stage.vectorize(axis)


def _unroll_rows_vectorize_columns(stage: Stage, rows: te.IterVar, columns: te.IterVar, lanes: int) -> None:
    """A register tile's store: its rows unrolled, its columns split into unrolled vectors."""
    outer, inner = stage.split(columns, factor=lanes)
    stage.unroll(rows)
    stage.unroll(outer)
    stage.vectorize(inner)


def _accumulate_in_registers(tile: Stage, k: te.IterVar, rows: te.IterVar, columns: te.IterVar,
                             lanes: int) -> None:
    """A register tile's accumulation: k outermost, then the rows (unrolled) and the columns in
    unrolled vectors, so every accumulator stays in a register across k."""
    outer, inner = tile.split(columns, factor=lanes)
    tile.reorder(k, rows, outer, inner)
    tile.unroll(rows)
    tile.unroll(outer)
    tile.vectorize(inner)


def _output_and_tile(s: Schedule, out: te.Tensor) -> tuple[Stage, Stage]:
    """(output stage, stage computing the register tile) for an ops.* output: with a fused
    epilogue the tile is its ``.acc`` reduction; without one a local cache of the output."""
    acc_name = f"{out.name}.acc"
    if any(st.name == acc_name for st in s.stages):
        return s[out], s[acc_name]
    local = s.cache_write(out, "local")
    return s[out], s[local]


def schedule_dense(s: Schedule, out: te.Tensor, mr: int = 8, nr: int = 32, order: str = "mn",
                   pack_inner: bool = False, parts: int | None = None) -> Schedule:
    """Register-tiled dense for ``ops.dense(..., pack_nr=nr)``: an ``mr x nr`` accumulator tile in
    vector registers (k innermost outside the tile), parallel over the outer M (or N) blocks.

    ``pack_inner`` (with ``order="nm"``): each ``nr``-wide panel of the weight is packed inside
    the parallel N loop, just before all M rows use it, instead of the whole weight up front:
    the panel (K x nr floats) stays in cache, and the weight is read from memory once (small M).
    With ``ops.dense(..., pack_mr=mr)`` each ``mr``-row block of the data is packed in the
    parallel M loop (``order="mn"``) just before the tiles of that block use it.

    ``parts`` (``order="nm"``): the parallel loop has that many iterations, one contiguous slice of
    the N panels each, instead of one per panel (with a weight packed beforehand,
    ``ops.packed_dense_weight``, and M = 1 this is a GEMV that vectorizes N: no horizontal sums)."""
    lanes = min(vector_lanes(), nr)
    top, tile = _output_and_tile(s, out)
    i, j = top.op.axis
    mo, mi = top.split(i, factor=mr)
    no, ni = top.split(j, factor=nr)
    if order == "mn":
        top.reorder(mo, no, mi, ni)
        top.parallel(mo)
    elif parts:
        po, no = top.split(no, nparts=parts)
        top.reorder(po, no, mo, mi, ni)
        top.parallel(po)
    else:
        top.reorder(no, mo, mi, ni)
        top.parallel(no)
    _unroll_rows_vectorize_columns(top, mi, ni, lanes)
    tile.compute_at(top, no if order == "mn" else mo)
    ti, tj = tile.op.axis
    (tk,) = tile.op.reduce_axis
    _accumulate_in_registers(tile, tk, ti, tj, lanes)
    pack_name = f"{out.name}.weight_pack"
    if any(st.name == pack_name for st in s.stages):
        pack = s[pack_name]
        po, _, pi = pack.op.axis
        if pack_inner and order == "nm":
            pack.compute_at(top, no)
        else:
            pack.parallel(po)
        pack.vectorize(pi)
    data_pack = f"{out.name}.data_pack"
    if any(st.name == data_pack for st in s.stages):
        pack = s[data_pack]
        po, _, pi = pack.op.axis
        if order == "mn":
            pack.compute_at(top, mo)
        else:
            pack.parallel(po)
        pack.unroll(pi)
    return s


def schedule_batch_matmul(s: Schedule, out: te.Tensor, mr: int = 8, nr: int = 32) -> Schedule:
    """Register-tiled batch_matmul for ``ops.batch_matmul(..., pack_nr=nr)``: one parallel loop
    over (batch, ``nr``-column panel); each panel of y is packed there, just before all M rows
    use it in ``mr x nr`` accumulator tiles (k innermost outside the tile), so y is read once and
    the work is a single fork-join (the small per-head matrices of attention are a few us each).
    Without a y batch dimension (``y[1, N, K]``) the panel is packed again per batch."""
    lanes = min(vector_lanes(), nr)
    top, tile = _output_and_tile(s, out)
    bb, i, j = top.op.axis
    mo, mi = top.split(i, factor=mr)
    no, ni = top.split(j, factor=nr)
    top.reorder(bb, no, mo, mi, ni)
    _unroll_rows_vectorize_columns(top, mi, ni, lanes)
    tile.compute_at(top, mo)
    _, ti, tj = tile.op.axis
    (tk,) = tile.op.reduce_axis
    _accumulate_in_registers(tile, tk, ti, tj, lanes)
    pack_name = f"{out.name}.y_pack"
    if any(st.name == pack_name for st in s.stages):
        pack = s[pack_name]
        pack.compute_at(top, no)
        pack.vectorize(pack.op.axis[-1])
    top.parallel(top.fuse(bb, no))
    return s


def schedule_matmul(s: Schedule, out: te.Tensor, mr: int = 6, nr: int = 32) -> Schedule:
    """Register-tiled ``ops.matmul`` (``a[M, K] b[K, N]``, b row-major, so ``nr`` columns of b
    at one k are one contiguous load; no packing): ``mr x nr`` accumulator tiles, parallel over
    the ``nr``-column panels, each panel (K x nr) used by all M rows while it is in cache.
    A 1x1 stride-1 convolution in NCHW is this matmul on the tensors as they are (weight
    ``[O, C]``, data ``[C, H*W]``, output ``[O, H*W]``): :func:`conv1x1_nchw_candidate`."""
    lanes = min(vector_lanes(), nr)
    top, tile = _output_and_tile(s, out)
    i, j = top.op.axis
    mo, mi = top.split(i, factor=mr)
    no, ni = top.split(j, factor=nr)
    top.reorder(no, mo, mi, ni)
    top.parallel(no)
    _unroll_rows_vectorize_columns(top, mi, ni, lanes)
    tile.compute_at(top, mo)
    ti, tj = tile.op.axis
    (tk,) = tile.op.reduce_axis
    _accumulate_in_registers(tile, tk, ti, tj, lanes)
    return s


def _nchwc_register_tile(s: Schedule, out: te.Tensor, tile_oh: int, tile_ow: int, pad_inline: bool,
                         pad_rows: bool = False) -> tuple[Stage, te.IterVar, te.IterVar, te.IterVar]:
    """The part the NCHW[x]c convolutions share: the padding inlined or materialized in
    parallel, the output in ``tile_oh x tile_ow x block`` register tiles (rows and columns
    unrolled, the channel block vectorized), parallel over (n, channel chunk, row blocks), the
    tile computed at the column block. With ``pad_rows`` the parallel loop is over (n, row
    blocks) with the channel chunks inside, and each row block first pads just the input rows
    it reads (all channels), which every chunk then reads from cache: no separate pass over the
    whole input. Returns the tile and its row, column and block axes."""
    top, tile = _output_and_tile(s, out)
    pad_name = f"{out.name}.pad"
    pad = s[pad_name] if any(st.name == pad_name for st in s.stages) else None
    if pad is not None and pad_inline:
        pad.compute_inline()
    elif pad is not None and not pad_rows:
        n, cc, h, _, cb = pad.op.axis
        pad.parallel(pad.fuse(n, cc, h))
        pad.vectorize(cb)
    n, chunk, oh, ow, ob = top.op.axis
    oho, ohi = top.split(oh, factor=tile_oh)
    owo, owi = top.split(ow, factor=tile_ow)
    if pad_rows:
        top.reorder(n, oho, chunk, owo, ohi, owi, ob)
        rows = top.fuse(n, oho)
        top.parallel(rows)
        if pad is not None and not pad_inline:
            pad.compute_at(top, rows)
            pad.vectorize(pad.op.axis[4])
    else:
        top.reorder(n, chunk, oho, owo, ohi, owi, ob)
        top.parallel(top.fuse(n, chunk, oho))
    top.unroll(ohi)
    top.unroll(owi)
    top.vectorize(ob)
    tile.compute_at(top, owo)
    _, _, toh, tow, tob = tile.op.axis
    return tile, toh, tow, tob


def schedule_conv2d_NCHWc(s: Schedule, out: te.Tensor, tile_ow: int = 8, unroll_kw: bool = True,
                          pad_inline: bool = False, tile_oh: int = 1, pad_rows: bool = False) -> Schedule:
    """TVM-style conv2d_NCHWc.x86 schedule: a ``tile_oh x tile_ow x oc_bn`` register tile (oh, ow
    unrolled, oc_bn vectorized), ic split by ic_bn, kw optionally unrolled, parallel over
    (n, oc_chunk, oh blocks), or with ``pad_rows`` over (n, oh blocks), each padding the input
    rows it reads just before its chunks use them (see :func:`_nchwc_register_tile`)."""
    tile, toh, tow, tob = _nchwc_register_tile(s, out, tile_oh, tile_ow, pad_inline, pad_rows)
    ic, kh, kw = tile.op.reduce_axis
    ic_bn = next(t for t in tile.op.input_tensors() if t.ndim == 5).shape[4]
    ico, ici = tile.split(ic, factor=ic_bn)
    if unroll_kw:
        tile.reorder(ico, kh, ici, kw, toh, tow, tob)
        tile.unroll(kw)
    else:
        tile.reorder(ico, kh, kw, ici, toh, tow, tob)
    tile.unroll(toh)
    tile.unroll(tow)
    tile.vectorize(tob)
    return s


def schedule_depthwise_NCHWc(s: Schedule, out: te.Tensor, tile_ow: int = 8, tile_oh: int = 1,
                             pad_inline: bool = False) -> Schedule:
    """Depthwise NCHW[bn]c: a ``tile_oh x tile_ow x bn`` register tile (bn vectorized, the kernel
    window unrolled around it), parallel over (n, channel block, oh blocks); padding
    materialized in parallel unless ``pad_inline``."""
    tile, toh, tow, tob = _nchwc_register_tile(s, out, tile_oh, tile_ow, pad_inline)
    ry, rx = tile.op.reduce_axis
    tile.reorder(ry, rx, toh, tow, tob)
    tile.unroll(rx)
    tile.unroll(toh)
    tile.unroll(tow)
    tile.vectorize(tob)
    return s


def schedule_depthwise_nchw(s: Schedule, out: te.Tensor, tile_ow: int = 16, tile_oh: int = 1,
                            pad_inline: bool = False) -> Schedule:
    """Depthwise conv2d in NCHW, with no layout transform: a ``tile_oh x tile_ow`` register tile
    along the output rows (``tile_ow`` vectorized over ow, the kernel window unrolled around
    it), parallel over channels; each channel's padded plane is materialized inside that loop,
    just before its tiles read it (it stays in cache), or with ``pad_inline`` the tile reads the
    input through the padding's bounds check."""
    top, tile = _output_and_tile(s, out)
    n, c, oh, ow = top.op.axis
    oho, ohi = top.split(oh, factor=tile_oh)
    owo, owi = top.split(ow, factor=tile_ow)
    top.reorder(n, c, oho, owo, ohi, owi)
    top.unroll(ohi)
    vectorize_by_lanes(top, owi, tile_ow)
    tile.compute_at(top, owo)
    _, _, toh, tow = tile.op.axis
    ry, rx = tile.op.reduce_axis
    tile.reorder(ry, rx, toh, tow)
    tile.unroll(ry)
    tile.unroll(rx)
    tile.unroll(toh)
    vectorize_by_lanes(tile, tow, tile_ow)
    pad_name = f"{out.name}.pad"
    if any(st.name == pad_name for st in s.stages):
        if pad_inline:
            s[pad_name].compute_inline()
        else:
            s[pad_name].compute_at(top, c)
    top.parallel(top.fuse(n, c))
    return s


def schedule_dense_gemv(s: Schedule, out: te.Tensor, rows: int = 4, k_vectors: int = 1,
                        unroll_sum: bool = True, parts: int | None = None) -> Schedule:
    """Dense at M = 1 (and a few rows) on the weight as it is, ``[N, K]`` (``ops.dense`` without
    ``pack_nr``): the reduction is split by ``k_vectors`` vectors of K and factored
    (``rfactor``) so that each output accumulates that many vectors over K, with one horizontal
    sum at the end; ``rows`` weight rows (times all M data rows) are accumulated at once, so each
    data vector is loaded once for them; parallel over blocks of ``rows`` outputs, or over ``parts`` slices of them
    (:func:`schedule_gemv_stages`)."""
    acc_name = f"{out.name}.acc"
    if any(st.name == f"{out.name}.weight_pack" for st in s.stages):
        raise ValueError("schedule_dense_gemv: build ops.dense without pack_nr (the GEMV reads the weight as it is)")
    red = s[acc_name] if any(st.name == acc_name for st in s.stages) else s[out]
    return schedule_gemv_stages(s, s[out], red, rows, vector_lanes() * k_vectors, unroll_sum, parts=parts)


def schedule_gemv_stages(s: Schedule, top: Stage, red: Stage, rows: int, width: int, unroll_sum: bool = True,
                         inline: Sequence[Stage] = (), parts: int | None = None) -> Schedule:
    """The GEMV schedule on explicit stages: ``red`` reduces ``[.., M, N]`` over one K axis,
    ``top`` is the output (``red`` itself or an element-wise epilogue of it, same shape; stages
    in ``inline`` between them are inlined). K is split by ``width`` (a multiple of the vector
    lanes; a split that does not divide is guarded) and factored into ``<red>.rf``.

    ``parts`` (2-d outputs only): the parallel loop has that many iterations, one contiguous
    slice of the weight each, instead of one per block of ``rows`` outputs. With one part per
    thread the runtime's threads mostly take the same slice at every call (the caller claims the
    first part), so a slice that fits a core's L2 stays there between calls, as with OpenBLAS's
    static split."""
    for stage in inline:
        stage.compute_inline()
    (k,) = red.op.reduce_axis
    _, ki = red.split(k, factor=width)
    rf = s[s.rfactor(red.tensor, ki, factor_axis=len(red.op.axis))]
    *outer, m, n = top.op.axis
    no, ni = top.split(n, factor=rows)
    if parts and not outer:
        po, no = top.split(no, nparts=parts)
        top.reorder(po, no, m, ni)
        top.parallel(po)
    else:
        top.reorder(*outer, no, m, ni)
        top.parallel(top.fuse(*outer, no) if outer else no)
    top.unroll(ni)
    if red is not top:
        red.compute_at(top, no if not outer else top.leaf[0])
        red.unroll(red.op.axis[-1])
        target = red
    else:
        target = top
    if unroll_sum:
        target.unroll(target.op.reduce_axis[0])
    rf.compute_at(top, no if parts and not outer else top.leaf[0])
    *rspatial, rk = rf.op.axis
    (rko,) = rf.op.reduce_axis
    rf.reorder(rko, *rspatial, rk)
    for axis in rspatial:
        rf.unroll(axis)
    vectorize_by_lanes(rf, rk, width)
    return s


def dense_gemv_candidate(m: int, n: int, k: int, rows: int = 4, k_vectors: int = 1, unroll_sum: bool = True,
                         parts: int | None = None):
    """(schedule, args) of :func:`schedule_dense_gemv`; a picklable builder for ``MeasureInput``."""
    from lorien.engine import ops

    data, weight = te.placeholder((m, k), name="data"), te.placeholder((n, k), name="weight")
    out = ops.dense(data, weight)
    s = create_schedule(out)
    schedule_dense_gemv(s, out, rows, k_vectors, unroll_sum, parts)
    return s, [data, weight, out]


def dense_candidate(m: int, n: int, k: int, mr: int = 8, nr: int = 32, order: str = "mn", pack_inner: bool = False,
                    pack_data: bool = False, prepacked_weight: bool = False, parts: int | None = None):
    """(schedule, args) of a register-tiled dense (``pack_data``: the data packed in ``mr``-row
    blocks too, see ``ops.dense``; ``prepacked_weight``: the kernel takes the weight already in
    its panels, ``ops.packed_dense_weight``; ``parts``: see :func:`schedule_dense`); a picklable
    builder for ``MeasureInput``."""
    from lorien.engine import ops

    data = te.placeholder((m, k), name="data")
    weight = ops.packed_dense_weight(n, k, nr) if prepacked_weight else te.placeholder((n, k), name="weight")
    out = ops.dense(data, weight, pack_nr=nr, pack_mr=mr if pack_data else None)
    s = create_schedule(out)
    schedule_dense(s, out, mr, nr, order, pack_inner, parts)
    return s, [data, weight, out]


def batch_matmul_candidate(b: int, m: int, n: int, k: int, mr: int = 8, nr: int = 32):
    """(schedule, args) of :func:`schedule_batch_matmul`; a picklable builder for ``MeasureInput``."""
    from lorien.engine import ops

    x, y = te.placeholder((b, m, k), name="x"), te.placeholder((b, n, k), name="y")
    out = ops.batch_matmul(x, y, pack_nr=nr)
    s = create_schedule(out)
    schedule_batch_matmul(s, out, mr, nr)
    return s, [x, y, out]


def conv1x1_nchw_candidate(channels: int, size: int, out_channels: int, mr: int = 6, nr: int = 32):
    """(schedule, args) of a 1x1 stride-1 convolution from NCHW to NCHW (batch 1, square input)
    as :func:`schedule_matmul`: args ``weight[O, C]``, ``data[C, H*W]``, ``out[O, H*W]``, which
    are ``OIHW`` / ``NCHW`` arrays reshaped (views, no copy)."""
    from lorien.engine import ops

    weight = te.placeholder((out_channels, channels), name="weight")
    data = te.placeholder((channels, size * size), name="data")
    out = ops.matmul(weight, data, name="conv1x1")
    s = create_schedule(out)
    schedule_matmul(s, out, mr, nr)
    return s, [weight, data, out]


def depthwise_nchw_candidate(channels: int, size: int, stride: int, tile_ow: int = 16, tile_oh: int = 1,
                             pad_inline: bool = False):
    """(schedule, args) of :func:`schedule_depthwise_nchw`: a 3x3 pad-1 depthwise conv2d, NCHW
    in and out (batch 1, square input), kernel ``[C, 1, 3, 3]``."""
    from lorien.engine import ops

    data = te.placeholder((1, channels, size, size), name="data")
    kernel = te.placeholder((channels, 1, 3, 3), name="kernel")
    out = ops.depthwise_conv2d_nchw(data, kernel, stride, 1)
    s = create_schedule(out)
    schedule_depthwise_nchw(s, out, tile_ow, tile_oh, pad_inline)
    return s, [data, kernel, out]


def conv2d_NCHWc_candidate(channels: int, size: int, out_channels: int, stride: int, ic_bn: int = 16,
                           oc_bn: int = 16, tile_ow: int = 8, unroll_kw: bool = True, kernel: int = 3,
                           pad: int = 1, tile_oh: int = 1, pad_rows: bool = False):
    """(schedule, args) of a scheduled 3x3 NCHW[x]c conv2d (batch 1, square input); ``pad_rows``:
    see :func:`schedule_conv2d_NCHWc`."""
    from lorien.engine import ops

    data = te.placeholder((1, channels // ic_bn, size, size, ic_bn), name="data")
    weight = te.placeholder((out_channels // oc_bn, channels // ic_bn, kernel, kernel, ic_bn, oc_bn), name="kernel")
    out = ops.conv2d_NCHWc(data, weight, stride, pad)
    s = create_schedule(out)
    schedule_conv2d_NCHWc(s, out, tile_ow, unroll_kw, tile_oh=tile_oh, pad_rows=pad_rows)
    return s, [data, weight, out]


def depthwise_NCHWc_candidate(channels: int, size: int, stride: int, bn: int = 16, tile_ow: int = 8,
                              tile_oh: int = 1, kernel: int = 3, pad: int = 1, pad_inline: bool = False):
    """(schedule, args) of a scheduled depthwise NCHW[bn]c conv2d (batch 1, square input)."""
    from lorien.engine import ops

    data = te.placeholder((1, channels // bn, size, size, bn), name="data")
    weight = te.placeholder((channels // bn, 1, kernel, kernel, 1, bn), name="kernel")
    out = ops.depthwise_conv2d_NCHWc(data, weight, stride, pad)
    s = create_schedule(out)
    schedule_depthwise_NCHWc(s, out, tile_ow, tile_oh, pad_inline)
    return s, [data, weight, out]
