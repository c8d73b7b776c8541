"""The meta_schedule dialect against real TVM MetaSchedule, and replay of TVM's traces.

Workloads (float32, batch 1): matmul ``C[256, 512] = A[256, 64] @ B[64, 512]``, matmul 512^3,
and an NHWC 3x3 convolution 28x28, 128 -> 128 channels, padding 1 (padding is its own block,
as TVM's topi/te definitions have it). Each is written once in Lorien's compute DSL and once
in TVM's TE, with the same blocks, loops and layouts.

* Lorien: the meta_schedule dialect tunes each workload with the same trial budget
  (XGBoost + evolutionary search over its design space, batches of 16, every candidate
  built by Lorien's engine, checked against NumPy and measured in isolated workers).
* TVM 0.27 MetaSchedule (when apache-tvm is installed): ``ms.tune_tir`` with the same budget,
  16 trials per iteration, its LocalBuilder (timeout 120 s) and LocalRunner measuring as
  Lorien does (number 1, repeat 3, min_repeat_ms 10), then ``compile_tir`` builds its best
  schedule.

Both systems' best kernels are timed again at the end, taking turns on the same input
arrays (fastest of interleaved runs; the 2 cores are shared with other work).
``ms_kernel_vs_tvm`` = TVM latency / Lorien latency on the workload where Lorien does worst
(above 1: Lorien's kernel is faster on every workload); ``ms_trials_per_s_vs_tvm`` = Lorien's
trials per second of tuning wall time / TVM's over all workloads; ``replay_ok`` = records of
the shared JSONDatabases (../shared/data/meta_schedule) whose traces replay into a kernel
matching NumPy / records.

    python benchmarks/meta_schedule.py            # 3 workloads x 32 trials per system (about 10 min here with TVM)
    python benchmarks/meta_schedule.py --quick    # the small matmul, 16 trials
    python benchmarks/meta_schedule.py --lorien-only   # Lorien's side only (no TVM tuning): its trials/s and
                                                       # kernels, for checking a change; the ratios print as skipped

Last line: ms_kernel_vs_tvm= ms_trials_per_s_vs_tvm= replay_ok=
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from lorien.engine.arrays import aligned_zeros, random_array

SHARED = Path(os.environ.get("LORIEN_SHARED_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data")) \
    / "meta_schedule"
WORKLOADS = {
    "matmul_256x64x512": ("matmul", 256, 64, 512),
    "matmul_512": ("matmul", 512, 512, 512),
    "conv2d_nhwc_28x28x128": ("conv", 28, 128, 128),
}
MEASURE = {"number": 1, "repeat": 3, "min_repeat_ms": 10, "build_timeout_s": 60, "run_timeout_s": 20}


def log(message: str) -> None:
    print(message, flush=True)


def lorien_dag(spec: tuple):
    """The workload in Lorien's compute DSL, blocks named as in TVM's definition."""
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    if spec[0] == "matmul":
        _, m, k, n = spec
        a, b = te.placeholder((m, k), "float32", "A"), te.placeholder((k, n), "float32", "B")
        r = te.reduce_axis(k, "k")
        c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
        return ComputeDAG([a, b, c])
    _, size, cin, cout = spec
    x, w = te.placeholder((1, size, size, cin), "float32", "X"), te.placeholder((3, 3, cin, cout), "float32", "W")
    pad = te.compute((1, size + 2, size + 2, cin), lambda n, h, w_, c: te.if_then_else(
        te.all(h >= 1, h < size + 1, w_ >= 1, w_ < size + 1), x[n, h - 1, w_ - 1, c], 0.0), name="pad")
    rh, rw, rc = te.reduce_axis(3, "rh"), te.reduce_axis(3, "rw"), te.reduce_axis(cin, "rc")
    conv = te.compute((1, size, size, cout), lambda n, h, w_, f: te.sum(
        pad[n, h + rh, w_ + rw, rc] * w[rh, rw, rc, f], axis=[rh, rw, rc]), name="conv")
    return ComputeDAG([x, w, conv])


def tvm_module(spec: tuple):
    """The same workload in TVM's TE, as an IRModule."""
    import tvm
    from tvm import te

    if spec[0] == "matmul":
        _, m, k, n = spec
        a, b = te.placeholder((m, k), "float32", "A"), te.placeholder((k, n), "float32", "B")
        r = te.reduce_axis((0, k), "k")
        c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
        tensors = [a, b, c]
    else:
        _, size, cin, cout = spec
        x, w = te.placeholder((1, size, size, cin), "float32", "X"), te.placeholder((3, 3, cin, cout), "float32", "W")
        pad = te.compute((1, size + 2, size + 2, cin), lambda n, h, w_, c: tvm.tirx.if_then_else(
            tvm.tirx.all(h >= 1, h < size + 1, w_ >= 1, w_ < size + 1), x[n, h - 1, w_ - 1, c], 0.0), name="pad")
        rh, rw, rc = te.reduce_axis((0, 3), "rh"), te.reduce_axis((0, 3), "rw"), te.reduce_axis((0, cin), "rc")
        conv = te.compute((1, size, size, cout), lambda n, h, w_, f: te.sum(
            pad[n, h + rh, w_ + rw, rc] * w[rh, rw, rc, f], axis=[rh, rw, rc]), name="conv")
        tensors = [x, w, conv]
    return tvm.IRModule({"main": te.create_prim_func(tensors)})


