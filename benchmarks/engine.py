"""Engine benchmark: Lorien's kernels, tuning throughput and parallel launch, each against the
baseline a user would pick, measured in the same run and timed the same way.

Every ratio is baseline time / Lorien time (> 1: Lorien is faster). Both sides of a kernel
comparison are called from Python through the same timer (``time.perf_counter`` around one
call), take turns in blocks of calls (the calls of a block's first millisecond, at least one,
are a warm-up, not counted) and get the same number of samples; the ratio is of medians, and
minimums are printed beside.

- ``dense*_vs_numpy``: C = A Bᵀ for 512³, 1024³, 1x1000x512 and 256x64x512 (M x N x K) against
  ``np.matmul(A, B.T, out=C)`` (OpenBLAS), BLAS threads pinned with threadpoolctl to the
  engine's thread count. Lorien's kernel is the best (screened first, not timed) of the
  engine's hand-written register tiles and random configs of the autotvm dense_pack.x86 and
  dense_nopack.x86 templates (screened by the native loop's fastest run in rotated rounds with
  successive halving, then the four fastest raced by their calls in interleaved rounds,
  ``lorien.engine.race``, then timed on fresh samples); any packing of B happens inside the
  kernel, on every call, except in the M < 4 candidates that take B packed beforehand (``weight
  packed beforehand``, as a constant weight is), named on the dense line. Lorien's kernel is
  called bound to its arrays (``kernel.bind``: checked once), as NumPy's call is a partial with
  ``B.T`` and ``out`` made once.
- ``conv3x3_kernel_vs_torch_*``: ResNet-18's seven 3x3 conv2d layers (batch 1). Lorien's
  NCHW16c kernel with input, weights and output already packed (kernel only), against
  PyTorch ``F.conv2d`` in its faster layout per layer (NCHW or channels_last, inputs converted
  beforehand; which one is printed). ``conv3x3_e2e_vs_torch_geomean``: Lorien from an NCHW
  input to an NCHW output, packing the input and unpacking the output (engine kernels) timed;
  the weights are packed once beforehand, as any inference engine does with constants.
- Layer classes against PyTorch (each side's best layout, same sample counts; kernel-only for
  Lorien's packed convolutions, as above, with ``*_e2e_*`` from NCHW beside):
  ``conv1x1_vs_torch_*``: ResNet-18's three 1x1 downsample convolutions and ten MobileNetV2
  pointwise layers (NCHW[x]c kernels, the channel block the widest power of two dividing C;
  for stride 1 also the NCHW-to-NCHW matmul on the arrays as they are, which is its own end to
  end; the faster median of Lorien's paths counts, as the faster of PyTorch's layouts does);
  ``depthwise_vs_torch_*``: MobileNetV2's ten 3x3 depthwise layers (Lorien's depthwise
  NCHW[x]c kernel or its NCHW kernel with no layout transform, the faster median;
  PyTorch ``F.conv2d(groups=C)``); ``bmm_vs_torch_geomean``: BERT-base
  attention's two batch_matmuls (12 heads, sequence 128) against ``torch.bmm`` with y
  transposed as a view or stored transposed; ``dense_m1_*`` / ``dense_small_m_*``: BERT-base
  dense layers at M = 1 (and the ResNet classifier) and at M = 8-32, against NumPy/OpenBLAS
  (``*_vs_numpy_min``: the worst layer) and PyTorch (``F.linear`` or ``matmul`` on the weight
  stored transposed). ``layers_vs_torch_geomean``: geomean of the six class geomeans
  (dense M=1, dense small M, conv3x3 kernel, conv1x1, depthwise, bmm).
- ``dense1024_peak_fraction``: dense 1024³'s median FLOP/s over the host's peak, cores x
  measured clock x FLOP per cycle of a core at its widest full-rate FMA width, all measured by
  ``lorien.engine.peak`` (JIT-compiled microkernels: a chain of dependent integer adds for the
  clock, 12 independent FMA chains at 4, 8 and 16 lanes for the throughput; thread CPU time,
  fastest of many short runs); ``numpy1024_peak_fraction``: OpenBLAS's, same run.
  ``dense1024_core_peak_fraction`` / ``numpy1024_core_peak_fraction``: each on one thread,
  fastest call by process CPU time over one core's peak (what a loaded machine's preemptions
  cannot lower). ``clock_ghz``, ``fma_flop_per_cycle`` (per core) and ``fma_lanes`` (the width
  the register tiles are sized for) say what was measured.
- ``trials_per_s_dense`` / ``trials_per_s_conv``: candidates per second through the autotvm
  tuner end to end (propose, build, check against NumPy, time, commit to a store) on dense
  256³ and a ResNet-18 conv2d_NCHWc layer; ``trials_per_s_vs_tvm``: the same count of trials
  of the same workloads by TVM MetaSchedule's ``tune_tir`` (geomean of the two ratios), or
  ``nan`` with a line saying so when apache-tvm is not installed.
- ``launch_warm_us``: what a 2-thread parallel loop costs above its serial run with the
  pool's threads spinning (warm): a 2-row x 256-float parallel loop (1 KiB a row: the launch is
  the cost, as in a small kernel; Lorien's caller may run the worker's row too when it gets
  there first, which libgomp's static schedule cannot) minus its first row run serially, the
  best of 7 rounds of 2000 back-to-back runs each; ``launch_warm_wide_us`` the same with 32768-float rows (128 KiB in
  and out a row; the key until issue 23's ninth round: a difference of two minima of loops of
  several microseconds, which moved more between processes than the launch costs);
  ``launch_cold_us`` the wide loop after the threads slept 50 ms. ``launch_*_vs_omp`` against
  the same loop compiled with ``gcc -O3 -fopenmp`` (libgomp, ``schedule(static)``), timed by
  the same native loop, the two sides taking turns in every round (each after a 20 ms pause,
  so that neither side's spinning workers hold a core through the other's turn). Every loop
  of both sides runs on the same two page-aligned arrays (the serial loops on their first
  row), and each side's serial baseline is its compiler's loop with no parallel runtime (for
  OpenMP the plain loop, not a 1-thread OpenMP region, whose own cost would be left out).
- ``launch_us_c`` / ``dense512_vs_numpy_c``: the engine runtime built from C instead of LLVM IR
  (``$LORIEN_RUNTIME=c``), measured in a child process (the warm launch of the 256-float rows).

    python benchmarks/engine.py            # full run, about 10 minutes (TVM tuning included)
    python benchmarks/engine.py --quick    # fewer samples and layers, 8 trials
    python benchmarks/engine.py --layers-only   # no tuning throughput, no C runtime child
    python benchmarks/engine.py --only dense_m1,bmm   # some parts (see --help), nan for the rest
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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lorien.engine import build, race, reference, runtime, te
from lorien.engine.arrays import aligned_copy, aligned_zeros
from lorien.engine.peak import HostPeak, measure_host_peak
from lorien.engine.schedule import create_schedule
from lorien.engine.x86 import (
    batch_matmul_candidate,
    conv1x1_nchw_candidate,
    conv2d_NCHWc_candidate,
    dense_candidate,
    dense_gemv_candidate,
    dense_register_tiles,
    depthwise_nchw_candidate,
    depthwise_NCHWc_candidate,
    vector_lanes,
)

# ResNet-18 3x3 conv2d layers, batch 1: (in channels, input size, out channels, stride)
RESNET18_3X3 = [(64, 56, 64, 1), (64, 56, 128, 2), (128, 28, 128, 1), (128, 28, 256, 2),
                (256, 14, 256, 1), (256, 14, 512, 2), (512, 7, 512, 1)]
DENSE_SHAPES = [(512, 512, 512), (1024, 1024, 1024), (1, 1000, 512), (256, 64, 512)]
# ResNet-18's 1x1 (downsample) convolutions: (in channels, input size, out channels, stride)
RESNET18_1X1 = [(64, 56, 128, 2), (128, 28, 256, 2), (256, 14, 512, 2)]
# MobileNetV2's pointwise (1x1, stride 1) convolutions, expand and project, one of each stage
MOBILENET_V2_POINTWISE = [(16, 112, 96, 1), (96, 56, 24, 1), (24, 56, 144, 1), (144, 28, 32, 1),
                          (32, 28, 192, 1), (64, 14, 384, 1), (384, 14, 64, 1), (576, 7, 160, 1),
                          (160, 7, 960, 1), (960, 7, 320, 1)]
# MobileNetV2's 3x3 depthwise convolutions: (channels, input size, stride)
MOBILENET_V2_DEPTHWISE = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
                          (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]
# BERT-base at batch 1, sequence 128: dense at M = 1 (one token) and small M, and attention's
# batch_matmuls (12 heads of 64): Q Kᵀ and (softmax) V.
BERT_DENSE_M1 = [(1, 768, 768), (1, 3072, 768), (1, 768, 3072), (1, 1000, 512)]
BERT_DENSE_SMALL_M = [(8, 768, 768), (16, 3072, 768), (32, 768, 3072)]
BERT_BMM = [(12, 128, 128, 64), (12, 128, 64, 128)]   # (batch, M, N, K) of x[B, M, K] y[B, N, K]ᵀ
NAN = float("nan")
#: What ``--only`` can pick.
PARTS = {"launch": "parallel launch vs OpenMP", "dense": "dense 512³, 1024³, 1x1000x512, 256x64x512 and the peak",
         "dense_m1": "BERT dense at M = 1", "dense_small_m": "BERT dense at M = 8-32",
         "conv3x3": "ResNet-18 3x3", "conv1x1": "1x1 convolutions", "depthwise": "MobileNetV2 depthwise",
         "bmm": "BERT batch_matmul", "tuning": "tuning throughput vs TVM", "c_runtime": "the C runtime child"}


# ---- timing ---------------------------------------------------------------------------------

#: Idle time before each block of paired samples: longer than OpenBLAS's worker threads spin
#: after a call (2^28 cycles by default, about 0.1 s), so that neither side's idle threads
#: still hold a core while the other side's block runs.
BLOCK_PAUSE_S = 0.25
#: Uncounted calls after the pause last at least this long (at least one call): a parked worker
#: thread (Lorien's pool, OpenBLAS's) runs again some 40-130 us after it is woken, as long as a
#: whole block of 6 calls of a 15 us kernel, which one warm-up call left partly one-threaded.
WARMUP_S = 0.001
#: A side whose median is more than this many times its minimum (a 2-thread call that ran at its
#: one-thread speed in most blocks, or a baseline as disturbed) has every side timed again.
RETIME_SPREAD = 1.8


def paired_samples(calls: dict[str, Callable[[], object]], samples: int, block: int = 6,
                   retime_spread: float = RETIME_SPREAD) -> dict[str, list[float]]:
    """Seconds of ``samples`` single calls of each callable; they take turns in blocks of
    ``block`` counted calls, each block led by a pause (:data:`BLOCK_PAUSE_S`) and uncounted
    warm-up calls (at least one, for :data:`WARMUP_S`). When any side's median is more than
    ``retime_spread`` times its minimum, every side is timed again the same way and each keeps
    the set with its lower median: a transient that held one side's calls at the one-thread
    speed in most of its blocks (a quiet run's 1x1 layer: median 129.6 us, minimum 64.6 us;
    1.95x against PyTorch when the layer was run again) decides nothing, and the other sides
    get the same second chance."""
    times = _paired_once(calls, samples, block)
    spread = {name: statistics.median(found) / min(found) for name, found in times.items()}
    if max(spread.values()) <= retime_spread:
        return times
    again = _paired_once(calls, samples, block)
    kept = {name: min(times[name], again[name], key=statistics.median) for name in calls}
    print("    timed again (median over minimum: " + ", ".join(f"{name} {x:.2f}" for name, x in spread.items())
          + "); medians first/second: " + ", ".join(f"{name} {statistics.median(times[name]) * 1e6:.1f}/"
                                                    f"{statistics.median(again[name]) * 1e6:.1f} us" for name in calls))
    return kept


def _paired_once(calls: dict[str, Callable[[], object]], samples: int, block: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    while min(len(found) for found in times.values()) < samples:
        for name, call in calls.items():
            time.sleep(BLOCK_PAUSE_S)
            warm_start = time.perf_counter()
            call()
            while time.perf_counter() - warm_start < WARMUP_S:
                call()
            for _ in range(min(block, samples - len(times[name]))):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return times


def fastest_path(times: dict[str, list[float]], paths: Sequence[str], baseline_s: float) -> tuple[str, float]:
    """Which of Lorien's ``paths`` (names in ``times``) has the fastest median, and the baseline's
    median over it: a layer counts the faster of Lorien's paths, as of PyTorch's layouts."""
    path = min(paths, key=lambda name: statistics.median(times[name]))
    return path, baseline_s / statistics.median(times[path])


def describe(name: str, seconds: list[float], flop: float | None = None) -> str:
    median, best = statistics.median(seconds), min(seconds)
    rate = f" ({flop / median / 1e9:.1f} GFLOPS median)" if flop else ""
    return f"{name}: median {median * 1e6:.1f} us, min {best * 1e6:.1f} us over {len(seconds)} samples{rate}"


def native_best_s(kernel, arrays, repeat: int = 5) -> float:
    """Fastest single run by the native timing loop (screening only): ``repeat`` runs, more
    for short kernels (up to 50, about 20 ms in all), whose fastest run a loaded machine
    disturbs most often."""
    first = min(kernel.time(*arrays, number=1, repeat=1))
    repeat = max(repeat, min(50, int(0.02 / max(first, 1e-6))))
    return min(first, *kernel.time(*arrays, number=1, repeat=repeat, warmup=False))


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

#: Candidates of a layer that the screening (native fastest runs, successive halving) leaves for the race.
FINALISTS = 4
#: Rounds of ``race.race`` among a layer's finalists.
RACE_ROUNDS = 9
#: Finalists whose best turn is within this fraction of the leader's race again (``race.race``'s
#: ``close``): about the spread of one kernel's best turn between two quiet runs.
RACE_CLOSE = 0.02


def pick_fastest(candidates: list[tuple], finalists: int = FINALISTS) -> tuple:
    """(label, kernel, config, arrays) of the fastest of ``candidates`` (``(label, kernel, config,
    arrays)``, labels unique). The native loop's fastest runs screen them in rotated rounds with
    successive halving (``race.screen``: a candidate screened while another process held the
    second core is measured again in the next round), then the ``finalists`` race by their bound
    calls, as the benchmark times them, in interleaved rotated rounds of time-budgeted turns,
    each after the pool's workers parked (``race.race``: the 25th percentile of each turn's calls,
    the best turn of each finalist; those within :data:`RACE_CLOSE` of the leader race again)."""
    by_label = {item[0]: item for item in candidates}
    if len(by_label) != len(candidates):
        raise ValueError(f"pick_fastest: labels repeat in {[item[0] for item in candidates]}")
    screened = race.screen({label: functools.partial(native_best_s, item[1], item[3])
                            for label, item in by_label.items()}, keep=finalists)
    if len(screened) == 1:
        return by_label[screened[0][0]]
    result = race.race({label: by_label[label][1].bind(*by_label[label][3]) for label, _ in screened},
                       rounds=RACE_ROUNDS, close=RACE_CLOSE)
    print("  finalists (native fastest run: " + ", ".join(f"{label} {s * 1e6:.1f} us" for label, s in screened)
          + f"); race (best of {RACE_ROUNDS} turns, {RACE_ROUNDS} more within {RACE_CLOSE:.0%} of the leader; "
          "25th percentile of each turn's calls): "
          + result.describe())
    return by_label[result.winner]


def screened_fastest(entries: list[tuple]) -> tuple:
    """The entry ``(label, kernel, arrays, ...)`` whose kernel has the fastest native run, the
    entries measured in rotated rounds with successive halving (:func:`pick_fastest` with one
    finalist: ``race.screen``, not one after the other); labels unique."""
    return pick_fastest([(str(entry[0]), entry[1], entry, entry[2]) for entry in entries], finalists=1)[2]


def dense_grid(quick: bool, m: int = 512, n: int = 512, lanes: int | None = None) -> list[tuple[int, int, str, bool]]:
    """(mr, nr, order, pack_data) register tiles for an M x N dense: ``x86.dense_register_tiles``
    (sized from the vector width, ``lanes`` if measured, and the vector register count), in
    both loop orders; the data is packed in ``mr``-row blocks when ``mr`` divides M. When no
    vector multiple divides N: panels as wide as N allows (the widest multiple of 8 up to 64)."""
    tiles = dense_register_tiles(m, n, lanes)
    if not tiles:
        nr = max(width for width in range(8, 65, 8) if n % width == 0)
        tiles = list(dict.fromkeys((min(mr, m), nr) for mr in (1, 4, 8, 14)))
    grid = [(mr, nr, order, m % mr == 0 and mr > 1) for mr, nr in tiles for order in ("mn", "nm")]
    if quick:  # the packed-data tiles first: they are the fastest at large M
        return sorted(grid, key=lambda tile: (not tile[3], tile[2]))[:3]
    return grid


def template_candidates(task_name: str, m: int, n: int, k: int, count: int) -> list[tuple[str, object]]:
    """(label, schedule builder) of ``count`` random configs of an autotvm dense template."""
    from dialects.autotvm.templates import instantiate

    task = instantiate(task_name, [["TENSOR", [m, k], "float32"], ["TENSOR", [n, k], "float32"], None, "float32"])
    rng = np.random.default_rng(0)
    picks = rng.choice(len(task.space), size=min(count, len(task.space)), replace=False)
    return [(f"{task_name} #{index}", functools.partial(task.instantiate, task.config(int(index)))) for index in picks]


def dense_skinny_candidates(m: int, n: int, k: int, quick: bool) -> list[tuple[str, object]]:
    """The engine's schedules for few rows: the GEMV (rfactor over K, ``rows`` weight rows at
    once, ``k_vectors`` vectors of K per row; parallel over blocks of rows, or over one slice of
    the weight per thread, ``parts``), below M = 4 the register tile on a weight packed
    beforehand in panels of 4 or 8 vectors (N vectorized: no horizontal sums; packed once, as a
    constant weight is), and, from M = 4, the register tile with each weight panel packed just
    before use, or on a weight packed beforehand (``mr`` of 4-8 rows, ``nr`` of 2-4 vectors,
    both loop orders)."""
    lanes, threads = vector_lanes(), runtime.num_threads()
    gemv = ((2, 1), (4, 1)) if quick else ((1, 2), (2, 1), (3, 1), (4, 1), (8, 1), (2, 2), (4, 2))
    out = [(f"gemv rows={rows} k_vectors={kv} parts={parts or 'rows'}",
            functools.partial(dense_gemv_candidate, m, n, k, rows, kv, True, parts))
           for rows, kv in gemv if m * rows * kv <= 32 for parts in (None, threads if threads > 1 else None)]
    if m < 4:
        out += [(f"weight packed beforehand nr={nr} parts={parts or 'panels'}",
                 functools.partial(dense_candidate, m, n, k, m, nr, "nm", False, False, True, parts))
                for nr in (4 * lanes, 8 * lanes) if n % nr == 0 for parts in (threads if threads > 1 else None, None)]
    out = list(dict((label, make) for label, make in out).items())
    if m >= 4:
        for mr, nr in ((min(m, 8), 2 * lanes), (min(m, 4), 4 * lanes), (min(m, 8), lanes)):
            if n % nr == 0:
                out.append((f"panel-packed tile mr={mr} nr={nr}",
                            functools.partial(dense_candidate, m, n, k, mr, nr, "nm", True)))
        # the register tile on a weight packed beforehand: no panel packing (a transposing
        # gather of the [N, K] weight) on every call
        for mr, nr in ((min(m, 8), 2 * lanes), (min(m, 8), 3 * lanes), (min(m, 4), 4 * lanes)):
            for order in ("mn", "nm") if n % nr == 0 else ():
                pack_data = order == "mn" and m % mr == 0
                out.append((f"weight packed beforehand mr={mr} nr={nr} {order}" + (" packed data" if pack_data else ""),
                            functools.partial(dense_candidate, m, n, k, mr, nr, order, False, pack_data, True)))
    return out


def torch_dense_calls(data: np.ndarray, weight: np.ndarray) -> dict[str, Callable[[], object]]:
    """PyTorch's two layouts of C = A Bᵀ: ``F.linear`` on the [N, K] weight, and ``matmul`` on
    the weight stored transposed ([K, N], converted beforehand)."""
    import torch

    t_data, t_weight = torch.from_numpy(data), torch.from_numpy(weight)
    t_weight_t = t_weight.t().contiguous()
    out = torch.empty((data.shape[0], weight.shape[0]))
    return {"torch linear": functools.partial(torch.nn.functional.linear, t_data, t_weight),
            "torch matmul Bt": functools.partial(torch.matmul, t_data, t_weight_t, out=out)}


def bench_dense(m: int, n: int, k: int, grid: list[tuple[int, int, str, bool]], samples: int,
                template_configs: int = 0, with_torch: bool = False, extra: list | None = None) -> dict[str, Any]:
    """Ratios for C = A Bᵀ (M x N x K): ``numpy`` (median NumPy time / median Lorien time), with
    ``with_torch`` also ``torch`` (PyTorch's faster layout), ``gflops`` and ``numpy_gflops``
    (medians) and ``choice``, the (label, schedule builder) of Lorien's kernel.
    Lorien's kernel is the best of the hand-written register tiles (``grid``), ``extra``
    (label, builder) candidates and, with ``template_configs``, as many random configs of each
    autotvm dense template (dense_pack.x86, dense_nopack.x86)."""
    rng = np.random.default_rng(0)
    data = aligned_copy(rng.uniform(-1, 1, (m, k)).astype("float32"))
    weight = aligned_copy(rng.uniform(-1, 1, (n, k)).astype("float32"))
    expected = reference.dense(data, weight)
    flop = 2.0 * m * n * k
    candidates = [((mr, nr, order, "packed data" if pack_data else "data as is"),
                   functools.partial(dense_candidate, m, n, k, mr, nr, order, False, pack_data))
                  for mr, nr, order, pack_data in grid]
    candidates += list(extra or [])
    for task_name in ("dense_pack.x86", "dense_nopack.x86") if template_configs else ():
        candidates += template_candidates(task_name, m, n, k, template_configs)
    built = []
    for label, make in candidates:
        s, args = make()
        kernel = build(s, args)
        out = aligned_zeros((m, n), "float32")
        arrays = kernel.pack_arguments(data, weight, out)   # a weight packed beforehand is packed here, once
        kernel(*arrays)
        np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3)
        built.append((str(label), kernel, (label, make), arrays))
    _, kernel, (config, make), arrays = pick_fastest(built)
    ours, theirs = arrays[-1], aligned_zeros((m, n), "float32")
    calls = {"lorien": kernel.bind(*arrays), "numpy": functools.partial(np.matmul, data, weight.T, out=theirs)}
    if with_torch:
        calls.update(torch_dense_calls(data, weight))
    times = paired_samples(calls, samples)
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-3)
    lorien_s = statistics.median(times["lorien"])
    result = {"numpy": statistics.median(times["numpy"]) / lorien_s, "gflops": flop / lorien_s / 1e9,
              "numpy_gflops": flop / statistics.median(times["numpy"]) / 1e9, "choice": (config, make)}
    line = (f"dense {m}x{n}x{k}: {describe('lorien', times['lorien'], flop)} {config}; "
            f"{describe('numpy', times['numpy'], flop)}; ratio {result['numpy']:.2f} "
            f"(min ratio {min(times['numpy']) / min(times['lorien']):.2f})")
    if with_torch:
        best = min((name for name in calls if name.startswith("torch")), key=lambda name: statistics.median(times[name]))
        result["torch"] = statistics.median(times[best]) / lorien_s
        line += f"; {describe(best, times[best], flop)}; vs torch {result['torch']:.2f}"
    print(line)
    return result


# ---- conv2d ---------------------------------------------------------------------------------

def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, limit + 1) if n % d == 0]


def layout_kernels(channels: int, size: int, out_channels: int, out_size: int, ic_bn: int, oc_bn: int):
    """Engine kernels NCHW -> NCHW{ic_bn}c (input) and NCHW{oc_bn}c -> NCHW (output, the faster of
    two schedules)."""
    x = te.placeholder((1, channels, size, size), name="x")
    packed = te.compute((1, channels // ic_bn, size, size, ic_bn),
                        lambda n, c, h, w, b: x[n, c * ic_bn + b, h, w], name="packed")
    s = create_schedule(packed)
    n, c, h, w, b = packed.op.axis
    s[packed].parallel(s[packed].fuse(n, c, h))
    s[packed].vectorize(b)
    pack = build(s, [x, packed])
    return pack, _fastest_unpack(out_channels, out_size, oc_bn)


def _fastest_unpack(channels: int, size: int, bn: int):
    """NCHW{bn}c -> NCHW, the faster (screened) of two schedules: vectorized along each output
    row (a per-lane gather from ``bn``-wide blocks), or along the block's channels (contiguous
    loads, per-lane stores) for ``tile`` unrolled positions of the row."""
    y = te.placeholder((1, channels // bn, size, size, bn), name="y")
    screened = []
    for tile in [None] + [width for width in (8, 7, 4) if size % width == 0][:1]:
        plain = te.compute((1, channels, size, size), lambda n, c, h, w: y[n, c // bn, h, w, c % bn], name="plain")
        s = create_schedule(plain)
        n, c, h, w = plain.op.axis
        if tile is None:
            s[plain].parallel(s[plain].fuse(n, c, h))
            s[plain].vectorize(w)
        else:
            co, ci = s[plain].split(c, factor=bn)
            wo, wi = s[plain].split(w, factor=tile)
            s[plain].reorder(n, co, h, wo, wi, ci)
            s[plain].parallel(s[plain].fuse(n, co, h))
            s[plain].unroll(wi)
            s[plain].vectorize(ci)
        kernel = build(s, [y, plain])
        blocked, out = aligned_zeros((1, channels // bn, size, size, bn), "float32"), aligned_zeros(
            (1, channels, size, size), "float32")
        screened.append((native_best_s(kernel, [blocked, out]), tile is not None, kernel))
    return min(screened, key=lambda item: item[:2])[2]


def channel_block(channels: int) -> int:
    """The packed channel block: the vector width when it divides ``channels``, else the widest
    power of two that does."""
    lanes = vector_lanes()
    return next(bn for bn in (lanes, 16, 8, 4, 2, 1) if bn <= lanes and channels % bn == 0)


def conv_grid(out_size: int, quick: bool, channels: int = 64, out_channels: int = 64,
              kernel: int = 3) -> list[tuple[int, int, int, bool, int, bool]]:
    """(ic_bn, oc_bn, tile_ow, unroll_kw, tile_oh, pad_rows) configs of a layer's NCHW[x]c kernel;
    a padded (3x3) layer has each both ways: the padding a parallel pass of its own, or
    ``pad_rows`` (parallel over output rows, each padding the input rows it reads)."""
    ic_bn, oc_bn = channel_block(channels), channel_block(out_channels)
    tiles = [t for t in _divisors(out_size, 28) if t >= 4] or [out_size]
    tiles = sorted(tiles, key=lambda t: abs(t - 8))[: 2 if quick else 4]
    unroll = (True,) if quick or kernel == 1 else (True, False)
    grid = [(ic_bn, oc_bn, t, kw, 1) for t in tiles for kw in unroll]
    if not quick:  # two vectors of output channels, or two output rows, per register tile
        if oc_bn == vector_lanes() and out_channels % (2 * oc_bn) == 0:
            grid += [(ic_bn, 2 * oc_bn, t, kw, 1) for t in tiles if t <= 14 for kw in unroll]
        if out_size % 2 == 0:
            grid += [(ic_bn, oc_bn, t, kw, 2) for t in tiles if t <= 8 for kw in unroll]
    return [(*config, pad_rows) for config in grid for pad_rows in ((False, True) if kernel > 1 else (False,))]


def torch_best(times: dict[str, list[float]]) -> str:
    return min((name for name in times if name.startswith("torch")), key=lambda name: statistics.median(times[name]))


def bench_conv_layer(channels: int, size: int, out_channels: int, stride: int, quick: bool,
                     samples: int, kernel_size: int = 3) -> tuple[float, float]:
    """(kernel-only ratio, end-to-end ratio) of one conv layer (3x3 pad 1 or 1x1 pad 0)
    against PyTorch's faster layout."""
    import torch

    pad = kernel_size // 2
    out_size = (size + 2 * pad - kernel_size) // stride + 1
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    weight = rng.uniform(-1, 1, (out_channels, channels, kernel_size, kernel_size)).astype("float32")
    t_data, t_weight = torch.from_numpy(data), torch.from_numpy(weight)
    t_data_cl = t_data.contiguous(memory_format=torch.channels_last)
    t_weight_cl = t_weight.contiguous(memory_format=torch.channels_last)
    conv = torch.nn.functional.conv2d
    expected = conv(t_data, t_weight, stride=stride, padding=pad).numpy()
    flop = 2.0 * out_channels * out_size * out_size * channels * kernel_size * kernel_size
    built, packings = [], {}
    for config in conv_grid(out_size, quick, channels, out_channels, kernel_size):
        ic_bn, oc_bn, tile_ow, unroll_kw, tile_oh, pad_rows = config
        s, args = conv2d_NCHWc_candidate(channels, size, out_channels, stride, ic_bn, oc_bn, tile_ow, unroll_kw,
                                         kernel=kernel_size, pad=pad, tile_oh=tile_oh, pad_rows=pad_rows)
        kernel = build(s, args)
        if (ic_bn, oc_bn) not in packings:   # the packed input and weight, shared by the configs of one blocking
            packings[ic_bn, oc_bn] = [aligned_copy(reference.pack_nchwc(data, ic_bn)),
                                      aligned_copy(reference.pack_kernel_oihwio(weight, ic_bn, oc_bn))]
        packed = packings[ic_bn, oc_bn]
        out = aligned_zeros(args[-1].shape, "float32")
        kernel(*packed, out)
        np.testing.assert_allclose(reference.unpack_nchwc(out), expected, rtol=1e-3, atol=1e-2)
        built.append((str(config), kernel, config, [*packed, out]))
    _, kernel, config, (packed_data, packed_weight, packed_out) = pick_fastest(built, 1 if quick else FINALISTS)
    pack, unpack = layout_kernels(channels, size, out_channels, out_size, config[0], config[1])
    plain_out = aligned_zeros((1, out_channels, out_size, out_size), "float32")

    def end_to_end() -> None:
        pack(data, packed_data)
        kernel(packed_data, packed_weight, packed_out)
        unpack(packed_out, plain_out)

    end_to_end()
    np.testing.assert_allclose(plain_out, expected, rtol=1e-3, atol=1e-2)
    calls = {"lorien kernel": kernel.bind(packed_data, packed_weight, packed_out), "lorien e2e": end_to_end}
    nchw = conv1x1_nchw_call(data, weight, expected) if kernel_size == 1 and stride == 1 else None
    if nchw:
        calls["lorien NCHW"] = nchw[1]
    with torch.no_grad():
        times = paired_samples({
            **calls,
            "torch NCHW": functools.partial(conv, t_data, t_weight, stride=stride, padding=pad),
            "torch channels_last": functools.partial(conv, t_data_cl, t_weight_cl, stride=stride, padding=pad),
        }, samples)
    torch_layout = torch_best(times)
    torch_s = statistics.median(times[torch_layout])
    # each of Lorien's paths from NCHW: packed NCHW[x]c (kernel only / with the layout kernels) and,
    # for 1x1 stride 1, the NCHW matmul (its own end to end); the faster median counts
    others = ("lorien NCHW",) if nchw else ()
    kernel_path, kernel_ratio = fastest_path(times, ("lorien kernel", *others), torch_s)
    e2e_path, e2e_ratio = fastest_path(times, ("lorien e2e", *others), torch_s)
    print(f"conv{kernel_size}x{kernel_size} {channels}x{size}x{size}->{out_channels} s{stride} "
          f"(ic_bn,oc_bn,tile_ow,unroll_kw,tile_oh,pad_rows)={config}"
          + (f", NCHW matmul {nchw[0]}" if nchw else "")
          + f": kernel {kernel_ratio:.2f}x ({kernel_path}), end to end {e2e_ratio:.2f}x ({e2e_path}) "
          f"against {torch_layout}")
    for name, seconds in times.items():
        print(f"    {describe(name, seconds, flop)}")
    return kernel_ratio, e2e_ratio


