"""A/B of the guided auto_scheduler search's refinement (``guide_refine``), interleaved.

Each held-out layer of ``benchmarks/costmodel.py``'s ``--quick`` set is tuned twice per seed with
the xgb tuner guided by the same pre-trained program model: without refinement
(``tuner_options: {guide_refine: 0}``, the guide picks among random programs and the knob
model's candidates, as before 2026-11-28) and with it (64, the dialect's default now). The two
runs of a pair alternate in order from seed to seed, so neither always runs first. Then both
runs' candidate best configs are re-timed together (``retime_candidates`` / ``retime_configs``
of costmodel.py: 15 rotated rounds, a config's fastest run) and per pair it prints the
re-timed best of each run after 8, 16, 32 and all trials, and the trials each needed to reach
95 % of the best either found. The last line holds geomeans over the pairs: ``refine_trials_ratio``
(trials without / with refinement, to 95 % of the best of both; > 1: refinement got there in
fewer) and ``best_ratio_<n>`` (re-timed best without / with after n trials; > 1: refinement's
best was faster). The model is trained as the pre-trained section trains it, from a kept
training store (``--train-store``; its records are measured first where it lacks them).

    PYTHONPATH=. python benchmarks/guide_refine_ab.py --train-store /tmp/train --seeds 2
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKPOINTS = (8, 16, 32)


def _costmodel_benchmark():
    """benchmarks/costmodel.py as a module, loaded the way retime_spread.py loads it."""
    spec = importlib.util.spec_from_file_location("bench_retime_spread", HERE / "retime_spread.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._costmodel_benchmark()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-store", type=Path, required=True,
                        help="the pre-trained model's training store (costmodel.py --pretrained-train-store)")
    parser.add_argument("--trials", type=int, default=64, help="trials of each run")
    parser.add_argument("--seeds", type=int, default=2, help="pairs of runs per layer, seeds 0 .. N-1")
    parser.add_argument("--refine", type=int, default=64, help="guide_refine of the refining run")
    parser.add_argument("--workdir", type=Path, default=None, help="where the model is written (default: a temp dir)")
    args = parser.parse_args(argv)

    bench = _costmodel_benchmark()
    from lorien.tune.loop import tune_job

    work = args.workdir or Path(tempfile.mkdtemp(prefix="lorien-refine-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    model, _ = bench.train_program_model(work, bench.PRETRAINED_SPREAD, trials=16, budget_s=600.0,
                                         store_path=args.train_store, tuned_trials=bench.TRAIN_TUNED_TRIALS)
    layers = [layer for layer in bench.network_layers() if layer[0] in bench.PRETRAINED_QUICK.values()]
    trial_ratios, best_ratios = [], {n: [] for n in (*CHECKPOINTS, args.trials)}
    for name, op, params in layers:
        for seed in range(args.seeds):
            variants = (0, args.refine) if seed % 2 == 0 else (args.refine, 0)
            runs: dict[int, list] = {}
            for refine in variants:
                job = bench._job("auto_scheduler", op, params, "xgb", args.trials, seed=seed, cost_model=model)
                job["tuner_options"] = {"guide_refine": refine}
                records: list = []
                start = time.perf_counter()
                tune_job(job, None, on_batch=lambda state, batch, records=records: records.extend(batch))
                runs[refine] = records
                bench.log(f"  {name} seed {seed} guide_refine {refine}: {len(records)} trials in "
                          f"{time.perf_counter() - start:.0f}s (load {os.getloadavg()[0]:.1f})")
            curves, _ = bench.retimed_curves("auto_scheduler", runs)
            plain, refined = curves[0], curves[args.refine]
            target = min(plain[-1], refined[-1]) / 0.95
            counts = {k: bench.trials_to_reach(c, target) or args.trials + 1 for k, c in curves.items()}
            trial_ratios.append(counts[0] / counts[args.refine])
            at = {}
            for n in best_ratios:
                at[n] = plain[min(n, len(plain)) - 1] / refined[min(n, len(refined)) - 1]
                best_ratios[n].append(at[n])
            bench.log(f"{name} seed {seed}: re-timed best (ms) without / with refinement after "
                      + ", ".join(f"{n}: {plain[min(n, len(plain)) - 1] * 1e3:.4f} / "
                                  f"{refined[min(n, len(refined)) - 1] * 1e3:.4f}" for n in best_ratios)
                      + f"; trials to 95 % of the best of both: {counts[0]} / {counts[args.refine]} "
                      f"(load {os.getloadavg()[0]:.1f})")
    geo = bench.geomean
    print(f"refine_trials_ratio={geo(trial_ratios):.3f} "
          + " ".join(f"best_ratio_{n}={geo(v):.3f}" for n, v in best_ratios.items())
          + f" pairs={len(trial_ratios)}", flush=True)
    if not all(math.isfinite(r) for r in trial_ratios):
        raise SystemExit("guide_refine_ab: a run measured nothing valid")


if __name__ == "__main__":
    main()
