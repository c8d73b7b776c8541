"""Engine benchmark: Lorien's kernels, tuning throughput and parallel launch, each against the
baseline a user would pick, measured in the same run and timed the same way.

Every ratio is baseline time / Lorien time (> 1: Lorien is faster). Both sides of a kernel
comparison are called from Python through the same timer (``time.perf_counter`` around one
call), take turns in blocks of calls (the first call of a block is a warm-up, not counted) and
get the same number of samples; the ratio is of medians, and minimums are printed beside.

- ``dense*_vs_numpy``: C = A Bᵀ for 512³, 1024³, 1x1000x512 and 256x64x512 (M x N x K) against
  ``np.matmul(A, B.T, out=C)`` (OpenBLAS), BLAS threads pinned with threadpoolctl to the
  engine's thread count. Lorien's kernel is the best (screened first, not timed) of the
  engine's hand-written register tiles and random configs of the autotvm dense_pack.x86 and
  dense_nopack.x86 templates; any packing of B happens inside the kernel, on every call.
- ``conv3x3_kernel_vs_torch_*``: ResNet-18's seven 3x3 conv2d layers (batch 1). Lorien's
  NCHW16c kernel with input, weights and output already packed (kernel only), against
  PyTorch ``F.conv2d`` in its faster layout per layer (NCHW or channels_last, inputs converted
  beforehand; which one is printed). ``conv3x3_e2e_vs_torch_geomean``: Lorien from an NCHW
  input to an NCHW output, packing the input and unpacking the output (engine kernels) timed;
  the weights are packed once beforehand, as any inference engine does with constants.
- ``trials_per_s_dense`` / ``trials_per_s_conv``: candidates per second through the autotvm
  tuner end to end (propose, build, check against NumPy, time, commit to a store) on dense
  256³ and a ResNet-18 conv2d_NCHWc layer; ``trials_per_s_vs_tvm``: the same count of trials
  of the same workloads by TVM MetaSchedule's ``tune_tir`` (geomean of the two ratios), or
  ``nan`` with a line saying so when apache-tvm is not installed.
- ``launch_warm_us`` / ``launch_cold_us``: fork-join overhead of a 2-thread parallel loop
  (a 2-row parallel loop minus one row run serially), with the pool's threads spinning (warm)
  or asleep after 50 ms idle (cold); ``launch_*_vs_omp`` against the same loop compiled with
  ``gcc -O3 -fopenmp`` (libgomp), timed by the same native loop.
- ``launch_us_c`` / ``dense512_vs_numpy_c``: the engine runtime built from C instead of LLVM IR
  (``$LORIEN_RUNTIME=c``), measured in a child process.

    python benchmarks/engine.py            # full run, about 10 minutes (TVM tuning included)
    python benchmarks/engine.py --quick    # fewer samples, 2 conv layers, 8 trials
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from lorien.engine import build, reference, runtime, te
from lorien.engine.schedule import create_schedule
from lorien.engine.x86 import conv2d_NCHWc_candidate, dense_candidate, vector_lanes

# ResNet-18 3x3 conv2d layers, batch 1: (in channels, input size, out channels, stride)
RESNET18_3X3 = [(64, 56, 64, 1), (64, 56, 128, 2), (128, 28, 128, 1), (128, 28, 256, 2),
                (256, 14, 256, 1), (256, 14, 512, 2), (512, 7, 512, 1)]
DENSE_SHAPES = [(512, 512, 512), (1024, 1024, 1024), (1, 1000, 512), (256, 64, 512)]
NAN = float("nan")


# ---- timing ---------------------------------------------------------------------------------

#: Idle time before each block of paired samples: longer than OpenBLAS's worker threads spin
#: after a call (2^28 cycles by default, about 0.1 s), so that neither side's idle threads
#: still hold a core while the other side's block runs.
BLOCK_PAUSE_S = 0.25


def paired_samples(calls: dict[str, Callable[[], object]], samples: int, block: int = 6) -> dict[str, list[float]]:
    """Seconds of ``samples`` single calls of each callable; they take turns in blocks of
    ``block`` counted calls, each block led by a pause (:data:`BLOCK_PAUSE_S`) and one
    uncounted warm-up call."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    while min(len(found) for found in times.values()) < samples:
        for name, call in calls.items():
            time.sleep(BLOCK_PAUSE_S)
            call()
            for _ in range(min(block, samples - len(times[name]))):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return times