def conv1x1_nchw_call(data: np.ndarray, weight: np.ndarray, expected: np.ndarray):
    """(label, call) of the fastest (screened) 1x1 stride-1 convolution from NCHW to NCHW as a
    register-tiled matmul on the arrays as they are (``x86.conv1x1_nchw_candidate``), or None
    when no tile's column panel divides H*W."""
    _, channels, size, _ = data.shape
    out_channels = weight.shape[0]
    columns = size * size
    plain_data, plain_weight = aligned_copy(data), aligned_copy(weight)
    out = aligned_zeros((1, out_channels, size, size), "float32")
    args = (plain_weight.reshape(out_channels, channels), plain_data.reshape(channels, columns),
            out.reshape(out_channels, columns))
    screened = []
    for mr, nr in dense_register_tiles(out_channels, columns):
        s, tensors = conv1x1_nchw_candidate(channels, size, out_channels, mr, nr)
        kernel = build(s, tensors)
        kernel(*args)
        np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-2)
        screened.append((f"mr={mr} nr={nr}", kernel, list(args)))
    if not screened:
        return None
    label, kernel, _ = screened_fastest(screened)
    return label, functools.partial(kernel, *args)


def bench_conv(layers, quick: bool, samples: int, kernel_size: int = 3) -> tuple[list[float], list[float]]:
    import torch

    torch.set_num_threads(runtime.num_threads())
    results = [bench_conv_layer(*layer, quick, samples, kernel_size) for layer in layers]
    return [kernel for kernel, _ in results], [e2e for _, e2e in results]


