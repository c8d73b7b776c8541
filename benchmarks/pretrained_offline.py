"""Offline scores of a pre-trained program model on fixed, measured candidate sets (issue 22).

The tuning benchmark (``benchmarks/costmodel.py``'s pre-trained section) counts trials of live
runs, which the machine's load moves. This one measures once, then scores any model on the same
numbers: for each held-out layer of the ``--quick`` set and each dialect, ``--points`` random
points of the layer's space are measured with the random tuner (seed ``--seed``; 5 repeats each,
none cut short, a point's latency its fastest repeat) into ``--set-store`` (a parquet store,
kept: a later run finds its records there and measures nothing). Then the model (``--model DIR``,
or the one the pre-trained section trains from ``--train-store``) scores every set, as the
tuning guide scores a pool (:class:`lorien.costmodel.pretrained.ProgramModel`, untouched by any
online update), and per set it prints, beside the mean of 500 random orders (chance):

- ``ndcg8``: NDCG@8 of the model's order, gain = throughput / the set's best;
- ``top1`` / ``top5`` / ``top8``: the best throughput among the model's first 1 / 5 / 8 picks
  over the set's best;
- ``t95``: trials to 95 % of the set's best if the points were measured in the model's order;
- with ``--pools``: the same first batch (8 picks, spread out as :meth:`ProgramGuide.choose`
  spreads them) from random pools of each size drawn from the set (200 draws; the whole set
  once): mean top-1, best of 8 and trials to 95 % of the set's best within the batch (9: never).

The last line holds means over the sets (``t95`` a geomean), per dialect as well.

    PYTHONPATH=. python benchmarks/pretrained_offline.py --set-store /tmp/offline --train-store /tmp/train
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FIRST_BATCH = 8


@functools.cache
def _costmodel_benchmark():
    """benchmarks/costmodel.py as a module (loaded once)."""
    spec = importlib.util.spec_from_file_location("bench_costmodel_offline", HERE / "costmodel.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def measured_set(bench, store_uri: str, dialect: str, op: str, params: dict, points: int, seed: int) -> list:
    """The layer's random points measured for the set (kept in the store; measured where missing)."""
    from lorien.tune.loop import tune_job
    from lorien.tune.resume import SOURCE_PREFIX, earlier_records, job_source
    from lorien.warehouse import open_store

    job = bench._job(dialect, op, params, "random", points, seed=seed)
    job["measure"] = {"repeat": 5, "stop_slower_repeats": False}
    job_id = job_source(job, dialect).removeprefix(SOURCE_PREFIX)
    with open_store(store_uri) as store:
        earlier = earlier_records(store, job_id, target=job["target"])
        if len(earlier) < points:
            tune_job(job, store, resume=earlier)
            earlier = earlier_records(store, job_id, target=job["target"])
    return earlier


