"""How far the pre-trained section's re-timing moves when the same configs are re-timed again.

Draws ``--configs`` configs of one held-out layer (the random tuner, seed 0, the dialect's own
sampler), then re-times all of them in ``--sessions`` separate sessions ``--gap-s`` seconds apart,
each building every config afresh and timing it as ``benchmarks/costmodel.py`` does
(``retime_samples``: rotated rounds, an untimed run then 3 timed single runs a turn). From the
same runs it computes each re-timing statistic (``retimed_latency``): ``min``, the fastest run
(the re-timing now), ``median-of-means`` (the re-timing before), and ``min`` of the first 5 rounds
only (the old round count). Per statistic: the spread of a config (its slowest session's latency /
its fastest session's), geomean and worst over the configs, and how often the sessions agree on
the fastest config. The machine's load average is printed with every session; the last line holds
the geomean spreads.

    PYTHONPATH=. python benchmarks/retime_spread.py --dialect auto_scheduler \\
        --layer bert_base_layer/attention.query --configs 12 --sessions 4
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _costmodel_benchmark():
    spec = importlib.util.spec_from_file_location("bench_costmodel", HERE / "costmodel.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_costmodel"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialect", default="auto_scheduler", help="dialect whose sampler draws the configs")
    parser.add_argument("--layer", default="bert_base_layer/attention.query", help="held-out layer name")
    parser.add_argument("--configs", type=int, default=12, help="configs drawn (random tuner trials)")
    parser.add_argument("--sessions", type=int, default=4, help="separate re-timings of the same configs")
    parser.add_argument("--gap-s", type=float, default=20.0, help="seconds between sessions")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per session (the benchmark's RETIME_ROUNDS)")
    args = parser.parse_args(argv)

    bench = _costmodel_benchmark()
    from lorien.tune.loop import tune_job

    layer = next((item for item in bench.network_layers() if item[0] == args.layer), None)
    if layer is None:
        raise SystemExit(f"retime_spread: no layer {args.layer!r} in the networks' extracted YAMLs")
    records: list = []
    tune_job(bench._job(args.dialect, layer[1], layer[2], "random", args.configs, seed=0), None,
             on_batch=lambda state, batch: records.extend(batch))
    valid = [r for r in records if r.is_valid]
    statistics = {"min": lambda t: bench.retimed_latency(t, "min"),
                  "median-of-means": lambda t: bench.retimed_latency(t, "median-of-means"),
                  "min-5-rounds": lambda t: bench.retimed_latency(t[:5], "min")}
    latency = {name: [] for name in statistics}  # per statistic: per session, a latency per config
    for session in range(args.sessions):
        if session:
            time.sleep(args.gap_s)
        load = os.getloadavg()[0]
        samples = bench.retime_samples(args.dialect, valid, args.rounds)
        configs = [r.config for r in valid if r.config in samples]
        for name, statistic in statistics.items():
            latency[name].append([statistic(samples[c]) for c in configs])
        best = min(latency["min"][-1])
        print(f"session {session}: load average {load:.1f}, {len(configs)} configs, fastest {best * 1e3:.4f} ms "
              f"(min), {min(latency['median-of-means'][-1]) * 1e3:.4f} ms (median-of-means)", flush=True)
    figures = {}
    for name, sessions in latency.items():
        table = np.asarray(sessions)  # sessions x configs
        spread = table.max(axis=0) / table.min(axis=0)
        winners = {int(np.argmin(row)) for row in table}
        figures[name] = math.exp(float(np.mean(np.log(spread))))
        worst = int(np.argmax(spread))
        print(f"{name:16s}: spread across sessions geomean {figures[name]:.3f}x, worst {spread.max():.3f}x "
              f"({' / '.join(f'{t * 1e3:.4f}' for t in table[:, worst])} ms), spread of the fastest config "
              f"{spread[int(np.argmin(table.min(axis=0)))]:.3f}x, the same fastest config in every session: "
              f"{'yes' if len(winners) == 1 else 'no'}")
    print(" ".join(f"retime_spread_{name.replace('-', '_')}={value:.3f}" for name, value in figures.items()))


if __name__ == "__main__":
    main()