def depthwise_grid(out_size: int, quick: bool) -> list[tuple[int, int, bool]]:
    tiles = [t for t in _divisors(out_size, 28) if t >= 4] or [out_size]
    tiles = sorted(tiles, key=lambda t: abs(t - 8))[: 2 if quick else 3]
    grid = [(t, 1, False) for t in tiles]
    if not quick:
        grid += [(t, 2, False) for t in tiles if out_size % 2 == 0 and t <= 8] + [(tiles[0], 1, True)]
    return grid


def bench_depthwise_layer(channels: int, size: int, stride: int, quick: bool, samples: int) -> tuple[float, float]:
    """(kernel-only ratio, end-to-end ratio) of one 3x3 depthwise layer (pad 1) against
    PyTorch's faster layout (``F.conv2d(groups=C)``, NCHW or channels_last)."""
    import torch

    out_size = (size + 2 - 3) // stride + 1
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    weight = rng.uniform(-1, 1, (channels, 1, 3, 3)).astype("float32")
    t_data, t_weight = torch.from_numpy(data), torch.from_numpy(weight)
    t_data_cl = t_data.contiguous(memory_format=torch.channels_last)
    t_weight_cl = t_weight.contiguous(memory_format=torch.channels_last)
    conv = functools.partial(torch.nn.functional.conv2d, stride=stride, padding=1, groups=channels)
    expected = conv(t_data, t_weight).numpy()
    flop = 2.0 * channels * out_size * out_size * 9
    bn = channel_block(channels)
    packed = [aligned_copy(reference.pack_nchwc(data, bn)), aligned_copy(reference.pack_depthwise_kernel(weight, bn))]
    screened = []
    for tile_ow, tile_oh, pad_inline in depthwise_grid(out_size, quick):
        s, args = depthwise_NCHWc_candidate(channels, size, stride, bn, tile_ow, tile_oh, pad_inline=pad_inline)
        kernel = build(s, args)
        out = aligned_zeros(args[-1].shape, "float32")
        kernel(*packed, out)
        np.testing.assert_allclose(reference.unpack_nchwc(out), expected, rtol=1e-4, atol=1e-4)
        screened.append(((bn, tile_ow, tile_oh, pad_inline), kernel, [*packed, out]))
    config, kernel, (_, _, packed_out) = screened_fastest(screened)
    pack, unpack = layout_kernels(channels, size, channels, out_size, bn, bn)
    plain_out = aligned_zeros((1, channels, out_size, out_size), "float32")

    def end_to_end() -> None:
        pack(data, packed[0])
        kernel(*packed, packed_out)
        unpack(packed_out, plain_out)

    end_to_end()
    np.testing.assert_allclose(plain_out, expected, rtol=1e-4, atol=1e-4)
    nchw_label, nchw_call = depthwise_nchw_call(data, weight, stride, expected, quick)
    with torch.no_grad():
        times = paired_samples({
            "lorien kernel": functools.partial(kernel, *packed, packed_out),
            "lorien e2e": end_to_end,
            "lorien NCHW": nchw_call,
            "torch NCHW": functools.partial(conv, t_data, t_weight),
            "torch channels_last": functools.partial(conv, t_data_cl, t_weight_cl),
        }, samples)
    torch_layout = torch_best(times)
    torch_s = statistics.median(times[torch_layout])
    # the faster median of Lorien's paths counts (NCHW[x]c packed, or NCHW with no transform)
    kernel_path, kernel_ratio = fastest_path(times, ("lorien kernel", "lorien NCHW"), torch_s)
    e2e_path, e2e_ratio = fastest_path(times, ("lorien e2e", "lorien NCHW"), torch_s)
    print(f"depthwise3x3 {channels}x{size}x{size} s{stride} (bn,tile_ow,tile_oh,pad_inline)={config}, "
          f"NCHW {nchw_label}: kernel {kernel_ratio:.2f}x ({kernel_path}), end to end {e2e_ratio:.2f}x ({e2e_path}) "
          f"against {torch_layout}")
    for name, seconds in times.items():
        print(f"    {describe(name, seconds, flop)}")
    return kernel_ratio, e2e_ratio