def set_features(dialect: str, records: list) -> tuple[np.ndarray, np.ndarray]:
    """(program feature vectors, throughput: 1 / fastest repeat, 0 for a failed point) of a set's
    distinct configs that lower."""
    from lorien.dialect import get_dialect
    from lorien.errors import LorienError
    from lorien.features.program import schedule_features

    owner = get_dialect(dialect)
    rows, throughput, seen = [], [], set()
    for record in records:
        if record.config in seen:
            continue
        seen.add(record.config)
        try:
            rows.append(schedule_features(*owner.schedule_record(record)))
        except (LorienError, KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
        throughput.append(1.0 / min(record.costs) if record.is_valid else 0.0)
    return np.vstack(rows), np.asarray(throughput)


def order_scores(scores: np.ndarray, throughput: np.ndarray, k: int = FIRST_BATCH) -> dict[str, float]:
    """How measuring in the order of ``scores`` (higher first) goes: NDCG@k, the best of the first
    1 / 5 / k picks over the set's best, and the trials to 95 % of the set's best."""
    from lorien.costmodel.metrics import ndcg_at, topk_score

    gains = throughput / throughput.max()
    order = np.argsort(-scores, kind="stable")
    best_so_far = np.maximum.accumulate(gains[order])
    return {"ndcg8": ndcg_at(scores, gains, k), "top1": float(best_so_far[0]),
            "top5": topk_score(throughput, scores, 5), "top8": topk_score(throughput, scores, k),
            "t95": int(np.argmax(best_so_far >= 0.95)) + 1}


def chance_scores(throughput: np.ndarray, draws: int = 500, seed: int = 0) -> dict[str, float]:
    """The mean of :func:`order_scores` over random orders."""
    rng = np.random.default_rng(seed)
    runs = [order_scores(rng.random(len(throughput)), throughput) for _ in range(draws)]
    return {key: float(np.mean([run[key] for run in runs])) for key in runs[0]}


def pool_scores(guide_order, throughput: np.ndarray, pool: int, draws: int = 200,
                seed: int = 0) -> tuple[float, float, float]:
    """The first batch the guide picks from random pools of ``pool`` points of the set
    (``guide_order(indices, k)`` returns its k picks in order): mean top-1, best of the batch
    (over the set's best) and trials to 95 % of the set's best within it (k + 1: never)."""
    rng = np.random.default_rng(seed)
    gains = throughput / throughput.max()
    first, batch, trials = [], [], []
    for _ in range(draws if pool < len(gains) else 1):
        drawn = rng.choice(len(gains), size=min(pool, len(gains)), replace=False)
        picked = gains[guide_order(drawn, FIRST_BATCH)]
        first.append(picked[0])
        batch.append(picked.max())
        hit = np.flatnonzero(picked >= 0.95)
        trials.append(hit[0] + 1 if len(hit) else FIRST_BATCH + 1)
    return float(np.mean(first)), float(np.mean(batch)), float(np.mean(trials))


class _SetSpace:
    """Points of a measured set as a guide's space: index i is the set's row i."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def get(self, index: int) -> int:
        return index


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set-store", required=True, help="parquet store of the measured sets (kept between runs)")
    parser.add_argument("--train-store", help="the pre-trained section's training store (the model is trained "
                                              "from it as that section trains it)")
    parser.add_argument("--model", help="score this model directory (lorien train -o) instead of training one")
    parser.add_argument("--points", type=int, default=128, help="random points measured per layer and dialect")
    parser.add_argument("--seed", type=int, default=777, help="the random tuner's seed for the sets")
    parser.add_argument("--dialects", default="autotvm,auto_scheduler,meta_schedule",
                        help="comma-separated dialects whose sets are scored")
    parser.add_argument("--pools", default="", help="comma-separated pool sizes of the first-batch study (e.g. "
                                                    "32,64,128); none by default")
    args = parser.parse_args()
    if not args.model and not args.train_store:
        parser.error("give --model or --train-store")
    bench = _costmodel_benchmark()
    from lorien.costmodel.pretrained import ProgramGuide, ProgramModel
    from lorien.target import host_target

    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model
        if not model_path:
            model_path, _ = bench.train_program_model(Path(tmp), bench.PRETRAINED_SPREAD, trials=16,
                                                      store_path=Path(args.train_store),
                                                      tuned_trials=bench.TRAIN_TUNED_TRIALS)
        dialects = [d for d in args.dialects.split(",") if d]
        pools = [int(p) for p in args.pools.split(",") if p]
        layers = [layer for layer in bench.network_layers() if layer[0] in bench.PRETRAINED_QUICK.values()]
        models: dict[str, ProgramModel] = {}  # as trained: nothing updates them here
        results = []
        for dialect in dialects:
            for name, op, params in layers:
                records = measured_set(bench, f"parquet:{args.set_store}", dialect, op, params, args.points, args.seed)
                rows, throughput = set_features(dialect, records)
                # scored with the target features of the threads the set was timed on, as a guide scores
                timed_for = next((r.measured_target for r in records if r.is_valid), None) or host_target().canonical
                model = models.setdefault(timed_for, ProgramModel(model_path, timed_for))
                scores = model.score(rows)
                got, chance = order_scores(scores, throughput), chance_scores(throughput)
                results.append((dialect, got))
                print(f"{dialect:15s} {name:34s} {len(throughput):4d} points: "
                      + " ".join(f"{key}={got[key]:.3f} ({chance[key]:.3f})" for key in got), flush=True)
                if pools:
                    guide = ProgramGuide(model, _SetSpace(rows), None)
                    guide.cache = {i: rows[i] for i in range(len(rows))}

                    def guide_order(indices, k, guide=guide):
                        return guide.choose([int(i) for i in indices], k)

                    print("    first batch from pools: " + " | ".join(
                        "{}: top1 {:.3f} best-of-8 {:.3f} t95 {:.2f}".format(pool, *pool_scores(
                            guide_order, throughput, pool)) for pool in pools), flush=True)
    summary = {}
    for label, chosen in [("", results), *((f"_{d}", [r for r in results if r[0] == d]) for d in dialects)]:
        if not chosen:
            continue
        for key in ("ndcg8", "top1", "top8"):
            summary[f"offline_{key}{label}"] = float(np.mean([got[key] for _, got in chosen]))
        summary[f"offline_t95{label}"] = math.exp(float(np.mean([math.log(got["t95"]) for _, got in chosen])))
    print(" ".join(f"{key}={value:.3f}" for key, value in summary.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