def tune_lorien(dag, trials: int, store_uri: str, target: str):
    """(kernel of the best record, trials, seconds) of Lorien's meta_schedule tuning."""
    from dialects.meta_schedule.compile import compile_record
    from dialects.meta_schedule.tuning import tune_dag
    from lorien.warehouse import open_store

    job = {"trials": trials, "batch_size": 16, "measure": MEASURE, "target": target, "seed": 0}
    started = time.monotonic()
    progress = tune_dag(dag, job, store_uri)
    seconds = time.monotonic() - started
    with open_store(store_uri) as store:
        best = store.best(progress.records[0].workload_key, target, k=1)
    return compile_record(best[0]), progress.trials, seconds


def tune_tvm(mod, trials: int, work_dir: str, target_dict: dict):
    """(callable best kernel, trials, seconds) of TVM MetaSchedule."""
    import tvm
    import tvm.s_tir.meta_schedule as ms

    target = tvm.target.Target(target_dict)
    started = time.monotonic()
    evaluator = ms.runner.EvaluatorConfig(number=MEASURE["number"], repeat=MEASURE["repeat"],
                                          min_repeat_ms=MEASURE["min_repeat_ms"])
    database = ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=16,
                           builder=ms.builder.LocalBuilder(timeout_sec=120),
                           runner=ms.runner.LocalRunner(evaluator_config=evaluator), num_tuning_cores=1, seed=0)
    seconds = time.monotonic() - started
    schedule = ms.tir_integration.compile_tir(database, mod, target)
    return tvm.compile(schedule.mod, target=target).jit(), len(database), seconds


def timed_against(name: str, kernel, tvm_kernel, dag, seconds: float) -> tuple[float, float]:
    """Fastest run of each kernel on the same inputs (64-byte aligned for both, as TVM's
    tensors are), taking turns; checks both outputs."""
    rng = np.random.default_rng(0)
    inputs = [random_array(t.shape, t.dtype, rng) for t in dag.io_tensors if t not in dag.outputs]
    expected = dag.evaluate(*inputs)[0]
    out = aligned_zeros(dag.outputs[0].shape, "float32")
    kernel(*inputs, out)
    if not np.allclose(out, expected, rtol=1e-3, atol=1e-3):
        raise SystemExit(f"{name}: Lorien's kernel differs from NumPy")
    lorien_s = tvm_s = math.inf
    tvm_args = None
    if tvm_kernel is not None:
        import tvm

        tvm_args = [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.tensor(np.zeros_like(out))]
        tvm_kernel(*tvm_args)
        if not np.allclose(tvm_args[-1].numpy(), expected, rtol=1e-3, atol=1e-3):
            raise SystemExit(f"{name}: TVM's kernel differs from NumPy")
        evaluator = tvm_kernel.time_evaluator(tvm_kernel.entry_name, tvm.cpu(), number=1, repeat=3)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        time.sleep(0.01)
        lorien_s = min(lorien_s, *kernel.time(*inputs, out, number=1, repeat=3))
        if tvm_kernel is not None:
            time.sleep(0.01)
            tvm_s = min(tvm_s, *evaluator(*tvm_args).results)
    return lorien_s, tvm_s