def depthwise_nchw_call(data: np.ndarray, weight: np.ndarray, stride: int, expected: np.ndarray, quick: bool):
    """(label, call) of the fastest (screened) 3x3 depthwise kernel from NCHW to NCHW
    (``x86.depthwise_nchw_candidate``: rows of ``tile_ow`` outputs vectorized, padding inlined
    or materialized per channel, no layout transform)."""
    _, channels, size, _ = data.shape
    out_size = expected.shape[-1]
    plain_data, plain_weight = aligned_copy(data), aligned_copy(weight)
    out = aligned_zeros(expected.shape, "float32")
    widths = [16] + [width for width in (8, 28, 14, 7) if out_size % width == 0 and not quick]
    screened = []
    for tile_ow in widths:
        for tile_oh in (2, 4) if quick else (1, 2, 4):
            for pad_inline in (True,) if quick else (True, False):
                s, tensors = depthwise_nchw_candidate(channels, size, stride, tile_ow, tile_oh, pad_inline)
                kernel = build(s, tensors)
                kernel(plain_data, plain_weight, out)
                np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
                screened.append((f"tile_ow={tile_ow} tile_oh={tile_oh} pad_inline={pad_inline}", kernel,
                                 [plain_data, plain_weight, out]))
    label, kernel, _ = screened_fastest(screened)
    return label, functools.partial(kernel, plain_data, plain_weight, out)


