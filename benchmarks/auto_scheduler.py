"""Template-free tuning of a network: the auto_scheduler dialect vs the autotvm dialect on
ResNet-18's tasks under the same total trial budget, gradient vs round-robin task
scheduling, and replay of TVM's Ansor logs (../shared/data/ansor).

Each system tunes the same twelve layers (eleven conv2d, one dense with bias), batch 1:

* auto_scheduler, NHWC convolutions (the layout TVM's auto-scheduler uses on CPUs), the
  task scheduler spending the budget with the ``gradient`` strategy, and again with
  ``round-robin``; XGBoost + evolutionary search, rounds of 16 trials;
* autotvm, TopHub's x86 templates (``conv2d_NCHWc.x86`` with its packed layouts,
  ``dense_nopack.x86``), the XGBoost tuner with transfer learning from the tasks tuned before
  (as AutoTVM's tutorials tune networks), the budget split evenly over the tasks (AutoTVM has
  no task scheduler). The auto_scheduler's model likewise learns from the other layers.

Kernels take their layout's tensors (layout transforms are outside the kernels for both:
autotvm's packed NCHWc weights, the auto_scheduler's weights packed by its layout rewrite, as
TVM does for a network's constant weights). Every measurement uses the same options and
64-byte aligned arrays. The estimated network latency is the sum over
tasks of weight (occurrences) x best latency; the best kernel of every task of every system is
built again and timed at the end, the systems taking turns (fastest of interleaved runs; the
2 cores are shared with other work). Ratios: ``ansor_vs_autotvm_net`` = autotvm latency /
auto_scheduler (gradient) latency, ``gradient_vs_roundrobin`` = round-robin latency /
gradient latency: above 1 means the first wins. ``replay_ok`` = records of the shared logs
whose steps replay into a kernel matching NumPy / records whose workload is registered
(DAG-hashed workloads of the resnet-50 log are reported, never guessed).

    python benchmarks/auto_scheduler.py            # 3 runs of 12 x 48 = 576 trials per system (about 20 min on 2 cores)
    python benchmarks/auto_scheduler.py --runs 1   # one run (about 6.5 min)
    python benchmarks/auto_scheduler.py --quick    # 4 layers, 4 x 16 = 64 trials, one run (about 1 min; a smoke run, too few trials for the goals)
    python benchmarks/auto_scheduler.py --store-dir runs/a                  # keep the stores (runs/a/run<i>/...)
    python benchmarks/auto_scheduler.py --store-dir runs/a --retime-only    # time them again, no tuning

Single runs on a shared 2-core machine move the ratios by a few per cent (the same kernel timed
0.58 ms while tuning and 0.72 ms minutes later), so the full benchmark tunes and times
everything three times (seeds 0, 1000, 2000) and its last line gives the median ratios; each
run's ratios are printed before it.

Last line: ansor_vs_autotvm_net= gradient_vs_roundrobin= replay_ok=
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

from lorien.dialect import get_dialect
from lorien.engine.arrays import argument_arrays
from lorien.target import host_target
from lorien.tune.config import parse_tune_config
from lorien.warehouse import open_store

SHARED = Path(os.environ.get("LORIEN_SHARED_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data")) / "ansor"
# ResNet-18, batch 1: (name, weight, conv2d params) and the dense layer.
LAYERS = [
    ("conv1", 1, {"C": 3, "H": 224, "W": 224, "K": 64, "kernel": 7, "stride": 2, "padding": 3}),
    ("layer1.conv", 4, {"C": 64, "H": 56, "W": 56, "K": 64, "kernel": 3, "stride": 1, "padding": 1}),
    ("layer2.conv1", 1, {"C": 64, "H": 56, "W": 56, "K": 128, "kernel": 3, "stride": 2, "padding": 1}),
    ("layer2.down", 1, {"C": 64, "H": 56, "W": 56, "K": 128, "kernel": 1, "stride": 2, "padding": 0}),
    ("layer2.conv", 3, {"C": 128, "H": 28, "W": 28, "K": 128, "kernel": 3, "stride": 1, "padding": 1}),
    ("layer3.conv1", 1, {"C": 128, "H": 28, "W": 28, "K": 256, "kernel": 3, "stride": 2, "padding": 1}),
    ("layer3.down", 1, {"C": 128, "H": 28, "W": 28, "K": 256, "kernel": 1, "stride": 2, "padding": 0}),
    ("layer3.conv", 3, {"C": 256, "H": 14, "W": 14, "K": 256, "kernel": 3, "stride": 1, "padding": 1}),
    ("layer4.conv1", 1, {"C": 256, "H": 14, "W": 14, "K": 512, "kernel": 3, "stride": 2, "padding": 1}),
    ("layer4.down", 1, {"C": 256, "H": 14, "W": 14, "K": 512, "kernel": 1, "stride": 2, "padding": 0}),
    ("layer4.conv", 3, {"C": 512, "H": 7, "W": 7, "K": 512, "kernel": 3, "stride": 1, "padding": 1}),
    ("fc", 1, None),
]
QUICK_LAYERS = ("layer2.down", "layer3.conv", "layer4.conv", "fc")
MEASURE = {"number": 1, "repeat": 3, "min_repeat_ms": 10, "build_timeout_s": 60, "run_timeout_s": 20}


def log(message: str) -> None:
    print(message, flush=True)


def workloads(dialect: str, layers: list) -> list[dict]:
    entries = []
    for name, weight, conv in layers:
        if conv is None:
            op = {"dense": {"M": 1, "N": 1000, "K": 512, "bias": True}}
        else:
            op = {"conv2d": dict(conv, **({"layout": "NHWC"} if dialect == "auto_scheduler" else {"layout": "NCHWc"}))}
        entries.append({"name": name, "weight": weight, **op})
    return entries


def tune_auto_scheduler(layers: list, budget: int, strategy: str, store_uri: str, target: str, seed: int = 0) -> float:
    from lorien.tune.network import tune_network

    config = parse_tune_config({"dialect": "auto_scheduler", "tuner": "xgb", "batch_size": 16, "target": target,
                                "seed": seed,
                                "measure": MEASURE, "workloads": workloads("auto_scheduler", layers),
                                "task_scheduler": {"strategy": strategy, "trials": budget, "round_trials": 16}})
    started = time.monotonic()
    summary = tune_network(config, config.task_scheduler, store_uri, log_dir=None, progress=False)
    log(f"auto_scheduler ({strategy}): {summary.trials} trials in {time.monotonic() - started:.0f} s, "
        f"estimated latency {summary.latency_s * 1e3:.3f} ms while tuning; trials per task "
        f"{[t.trials for t in summary.tasks]}")
    return summary.latency_s


def tune_autotvm(layers: list, budget: int, store_uri: str, target: str, seed: int = 0) -> float:
    from lorien.tune.local import tune_config

    per_task = budget // len(layers)
    config = parse_tune_config({"dialect": "autotvm", "tuner": "xgb", "transfer": True, "batch_size": 8,
                                "trials": per_task, "target": target, "measure": MEASURE, "seed": seed,
                                "workloads": workloads("autotvm", layers)})
    started = time.monotonic()
    summaries = tune_config(config, progress=False, store_uri=store_uri)
    latency = sum(weight * (s.best_cost_s or math.inf) for (_, weight, _), s in zip(layers, summaries, strict=True))
    log(f"autotvm (even split): {sum(s.trials for s in summaries)} trials in {time.monotonic() - started:.0f} s, "
        f"estimated latency {latency * 1e3:.3f} ms while tuning")
    return latency


def best_kernels(dialect_name: str, layers: list, store_uri: str, target: str) -> list:
    """The kernel of the best stored record of every task (None where a task has none)."""
    dialect = get_dialect(dialect_name)
    kernels = []
    with open_store(store_uri) as store:
        for entry in workloads(dialect_name, layers):
            name = entry.pop("name")
            entry.pop("weight")
            (op, params), = entry.items()
            task_name, args = dialect.expand_workload(op, params)
            best = store.best(dialect.workload_key(task_name, args), target, k=1)
            if not best:
                log(f"  {dialect_name} {name}: no valid record")
                kernels.append(None)
                continue
            kernel = dialect.compile_record(best[0])
            kernels.append((kernel, argument_arrays(kernel.args, 0)))  # 64-byte aligned, as while tuning
    return kernels


def interleaved_latencies(systems: dict[str, list], layers: list, seconds_per_task: float) -> dict[str, float]:
    """Network latency of each system: per task, the systems' kernels take turns and each
    keeps its fastest run."""
    totals = dict.fromkeys(systems, 0.0)
    for index, (name, weight, _) in enumerate(layers):
        fastest = dict.fromkeys(systems, math.inf)
        end = time.perf_counter() + seconds_per_task
        while time.perf_counter() < end:
            for system, kernels in systems.items():
                if kernels[index] is not None:
                    kernel, arrays = kernels[index]
                    time.sleep(0.01)
                    fastest[system] = min(fastest[system], *kernel.time(*arrays, number=1, repeat=3))
        log(f"  {name:<13} x{weight}: " + "  ".join(f"{system} {fastest[system] * 1e3:8.4f} ms" for system in systems))
        for system in systems:
            totals[system] += weight * fastest[system]
    return totals


def replay_shared_logs() -> tuple[int, int]:
    from dialects.auto_scheduler.compile import replay_log

    logging.getLogger("lorien.workload").setLevel(logging.ERROR)  # unregistered hashes are summed up below
    ok = registered = 0
    if not SHARED.is_dir():
        log(f"  no shared Ansor logs at {SHARED} (set LORIEN_SHARED_DATA)")
    for path in sorted(SHARED.glob("*.json")):
        outcomes = replay_log(path)
        for outcome in outcomes:
            if outcome.status != "unregistered":
                registered += 1
                ok += outcome.status == "ok"
                log("  " + outcome.summary())
        unregistered = [o for o in outcomes if o.status == "unregistered"]
        if unregistered:
            hashes = sorted({o.workload_key.split('"')[1] for o in unregistered})
            log(f"  {path.name}: {len(unregistered)} records of {len(hashes)} DAG-hashed workloads nobody "
                f"registered, not replayed (e.g. {hashes[0]})")
    return ok, registered


def one_run(layers: list, budget: int, root: str, target: str, tune: bool, seed: int, quick: bool) -> tuple[float, float]:
    """Tune (unless ``tune`` is false) and time the three systems' stores under ``root``:
    (ansor_vs_autotvm, gradient_vs_roundrobin)."""
    stores = {name: f"parquet:{root}/{name}" for name in ("gradient", "round-robin", "autotvm")}
    if tune:
        tune_auto_scheduler(layers, budget, "gradient", stores["gradient"], target, seed)
        tune_auto_scheduler(layers, budget, "round-robin", stores["round-robin"], target, seed)
        tune_autotvm(layers, budget, stores["autotvm"], target, seed)
    log("best kernels timed again, taking turns:")
    systems = {name: best_kernels("autotvm" if name == "autotvm" else "auto_scheduler", layers, uri, target)
               for name, uri in stores.items()}
    latency = interleaved_latencies(systems, layers, seconds_per_task=1.0 if quick else 3.0)
    for system, value in latency.items():
        log(f"network latency, {system}: {value * 1e3:.3f} ms")
    return latency["autotvm"] / latency["gradient"], latency["round-robin"] / latency["gradient"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 layers, 16 trials per layer")
    parser.add_argument("--trials-per-task", type=int, help="budget per task (default 48, quick 16)")
    parser.add_argument("--runs", type=int,
                        help="tune and time everything this many times (seeds 0, 1000, ...); the last line gives "
                             "the median ratios (default 3, quick 1)")
    parser.add_argument("--store-dir", help="keep the three systems' stores here (default: a temporary directory; "
                        "with --runs, one folder run<i> per run); with --retime-only, time the best kernels of "
                        "stores written before")
    parser.add_argument("--retime-only", action="store_true", help="skip tuning: time the stores of --store-dir again")
    args = parser.parse_args()
    layers = [layer for layer in LAYERS if not args.quick or layer[0] in QUICK_LAYERS]
    budget = len(layers) * (args.trials_per_task or (16 if args.quick else 48))
    target = host_target().canonical
    log(f"{len(layers)} tasks, budget {budget} trials per system, target {target}")

    if args.retime_only and not args.store_dir:
        parser.error("--retime-only needs --store-dir")
    args.runs = args.runs or (1 if args.quick else 3)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    log("replaying the shared Ansor logs:")
    replay_ok, replay_total = replay_shared_logs()

    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            root = args.store_dir or tmp
            if args.runs > 1:
                root = f"{root}/run{run}"
                log(f"run {run + 1} of {args.runs} (seed {1000 * run}):")
            ratios.append(one_run(layers, budget, root, target, not args.retime_only, 1000 * run, args.quick))
            if args.runs > 1:
                log(f"run {run + 1}: ansor_vs_autotvm_net={ratios[-1][0]:.3f} "
                    f"gradient_vs_roundrobin={ratios[-1][1]:.3f}")
    ansor_vs_autotvm, gradient_vs_roundrobin = (float(np.median([r[i] for r in ratios])) for i in range(2))
    if args.runs > 1:
        log(f"medians of {args.runs} runs:")
    print(f"ansor_vs_autotvm_net={ansor_vs_autotvm:.3f} gradient_vs_roundrobin={gradient_vs_roundrobin:.3f} "
          f"replay_ok={replay_ok}/{replay_total}")


if __name__ == "__main__":
    main()
