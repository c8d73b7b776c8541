"""How a pre-trained program-feature model ranks the candidates of a model's relax tasks.

Reads the work directory ``benchmarks/model_tvm.py --keep-work DIR`` kept, and for every task of
every model there scores, with the model as trained (no online update), the candidates two
stores measured: the Lorien row's engine-measured records (``DIR/MODEL/lorien/store``: engine
latencies, what a guided run learns from) and TVM's own tuning records (``DIR/MODEL/adapter_store``:
TVM latencies, what the built model runs). Per task: Kendall's tau of the scores against
throughput (1 / fastest repeat), NDCG@4 (gain = throughput / the task's best) beside the mean
NDCG@4 of 200 random orders (chance), and the throughput of the model's top pick / the best.
Tasks with fewer than 3 distinct valid candidates, or one program for all, are left out.

    python benchmarks/model_tvm_ranking.py DIR --cost-model models/program
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NDCG_K = 4


def task_rankings(store_uri: str, model_path: str, measured_by: set[str], names: dict[str, str]) -> list[dict]:
    """One row per task (workload key) of the store: how the model orders its valid records
    measured by one of ``measured_by``; ``names``: task names by workload key (TVM's records
    name the operator, e.g. ``conv2d_nchw``, not the fused function)."""
    from scipy.stats import kendalltau

    from lorien.costmodel.metrics import ndcg_at, ndcg_of_random_orders
    from lorien.costmodel.pretrained import ProgramModel
    from lorien.dialect import get_dialect
    from lorien.features.program import schedule_features
    from lorien.record import TuningRecord
    from lorien.target import host_target
    from lorien.warehouse import open_store

    dialect = get_dialect("meta_schedule")
    store = open_store(store_uri)  # open while records are lowered: their workloads are found there
    records = [TuningRecord.from_row(row) for row in store.scan({"dialect": "meta_schedule"}).to_pylist()]
    # scored with the target features of the threads the engine timed them on, as the guide scored them
    model = ProgramModel(model_path, next((r.measured_target for r in records if r.measured_by == "lorien"
                                           and r.measured_target), None) or host_target().canonical)
    by_task: dict[str, dict[str, TuningRecord]] = {}
    for record in records:
        if record.is_valid and record.measured_by in measured_by:
            kept = by_task.setdefault(names.get(record.workload_key, record.workload_key), {})
            if record.config not in kept or min(record.costs) < min(kept[record.config].costs):
                kept[record.config] = record
    rows = []
    rng = np.random.default_rng(0)
    for task, kept in sorted(by_task.items()):
        if len(kept) < 3:
            continue
        features = np.vstack([schedule_features(*dialect.schedule_record(r, store)) for r in kept.values()])
        if len({row.tobytes() for row in features}) < 2:
            continue
        throughput = 1.0 / np.asarray([min(r.costs) for r in kept.values()])
        gains = throughput / throughput.max()
        scores = model.score(features)
        tau = kendalltau(scores, throughput).statistic
        chance = ndcg_of_random_orders(gains, NDCG_K, 200, rng)
        rows.append({"task": task, "n": len(kept), "tau": float(tau), "ndcg": ndcg_at(scores, gains, NDCG_K),
                     "ndcg_random": chance, "top1": float(gains[int(np.argmax(scores))]),
                     "spread": float(throughput.max() / throughput.min())})
    store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("work", type=Path, help="a directory benchmarks/model_tvm.py --keep-work kept")
    parser.add_argument("--cost-model", required=True, metavar="DIR", help="the model directory (lorien train -o)")
    args = parser.parse_args(argv)
    from lorien.record import MEASURED_BY_ENGINE, MEASURED_BY_LOG, MEASURED_BY_TVM
    from lorien.warehouse import open_store

    summary = []
    for model_dir in sorted(path for path in args.work.iterdir() if (path / "lorien" / "store").is_dir()):
        with open_store(f"parquet:{model_dir / 'lorien' / 'store'}") as store:
            table = store.scan({"dialect": "meta_schedule"})
            names = dict(zip(table.column("workload_key").to_pylist(), table.column("task_name").to_pylist(),
                             strict=True))
        # TVM's own tuning, committed through the adapter: TVM's runner timed it, the build field is empty
        for label, store, measured_by in (("engine", model_dir / "lorien" / "store", {MEASURED_BY_ENGINE}),
                                          ("tvm", model_dir / "adapter_store", {MEASURED_BY_TVM, MEASURED_BY_LOG})):
            if not store.is_dir():
                continue
            for row in task_rankings(f"parquet:{store}", args.cost_model, measured_by, names):
                summary.append((label, row))
                print(f"{model_dir.name} {label:<6} {row['task'][:44]:<44} n={row['n']:>2} spread {row['spread']:6.2f}x "
                      f"tau {row['tau']:+.2f} ndcg@{NDCG_K} {row['ndcg']:.3f} (random {row['ndcg_random']:.3f}) "
                      f"top1 {row['top1']:.2f}")
    for label in ("engine", "tvm"):
        rows = [row for which, row in summary if which == label]
        if rows:
            print(f"{label}-measured: {len(rows)} tasks, mean tau {np.mean([r['tau'] for r in rows]):+.3f}, "
                  f"mean ndcg@{NDCG_K} {np.mean([r['ndcg'] for r in rows]):.3f} "
                  f"(random {np.mean([r['ndcg_random'] for r in rows]):.3f}), "
                  f"mean top1 {np.mean([r['top1'] for r in rows]):.3f}")
    return 0 if summary and all(math.isfinite(row["ndcg"]) for _, row in summary) else 1


if __name__ == "__main__":
    raise SystemExit(main())