def bmm_candidates(b: int, m: int, n: int, k: int, count: int) -> list[tuple[str, object]]:
    from dialects.autotvm.templates import instantiate

    task = instantiate("batch_matmul.x86", [["TENSOR", [b, m, k], "float32"], ["TENSOR", [b, n, k], "float32"], None])
    lanes = vector_lanes()
    # register tiles that fit: 4-8 rows x 1-4 vectors of columns (the template's tile_y[-1] x
    # tile_x[-1]), then random configs
    tiles = [i for i in range(len(task.space)) if len(task.space) <= 50000
             and task.config(i)["tile_y"].size[-1] in (4, 6, 8)
             and task.config(i)["tile_x"].size[-1] in (lanes, 2 * lanes, 4 * lanes)
             and task.config(i)["tile_y"].size[-1] * task.config(i)["tile_x"].size[-1] <= 24 * lanes]
    rng = np.random.default_rng(0)
    picks = list(rng.choice(tiles, size=min(count // 2, len(tiles)), replace=False)) if tiles else []
    others = [i for i in range(len(task.space)) if i not in set(picks)]
    picks += list(rng.choice(others, size=min(count - len(picks), len(others)), replace=False))
    return [(f"batch_matmul.x86 #{index}", functools.partial(task.instantiate, task.config(int(index))))
            for index in picks]


def bmm_engine_candidates(b: int, m: int, n: int, k: int, lanes: int | None = None) -> list[tuple[str, object]]:
    """(label, schedule builder) of the engine's batch_matmul register tiles
    (``x86.schedule_batch_matmul``: one parallel loop over batch and y panels, each panel packed
    just before use), sized by ``dense_register_tiles``."""
    return [(f"engine tile mr={mr} nr={nr}", functools.partial(batch_matmul_candidate, b, m, n, k, mr, nr))
            for mr, nr in dense_register_tiles(m, n, lanes)]


def bench_bmm(b: int, m: int, n: int, k: int, samples: int, configs: int, lanes: int | None = None) -> float:
    """Median PyTorch time (faster of ``bmm`` on y transposed as a view and on y stored [B, K, N])
    / median Lorien time for out = x yᵀ; Lorien's kernel is the best (screened first) of the
    engine's register tiles (:func:`bmm_engine_candidates`) and ``configs`` random configs of
    the autotvm batch_matmul.x86 template."""
    import torch

    rng = np.random.default_rng(0)
    x = aligned_copy(rng.uniform(-1, 1, (b, m, k)).astype("float32"))
    y = aligned_copy(rng.uniform(-1, 1, (b, n, k)).astype("float32"))
    expected = reference.batch_matmul(x, y)
    flop = 2.0 * b * m * n * k
    screened = []
    for label, make in bmm_engine_candidates(b, m, n, k, lanes) + bmm_candidates(b, m, n, k, configs):
        s, args = make()
        kernel = build(s, args)
        out = aligned_zeros((b, m, n), "float32")
        kernel(x, y, out)
        np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3)
        screened.append((label, kernel, [x, y, out]))
    config, kernel, (_, _, out) = screened_fastest(screened)
    t_x, t_y = torch.from_numpy(x), torch.from_numpy(y)
    t_yt = t_y.transpose(1, 2).contiguous()
    t_out = torch.empty((b, m, n))
    times = paired_samples({"lorien": functools.partial(kernel, x, y, out),
                            "torch bmm y.T view": functools.partial(torch.bmm, t_x, t_y.transpose(1, 2), out=t_out),
                            "torch bmm yT stored": functools.partial(torch.bmm, t_x, t_yt, out=t_out)}, samples)
    np.testing.assert_allclose(out, t_out.numpy(), rtol=1e-3, atol=1e-3)
    best = torch_best(times)
    ratio = statistics.median(times[best]) / statistics.median(times["lorien"])
    print(f"batch_matmul {b}x{m}x{n}x{k} {config}: {ratio:.2f}x against {best}")
    for name, seconds in times.items():
        print(f"    {describe(name, seconds, flop)}")
    return ratio


# ---- the host's peak ------------------------------------------------------------------------

def cpu_model_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def host_peak(threads: int) -> HostPeak:
    """The host's peak as ``lorien.engine.peak`` measures it (clock and per-core FMA throughput at
    every vector width, by JIT-compiled microkernels), for ``threads`` cores."""
    peak = measure_host_peak(threads)
    print(f"peak: {cpu_model_name()}: {peak.describe()}")
    return peak


def core_peak_fraction(call: Callable[[], object], flop: float, peak: HostPeak, calls: int = 12) -> float:
    """One core's fraction of its peak: ``call`` run on one thread (the caller sets the threads),
    its fastest of ``calls`` runs by the process's CPU time, which a loaded machine's preemptions
    do not lengthen (the wall-clock medians do), over clock x FLOP per cycle of a core."""
    call()
    best = math.inf
    for _ in range(calls):
        start = time.process_time()
        call()
        best = min(best, time.process_time() - start)
    return flop / best / (peak.clock_hz * peak.core_flop_per_cycle)


def dense_core_fractions(shape: tuple[int, int, int], kernel_config: tuple, peak: HostPeak) -> dict[str, float]:
    """Lorien's chosen dense kernel and NumPy/OpenBLAS, each on one thread: their fractions of a
    core's measured peak (:func:`core_peak_fraction`)."""
    from threadpoolctl import threadpool_limits

    m, n, k = shape
    rng = np.random.default_rng(1)
    data = aligned_copy(rng.uniform(-1, 1, (m, k)).astype("float32"))
    weight = aligned_copy(rng.uniform(-1, 1, (n, k)).astype("float32"))
    ours, theirs = aligned_zeros((m, n), "float32"), aligned_zeros((m, n), "float32")
    flop = 2.0 * m * n * k
    with runtime.threads(1), threadpool_limits(limits=1, user_api="blas"):
        s, args = kernel_config[1]()
        kernel = build(s, args)
        result = {"lorien": core_peak_fraction(functools.partial(kernel, data, weight, ours), flop, peak),
                  "numpy": core_peak_fraction(functools.partial(np.matmul, data, weight.T, out=theirs), flop, peak)}
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-3)
    print(f"dense {m}x{n}x{k} on one core, fastest by CPU time: lorien {result['lorien']:.2f} of the core's peak "
          f"({kernel_config[0]}), numpy {result['numpy']:.2f}")
    return result


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
static double seconds_between(struct timespec t0, struct timespec t1) {
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
static void rows(const float *a, float *out, long count, long width) {
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < count; r++)
        for (long i = 0; i < width; i++) out[r * width + i] = a[r * width + i] * 2.0f + 1.0f;
}
/* The same loop with no OpenMP region: the serial baseline, as Lorien's is a kernel with no
   parallel loop. */
static void rows_serial(const float *a, float *out, long count, long width) {
    for (long r = 0; r < count; r++)
        for (long i = 0; i < width; i++) out[r * width + i] = a[r * width + i] * 2.0f + 1.0f;
}
double omp_time_rows(const float *a, float *out, long count, long width, long number, int threads) {
    omp_set_num_threads(threads);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long n = 0; n < number; n++) rows(a, out, count, width);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return seconds_between(t0, t1);
}
double serial_time_rows(const float *a, float *out, long count, long width, long number) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long n = 0; n < number; n++) {
        rows_serial(a, out, count, width);
        __asm__ __volatile__("" : : "r"(out) : "memory");   /* every run stores, none is folded away */
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return seconds_between(t0, t1);
}
"""
#: Row widths of the launched loop (floats): 32768 (128 KiB in and out per row, the figure
#: reported since the first round) and 256 (1 KiB: a loop whose cost is the launch, what a
#: small kernel pays; the key).
LAUNCH_WIDTH = 1 << 15
LAUNCH_SMALL_WIDTH = 256
COLD_IDLE_S = 0.05


def _rows_kernel(rows: int, width: int, parallel: bool):
    """out = a * 2 + 1 over ``rows`` x ``width`` floats, the rows a parallel loop when ``parallel``."""
    a = te.placeholder((rows, width), name="a")
    out = te.compute((rows, width), lambda r, i: a[r, i] * 2.0 + 1.0, name="out")
    s = create_schedule(out)
    r, i = s[out].op.axis
    _, inner = s[out].split(i, factor=16)
    s[out].vectorize(inner)
    if parallel:
        s[out].parallel(r)
    return build(s, [a, out])


def launch_arrays(width: int) -> tuple[np.ndarray, np.ndarray]:
    """The launched loop's input (ones) and output, 2 rows of ``width`` floats, each starting on
    a page: every loop of both sides runs on these two arrays (the serial loops on their first
    row), so that where the input and output streams fall within a page (4K aliasing of loads
    with earlier stores, cache sets) is the same for every loop, both sides and every process;
    NumPy's own allocations put them at offsets that differ from one process to the next."""
    a, out = aligned_zeros((2, width), "float32", alignment=4096), aligned_zeros((2, width), "float32", alignment=4096)
    a.fill(1.0)
    return a, out