def replay_shared() -> tuple[int, int]:
    from dialects.meta_schedule.compile import replay_database

    ok = total = 0
    if not SHARED.is_dir():
        log(f"  no shared MetaSchedule databases at {SHARED} (set LORIEN_SHARED_DATA)")
    for database in sorted(p for p in SHARED.iterdir() if p.is_dir()) if SHARED.is_dir() else []:
        outcomes = replay_database(database)
        ok += sum(o.status == "ok" for o in outcomes)
        total += len(outcomes)
        log(f"  {database.name}: {sum(o.status == 'ok' for o in outcomes)}/{len(outcomes)} traces replayed, "
            f"outputs match NumPy")
        for outcome in outcomes:
            if outcome.status != "ok":
                log("    " + outcome.summary())
    return ok, total


def main() -> None:
    import llvmlite.binding as llvm

    from lorien.target import host_target

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small matmul only, 16 trials")
    parser.add_argument("--trials", type=int, help="trials per workload and system (default 32, quick 16)")
    parser.add_argument("--lorien-only", action="store_true",
                        help="tune with Lorien only (TVM's part skipped; the ratios print as skipped)")
    args = parser.parse_args()
    logging.getLogger("lorien").setLevel(logging.WARNING)
    names = ["matmul_256x64x512"] if args.quick else list(WORKLOADS)
    trials = args.trials or (16 if args.quick else 32)
    target = host_target().canonical
    cores = os.cpu_count() or 1
    tvm_target = {"kind": "llvm", "mcpu": llvm.get_host_cpu_name(), "num-cores": cores}
    have_tvm = False
    if args.lorien_only:
        log("TVM part skipped: --lorien-only")
    else:
        try:
            import tvm  # noqa: F401
            have_tvm = True
        except ImportError:
            log("TVM part skipped: apache-tvm is not installed (pip install 'lorien[tvm]')")
    log(f"{len(names)} workloads, {trials} trials each per system, Lorien target {target}")

    log("replaying the shared MetaSchedule databases:")
    replay_ok, replay_total = replay_shared()

    ratios, lorien_trials, lorien_seconds, tvm_trials, tvm_seconds = [], 0, 0.0, 0, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            dag = lorien_dag(WORKLOADS[name])
            kernel, count, seconds = tune_lorien(dag, trials, f"parquet:{tmp}/{name}", target)
            lorien_trials, lorien_seconds = lorien_trials + count, lorien_seconds + seconds
            log(f"{name}: Lorien tuned {count} trials in {seconds:.1f} s ({count / seconds:.2f} trials/s)")
            tvm_kernel = None
            if have_tvm:
                tvm_kernel, count, seconds = tune_tvm(tvm_module(WORKLOADS[name]), trials, f"{tmp}/{name}-tvm",
                                                      tvm_target)
                tvm_trials, tvm_seconds = tvm_trials + count, tvm_seconds + seconds
                log(f"{name}: TVM tuned {count} trials in {seconds:.1f} s ({count / seconds:.2f} trials/s)")
            lorien_s, tvm_s = timed_against(name, kernel, tvm_kernel, dag, 1.0 if args.quick else 3.0)
            flop = dag.flop()
            line = f"{name}: Lorien {lorien_s * 1e3:.4f} ms ({flop / lorien_s / 1e9:.1f} GFLOPS)"
            if have_tvm:
                ratios.append(tvm_s / lorien_s)
                line += f", TVM {tvm_s * 1e3:.4f} ms ({flop / tvm_s / 1e9:.1f} GFLOPS), TVM/Lorien {ratios[-1]:.2f}x"
            log(line)
    replay = f"replay_ok={replay_ok}/{replay_total}"
    if not have_tvm:
        log(f"Lorien: {lorien_trials} trials in {lorien_seconds:.1f} s ({lorien_trials / lorien_seconds:.2f} trials/s)")
        log(f"ms_kernel_vs_tvm=skipped ms_trials_per_s_vs_tvm=skipped {replay}")
        return
    trials_ratio = (lorien_trials / lorien_seconds) / (tvm_trials / tvm_seconds)
    log(f"ms_kernel_vs_tvm={min(ratios):.2f} ms_trials_per_s_vs_tvm={trials_ratio:.1f} {replay}")


if __name__ == "__main__":
    main()
