"""Schedule primitives, replay, lowering and the JIT: each checked against NumPy on small shapes."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from lorien.engine import ScheduleError, build, lower, ops, reference, runtime, te
from lorien.engine.schedule import create_schedule, replay
from lorien.errors import LorienError

RNG = np.random.default_rng(1)


def _dense(m=13, n=20, k=7, pack_nr=None):
    data, weight = te.placeholder((m, k), name="data"), te.placeholder((n, k), name="weight")
    return data, weight, ops.dense(data, weight, pack_nr=pack_nr)


def _check_dense(s, data, weight, out):
    a = RNG.standard_normal(data.shape).astype("float32")
    b = RNG.standard_normal(weight.shape).astype("float32")
    c = np.zeros(out.shape, "float32")
    build(s, [data, weight, out])(a, b, c)
    np.testing.assert_allclose(c, reference.dense(a, b), rtol=1e-4, atol=1e-4)


def test_split_by_factor_that_does_not_divide_is_guarded():
    data, weight, out = _dense()
    s = create_schedule(out)
    s[out].split(out.op.axis[0], factor=4)
    s[out].split(out.op.axis[1], factor=6)
    _check_dense(s, data, weight, out)


def test_split_by_nparts():
    data, weight, out = _dense()
    s = create_schedule(out)
    outer, inner = s[out].split(out.op.axis[1], nparts=3)
    assert (outer.name, inner.name) == ("j.outer", "j.inner")
    _check_dense(s, data, weight, out)


def test_reorder_puts_reduction_outermost():
    data, weight, out = _dense()
    s = create_schedule(out)
    i, j = out.op.axis
    (k,) = out.op.reduce_axis
    s[out].reorder(k, j, i)
    assert s[out].leaf == ["k", "j", "i"]
    _check_dense(s, data, weight, out)


def test_fuse_and_parallel_over_the_fused_axis():
    data, weight, out = _dense(m=16, n=24)
    s = create_schedule(out)
    fused = s[out].fuse(*out.op.axis)
    s[out].parallel(fused)
    assert "'parallel'" in str(lower(s, [data, weight, out]))
    _check_dense(s, data, weight, out)


def test_vectorize_makes_vector_ops_and_unroll_expands_copies():
    data, weight, out = _dense(m=8, n=32)
    s = create_schedule(out)
    i, j = out.op.axis
    (k,) = out.op.reduce_axis
    io, ii = s[out].split(i, factor=2)
    jo, ji = s[out].split(j, factor=16)
    s[out].reorder(io, jo, k, ii, ji)
    s[out].unroll(ii)
    s[out].vectorize(ji)
    text = str(lower(s, [data, weight, out]))
    assert "float32x16" in text and "fma" in text
    assert text.count("ALU float32x16") == 2  # one fma per unrolled row
    _check_dense(s, data, weight, out)


def test_register_tile_with_cache_write_and_compute_at_over_packed_weight():
    data, weight, out = _dense(m=12, n=32, k=9, pack_nr=16)
    s = create_schedule(out)
    local = s.cache_write(out, "local")
    i, j = s[out].op.axis
    io, ii = s[out].split(i, factor=4)
    jo, ji = s[out].split(j, factor=16)
    s[out].reorder(io, jo, ii, ji)
    s[out].vectorize(ji)
    s[out].parallel(io)
    s[local].compute_at(s[out], jo)
    li, lj = s[local].op.axis
    (lk,) = s[local].op.reduce_axis
    s[local].reorder(lk, li, lj)
    s[local].unroll(li)
    s[local].vectorize(lj)
    pack = s["dense.weight_pack"]
    pack.parallel(pack.op.axis[0])
    pack.vectorize(pack.op.axis[2])
    text = str(lower(s, [data, weight, out]))
    assert "('dense.local', 64, 'local')" in text  # a 4x16 accumulator tile
    _check_dense(s, data, weight, out)


def test_compute_inline_removes_the_padding_stage():
    data, kern = te.placeholder((1, 2, 5, 5), name="data"), te.placeholder((3, 2, 3, 3), name="kernel")
    out = ops.conv2d_nchw(data, kern, 1, 1)
    s = create_schedule(out)
    s["conv2d.pad"].compute_inline()
    assert "conv2d.pad" not in str(lower(s, [data, kern, out]))
    a, k = RNG.standard_normal((1, 2, 5, 5)).astype("float32"), RNG.standard_normal((3, 2, 3, 3)).astype("float32")
    c = np.zeros(out.shape, "float32")
    build(s, [data, kern, out])(a, k, c)
    np.testing.assert_allclose(c, reference.conv2d_nchw(a, k, 1, 1), rtol=1e-4, atol=1e-4)


def test_padding_computed_at_an_output_row_allocates_only_the_window():
    data, kern = te.placeholder((1, 2, 6, 6), name="data"), te.placeholder((2, 2, 3, 3), name="kernel")
    out = ops.conv2d_nchw(data, kern, 1, 1)
    s = create_schedule(out)
    s["conv2d.pad"].compute_at(s[out], out.op.axis[2])
    assert "('conv2d.pad', 48, 'local')" in str(lower(s, [data, kern, out]))  # 2 channels x 3 rows x 8 cols
    a, k = RNG.standard_normal((1, 2, 6, 6)).astype("float32"), RNG.standard_normal((2, 2, 3, 3)).astype("float32")
    c = np.zeros(out.shape, "float32")
    build(s, [data, kern, out])(a, k, c)
    np.testing.assert_allclose(c, reference.conv2d_nchw(a, k, 1, 1), rtol=1e-4, atol=1e-4)


def test_fused_epilogue_stage_computes_bias_and_relu():
    data, weight, bias = te.placeholder((4, 8), name="d"), te.placeholder((16, 8), name="w"), te.placeholder((16,), name="b")
    out = ops.dense(data, weight, bias=bias, relu=True)
    s = create_schedule(out)
    i, j = s[out].op.axis
    s[out].vectorize(j)
    s["dense.acc"].compute_at(s[out], i)
    a, w, b = (RNG.standard_normal(t.shape).astype("float32") for t in (data, weight, bias))
    c = np.zeros(out.shape, "float32")
    build(s, [data, weight, bias, out])(a, w, b, c)
    np.testing.assert_allclose(c, reference.dense(a, w, b, relu=True), rtol=1e-4, atol=1e-4)


def test_steps_serialize_to_json_and_replay_to_the_same_program():
    data, weight, out = _dense(m=8, n=32)
    s = create_schedule(out)
    local = s.cache_write(out, "local")
    jo, ji = s[out].split(s[out].op.axis[1], factor=16)
    s[out].vectorize(ji)
    s[local].compute_at(s[out], jo)
    steps = json.loads(json.dumps(s.steps))
    replayed = replay(steps, out)
    assert replayed.steps == s.steps
    assert str(lower(replayed, [data, weight, out])) == str(lower(s, [data, weight, out]))
    _check_dense(replayed, data, weight, out)


def test_unknown_axis_is_a_schedule_error_naming_it():
    _, _, out = _dense()
    s = create_schedule(out)
    with pytest.raises(ScheduleError, match="'nope'"):
        s[out].split("nope", factor=2)


def test_reduction_cannot_be_inlined():
    _, _, out = _dense()
    with pytest.raises(ScheduleError, match="reduction"):
        replay([{"kind": "compute_inline", "stage": "dense"}], out)


def test_printed_ir_shows_loops_loads_and_stores():
    data, weight, out = _dense(m=4, n=4, k=4)
    text = str(lower(create_schedule(out), [data, weight, out]))
    assert text.splitlines()[0].startswith("kernel kernel(data: float32[4, 4]")
    for kind in ("LOOP", "ENDLOOP", "LOAD", "STORE", "ALU"):
        assert kind in text


def test_parallel_loop_uses_every_thread_and_gives_the_same_answer():
    a = te.placeholder((4096,), name="a")
    out = te.compute((4096,), lambda i: a[i] * 2.0 + 1.0, name="out")
    s = create_schedule(out)
    o, inner = s[out].split(out.op.axis[0], factor=64)
    s[out].parallel(o)
    s[out].vectorize(inner)
    x = RNG.standard_normal(4096).astype("float32")
    y = np.zeros(4096, "float32")
    build(s, [a, out])(x, y)
    np.testing.assert_allclose(y, x * 2 + 1, rtol=1e-6)
    assert runtime.num_threads() >= 1


def test_kernel_time_grows_number_until_a_repeat_lasts_min_repeat_ms():
    data, weight, out = _dense(m=8, n=8, k=8)
    kernel = build(create_schedule(out), [data, weight, out])
    arrays = [np.ones(t.shape, "float32") for t in (data, weight, out)]
    (cost,) = kernel.time(*arrays, number=1, repeat=1, min_repeat_ms=5)
    assert kernel.last_number > 1
    assert cost * kernel.last_number >= 0.005


def test_kernel_time_starts_number_from_the_untimed_run_and_times_each_repeat_once(monkeypatch):
    """With the untimed run's time (its own warm-up, or the caller's ``run_s``), ``number`` starts
    where a repeat fills ``min_repeat_ms`` (a tenth to spare), so the first repeat is not timed
    short and again; a start that proves short still grows; without ``min_repeat_ms``: ``number``."""
    import importlib

    build_module = importlib.import_module("lorien.engine.build")  # the module, not lorien.engine's build()
    assert build_module.starting_number(1, 10, 0.004) == 3  # 2.75 runs of 4 ms fill 11 ms
    assert build_module.starting_number(5, 10, 0.004) == 5 and build_module.starting_number(1, 0, 0.004) == 1
    assert build_module.starting_number(1, 10, None) == 1 and build_module.starting_number(1, 10, 0.0) == 1
    data, weight, out = _dense(m=8, n=8, k=8)
    kernel = build(create_schedule(out), [data, weight, out])
    arrays = [np.ones(t.shape, "float32") for t in (data, weight, out)]
    numbers = []
    real = build_module.runtime.time_kernel
    clock = {"per_run_s": 0.001}

    def scripted(address, pointers, number):
        numbers.append(number)
        real(address, pointers, 1)
        return number * clock["per_run_s"]

    monkeypatch.setattr(build_module.runtime, "time_kernel", scripted)
    costs = kernel.time(*arrays, number=1, repeat=3, min_repeat_ms=5)
    assert numbers == [1, 6, 6, 6] and costs == [0.001] * 3  # the untimed run, then 3 repeats of 6 ms
    numbers.clear()
    costs = kernel.time(*arrays, number=1, repeat=2, min_repeat_ms=5, warmup=False, run_s=0.004)
    assert numbers[0] == 2 and numbers[1] > 2 and len(costs) == 2  # 8 ms expected, 2 ms taken: grows
    assert all(n * 0.001 >= 0.005 for n in numbers[1:])


def test_kernel_rejects_arrays_of_the_wrong_shape():
    data, weight, out = _dense(m=4, n=4, k=4)
    kernel = build(create_schedule(out), [data, weight, out])
    with pytest.raises(ValueError, match="'weight'"):
        kernel(np.ones((4, 4), "float32"), np.ones((3, 4), "float32"), np.ones((4, 4), "float32"))


def test_same_program_is_compiled_once():
    data, weight, out = _dense(m=4, n=4, k=4)
    first = build(create_schedule(out), [data, weight, out])
    second = build(create_schedule(out), [data, weight, out])
    assert first.address == second.address


def test_dump_ir_writes_the_ir_every_compiled_object_was_built_from(tmp_path, monkeypatch):
    from lorien.engine.codegen import llvm as llvm_codegen

    data, weight, out = _dense(m=4, n=4, k=4)
    ir_text = llvm_codegen.render(lower(create_schedule(out), [data, weight, out], "kernel"), "kernel")
    monkeypatch.setenv("LORIEN_DUMP_IR", str(tmp_path / "corpus"))
    llvm_codegen.compile_object(ir_text)
    assert [path.read_text() for path in (tmp_path / "corpus").glob("*.ll")] == [ir_text]


def test_max_reduction_matches_numpy():
    a = te.placeholder((6, 10), name="a")
    k = te.reduce_axis(10, name="k")
    out = te.compute((6,), lambda i: te.max(a[i, k], axis=k), name="rowmax")
    x = RNG.standard_normal((6, 10)).astype("float32")
    y = np.zeros(6, "float32")
    build(create_schedule(out), [a, out])(x, y)
    np.testing.assert_array_equal(y, x.max(axis=1))


def test_intermediate_stage_at_root_is_a_temporary_buffer():
    a = te.placeholder((8, 8), name="a")
    doubled = te.compute((8, 8), lambda i, j: a[i, j] * 2.0, name="doubled")
    out = te.compute((8, 8), lambda i, j: doubled[j, i] + 1.0, name="out")
    text = str(lower(create_schedule(out), [a, out]))
    assert "('doubled', 64, 'global')" in text and "FREE" in text
    x = RNG.standard_normal((8, 8)).astype("float32")
    y = np.zeros((8, 8), "float32")
    build(create_schedule(out), [a, out])(x, y)
    np.testing.assert_allclose(y, x.T * 2 + 1, rtol=1e-6)


def test_timing_with_cache_flush_returns_one_cost_per_repeat():
    data, weight, out = _dense(m=8, n=8, k=8)
    kernel = build(create_schedule(out), [data, weight, out])
    arrays = [np.ones(t.shape, "float32") for t in (data, weight, out)]
    costs = kernel.time(*arrays, number=2, repeat=3, flush_cache=True)
    assert len(costs) == 3 and all(c > 0 for c in costs)


def test_int32_tensors_compute_with_int_literals():
    a = te.placeholder((5,), "int32", name="a")
    out = te.compute((5,), lambda i: a[i] * 3 + 1, name="out")
    x = np.arange(5, dtype="int32")
    y = np.zeros(5, "int32")
    build(create_schedule(out), [a, out])(x, y)
    np.testing.assert_array_equal(y, x * 3 + 1)


def test_compiled_object_is_cached_on_disk_by_ir_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("LORIEN_CACHE_DIR", str(tmp_path))
    a = te.placeholder((37,), name="a")
    out = te.compute((37,), lambda i: a[i] - 37.0, name="out")
    build(create_schedule(out), [a, out])
    assert len(list((tmp_path / "kernels").glob("*.o"))) == 1


@pytest.mark.parametrize("stride", [1, 2])
def test_inlined_padding_under_a_vectorized_axis_uses_masked_or_gathered_loads(stride):
    data, kern = te.placeholder((1, 2, 9, 9), name="data"), te.placeholder((3, 2, 3, 3), name="kernel")
    out = ops.conv2d_nchw(data, kern, stride, 1)
    s = create_schedule(out)
    s["conv2d.pad"].compute_inline()
    n, f, y, x = s[out].op.axis
    rc, ry, rx = s[out].op.reduce_axis
    s[out].reorder(n, f, y, rc, ry, rx, x)
    s[out].vectorize(x)
    text = str(lower(s, [data, kern, out]))
    if stride == 1:  # contiguous rows: one masked vector load per row of the window
        assert re.search(r"LOAD float32x\d+ %0\(data\) %\d+ %\d+", text)
    else:  # strided: lanes gathered one by one
        assert "VECTOR float32x" in text
    a, k = RNG.standard_normal((1, 2, 9, 9)).astype("float32"), RNG.standard_normal((3, 2, 3, 3)).astype("float32")
    c = np.zeros(out.shape, "float32")
    build(s, [data, kern, out])(a, k, c)
    np.testing.assert_allclose(c, reference.conv2d_nchw(a, k, stride, 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("order", ["mn", "nm"])
def test_x86_register_tiled_dense_matches_numpy(order):
    from lorien.engine.x86 import dense_candidate

    s, args = dense_candidate(24, 64, 40, mr=4, nr=32, order=order)
    a, w = (RNG.standard_normal(t.shape).astype("float32") for t in args[:2])
    out = np.zeros(args[2].shape, "float32")
    build(s, args)(a, w, out)
    np.testing.assert_allclose(out, reference.dense(a, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride,unroll_kw,tile_oh", [(1, True, 2), (2, False, 1)])
def test_x86_conv2d_NCHWc_schedule_with_different_channel_blocks_matches_numpy(stride, unroll_kw, tile_oh):
    from lorien.engine.x86 import conv2d_NCHWc_candidate

    s, args = conv2d_NCHWc_candidate(32, 8, 64, stride, ic_bn=16, oc_bn=32, tile_ow=4, unroll_kw=unroll_kw,
                                     tile_oh=tile_oh)
    data, kern = RNG.standard_normal((1, 32, 8, 8)).astype("float32"), RNG.standard_normal((64, 32, 3, 3)).astype("float32")
    out = np.zeros(args[2].shape, "float32")
    build(s, args)(reference.pack_nchwc(data, 16), reference.pack_kernel_oihwio(kern, 16, 32), out)
    np.testing.assert_allclose(reference.unpack_nchwc(out), reference.conv2d_nchw(data, kern, stride, 1),
                               rtol=1e-3, atol=1e-3)


def _random_schedule(stage, rng) -> None:
    """Random splits, a random loop order, maybe a fuse, parallel, vectorize and unroll."""
    for axis in list(stage.leaf):
        if rng.random() < 0.6:
            if rng.random() < 0.5:
                stage.split(axis, factor=rng.choice([2, 3, 4, 8, 16]))
            else:
                stage.split(axis, nparts=rng.choice([2, 3, 4]))
    order = list(stage.leaf)
    rng.shuffle(order)
    stage.reorder(*order)
    first, second = stage.leaf[0], stage.leaf[1] if len(stage.leaf) > 1 else None
    if second and rng.random() < 0.3 and stage.axes[first].kind == stage.axes[second].kind:
        stage.fuse(first, second)
    if rng.random() < 0.5 and stage.axes[stage.leaf[0]].kind == "spatial":
        stage.parallel(stage.leaf[0])
    if rng.random() < 0.6:
        stage.vectorize(stage.leaf[-1])
    for axis in stage.leaf[1:-1]:
        if rng.random() < 0.2:
            stage.unroll(axis)


@pytest.mark.parametrize("seed", range(12))
def test_random_schedules_compute_what_numpy_computes(seed):
    import random

    rng = random.Random(seed)
    if seed % 2:
        d, w = te.placeholder((rng.randint(3, 20), 9), name="d"), te.placeholder((rng.randint(3, 33), 9), name="w")
        b = te.placeholder((w.shape[0],), name="b")
        out = ops.dense(d, w, bias=b, relu=True)
        inputs, ref = [d, w, b], lambda x, y, z: reference.dense(x, y, z, relu=True)
        s = create_schedule(out)
        _random_schedule(s["dense.acc"], rng)
        _random_schedule(s[out], rng)
        s["dense.acc"].compute_at(s[out], rng.choice(s[out].leaf))
    else:
        stride = rng.choice([1, 2])
        d, w = te.placeholder((1, 3, rng.randint(5, 10), 8), name="d"), te.placeholder((4, 3, 3, 3), name="w")
        out = ops.conv2d_nchw(d, w, stride, 1)
        inputs, ref = [d, w], lambda x, y: reference.conv2d_nchw(x, y, stride, 1)
        s = create_schedule(out)
        _random_schedule(s[out], rng)
        _random_schedule(s["conv2d.pad"], rng)
        s["conv2d.pad"].compute_at(s[out], rng.choice(s[out].leaf))
    arrays = [RNG.standard_normal(t.shape).astype("float32") for t in inputs]
    result = np.zeros(out.shape, "float32")
    build(s, [*inputs, out])(*arrays, result)
    np.testing.assert_allclose(result, ref(*arrays), rtol=1e-3, atol=1e-3, err_msg=json.dumps(s.steps))


def test_tile_is_two_splits_and_a_reorder():
    data, weight, out = _dense(m=12, n=20)
    s = create_schedule(out)
    i, j = out.op.axis
    io, jo, ii, ji = s[out].tile(i, j, 4, 8)
    assert s[out].leaf == ["i.outer", "j.outer", "i.inner", "j.inner", "k"]
    assert [step["kind"] for step in s.steps] == ["split", "split", "reorder"]
    _check_dense(s, data, weight, out)


def test_elementwise_functions_casts_and_min_reduction_match_numpy():
    a = te.placeholder((4, 16), name="a")
    k = te.reduce_axis(16, name="k")
    rowmin = te.compute((4,), lambda i: te.min(a[i, k], axis=k), name="rowmin")
    out = te.compute((4, 16), lambda i, j: te.exp(a[i, j]) + te.sqrt(te.maximum(a[i, j], 0.0))
                     + te.cast(te.cast(a[i, j] * 10.0, "int32"), "float32") + rowmin[i], name="out")
    s = create_schedule(out)
    s[out].vectorize(out.op.axis[1])
    x = RNG.standard_normal((4, 16)).astype("float32")
    y = np.zeros((4, 16), "float32")
    build(s, [a, out])(x, y)
    expected = np.exp(x) + np.sqrt(np.maximum(x, 0)) + np.trunc(x * 10).astype("float32") + x.min(axis=1, keepdims=True)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride", [1, 2])
def test_c_renderer_compiles_the_same_program_to_the_same_answer(stride):
    data, kern = te.placeholder((1, 3, 9, 9), name="data"), te.placeholder((32, 3, 3, 3), name="kernel")
    bias = te.placeholder((32,), name="bias")
    out = ops.conv2d_nchw(data, kern, stride, 1, bias=bias, relu=True)
    s = create_schedule(out)
    s["conv2d.pad"].compute_inline()
    acc = s["conv2d.acc"]
    n, f, y, x = s[out].op.axis
    fo, fi = s[out].split(f, factor=16)
    s[out].reorder(n, fo, y, x, fi)
    s[out].parallel(fo)
    s[out].vectorize(fi)
    acc.compute_at(s[out], x)
    _, af, _, _ = acc.op.axis
    acc.reorder(*acc.op.reduce_axis, af)
    acc.vectorize(af)
    arrays = [RNG.standard_normal(t.shape).astype("float32") for t in (data, kern, bias)]
    expected = reference.conv2d_nchw(*arrays[:2], stride, 1, bias=arrays[2], relu=True)
    for target in ("llvm", "c"):
        kernel = build(s, [data, kern, bias, out], target=target)
        result = np.zeros(out.shape, "float32")
        kernel(*arrays, result)
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4, err_msg=target)
    assert kernel.ir_text.startswith("#include") and "#pragma omp parallel for" in kernel.ir_text


def test_unknown_build_target_is_rejected():
    _, _, out = _dense(m=4, n=4, k=4)
    with pytest.raises(LorienError, match="'cuda'"):
        build(create_schedule(out), list(out.op.input_tensors()) + [out], target="cuda")


def test_stage_computed_at_a_loop_that_is_split_later_moves_to_the_inner_loop():
    data, weight, bias = te.placeholder((8, 8), name="d"), te.placeholder((16, 8), name="w"), te.placeholder((16,), name="b")
    out = ops.dense(data, weight, bias=bias, relu=True)
    s = create_schedule(out)
    i, j = s[out].op.axis
    s["dense.acc"].compute_at(s[out], j)
    _, ji = s[out].split(j, factor=4)
    assert s["dense.acc"].attach == ("dense", ji.name)
    fused = s[out].fuse(i, s[out].leaf[1])
    assert s["dense.acc"].attach == ("dense", s[out].leaf[1]) and fused.name == s[out].leaf[0]
    a, w, b = (RNG.standard_normal(t.shape).astype("float32") for t in (data, weight, bias))
    c = np.zeros(out.shape, "float32")
    build(s, [data, weight, bias, out])(a, w, b, c)
    np.testing.assert_allclose(c, reference.dense(a, w, b, relu=True), rtol=1e-4, atol=1e-4)


def test_stage_computed_at_a_loop_that_is_fused_moves_to_the_fused_loop():
    data, weight, bias = te.placeholder((8, 8), name="d"), te.placeholder((16, 8), name="w"), te.placeholder((16,), name="b")
    out = ops.dense(data, weight, bias=bias)
    s = create_schedule(out)
    i, j = s[out].op.axis
    s["dense.acc"].compute_at(s[out], i)
    fused = s[out].fuse(i, j)
    assert s["dense.acc"].attach == ("dense", fused.name)
    a, w, b = (RNG.standard_normal(t.shape).astype("float32") for t in (data, weight, bias))
    c = np.zeros(out.shape, "float32")
    build(s, [data, weight, bias, out])(a, w, b, c)
    np.testing.assert_allclose(c, reference.dense(a, w, b), rtol=1e-4, atol=1e-4)


def _matmul(m=12, n=16, k=10):
    a, b = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    return a, b, ops.matmul(a, b)


def test_cache_read_stages_a_tile_of_an_input_where_it_is_used():
    a, b, out = _matmul()
    s = create_schedule(out)
    b_tile = s.cache_read(b, "local", [out])
    assert b_tile.name == "B.local" and s[b_tile].leaf == ["ax0", "ax1"]
    i, j = s[out].op.axis
    (k,) = s[out].op.reduce_axis
    jo, ji = s[out].split(j, factor=8)
    ko, ki = s[out].split(k, factor=5)
    s[out].reorder(i, jo, ko, ki, ji)
    s[b_tile].compute_at(s[out], ko)
    assert "('B.local', 40, 'local')" in str(lower(s, [a, b, out]))  # 5 rows of k x 8 columns
    x, y = RNG.standard_normal(a.shape).astype("float32"), RNG.standard_normal(b.shape).astype("float32")
    c = np.zeros(out.shape, "float32")
    build(s, [a, b, out])(x, y, c)
    np.testing.assert_allclose(c, x @ y, rtol=1e-4, atol=1e-4)


def test_cache_read_replays_from_json_and_other_readers_keep_the_original():
    a = te.placeholder((8, 8), name="a")
    doubled = te.compute((8, 8), lambda i, j: a[i, j] * 2.0, name="doubled")
    out = te.compute((8, 8), lambda i, j: doubled[i, j] + a[j, i], name="out")
    s = create_schedule(out)
    s.cache_read(doubled, "local", ["out"])
    replayed = replay(json.loads(json.dumps(s.steps)), out)
    assert [st.name for st in replayed.stages] == ["doubled", "doubled.local", "out"]
    x = RNG.standard_normal((8, 8)).astype("float32")
    y = np.zeros((8, 8), "float32")
    build(replayed, [a, out])(x, y)
    np.testing.assert_allclose(y, x * 2 + x.T, rtol=1e-6)


def test_cache_read_for_a_stage_that_does_not_read_the_tensor_is_refused():
    a, b, out = _matmul()
    other = te.compute((4,), lambda i: a[i, 0] + 1.0, name="other")
    s = create_schedule([out, other])
    with pytest.raises(ScheduleError, match="'other' does not read 'B'"):
        s.cache_read(b, "local", [other])


def _row_sum(rows=3, cols=1000):
    a = te.placeholder((rows, cols), name="a")
    k = te.reduce_axis(cols, name="k")
    return a, te.compute((rows,), lambda i: te.sum(a[i, k] * 2.0, axis=k), name="total")


@pytest.mark.parametrize("factor,factor_axis", [(50, 0), (48, 1)])
def test_rfactor_sums_partial_results_along_the_factored_loop(factor, factor_axis):
    a, out = _row_sum()
    s = create_schedule(out)
    ko, ki = s[out].split(out.op.reduce_axis[0], factor=factor)
    rf = s.rfactor(out, ki, factor_axis)
    assert rf.name == "total.rf" and rf.shape == ((factor, 3) if factor_axis == 0 else (3, factor))
    assert s[rf].leaf == (["k.inner", "i", "k.outer"] if factor_axis == 0 else ["i", "k.inner", "k.outer"])
    assert s[out].leaf == ["i", "k.inner.v"]
    s[rf].reorder(*[name for name in s[rf].leaf if name != "k.inner"], "k.inner")
    s[rf].vectorize("k.inner")
    replayed = replay(json.loads(json.dumps(s.steps)), out)
    x = RNG.standard_normal(a.shape).astype("float32")
    y = np.zeros(3, "float32")
    build(replayed, [a, out])(x, y)  # 48 does not divide 1000: the tail is guarded
    np.testing.assert_allclose(y, (x * 2).sum(axis=1), rtol=1e-4, atol=1e-3)


def test_rfactor_of_a_whole_reduce_loop_keeps_no_reduction_in_the_factored_stage():
    a, out = _row_sum(rows=2, cols=16)
    s = create_schedule(out)
    rf = s.rfactor(out, "k", 1)
    assert s[rf].op.reduce_axis == []
    x = RNG.standard_normal(a.shape).astype("float32")
    y = np.zeros(2, "float32")
    build(s, [a, out])(x, y)
    np.testing.assert_allclose(y, (x * 2).sum(axis=1), rtol=1e-5)


def test_rfactor_of_a_spatial_loop_is_refused():
    _, out = _row_sum()
    s = create_schedule(out)
    with pytest.raises(ScheduleError, match="'i' of stage 'total' is not a reduce loop"):
        s.rfactor(out, "i")


def test_storage_align_is_recorded_and_replayed_and_changes_nothing_on_the_cpu():
    a, b, out = _matmul()
    s = create_schedule(out)
    b_tile = s.cache_read(b, "local", [out])
    s[b_tile].compute_at(s[out], s[out].op.axis[0])
    plain = str(lower(s, [a, b, out]))
    s[b_tile].storage_align("ax0", 16, 1)
    replayed = replay(json.loads(json.dumps(s.steps)), out)
    assert replayed[b_tile.name].alignments == {"ax0": (16, 1)}
    assert str(lower(replayed, [a, b, out])) == plain
    with pytest.raises(ScheduleError, match="factor must be >= 1"):
        s[b_tile].storage_align("ax1", 0, 0)


def test_a_kernel_called_again_writes_to_the_arrays_of_each_call():
    data, weight, out = _dense(m=4, n=8, k=5)
    kernel = build(create_schedule(out), [data, weight, out])
    a, b = RNG.standard_normal((4, 5)).astype("float32"), RNG.standard_normal((8, 5)).astype("float32")
    first, second = np.zeros((4, 8), "float32"), np.zeros((4, 8), "float32")
    kernel(a, b, first)
    kernel(a, b, first)  # the same arrays: their pointers are reused
    kernel(a, b, second)
    np.testing.assert_allclose(second, reference.dense(a, b), rtol=1e-5, atol=1e-5)
    del first  # a new array, possibly at the address of the dead one
    third = np.zeros((4, 8), "float32")
    kernel(a, 2 * b, third)
    np.testing.assert_allclose(third, reference.dense(a, 2 * b), rtol=1e-5, atol=1e-5)
    third.flags.writeable = False
    with pytest.raises(LorienError, match="writeable"):
        kernel(a, 2 * b, third)


def test_threads_calling_one_kernel_on_their_own_arrays_each_get_their_own_result():
    import threading

    data, weight, out = _dense(m=4, n=8, k=5)
    kernel = build(create_schedule(out), [data, weight, out])
    failures = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        a, b = rng.standard_normal((4, 5)).astype("float32"), rng.standard_normal((8, 5)).astype("float32")
        expected, result = reference.dense(a, b), np.zeros((4, 8), "float32")
        for _ in range(2000):
            result.fill(0)
            kernel(a, b, result)
            if not np.allclose(result, expected, rtol=1e-5, atol=1e-5):
                failures.append(seed)
                return

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch every few bytecodes, inside a call's pointer lookup too
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures


def test_a_bound_kernel_runs_on_the_arrays_it_was_bound_to_and_keeps_them_alive():
    import gc

    data, weight, out = _dense(m=4, n=8, k=5)
    kernel = build(create_schedule(out), [data, weight, out])
    a, b = RNG.standard_normal((4, 5)).astype("float32"), RNG.standard_normal((8, 5)).astype("float32")
    result = np.zeros((4, 8), "float32")
    call = kernel.bind(a, b, result)
    expected = reference.dense(a, b)
    b *= 2  # the bound call reads the arrays as they are at each call
    del a
    gc.collect()
    call()
    np.testing.assert_allclose(result, 2 * expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(LorienError, match="argument 'weight'"):
        kernel.bind(np.zeros((4, 5), "float32"), np.zeros((5, 8), "float32"), result)
    fixed = build(create_schedule(out), [data, weight, out], target="llvm -num-cores=1")  # sets its threads
    result.fill(0)
    fixed.bind(2 * np.ones((4, 5), "float32"), np.ones((8, 5), "float32"), result)()
    assert np.all(result == 10)