#: Idle time before each side's warm rounds: longer than either side's workers spin after a
#: loop (Lorien's 1 ms, libgomp's GOMP_SPINCOUNT), so neither holds the other's second core.
SIDE_PAUSE_S = 0.02
#: Warm rounds: each side's best of these (2000 back-to-back runs each) is its figure.
WARM_ROUNDS = 7
WARM_RUNS = 2000


def _launch_overheads(sides: dict[str, tuple[Callable[[int], float], Callable[[int], float]]],
                      rounds: int) -> dict[str, tuple[float, float]]:
    """Per side, (warm, cold) fork-join overhead in microseconds: the best 2-row parallel run
    minus the best 1-row serial run; cold runs come after the threads sat idle for COLD_IDLE_S
    (``rounds`` of them; none when 0). ``sides`` maps a name to (parallel_s, serial_s): seconds
    of ``number`` runs. The sides take turns in every warm and cold round, so a load that comes
    and goes reaches both alike."""
    warm_par = dict.fromkeys(sides, math.inf)
    warm_one = dict.fromkeys(sides, math.inf)
    for _ in range(WARM_ROUNDS):
        for name, (parallel_s, serial_s) in sides.items():
            time.sleep(SIDE_PAUSE_S)
            warm_par[name] = min(warm_par[name], parallel_s(WARM_RUNS) / WARM_RUNS)
            warm_one[name] = min(warm_one[name], serial_s(WARM_RUNS) / WARM_RUNS)
    cold: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, (parallel_s, _) in sides.items():
            time.sleep(COLD_IDLE_S)
            cold[name].append(parallel_s(1))
    return {name: (max(0.0, (warm_par[name] - warm_one[name]) * 1e6),
                   max(0.0, (statistics.median(cold[name]) - warm_one[name]) * 1e6) if cold[name] else NAN)
            for name in sides}