def describe(name: str, seconds: list[float], flop: float | None = None) -> str:
    median, best = statistics.median(seconds), min(seconds)
    rate = f" ({flop / median / 1e9:.1f} GFLOPS median)" if flop else ""
    return f"{name}: median {median * 1e6:.1f} us, min {best * 1e6:.1f} us over {len(seconds)} samples{rate}"


def native_best_s(kernel, arrays, repeat: int = 5) -> float:
    """Fastest single run of ``repeat`` by the native timing loop (screening only)."""
    return min(kernel.time(*arrays, number=1, repeat=repeat))


def pin_blas_threads(threads: int):
    """Limit BLAS to ``threads`` (what the engine uses) and say what BLAS this is."""
    from threadpoolctl import threadpool_info, threadpool_limits

    limiter = threadpool_limits(limits=threads, user_api="blas")
    for pool in threadpool_info():
        if pool.get("user_api") == "blas":
            print(f"NumPy BLAS: {pool.get('internal_api')} {pool.get('version')}, {pool.get('num_threads')} threads "
                  f"(pinned to the engine's {threads})")
    return limiter


# ---- dense ----------------------------------------------------------------------------------

def dense_grid(quick: bool, m: int = 512, n: int = 512) -> list[tuple[int, int, str]]:
    """Register tiles (mr rows x nr columns) that fit the vector registers: 32 zmm with AVX-512,
    16 ymm with AVX2 (accumulators mr * nr / lanes, plus broadcasts and B vectors). nr must
    divide N (B is packed in nr-wide panels); mr is at most M."""
    tiles = ((4, 64), (6, 64), (8, 32), (12, 32), (14, 32)) if vector_lanes() == 16 else \
        ((6, 16), (4, 16), (3, 32), (2, 32), (8, 16))
    fitting = [(min(mr, m), nr) for mr, nr in tiles if n % nr == 0]
    if not fitting:  # panels as wide as N allows: the widest multiple of 8 up to 64 dividing it
        nr = max(width for width in range(8, 65, 8) if n % width == 0)
        fitting = [(min(mr, m), nr) for mr in (1, 4, 8, 14)]
    fitting = list(dict.fromkeys(fitting))
    if quick:
        return [(mr, nr, "mn") for mr, nr in fitting[:2]]
    return [(mr, nr, order) for mr, nr in fitting for order in ("mn", "nm")]


def template_candidates(task_name: str, m: int, n: int, k: int, count: int) -> list[tuple[str, object]]:
    """(label, schedule builder) of ``count`` random configs of an autotvm dense template."""
    from dialects.autotvm.templates import instantiate

    task = instantiate(task_name, [["TENSOR", [m, k], "float32"], ["TENSOR", [n, k], "float32"], None, "float32"])
    rng = np.random.default_rng(0)
    picks = rng.choice(len(task.space), size=min(count, len(task.space)), replace=False)
    return [(f"{task_name} #{index}", functools.partial(task.instantiate, task.config(int(index)))) for index in picks]


