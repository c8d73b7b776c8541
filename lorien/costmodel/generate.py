"""Training data from real measurements: tune a spread of dense/conv2d workloads with the
random tuner on this machine and commit every measured candidate to a store.

Sizes: ``small`` (a handful of workloads, few trials: CI), ``medium`` and ``large`` (for a
real training set); ``--workload op:K=V,...`` adds explicit workloads.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from lorien.errors import ConfigError

#: (op, params) spreads; params as the autotvm dialect's op shorthands take them.
SPREADS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "small": [("dense", {"M": m, "N": n, "K": k}) for m, n, k in ((1, 64, 64), (16, 64, 128), (16, 128, 64))]
    + [("conv2d", {"C": 16, "H": 14, "W": 14, "K": 16, "padding": 1})],
    "medium": [("dense", {"M": m, "N": n, "K": k})
               for m, n, k in itertools.product((1, 16, 64), (128, 256, 512), (128, 256, 512))]
    + [("conv2d", {"C": c, "H": h, "W": h, "K": k, "kernel": r, "padding": r // 2})
       for c, h, k, r in ((32, 28, 32, 3), (64, 14, 64, 3), (64, 28, 128, 1), (128, 14, 128, 3))],
    "large": [("dense", {"M": m, "N": n, "K": k})
              for m, n, k in itertools.product((1, 8, 32, 64, 128), (64, 128, 256, 512, 1024),
                                                (64, 128, 256, 512, 1024))]
    + [("conv2d", {"C": c, "H": h, "W": h, "K": k, "kernel": r, "padding": r // 2, "stride": s})
       for c, h, k, r, s in ((3, 224, 64, 7, 2), (64, 56, 64, 3, 1), (64, 56, 128, 1, 2), (128, 28, 128, 3, 1),
                             (128, 28, 256, 1, 2), (256, 14, 256, 3, 1), (256, 14, 512, 1, 2), (512, 7, 512, 3, 1))],
}
DEFAULT_TRIALS = {"small": 8, "medium": 64, "large": 200}


def parse_workload_spec(text: str) -> tuple[str, dict[str, Any]]:
    """``dense:M=16,N=256,K=256`` -> ("dense", {"M": 16, "N": 256, "K": 256})."""
    op, sep, rest = text.partition(":")
    if not sep or not op:
        raise ConfigError(f"workload {text!r}: expected OP:KEY=VALUE,... (e.g. dense:M=16,N=256,K=256)")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"workload {text!r}: {item!r} is not KEY=VALUE")
        params[key] = int(value) if value.lstrip("-").isdigit() else value
    return op, params


def training_jobs(size: str = "small", workloads: Sequence[str] = (), trials: int | None = None,
                  target: str = "llvm", tuner: str = "random", seed: int = 0, ops: Sequence[str] | None = None,
                  measure: dict[str, Any] | None = None, dialect: str = "autotvm") -> list[dict[str, Any]]:
    """Tuning jobs (the team's job dict) of a spread plus explicit workloads."""
    from lorien.dialect import get_dialect

    if size not in SPREADS and size != "none":
        raise ConfigError(f"unknown size {size!r} (known: {', '.join(SPREADS)}, none)")
    chosen = [] if size == "none" else [(op, p) for op, p in SPREADS[size] if ops is None or op in ops]
    chosen += [parse_workload_spec(text) for text in workloads]
    if not chosen:
        raise ConfigError("no workloads to tune (size none and no --workload)")
    plugin = get_dialect(dialect)
    trials = trials if trials is not None else DEFAULT_TRIALS.get(size, 64)
    jobs = []
    for i, (op, params) in enumerate(chosen):
        task_name, args = plugin.expand_workload(op, params)
        jobs.append({"dialect": dialect, "task_name": task_name, "args": args, "target": target,
                     "tuner": tuner, "trials": trials, "seed": seed + i, "commit_nbest": 20,
                     "measure": dict(measure or {}), "source": "lorien generate"})
    return jobs


def generate_training_set(store_uri: str | None, size: str = "small", workloads: Sequence[str] = (),
                          trials: int | None = None, target: str = "llvm", tuner: str = "random", seed: int = 0,
                          ops: Sequence[str] | None = None, measure: dict[str, Any] | None = None,
                          progress: bool = True) -> list[Any]:
    """Tune every job of the spread into ``store_uri``; returns the per-workload summaries."""
    from lorien.progress import Progress
    from lorien.tune.local import tune_workload

    jobs = training_jobs(size, workloads, trials, target, tuner, seed, ops, measure)
    summaries = []
    with Progress(len(jobs), "generate", unit="workload", enabled=progress) as bar:
        for job in jobs:
            # on a terminal each workload draws its trial bar under this one; in a log, one line each
            summaries.append(tune_workload(job, store_uri, progress=bar.is_bar))
            bar.step(summaries[-1].line())
    return summaries
