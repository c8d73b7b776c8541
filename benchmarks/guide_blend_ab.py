"""A/B of the pre-trained guide's blend, interleaved: the count-based blend of before 2026-11-28
against the skill-weighted blend with the unguided plan's share (the library's now).

Each held-out layer of ``benchmarks/costmodel.py``'s ``--quick`` set (or ``--layers``) is tuned
twice per seed in one dialect with the xgb tuner guided by the same pre-trained program model:
``count``, the run's own model weighing ``n / (n + 16)`` after ``n`` measurements whatever it
has shown, the pre-trained model the rest, the guide always ranking, ``unguided_share`` 0
(restored here by replacing :meth:`ProgramModel.weights` for the run); and ``skill``, the
library as it is. The two runs of a pair alternate in order from seed to seed. Both runs'
candidate best configs are re-timed together (``retime_candidates`` / ``retime_configs`` of
costmodel.py: 15 rotated rounds, a config's fastest run); per pair it prints the re-timed best
of each after 16, 32 and all trials and the trials each needed to reach 95 % of the best
either found. The last line holds geomeans over the pairs: ``blend_trials_ratio`` (trials
count / skill; > 1: the skill-weighted guide got there in fewer) and ``best_ratio_<n>``
(re-timed best count / skill after n trials; > 1: the skill-weighted run's best was faster).

    PYTHONPATH=. python benchmarks/guide_blend_ab.py --train-store /tmp/train --seeds 4
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
CHECKPOINTS = (16, 32)
#: The count-based blend's constant: measurements at which the run's own model weighed half.
COUNT_PRIOR_WEIGHT = 16


def _costmodel_benchmark():
    """benchmarks/costmodel.py as a module, loaded the way retime_spread.py loads it."""
    spec = importlib.util.spec_from_file_location("bench_retime_spread", HERE / "retime_spread.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._costmodel_benchmark()


def count_weights(model) -> tuple[float, float]:
    """The blend weights of before 2026-11-28: (pre-trained, own) = (16 / (n + 16), n / (n + 16))."""
    if model.local is None:
        return 1.0, 0.0
    own = model.measured / (model.measured + COUNT_PRIOR_WEIGHT)
    return 1.0 - own, own


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-store", type=Path, required=True,
                        help="the pre-trained model's training store (costmodel.py --pretrained-train-store)")
    parser.add_argument("--dialect", default="meta_schedule", help="the dialect whose layers are tuned")
    parser.add_argument("--layers", default=None,
                        help="comma-separated layer names (default: the three --quick layers)")
    parser.add_argument("--trials", type=int, default=64, help="trials of each run")
    parser.add_argument("--seeds", type=int, default=4, help="pairs of runs per layer, seeds S .. S+N-1")
    parser.add_argument("--first-seed", type=int, default=0, help="S, the first seed")
    parser.add_argument("--workdir", type=Path, default=None, help="where the model is written (default: a temp dir)")
    args = parser.parse_args(argv)

    bench = _costmodel_benchmark()
    from lorien.costmodel.pretrained import ProgramModel
    from lorien.tune.loop import tune_job

    work = args.workdir or Path(tempfile.mkdtemp(prefix="lorien-blend-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    model, _ = bench.train_program_model(work, bench.PRETRAINED_SPREAD, trials=16, budget_s=600.0,
                                         store_path=args.train_store, tuned_trials=bench.TRAIN_TUNED_TRIALS)
    names = args.layers.split(",") if args.layers else list(bench.PRETRAINED_QUICK.values())
    layers = [layer for layer in bench.network_layers() if layer[0] in names]
    skill_weights = ProgramModel.weights
    trial_ratios, best_ratios = [], {n: [] for n in (*CHECKPOINTS, args.trials)}
    for name, op, params in layers:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            variants = ("count", "skill") if seed % 2 == 0 else ("skill", "count")
            runs: dict[str, list] = {}
            for variant in variants:
                job = bench._job(args.dialect, op, params, "xgb", args.trials, seed=seed, cost_model=model)
                if variant == "count":
                    job["tuner_options"] = {"unguided_share": 0.0}
                ProgramModel.weights = count_weights if variant == "count" else skill_weights
                records: list = []
                start = time.perf_counter()
                try:
                    tune_job(job, None, on_batch=lambda state, batch, records=records: records.extend(batch))
                finally:
                    ProgramModel.weights = skill_weights
                runs[variant] = records
                bench.log(f"  {name} seed {seed} {variant}: {len(records)} trials in "
                          f"{time.perf_counter() - start:.0f}s (load {os.getloadavg()[0]:.1f})")
            curves, _ = bench.retimed_curves(args.dialect, runs)
            count, skill = curves["count"], curves["skill"]
            target = min(count[-1], skill[-1]) / 0.95
            counts = {k: bench.trials_to_reach(c, target) or args.trials + 1 for k, c in curves.items()}
            trial_ratios.append(counts["count"] / counts["skill"])
            for n in best_ratios:
                best_ratios[n].append(count[min(n, len(count)) - 1] / skill[min(n, len(skill)) - 1])
            bench.log(f"{name} seed {seed}: re-timed best (ms) count / skill after "
                      + ", ".join(f"{n}: {count[min(n, len(count)) - 1] * 1e3:.4f} / "
                                  f"{skill[min(n, len(skill)) - 1] * 1e3:.4f}" for n in best_ratios)
                      + f"; trials to 95 % of the best of both: {counts['count']} / {counts['skill']} "
                      f"(load {os.getloadavg()[0]:.1f})")
    geo = bench.geomean
    print(f"blend_trials_ratio={geo(trial_ratios):.3f} "
          + " ".join(f"best_ratio_{n}={geo(v):.3f}" for n, v in best_ratios.items())
          + f" pairs={len(trial_ratios)}", flush=True)
    if not all(math.isfinite(r) for r in trial_ratios):
        raise SystemExit("guide_blend_ab: a run measured nothing valid")


if __name__ == "__main__":
    main()