def bench_dense(m: int, n: int, k: int, grid: list[tuple[int, int, str]], samples: int,
                template_configs: int = 0) -> float:
    """Median NumPy time / median Lorien time for C = A Bᵀ (M x N x K). Lorien's kernel is the
    best of the hand-written register tiles (``grid``) and, with ``template_configs``, as many
    random configs of each autotvm dense template (dense_pack.x86, dense_nopack.x86)."""
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (m, k)).astype("float32")
    weight = rng.uniform(-1, 1, (n, k)).astype("float32")
    expected = reference.dense(data, weight)
    flop = 2.0 * m * n * k
    candidates = [((mr, nr, order), functools.partial(dense_candidate, m, n, k, mr, nr, order))
                  for mr, nr, order in grid]
    for task_name in ("dense_pack.x86", "dense_nopack.x86") if template_configs else ():
        candidates += template_candidates(task_name, m, n, k, template_configs)
    screened = []
    for label, make in candidates:
        s, args = make()
        kernel = build(s, args)
        out = np.zeros((m, n), "float32")
        kernel(data, weight, out)
        np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3)
        screened.append((native_best_s(kernel, [data, weight, out]), label, kernel))
    _, config, kernel = min(screened, key=lambda item: item[0])
    ours, theirs = np.zeros((m, n), "float32"), np.zeros((m, n), "float32")
    times = paired_samples({"lorien": functools.partial(kernel, data, weight, ours),
                            "numpy": functools.partial(np.matmul, data, weight.T, out=theirs)}, samples)
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-3)
    ratio = statistics.median(times["numpy"]) / statistics.median(times["lorien"])
    print(f"dense {m}x{n}x{k}: {describe('lorien', times['lorien'], flop)} {config}; "
          f"{describe('numpy', times['numpy'], flop)}; ratio {ratio:.2f} "
          f"(min ratio {min(times['numpy']) / min(times['lorien']):.2f})")
    return ratio


# ---- conv2d ---------------------------------------------------------------------------------

def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, limit + 1) if n % d == 0]


