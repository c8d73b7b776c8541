"""Training data from real measurements: tune a spread of workloads with the random tuner (or
another) on this machine, in one dialect or several, and commit every measured candidate to a
store.

Sizes: ``small`` (a handful of workloads, few trials: CI), ``medium`` and ``large`` (for a
real training set) cover the four tunable operators: dense, conv2d (``conv2d_NCHWc.x86``),
depthwise conv2d and batch_matmul. Their shapes span the layers of common networks without
being any of them: no task of ResNet-18, ResNet-50, MobileNetV2 or a BERT-base layer
(configs/models/) is in a spread, so a model trained on one can be judged zero-shot on those
networks. ``exclude`` (configs) drops a spread's workloads that a tuning config names;
``--workload op:K=V,...`` adds explicit workloads.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lorien.errors import ConfigError

#: Ops of the spreads, as the tuning YAML's op shorthands name them.
OPS = ("dense", "conv2d", "depthwise_conv2d", "batch_matmul")


def _conv(c: int, h: int, k: int, kernel: int, stride: int = 1) -> tuple[str, dict[str, Any]]:
    return "conv2d", {"C": c, "H": h, "W": h, "K": k, "kernel": kernel, "stride": stride, "padding": kernel // 2}


def _depthwise(c: int, h: int, stride: int = 1, kernel: int = 3) -> tuple[str, dict[str, Any]]:
    return "depthwise_conv2d", {"C": c, "H": h, "W": h, "kernel": kernel, "stride": stride, "padding": kernel // 2}


def _bmm(b: int, m: int, n: int, k: int) -> tuple[str, dict[str, Any]]:
    return "batch_matmul", {"B": b, "M": m, "N": n, "K": k}


#: (op, params) spreads; params as the tuning YAML's op shorthands take them (Dialect.expand_workload).
SPREADS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "small": [("dense", {"M": m, "N": n, "K": k}) for m, n, k in ((1, 64, 64), (16, 64, 128), (16, 128, 64))]
    + [_conv(16, 14, 16, 3), _depthwise(16, 14), _bmm(2, 16, 16, 32)],
    "medium": [("dense", {"M": m, "N": n, "K": k})
               for m, n, k in itertools.product((1, 16, 64), (128, 256, 512), (128, 256, 512))]
    # stems, 3x3 (stride 1 and 2), 1x1 expansions/projections and stride-2 downsamples
    + [_conv(*shape) for shape in (
        (3, 112, 32, 7, 2), (3, 112, 16, 3, 2),
        (32, 56, 32, 3), (48, 28, 48, 3), (96, 28, 96, 3), (192, 14, 192, 3), (384, 7, 384, 3), (64, 14, 64, 3),
        (48, 56, 96, 3, 2), (96, 28, 192, 3, 2), (192, 14, 384, 3, 2),
        (16, 112, 64, 1), (48, 56, 192, 1), (192, 56, 48, 1), (64, 28, 256, 1), (256, 28, 64, 1),
        (128, 14, 512, 1), (512, 14, 128, 1), (256, 7, 1024, 1), (1024, 7, 256, 1), (40, 28, 240, 1),
        (48, 56, 96, 1, 2), (96, 28, 192, 1, 2), (192, 14, 384, 1, 2))]
    + [_depthwise(*shape) for shape in (
        (16, 112), (64, 112, 2), (48, 56), (64, 56), (72, 56, 2), (120, 28), (128, 28), (240, 28, 2),
        (256, 14), (480, 14), (672, 14, 2), (768, 7), (1152, 7), (240, 28, 1, 5), (480, 14, 1, 5))]
    + [_bmm(*shape) for shape in (
        (8, 64, 64, 64), (16, 256, 256, 32), (8, 128, 32, 128), (16, 96, 96, 48), (4, 256, 64, 256),
        (8, 64, 256, 64), (16, 192, 192, 64), (8, 128, 128, 32), (16, 32, 128, 96), (4, 384, 384, 64))],
    "large": [("dense", {"M": m, "N": n, "K": k})
              for m, n, k in itertools.product((1, 8, 32, 64, 128), (64, 128, 256, 512, 1024),
                                                (64, 128, 256, 512, 1024))]
    + [_conv(c, h, k, r, s) for c, h, k, r, s in itertools.product(
        (24, 48, 96, 192, 384), (14, 28, 56), (40, 80, 160, 320), (1, 3), (1, 2)) if c * h <= 96 * 56]
    + [_depthwise(c, h, s, r) for c, h, s, r in itertools.product(
        (24, 48, 72, 120, 240, 480), (14, 28, 56), (1, 2), (3, 5)) if c * h <= 240 * 28]
    + [_bmm(b, m, n, k) for b, m, n, k in itertools.product((4, 16), (64, 192, 256), (32, 96, 256), (32, 96, 256))],
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


def config_workload_keys(paths: Iterable[str | Path]) -> set[str]:
    """Workload keys of every workload the tuning configs name (what ``exclude`` drops)."""
    from lorien.dialect import get_dialect
    from lorien.tune.config import load_tune_config

    return {get_dialect(job["dialect"]).workload_key(job["task_name"], job["args"])
            for path in paths for job in load_tune_config(path).jobs}


def _keys_in_every_dialect(op: str, params: dict[str, Any]) -> set[str]:
    """A workload's key in every built-in dialect that can tune it: an exclude config names its
    workloads in its own dialect, whichever dialect the training set is tuned in."""
    from lorien.errors import LorienError
    from lorien.plugins import BUILTIN_DIALECTS, get_dialect

    keys = set()
    for name in BUILTIN_DIALECTS:
        try:
            plugin = get_dialect(name)
            keys.add(plugin.workload_key(*plugin.expand_workload(op, params)))
        except (LorienError, ImportError):
            continue
    return keys


def training_jobs(size: str = "small", workloads: Sequence[str] = (), trials: int | None = None,
                  target: str | None = None, tuner: str = "random", seed: int = 0, ops: Sequence[str] | None = None,
                  measure: dict[str, Any] | None = None, dialect: str | None = None,
                  exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Tuning jobs (the team's job dict) of a spread plus explicit workloads, for ``target``
    (default this host's CPU) and ``dialect`` (default a tuning config's), without the
    workloads whose keys ``exclude`` holds (an explicit one of them is an error)."""
    from lorien.dialect import get_dialect
    from lorien.target import host_target, parse_target
    from lorien.tune.job import JOB_DEFAULTS

    if size not in SPREADS and size != "none":
        raise ConfigError(f"unknown size {size!r} (known: {', '.join(SPREADS)}, none)")
    unknown_ops = sorted(set(ops or ()) - set(OPS))
    if unknown_ops:
        raise ConfigError(f"unknown op(s) {unknown_ops} (known: {', '.join(OPS)})")
    spread = [] if size == "none" else [(op, p) for op, p in SPREADS[size] if ops is None or op in ops]
    explicit = {len(spread) + i: text for i, text in enumerate(workloads)}
    dialect = dialect or JOB_DEFAULTS["dialect"]
    plugin = get_dialect(dialect)
    excluded = set(exclude)
    target = parse_target(target).canonical if target else host_target().canonical
    trials = trials if trials is not None else DEFAULT_TRIALS.get(size, 64)
    jobs = []
    for position, (op, params) in enumerate([*spread, *map(parse_workload_spec, workloads)]):
        task_name, args = plugin.expand_workload(op, params)
        if excluded and ({plugin.workload_key(task_name, args)} | _keys_in_every_dialect(op, params)) & excluded:
            if position in explicit:
                raise ConfigError(f"workload {explicit[position]!r} is a workload of an exclude config")
            continue
        jobs.append({"dialect": dialect, "task_name": task_name, "args": args, "target": target,
                     "tuner": tuner, "trials": trials, "seed": seed + len(jobs), "commit_nbest": 20,
                     "measure": dict(measure or {})})
    if not jobs:
        raise ConfigError("no workloads to tune (size none and no --workload, or every one excluded)")
    return jobs