def _lorien_launch_side(a: np.ndarray, out: np.ndarray) -> tuple[Callable[[int], float], Callable[[int], float]]:
    """Lorien's (parallel_s, serial_s) on ``a``/``out``: the 2-row parallel kernel, and the 1-row
    serial kernel on their first row (a view: same addresses)."""
    width = a.shape[1]
    par, one = _rows_kernel(2, width, True), _rows_kernel(1, width, False)
    return (lambda number: par.time(a, out, number=number)[0] * number,
            lambda number: one.time(a[:1], out[:1], number=number)[0] * number)


def _omp_launch_side(a: np.ndarray, out: np.ndarray) -> tuple[Callable[[int], float], Callable[[int], float]] | None:
    """The same loop with OpenMP (gcc -fopenmp) on the same arrays, its serial baseline the loop
    with no OpenMP region (as Lorien's is a kernel with no parallel loop); None when there is no
    compiler."""
    from lorien.native import NativeBuildError, load_shared

    try:
        lib = load_shared(OMP_SOURCE, "bench_omp_rows", ("-O3", "-march=native", "-fopenmp"), libs=("-fopenmp",))
    except NativeBuildError as exc:
        print(f"parallel launch (OpenMP): skipped ({str(exc).splitlines()[0]})")
        return None
    lib.omp_time_rows.restype = lib.serial_time_rows.restype = ctypes.c_double
    lib.omp_time_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                  ctypes.c_long, ctypes.c_int]
    lib.serial_time_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long]
    width, threads = a.shape[1], runtime.num_threads()
    return (lambda number: lib.omp_time_rows(a.ctypes.data, out.ctypes.data, 2, width, number, threads),
            lambda number: lib.serial_time_rows(a.ctypes.data, out.ctypes.data, 1, width, number))


def bench_launch(rounds: int, with_omp: bool = False) -> dict[str, dict[str, tuple[float, float]]]:
    """Fork-join overhead in microseconds of Lorien's pool (``lorien``) and, with ``with_omp``, of
    the same loop on OpenMP (``omp``; nan when there is no compiler), measured in turns, per row
    width: ``{"small": {side: (warm, nan)}, "large": {side: (warm, cold)}}`` (256 and 32768
    floats a row; the cold launch, ``rounds`` of it, on the large loop only)."""
    found: dict[str, dict[str, tuple[float, float]]] = {}
    for size, width, cold_rounds in (("small", LAUNCH_SMALL_WIDTH, 0), ("large", LAUNCH_WIDTH, rounds)):
        a, out = launch_arrays(width)
        sides = {"lorien": _lorien_launch_side(a, out)}
        omp = _omp_launch_side(a, out) if with_omp else None
        if omp:
            sides["omp"] = omp
        found[size] = _launch_overheads(sides, cold_rounds)
        np.testing.assert_array_equal(out, np.full_like(out, 3.0))
        if with_omp and not omp:
            found[size]["omp"] = (NAN, NAN)
        described = ", ".join(f"{name} warm {warm:.2f} us" + ("" if math.isnan(cold) else f", cold {cold:.2f} us")
                              for name, (warm, cold) in found[size].items())
        print(f"parallel launch, 2 rows x {width} floats ({runtime.backend()} runtime, libgomp for omp, "
              f"{runtime.num_threads()} threads): {described}")
    return found


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
    launch_us, _ = bench_launch(rounds=5)["small"]["lorien"]
    dense512 = bench_dense(512, 512, 512, dense_grid(quick), 30 if quick else 120)["numpy"]
    limiter.restore_original_limits()
    print(json.dumps({"runtime": runtime.backend(), "launch_us": launch_us, "dense512": dense512}))


def geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values)))) if values else NAN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, layers and trials")
    parser.add_argument("--layers-only", action="store_true",
                        help="only the layer classes against PyTorch/NumPy and the launch (no tuning throughput, "
                             "no C runtime child)")
    parser.add_argument("--only", type=lambda text: text.split(","), default=list(PARTS), metavar="PART[,PART...]",
                        help="run only these parts (the others print nan on the last line): "
                             + ", ".join(f"{name} ({what})" for name, what in PARTS.items()))
    parser.add_argument("--runtime-child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    unknown = sorted(set(opts.only) - set(PARTS))
    if unknown:
        parser.error(f"--only: unknown part(s) {', '.join(unknown)} (known: {', '.join(PARTS)})")
    wanted = set(opts.only)
    quick = opts.quick
    if opts.runtime_child:
        runtime_child(quick)
        return
    threads = runtime.num_threads()
    print(f"host: {cpu_model_name()}, {os.cpu_count()} CPUs, {threads} kernel threads ({runtime.backend()} runtime), "
          f"load average {os.getloadavg()[0]:.1f}")
    have_torch = importlib.util.find_spec("torch") is not None
    if have_torch:
        import torch

        torch.set_num_threads(threads)
        print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads")
    else:
        print("layers vs PyTorch: skipped (torch is not installed: pip install torch==2.13.0)")
    limiter = pin_blas_threads(threads)
    peak = host_peak(threads)
    unmeasured = {"lorien": (NAN, NAN), "omp": (NAN, NAN)}
    launches = (bench_launch(rounds=10 if quick else 40, with_omp=True) if "launch" in wanted
                else {"small": unmeasured, "large": unmeasured})
    (launch_warm, _), (omp_warm, _) = launches["small"]["lorien"], launches["small"]["omp"]
    (wide_warm, launch_cold), (omp_wide_warm, omp_cold) = launches["large"]["lorien"], launches["large"]["omp"]
    dense_samples = 30 if quick else 150
    lanes = min(peak.lanes, vector_lanes())  # the widest vector the FMAs run at full rate
    skipped = {"numpy": NAN, "torch": NAN, "gflops": NAN, "numpy_gflops": NAN}
    dense = {shape: bench_dense(*shape, dense_grid(quick, shape[0], shape[1], lanes), dense_samples,
                                template_configs=8 if quick else 32,
                                extra=dense_skinny_candidates(*shape, quick) if shape[0] < 64 else None)
             if "dense" in wanted else skipped for shape in DENSE_SHAPES}
    layer_samples = 20 if quick else 40
    core = (dense_core_fractions((1024, 1024, 1024), dense[(1024, 1024, 1024)]["choice"], peak)
            if "dense" in wanted else {"lorien": NAN, "numpy": NAN})
    m1 = [bench_dense(*shape, dense_grid(quick, shape[0], shape[1], lanes), layer_samples,
                      template_configs=8 if quick else 24, with_torch=have_torch,
                      extra=dense_skinny_candidates(*shape, quick))
          for shape in (BERT_DENSE_M1[:2] if quick else BERT_DENSE_M1)] if "dense_m1" in wanted else [skipped]
    small_m = [bench_dense(*shape, dense_grid(quick, shape[0], shape[1], lanes), layer_samples,
                           template_configs=8 if quick else 24, with_torch=have_torch,
                           extra=dense_skinny_candidates(*shape, quick))
               for shape in (BERT_DENSE_SMALL_M[:1] if quick else BERT_DENSE_SMALL_M)
               ] if "dense_small_m" in wanted else [skipped]
    launch_c, dense512_c = ((NAN, NAN) if opts.layers_only or "c_runtime" not in wanted
                            else bench_other_runtime("c", quick))
    nan_pair = ([NAN], [NAN])
    kernel_ratios, e2e_ratios = conv1x1 = depthwise = nan_pair
    bmm = [NAN]
    if have_torch:
        if "conv3x3" in wanted:
            kernel_ratios, e2e_ratios = bench_conv(RESNET18_3X3[:2] if quick else RESNET18_3X3, quick,
                                                   20 if quick else 60)
        if "conv1x1" in wanted:
            conv1x1 = bench_conv(RESNET18_1X1[:1] + MOBILENET_V2_POINTWISE[:1] if quick
                                 else RESNET18_1X1 + MOBILENET_V2_POINTWISE, quick, layer_samples, kernel_size=1)
        if "depthwise" in wanted:
            depthwise = [bench_depthwise_layer(*layer, quick, layer_samples)
                         for layer in (MOBILENET_V2_DEPTHWISE[2:4] if quick else MOBILENET_V2_DEPTHWISE)]
            depthwise = ([kernel for kernel, _ in depthwise], [e2e for _, e2e in depthwise])
        if "bmm" in wanted:
            bmm = [bench_bmm(*shape, layer_samples, 8 if quick else 24, lanes) for shape in BERT_BMM]
    limiter.restore_original_limits()
    if opts.layers_only or "tuning" not in wanted:
        dense_rate = conv_rate = vs_tvm = NAN
    else:
        trials = 8 if quick else 32
        dense_rate, conv_rate = bench_tuner(DENSE_256_JOB, trials), bench_tuner(CONV_JOB, trials)
        tvm_rates = bench_tvm_tuning(trials)
        vs_tvm = geomean([dense_rate / tvm_rates["dense"], conv_rate / tvm_rates["conv"]]) if tvm_rates else NAN
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    name = {shape: "dense" + ("x".join(map(str, shape)) if len(set(shape)) > 1 else str(shape[0]))
            for shape in DENSE_SHAPES}
    classes = {"dense_m1": geomean([r.get("torch", NAN) for r in m1]),
               "dense_small_m": geomean([r.get("torch", NAN) for r in small_m]),
               "conv3x3": geomean(kernel_ratios), "conv1x1": geomean(conv1x1[0]),
               "depthwise": geomean(depthwise[0]), "bmm": geomean(bmm)}
    print("layer classes vs PyTorch (geomean per class): "
          + ", ".join(f"{key} {value:.2f}" for key, value in classes.items()))
    print(" ".join(f"{name[shape]}_vs_numpy={ratio['numpy']:.2f}" for shape, ratio in dense.items())
          + f" dense_m1_vs_numpy_min={min(r['numpy'] for r in m1):.2f}"
          f" dense_m1_vs_numpy_geomean={geomean([r['numpy'] for r in m1]):.2f}"
          f" dense_small_m_vs_numpy_min={min(r['numpy'] for r in small_m):.2f}"
          f" dense_m1_vs_torch_geomean={classes['dense_m1']:.2f}"
          f" dense_small_m_vs_torch_geomean={classes['dense_small_m']:.2f}"
          f" conv1x1_vs_torch_geomean={geomean(conv1x1[0]):.2f} conv1x1_vs_torch_min={min(conv1x1[0]):.2f}"
          f" conv1x1_e2e_vs_torch_geomean={geomean(conv1x1[1]):.2f}"
          f" depthwise_vs_torch_geomean={geomean(depthwise[0]):.2f} depthwise_vs_torch_min={min(depthwise[0]):.2f}"
          f" depthwise_e2e_vs_torch_geomean={geomean(depthwise[1]):.2f}"
          f" bmm_vs_torch_geomean={geomean(bmm):.2f}"
          f" conv3x3_kernel_vs_torch_geomean={geomean(kernel_ratios):.2f}"
          f" conv3x3_kernel_vs_torch_min={min(kernel_ratios):.2f}"
          f" conv3x3_e2e_vs_torch_geomean={geomean(e2e_ratios):.2f}"
          f" layers_vs_torch_geomean={geomean(list(classes.values())):.2f}"
          f" dense1024_peak_fraction={dense[(1024, 1024, 1024)]['gflops'] * 1e9 / peak.flops:.2f}"
          f" numpy1024_peak_fraction={dense[(1024, 1024, 1024)]['numpy_gflops'] * 1e9 / peak.flops:.2f}"
          f" dense1024_core_peak_fraction={core['lorien']:.2f} numpy1024_core_peak_fraction={core['numpy']:.2f}"
          f" clock_ghz={peak.clock_hz / 1e9:.2f} fma_flop_per_cycle={peak.core_flop_per_cycle:.1f}"
          f" fma_lanes={peak.lanes}"
          f" trials_per_s_dense={dense_rate:.2f} trials_per_s_conv={conv_rate:.2f}"
          f" trials_per_s_vs_tvm={vs_tvm:.1f}"
          f" launch_warm_us={launch_warm:.2f} launch_warm_vs_omp={omp_warm / max(launch_warm, 1e-3):.2f}"
          f" launch_warm_wide_us={wide_warm:.2f} launch_warm_wide_vs_omp={omp_wide_warm / max(wide_warm, 1e-3):.2f}"
          f" launch_cold_us={launch_cold:.2f} launch_cold_vs_omp={omp_cold / max(launch_cold, 1e-3):.2f}"
          f" launch_us_c={launch_c:.2f} dense512_vs_numpy_c={dense512_c:.2f}")


if __name__ == "__main__":
    main()