def layout_kernels(channels: int, size: int, out_channels: int, out_size: int, ic_bn: int, oc_bn: int):
    """Engine kernels NCHW -> NCHW{ic_bn}c (input) and NCHW{oc_bn}c -> NCHW (output)."""
    x = te.placeholder((1, channels, size, size), name="x")
    packed = te.compute((1, channels // ic_bn, size, size, ic_bn),
                        lambda n, c, h, w, b: x[n, c * ic_bn + b, h, w], name="packed")
    s = create_schedule(packed)
    n, c, h, w, b = packed.op.axis
    s[packed].parallel(s[packed].fuse(n, c, h))
    s[packed].vectorize(b)
    pack = build(s, [x, packed])
    y = te.placeholder((1, out_channels // oc_bn, out_size, out_size, oc_bn), name="y")
    plain = te.compute((1, out_channels, out_size, out_size),
                       lambda n, c, h, w: y[n, c // oc_bn, h, w, c % oc_bn], name="plain")
    s = create_schedule(plain)
    n, c, h, w = plain.op.axis
    s[plain].parallel(s[plain].fuse(n, c, h))
    s[plain].vectorize(w)
    return pack, build(s, [y, plain])


def conv_grid(out_size: int, quick: bool) -> list[tuple[int, int, int, bool, int]]:
    lanes = vector_lanes()
    tiles = [t for t in _divisors(out_size, 28) if t >= 4] or [out_size]
    tiles = sorted(tiles, key=lambda t: abs(t - 8))[: 2 if quick else 4]
    unroll = (True,) if quick else (True, False)
    grid = [(lanes, lanes, t, kw, 1) for t in tiles for kw in unroll]
    if not quick:  # two vectors of output channels, or two output rows, per register tile
        grid += [(lanes, 2 * lanes, t, kw, 1) for t in tiles if t <= 14 for kw in unroll]
        if out_size % 2 == 0:
            grid += [(lanes, lanes, t, kw, 2) for t in tiles if t <= 8 for kw in unroll]
    return grid


def bench_conv_layer(channels: int, size: int, out_channels: int, stride: int, quick: bool,
                     samples: int) -> tuple[float, float]:
    """(kernel-only ratio, end-to-end ratio) of one 3x3 layer against PyTorch's faster layout."""
    import torch

    out_size = (size + 2 - 3) // stride + 1
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    weight = rng.uniform(-1, 1, (out_channels, channels, 3, 3)).astype("float32")
    t_data, t_weight = torch.from_numpy(data), torch.from_numpy(weight)
    t_data_cl = t_data.contiguous(memory_format=torch.channels_last)
    t_weight_cl = t_weight.contiguous(memory_format=torch.channels_last)
    conv = torch.nn.functional.conv2d
    expected = conv(t_data, t_weight, stride=stride, padding=1).numpy()
    flop = 2.0 * out_channels * out_size * out_size * channels * 9
    screened = []
    for ic_bn, oc_bn, tile_ow, unroll_kw, tile_oh in conv_grid(out_size, quick):
        s, args = conv2d_NCHWc_candidate(channels, size, out_channels, stride, ic_bn, oc_bn, tile_ow, unroll_kw,
                                         tile_oh=tile_oh)
        kernel = build(s, args)
        packed = [reference.pack_nchwc(data, ic_bn), reference.pack_kernel_oihwio(weight, ic_bn, oc_bn)]
        out = np.zeros(args[-1].shape, "float32")
        kernel(*packed, out)
        np.testing.assert_allclose(reference.unpack_nchwc(out), expected, rtol=1e-3, atol=1e-2)
        screened.append((native_best_s(kernel, [*packed, out]), (ic_bn, oc_bn, tile_ow, unroll_kw, tile_oh),
                         kernel, packed, out))
    _, config, kernel, (packed_data, packed_weight), packed_out = min(screened, key=lambda item: item[0])
    pack, unpack = layout_kernels(channels, size, out_channels, out_size, config[0], config[1])
    plain_out = np.zeros((1, out_channels, out_size, out_size), "float32")

    def end_to_end() -> None:
        pack(data, packed_data)
        kernel(packed_data, packed_weight, packed_out)
        unpack(packed_out, plain_out)

    end_to_end()
    np.testing.assert_allclose(plain_out, expected, rtol=1e-3, atol=1e-2)
    with torch.no_grad():
        times = paired_samples({
            "lorien kernel": functools.partial(kernel, packed_data, packed_weight, packed_out),
            "lorien e2e": end_to_end,
            "torch NCHW": functools.partial(conv, t_data, t_weight, stride=stride, padding=1),
            "torch channels_last": functools.partial(conv, t_data_cl, t_weight_cl, stride=stride, padding=1),
        }, samples)
    torch_layout = min(("torch NCHW", "torch channels_last"), key=lambda name: statistics.median(times[name]))
    torch_s = statistics.median(times[torch_layout])
    kernel_ratio = torch_s / statistics.median(times["lorien kernel"])
    e2e_ratio = torch_s / statistics.median(times["lorien e2e"])
    print(f"conv3x3 {channels}x{size}x{size}->{out_channels} s{stride} (ic_bn,oc_bn,tile_ow,unroll_kw,tile_oh)="
          f"{config}: kernel {kernel_ratio:.2f}x, end to end {e2e_ratio:.2f}x against {torch_layout}")
    for name, seconds in times.items():
        print(f"    {describe(name, seconds, flop)}")
    return kernel_ratio, e2e_ratio


def bench_conv(layers, quick: bool, samples: int) -> tuple[list[float], list[float]]:
    import torch

    torch.set_num_threads(runtime.num_threads())
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads")
    results = [bench_conv_layer(*layer, quick, samples) for layer in layers]
    return [kernel for kernel, _ in results], [e2e for _, e2e in results]


# ---- tuning throughput ----------------------------------------------------------------------

DENSE_256_JOB = {"dialect": "autotvm", "task_name": "dense_pack.x86",
                 "args": [["TENSOR", [256, 256], "float32"], ["TENSOR", [256, 256], "float32"], None, "float32"]}
CONV_JOB = {"dialect": "autotvm", "task_name": "conv2d_NCHWc.x86",
            "args": [["TENSOR", [1, 64, 56, 56], "float32"], ["TENSOR", [64, 64, 3, 3], "float32"], [1, 1],
                     [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"]}


def bench_tuner(job: dict, trials: int) -> float:
    """Candidates per second through the autotvm tuner, committing to a fresh store."""
    from lorien.target import host_target
    from lorien.tune.loop import tune_job

    base = {**job, "target": host_target().canonical, "tuner": "random", "batch_size": 8,
            "measure": {"number": 1, "repeat": 3, "min_repeat_ms": 0}}
    with tempfile.TemporaryDirectory() as directory:
        store = f"parquet:{directory}/warehouse"
        tune_job({**base, "trials": 2, "seed": 99}, store)  # start the worker pools
        start = time.perf_counter()
        progress = tune_job({**base, "trials": trials, "seed": 0}, store)
        elapsed = time.perf_counter() - start
    rate = progress.trials / elapsed
    print(f"tuning throughput {job['task_name']}: {progress.trials} candidates in {elapsed:.2f} s "
          f"({progress.trials - progress.errors} valid) = {rate:.2f}/s")
    return rate


def bench_tvm_tuning(trials: int) -> dict[str, float]:
    """TVM MetaSchedule candidates per second on the same dense and conv2d workloads."""
    if importlib.util.find_spec("tvm") is None:
        print("TVM MetaSchedule throughput: skipped (apache-tvm is not installed: pip install -e '.[tvm]')")
        return {}
    import logging

    import tvm
    from tvm import te as tvm_te
    from tvm.s_tir import meta_schedule as ms

    from lorien.target import host_target

    def dense():
        a, b = tvm_te.placeholder((256, 256), name="A"), tvm_te.placeholder((256, 256), name="B")
        k = tvm_te.reduce_axis((0, 256), name="k")
        c = tvm_te.compute((256, 256), lambda i, j: tvm_te.sum(a[i, k] * b[j, k], axis=k), name="C")
        return tvm_te.create_prim_func([a, b, c])

    def conv():
        data = tvm_te.placeholder((1, 64, 56, 56), name="data")
        weight = tvm_te.placeholder((64, 64, 3, 3), name="weight")
        pad = tvm_te.compute((1, 64, 58, 58), lambda n, c, y, x: tvm_te.if_then_else(
            tvm_te.all(y >= 1, y < 57, x >= 1, x < 57), data[n, c, y - 1, x - 1], tvm_te.const(0.0, "float32")),
            name="pad")
        rc, ry, rx = (tvm_te.reduce_axis((0, 64), name="rc"), tvm_te.reduce_axis((0, 3), name="ry"),
                      tvm_te.reduce_axis((0, 3), name="rx"))
        out = tvm_te.compute((1, 64, 56, 56), lambda n, f, y, x: tvm_te.sum(
            pad[n, rc, y + ry, x + rx] * weight[f, rc, ry, rx], axis=[rc, ry, rx]), name="conv")
        return tvm_te.create_prim_func([data, weight, out])

    target = tvm.target.Target({"kind": "llvm", "mcpu": host_target().get("mcpu"),
                                "num-cores": runtime.num_threads()})
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)  # its per-round tables
    rates = {}
    for name, func in (("dense", dense), ("conv", conv)):
        with tempfile.TemporaryDirectory() as work_dir:
            start = time.perf_counter()
            ms.tune_tir(tvm.IRModule({"main": func()}), target, work_dir, max_trials_global=trials,
                        num_trials_per_iter=8, builder=ms.builder.LocalBuilder(timeout_sec=120))
            elapsed = time.perf_counter() - start
        rates[name] = trials / elapsed
        print(f"TVM MetaSchedule throughput {name}: {trials} candidates in {elapsed:.1f} s = {rates[name]:.2f}/s "
              "(its builder workers' start-up included, as a tune_tir user pays it)")
    return rates


# ---- parallel launch ------------------------------------------------------------------------

OMP_SOURCE = r"""
#include <omp.h>
#include <time.h>
static void rows(const float *a, float *out, long count, long width) {
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < count; r++)
        for (long i = 0; i < width; i++) out[r * width + i] = a[r * width + i] * 2.0f + 1.0f;
}
double omp_time_rows(const float *a, float *out, long count, long width, long number, int threads) {
    omp_set_num_threads(threads);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long n = 0; n < number; n++) rows(a, out, count, width);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
"""
LAUNCH_WIDTH = 1 << 15
COLD_IDLE_S = 0.05


def _rows_kernel(rows: int, width: int, parallel: bool):
    a = te.placeholder((rows, width), name="a")
    out = te.compute((rows, width), lambda r, i: a[r, i] * 2.0 + 1.0, name="out")
    s = create_schedule(out)
    r, i = s[out].op.axis
    _, inner = s[out].split(i, factor=16)
    s[out].vectorize(inner)
    if parallel:
        s[out].parallel(r)
    return build(s, [a, out]), [np.ones((rows, width), "float32"), np.zeros((rows, width), "float32")]


def _launch_overheads(parallel_s: Callable[[int], float], serial_s: Callable[[int], float],
                      rounds: int) -> tuple[float, float]:
    """(warm, cold) fork-join overhead in microseconds: the best 2-row parallel run minus the
    best 1-row serial run; cold runs come after the threads sat idle for COLD_IDLE_S."""
    warm_par = warm_one = math.inf
    for _ in range(7):
        warm_par = min(warm_par, parallel_s(2000) / 2000)
        warm_one = min(warm_one, serial_s(2000) / 2000)
    cold = []
    for _ in range(rounds):
        time.sleep(COLD_IDLE_S)
        cold.append(parallel_s(1))
    return max(0.0, (warm_par - warm_one) * 1e6), max(0.0, (statistics.median(cold) - warm_one) * 1e6)


def bench_launch(rounds: int) -> tuple[float, float]:
    """Lorien's (warm, cold) fork-join overhead in microseconds."""
    par, par_arrays = _rows_kernel(2, LAUNCH_WIDTH, True)
    one, one_arrays = _rows_kernel(1, LAUNCH_WIDTH, False)
    warm, cold = _launch_overheads(lambda number: par.time(*par_arrays, number=number)[0] * number,
                                   lambda number: one.time(*one_arrays, number=number)[0] * number, rounds)
    print(f"parallel launch (lorien, {runtime.backend()} runtime, {runtime.num_threads()} threads): "
          f"warm {warm:.2f} us, cold {cold:.2f} us")
    return warm, cold


def bench_launch_omp(rounds: int) -> tuple[float, float]:
    """The same loop with OpenMP (gcc -fopenmp); nan when there is no compiler."""
    from lorien.native import NativeBuildError, load_shared

    try:
        lib = load_shared(OMP_SOURCE, "bench_omp_rows", ("-O3", "-march=native", "-fopenmp"), libs=("-fopenmp",))
    except NativeBuildError as exc:
        print(f"parallel launch (OpenMP): skipped ({str(exc).splitlines()[0]})")
        return NAN, NAN
    lib.omp_time_rows.restype = ctypes.c_double
    lib.omp_time_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                  ctypes.c_long, ctypes.c_int]
    a, out = np.ones((2, LAUNCH_WIDTH), "float32"), np.zeros((2, LAUNCH_WIDTH), "float32")
    threads = runtime.num_threads()

    def timed(count: int, number: int, use: int) -> float:
        return lib.omp_time_rows(a.ctypes.data, out.ctypes.data, count, LAUNCH_WIDTH, number, use)

    warm, cold = _launch_overheads(lambda number: timed(2, number, threads), lambda number: timed(1, number, 1),
                                   rounds)
    print(f"parallel launch (OpenMP, libgomp, {threads} threads): warm {warm:.2f} us, cold {cold:.2f} us")
    return warm, cold


# ---- the other runtime ----------------------------------------------------------------------

def bench_other_runtime(name: str, quick: bool) -> tuple[float, float]:
    """(warm launch_us, dense512_vs_numpy) measured by a child process on runtime ``name``."""
    env = {**os.environ, "LORIEN_RUNTIME": name}
    child = subprocess.run([sys.executable, __file__, "--runtime-child", *(["--quick"] if quick else [])],
                           env=env, capture_output=True, text=True, timeout=1800)
    if child.returncode != 0:
        print(f"runtime {name}: could not measure ({child.stderr.strip().splitlines()[-1:]})")
        return NAN, NAN
    print("\n".join(f"  [{name} runtime] {line}" for line in child.stdout.splitlines()[:-1]))
    result = json.loads(child.stdout.splitlines()[-1])
    return result["launch_us"], result["dense512"]


def runtime_child(quick: bool) -> None:
    """--runtime-child: warm launch overhead and dense 512 on this process's runtime, then JSON."""
    limiter = pin_blas_threads(runtime.num_threads())
    launch_us, _ = bench_launch(rounds=5)
    dense512 = bench_dense(512, 512, 512, dense_grid(quick), 30 if quick else 120)
    limiter.restore_original_limits()
    print(json.dumps({"runtime": runtime.backend(), "launch_us": launch_us, "dense512": dense512}))


def geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values)))) if values else NAN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, 2 conv layers, 8 trials")
    parser.add_argument("--runtime-child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    quick = opts.quick
    if opts.runtime_child:
        runtime_child(quick)
        return
    threads = runtime.num_threads()
    print(f"host: {os.cpu_count()} CPUs, {threads} kernel threads ({runtime.backend()} runtime), "
          f"load average {os.getloadavg()[0]:.1f}")
    limiter = pin_blas_threads(threads)
    launch_warm, launch_cold = bench_launch(rounds=10 if quick else 40)
    omp_warm, omp_cold = bench_launch_omp(rounds=10 if quick else 40)
    dense = {shape: bench_dense(*shape, dense_grid(quick, shape[0], shape[1]), 30 if quick else 150,
                                template_configs=8 if quick else 32)
             for shape in DENSE_SHAPES}
    launch_c, dense512_c = bench_other_runtime("c", quick)
    if importlib.util.find_spec("torch") is None:
        print("conv2d vs PyTorch: skipped (torch is not installed: pip install torch==2.13.0)")
        kernel_ratios, e2e_ratios = [NAN], [NAN]
    else:
        kernel_ratios, e2e_ratios = bench_conv(RESNET18_3X3[:2] if quick else RESNET18_3X3, quick,
                                               20 if quick else 60)
    limiter.restore_original_limits()
    trials = 8 if quick else 32
    dense_rate, conv_rate = bench_tuner(DENSE_256_JOB, trials), bench_tuner(CONV_JOB, trials)
    tvm_rates = bench_tvm_tuning(trials)
    vs_tvm = geomean([dense_rate / tvm_rates["dense"], conv_rate / tvm_rates["conv"]]) if tvm_rates else NAN
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    name = {shape: "dense" + ("x".join(map(str, shape)) if len(set(shape)) > 1 else str(shape[0]))
            for shape in DENSE_SHAPES}
    print(" ".join(f"{name[shape]}_vs_numpy={ratio:.2f}" for shape, ratio in dense.items())
          + f" conv3x3_kernel_vs_torch_geomean={geomean(kernel_ratios):.2f}"
          f" conv3x3_kernel_vs_torch_min={min(kernel_ratios):.2f}"
          f" conv3x3_e2e_vs_torch_geomean={geomean(e2e_ratios):.2f}"
          f" trials_per_s_dense={dense_rate:.2f} trials_per_s_conv={conv_rate:.2f}"
          f" trials_per_s_vs_tvm={vs_tvm:.1f}"
          f" launch_warm_us={launch_warm:.2f} launch_warm_vs_omp={omp_warm / max(launch_warm, 1e-3):.2f}"
          f" launch_cold_us={launch_cold:.2f} launch_cold_vs_omp={omp_cold / max(launch_cold, 1e-3):.2f}"
          f" launch_us_c={launch_c:.2f} dense512_vs_numpy_c={dense512_c:.2f}")


if __name__ == "__main__":
    main()