def generate_training_set(store_uri: str | None, size: str = "small", workloads: Sequence[str] = (),
                          trials: int | None = None, target: str | None = None, tuner: str = "random", seed: int = 0,
                          ops: Sequence[str] | None = None, measure: dict[str, Any] | None = None,
                          progress: bool = True, exclude_configs: Sequence[str | Path] = (),
                          dialects: Sequence[str] | None = None) -> list[Any]:
    """Tune every job of the spread into ``store_uri``; returns the per-workload summaries.

    ``exclude_configs``: tuning YAMLs whose workloads are left out (e.g. the networks a model
    will be judged on zero-shot). ``dialects``: tune the spread in each of these (default a
    tuning config's default dialect), one dialect's jobs after another, the same seeds in each:
    what a program-feature model (``lorien featurize --features program``) trains on.
    """
    from lorien.plugins import get_dialect
    from lorien.progress import Progress
    from lorien.tune.local import tune_workload

    dialects = list(dict.fromkeys(dialects or ()))  # a dialect named twice is tuned once
    for name in dialects:
        get_dialect(name)  # an unknown dialect fails before anything is measured
    excluded = config_workload_keys(exclude_configs)
    jobs = [job for name in (dialects or [None]) for job in training_jobs(
        size, workloads, trials, target, tuner, seed, ops, measure, dialect=name, exclude=excluded)]
    if progress and excluded:
        kept = len(training_jobs(size, workloads, trials, target, tuner, seed, ops, measure)) * len(dialects or [None])
        print(f"generate: {kept - len(jobs)} job(s) of the spread tune a workload of "
              f"{', '.join(map(str, exclude_configs))}; left out", file=sys.stderr, flush=True)
    summaries = []
    with Progress(len(jobs), "generate", unit="workload", enabled=progress) as bar:
        for job in jobs:
            # on a terminal each workload draws its trial bar under this one; in a log, one line each
            summaries.append(tune_workload(job, store_uri, progress=bar.is_bar))
            bar.step(summaries[-1].line())
    return summaries
