"""Cost-model benchmarks: featurization speed and memory, zero-shot proposals vs tuning (dense,
and conv2d / depthwise / batch_matmul on whole held-out networks), transfer across targets.

    python benchmarks/costmodel.py            # full: every held-out layer tuned with 300 trials (hours on 2 cores)
    python benchmarks/costmodel.py --quick    # small: 20-22 minutes on 2 cores; tuned references of 48 trials
                                              # (plus the pre-trained section: 3 layers x 3 dialects, 32 trials)
    python benchmarks/costmodel.py --quick --tune-trials 300   # the quick layers against 300-trial tuning

Featurization runs on a parquet store of synthetic AutoTVM records made from the shared TopHub
logs (each base record varied in batch size, config index, cost and timestamp). Peak memory
is the largest summed RSS of the featurizing process and its workers, sampled with psutil.

Zero-shot, dense: a training set is measured on this machine (36 dense workloads, each swept
by the random tuner and tuned by the xgb tuner, as a warehouse of tuning logs holds),
featurized and used to train an XGBoost ranking model; for each held-out workload the
model's top-5 proposals are measured and compared with the same workload tuned with 300
trials (xgb tuner), and with 5 random configs of its space. Held-out workloads share no
(M, N, K) and no workload key with the training spread (checked).

Zero-shot, networks: the conv2d (conv2d_NCHWc.x86), depthwise and batch_matmul workloads of
`lorien generate --size medium` (49 workloads, none of them a layer of the held-out networks:
checked) are swept by the random tuner (64 configs) and tuned by the xgb tuner (64 trials);
a model trained on them proposes for every conv2d, depthwise and batch_matmul task of
ResNet-18, MobileNetV2 and a BERT-base encoder layer (configs/models, as `lorien extract`
wrote them), compared per layer as above with the
layer tuned with 300 trials (--quick: 6 layers, 48 trials, a third of the spread). Per
operator and per network, the ratio is network-level: the time of the layers run as often as
the network runs them (the configs' `weight`) with the tuned configs over that time with the
proposals (top-1, best of 5) or random configs; the per-layer range is printed. Time saved:
tuning wall time against proposing and measuring the 5 proposals.

Transfer: the same random sweeps (same seeds, so the same configs) are measured for a second
target, a different machine on this one: `llvm -mcpu=haswell -num-cores=1` (AVX2 code on one
thread) on an AVX-512 host, `llvm -mcpu=x86-64 -num-cores=1` (SSE) on an AVX2 host. Per
template, `lorien train --target <host> --transfer-from <second> --target-fraction 0.1 --curve
0,0.05,0.1,1` compares a model of the second target's records plus k% of this host's with a
model of this host's k% alone on held-out host workloads (5 folds; TenSet top-1 / top-5 and
pairwise accuracy); transfer10_top5 and own10_top5 are the mean top-5 over the three
templates at 10%.

Pre-trained models in tuning (issue 22; --skip-pretrained leaves it out): a spread of 24
conv2d / depthwise / dense / batch_matmul workloads that are no layer of any extracted
network (checked) is tuned in each of the three dialects with the random tuner (48 trials;
--quick, --pretrained-layers one and three: 16) and, as a warehouse of tuning runs holds it,
with the xgb tuner (32 trials, --pretrained-train-tuned; 0: random samples only), workload
after workload until a time budget is spent (--pretrained-train-s; 180 s with --quick, 240 s
with one, 600 s with three, none in the full run),
featurized with program features (`--features program`) and one XGBoost ranking model is
trained on all of it. Held-out layers of ResNet-50, MobileNetV2 and
the BERT-base layer are then tuned twice per dialect with the xgb tuner, the same seed and
budget (300 trials; one and three: 48; --quick: 32; --pretrained-trials): from scratch, and
guided by the model
(`cost_model`). Then the candidate best configs of both runs (each run's first 8 configs, each
config a run's curve stepped at, and each run's 16 fastest by first measurement) are re-timed together in this process, the
tuner's timing method (an untimed run, then 3 timed runs) in 15 rotated rounds; a config's
latency is its fastest of those 45 runs (other jobs only ever add time to a run); the target
is 95 % of the throughput of the scratch run's re-timed best, and a run's trial count is the
first trial by which it had measured a config whose re-timed latency meets the target (budget
+ 1 when it never did, marked '>'), so one lucky noisy first measurement counts for nothing.
The counts on the first measurements are printed beside them and kept as raw_* in the JSON.
pretrained_trials_speedup_<dialect> is the geomean of their ratio over the dialect's layers;
pretrained_final_vs_scratch the geomean of scratch best / guided best at equal trials. The same
counts against 95 % of the best either run found (nearer the best of a long run when the guided
run found a faster config than the scratch run) are printed as known_trials_speedup_<dialect>
and kept in the JSON. Beside each dialect's figure the log prints a 90 % bootstrap interval of
the geomean over its pairs (pretrained_speedup_interval_<dialect> in the JSON): how far the
luck of a run's few pairs can move it. The layers: --quick and --pretrained-layers three: resnet50/layer3.1.conv2,
mobilenet_v2/features.8.conv.0.0 and bert_base_layer/attention.query in every dialect
(--pretrained-layers one: one of them per dialect, autotvm / auto_scheduler / meta_schedule in
that order); the full run the 8 layers of PRETRAINED_FULL in every dialect
(--pretrained-layers all: every layer). Zero-shot top-1
(the model's first pick, re-timed, against the scratch run's re-timed best) is printed per
layer beside the spread of the scratch run's 8 random first configs (slowest / fastest),
and summarized over the layers whose random configs differ by at least 1.2x. --curves FILE
writes every run's best-so-far curve (notebooks/pretrained_curves.ipynb plots them).
--pretrained-transfer: the guided auto_scheduler and meta_schedule runs also learn from and
seed with the training store's records of other workloads (the job option transfer; the
scratch runs stay from scratch).
--pretrained-dialects auto_scheduler tunes one dialect's layers only (the others' figures are
nan); --pretrained-seeds N makes each layer's pair of runs with seeds 0 .. N-1 (the geomeans
are over layers and seeds): one layer's count on one seed is mostly luck.
The model's ranking quality on each held-out layer is printed too: NDCG@8 of its order of
the scratch run's configs (as trained, before any online update; gain = throughput / best,
from each config's fastest first-measurement repeat) beside the chance level of random orders.

The zero-shot ratios come from a final re-measurement: the tuned best config, the 5 proposals
and the 5 random configs are built once and timed in interleaved rounds (15; order rotated
each round), so all of them see the same load on the shared cores; each config's median
round (each round the fastest of 3 runs) gives the ratios on the last line. The fastest
round's ratios are printed too (dense): a config that uses both cores can look far faster in
the one round that caught the machine idle, so the median is the steadier comparison here.
Ratios are throughput / tuned throughput. time_ratio = tuning wall time / zero-shot wall time
(proposing + measuring the 5 proposals). Each section prints its wall seconds as it ends
(`section NAME: Ns`), and all of them together (`section seconds: featurize=... total=...`)
come just before the last line, the key=value summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("LORIEN_SHARED_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(REPO))

from lorien.costmodel.metrics import ndcg_at, ndcg_of_random_orders  # noqa: E402

#: Training workloads: both dense templates (M < 16 is dense_nopack), dimensions with and
#: without a factor of 3. The held-out workloads share no (M, N, K) with them.
TRAIN_SHAPES = [(m, n, k) for m in (1, 8, 16, 64) for n in (96, 256, 768) for k in (128, 320, 512)]
HELD_OUT = [(32, 384, 256), (8, 256, 384), (48, 512, 192)]


def log(message: str) -> None:
    print(message, flush=True)


#: Wall seconds of each section of this run, in run order (printed by :func:`section` as each
#: ends, and all together before the last line).
SECTION_SECONDS: dict[str, float] = {}


@contextmanager
def section(name: str):
    """Time one section of the benchmark: its wall seconds are printed when it ends and kept in
    :data:`SECTION_SECONDS` (a section run twice adds up)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - start
        SECTION_SECONDS[name] = SECTION_SECONDS.get(name, 0.0) + seconds
        log(f"section {name}: {seconds:.0f}s")


# ---- featurization -------------------------------------------------------------------------

def synthetic_store(path: Path, n_records: int, base_records: int = 100_000) -> str:
    """A parquet store of ``n_records`` synthetic records (copies of a TopHub-based base set
    with distinct timestamps and record ids)."""
    from lorien.formats import iter_log_tables
    from lorien.formats.synthetic import make_autotvm_log
    from lorien.warehouse import open_store

    uri = f"parquet:{path}"
    base_log = path.parent / f"base-{base_records}.log"
    if not base_log.exists():
        make_autotvm_log(sorted((SHARED / "tophub").glob("*.log")), base_log, base_records)
    base = pa.concat_tables([table for table, _ in iter_log_tables(base_log)]).combine_chunks()
    store = open_store(uri)
    written, copy = 0, 0
    while written < n_records:
        take = min(base.num_rows, n_records - written)
        part = base.slice(0, take)
        if copy:
            ids = [hashlib.blake2b(f"{rid}/{copy}".encode(), digest_size=16).hexdigest()
                   for rid in part["record_id"].to_pylist()]
            part = part.set_column(part.schema.get_field_index("record_id"), "record_id", pa.array(ids))
            shifted = pa.array(part["timestamp"].to_numpy() + copy * 1e7)
            part = part.set_column(part.schema.get_field_index("timestamp"), "timestamp", shifted)
        store.commit(part)
        written += take
        copy += 1
    store.close()
    return uri


def featurize_run(uri: str, out: Path, jobs: int) -> dict:
    """Featurize a store in a subprocess: wall seconds, CPU seconds and the largest summed RSS
    of its process tree (workers included), sampled every 20 ms."""
    code = ("import sys; from lorien.features import featurize; "
            f"r = featurize({str(out)!r}, store={uri!r}, jobs={jobs}, progress=False); "
            "print(r.records_read)")
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=str(REPO))
    process = psutil.Process(child.pid)
    peak = 0
    cpu_of: dict[int, float] = {}  # last CPU seconds seen per process of the tree
    while child.poll() is None:
        try:
            tree = [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        rss = 0
        for member in tree:
            try:
                rss += member.memory_info().rss
                times = member.cpu_times()
                cpu_of[member.pid] = times.user + times.system
            except psutil.NoSuchProcess:
                continue
        peak = max(peak, rss)
        time.sleep(0.02)
    child.wait()
    wall = time.perf_counter() - start
    if child.returncode != 0:
        raise SystemExit(f"featurization subprocess failed with code {child.returncode}")
    records = int(child.stdout.read().decode().strip()) if child.stdout else 0
    cpu = sum(cpu_of.values())
    result = {"records": records, "wall_s": wall, "cpu_s": cpu, "peak_mib": peak / 2**20,
              "rps": records / wall, "rps_per_cpu_s": records / max(cpu, 1e-9)}
    log(f"featurize {records} records (jobs={jobs}): {wall:.1f}s wall, {cpu:.1f}s CPU, "
        f"{result['rps']:.0f} records/s, {result['rps_per_cpu_s']:.0f} records per CPU-second, "
        f"peak {result['peak_mib']:.0f} MiB (load average {os.getloadavg()[0]:.1f})")
    return result


# ---- zero-shot: shared parts ---------------------------------------------------------------

def best_gflops(records: list) -> float:
    values = [r.gflops for r in records if r.gflops is not None]
    return max(values) if values else 0.0


def remeasure_gflops(task_name: str, args: list, entities: list[list], rounds: int,
                     min_repeat_ms: float = 0.0) -> list[dict]:
    """Re-measure configs side by side: each is built once in this process, then all of them
    take turns for ``rounds`` rounds (order rotated every round; each turn is the fastest of 3
    repeats, each repeat averaging enough runs to last ``min_repeat_ms``), so every config sees
    the same load on the shared cores. Returns per config
    ``{"min": GFLOPS of its fastest round, "median": GFLOPS of its median round}``; a config
    given as None (failed in its first measurement) gets zeros."""
    from dialects.autotvm.tuning import ConfigBuilder
    from lorien.engine import build
    from lorien.engine.arrays import argument_arrays
    from lorien.engine.race import rotated
    from lorien.workload import compute_flop

    flop = compute_flop(task_name, args) or 0.0
    args_json = json.dumps(args)
    rng = np.random.default_rng(0)
    kernels = []
    for entity in entities:
        if entity is None:
            kernels.append(None)
            continue
        schedule, tensors = ConfigBuilder(task_name, args_json, json.dumps(entity))()
        kernel = build(schedule, list(tensors))
        arrays = argument_arrays(kernel.args, rng)
        kernel(*arrays)  # warm: first touch of the output, code paged in
        kernels.append((kernel, arrays))
    runs: list[list[float]] = [[] for _ in entities]
    live = [i for i, item in enumerate(kernels) if item is not None]
    for r in range(rounds if live else 0):
        for i in rotated(live, r):
            kernel, arrays = kernels[i]
            time.sleep(0.01)  # let idle threads of the previous kernel park
            runs[i].append(min(kernel.time(*arrays, number=1, repeat=3, min_repeat_ms=min_repeat_ms)))
    return [{"min": flop / min(t) / 1e9, "median": flop / float(np.median(t)) / 1e9} if t else
            {"min": 0.0, "median": 0.0} for t in runs]


def job_of(op: str, params: dict, tuner: str, trials: int, seed: int) -> dict:
    """A tuning job dict of an op shorthand, for this host."""
    from lorien.dialect import get_dialect
    from lorien.target import host_target

    task_name, args = get_dialect("autotvm").expand_workload(op, params)
    return {"dialect": "autotvm", "task_name": task_name, "args": args, "target": host_target().canonical,
            "tuner": tuner, "trials": trials, "seed": seed, "commit_nbest": 20, "measure": {}}


def measure_training_set(jobs: list[dict], store_uri: str, work: Path, random_trials: int, tuned_trials: int) -> None:
    """What a warehouse holds for each job's workload: a random sweep of its space (none when
    ``random_trials`` is 0) and a model-based (xgb) tuning run."""
    from lorien.tune.local import tune_workload

    for i, job in enumerate(jobs):
        if random_trials:
            tune_workload({**job, "tuner": "random", "trials": random_trials}, store_uri, log_dir=work / "logs",
                          progress=False)
        tune_workload({**job, "tuner": "xgb", "trials": tuned_trials, "seed": 1000 + i}, store_uri,
                      log_dir=work / "logs", progress=False)


def train_model(store_uri: str, work: Path, name: str):
    """Featurize a store and train an XGBoost ranking model on it (every template)."""
    from lorien.costmodel import load_cost_model, train_cost_model
    from lorien.features import featurize

    featurize(work / f"{name}-features", store=store_uri, jobs=2, progress=False)
    train_cost_model(work / f"{name}-features", work / name, kind="xgb-rank", folds=3, baseline=None, plots=False,
                     progress=False)
    return load_cost_model(work / name)


def evaluate_layer(model, job: dict, label: str, tune_trials: int, rounds: int, work: Path, seed: int) -> dict:
    """One held-out layer: tuned with ``tune_trials`` xgb trials vs the model's 5 proposals vs
    5 random configs, first as measured, then re-measured together in interleaved rounds."""
    from dialects.autotvm.tuning import cached_task
    from lorien.costmodel.zeroshot import Proposal, measure_proposals, propose, sample_indices
    from lorien.tune.local import tune_workload

    task_name, args = job["task_name"], job["args"]
    started = time.perf_counter()
    tuned = tune_workload({**job, "tuner": "xgb", "trials": tune_trials, "seed": seed},
                          f"parquet:{work / 'tuned-store'}", log_dir=work / "logs", progress=False)
    tune_s = time.perf_counter() - started
    tuned_gflops = tuned.best_gflops or 0.0

    started = time.perf_counter()
    proposals = propose(model, task_name=task_name, args=args, topk=5, target=job["target"])
    records = measure_proposals(proposals, model.name, task_name, args, target=job["target"],
                                store_uri=f"parquet:{work / 'zeroshot-store'}")
    zero_shot_s = time.perf_counter() - started

    space = cached_task(task_name, json.dumps(args)).space
    random_props = [Proposal(rank=r + 1, score=0.0, entity=space.get(int(i)).to_json_entity())
                    for r, i in enumerate(sample_indices(len(space), 5, seed=7 + seed))]
    random_records = measure_proposals(random_props, "random", task_name, args, target=job["target"], commit=False)
    log(f"zero-shot {label}: first measurements: tuned({tune_trials} trials) {tuned_gflops:.2f} GFLOPS in "
        f"{tune_s:.0f}s; top-1 {records[0].gflops or 0.0:.2f}, best of 5 {best_gflops(records):.2f} in "
        f"{zero_shot_s:.1f}s; random best of 5 {best_gflops(random_records):.2f}")

    # The final comparison: the tuned best config, the 5 proposals and the 5 random configs
    # re-measured together, interleaved, so load on the shared cores hits them all alike.
    def valid(record) -> list | None:
        return json.loads(record.config)["entity"] if record.error_no == 0 else None

    finalists = [tuned.best_config, *(valid(r) for r in records), *(valid(r) for r in random_records)]
    again = remeasure_gflops(task_name, args, finalists, rounds)
    entry = {"label": label, "task_name": task_name, "tune_s": tune_s, "zero_shot_s": zero_shot_s, "rounds": rounds,
             "flop": tuned_flop(task_name, args),
             "first": {"tuned_gflops": tuned_gflops, "top1_gflops": records[0].gflops or 0.0,
                       "best5_gflops": best_gflops(records), "random_best5_gflops": best_gflops(random_records)}}
    for stat in ("min", "median"):
        values = [g[stat] for g in again]
        entry[stat] = {"tuned_gflops": values[0], "top1_gflops": values[1], "best5_gflops": max(values[1:6]),
                       "random_best5_gflops": max(values[6:11])}
    e = entry["median"]
    log(f"zero-shot {label}: re-measured ({rounds} interleaved rounds, median run): tuned "
        f"{e['tuned_gflops']:.2f} GFLOPS, top-1 {e['top1_gflops']:.2f}, best of 5 {e['best5_gflops']:.2f}, "
        f"random best of 5 {e['random_best5_gflops']:.2f}")
    return entry


def tuned_flop(task_name: str, args: list) -> float:
    from lorien.workload import compute_flop

    return float(compute_flop(task_name, args) or 0.0)


def mean_ratio(entries: list[dict], key: str, stat: str = "median") -> float:
    """Mean over layers of a config's throughput / the tuned config's."""
    ratios = [e[stat][key] / e[stat]["tuned_gflops"] for e in entries if e[stat]["tuned_gflops"] > 0]
    return float(np.mean(ratios)) if ratios else float("nan")


def network_ratio(entries: list[dict], key: str, stat: str = "median") -> float:
    """Time of the layers run once each as the network does (``weight`` times) with the tuned
    configs / with the ``key`` configs: the network-level throughput ratio."""
    tuned = sum(e["weight"] * e["flop"] / e[stat]["tuned_gflops"] for e in entries if e[stat]["tuned_gflops"] > 0)
    picked = sum(e["weight"] * e["flop"] / e[stat][key] if e[stat][key] > 0 else math.inf
                 for e in entries if e[stat]["tuned_gflops"] > 0)
    return tuned / picked if picked > 0 else float("nan")


# ---- zero-shot: dense -------------------------------------------------------------------

def check_held_out(train_shapes: list, held_out: list) -> None:
    """Held-out workloads share neither (M, N, K) nor their template's workload key with training."""
    from lorien.dialect import get_dialect
    from lorien.workload import autotvm_workload_key

    expand = get_dialect("autotvm").expand_workload
    keys = {autotvm_workload_key(*expand("dense", {"M": m, "N": n, "K": k})) for m, n, k in train_shapes}
    for shape in held_out:
        key = autotvm_workload_key(*expand("dense", dict(zip("MNK", shape, strict=True))))
        if tuple(shape) in {tuple(t) for t in train_shapes} or key in keys:
            raise SystemExit(f"held-out workload {shape} ({key}) is in the training spread")


def zero_shot_dense(work: Path, train_trials: tuple[int, int], tune_trials: int, held_out: list,
                    train_shapes: list, rounds: int = 15) -> dict:
    check_held_out(train_shapes, held_out)
    train_uri = f"parquet:{work / 'dense-train-store'}"
    start = time.perf_counter()
    jobs = [job_of("dense", dict(zip("MNK", shape, strict=True)), "random", 0, i) for i, shape in enumerate(train_shapes)]
    measure_training_set(jobs, train_uri, work, *train_trials)
    log(f"zero-shot dense: training set of {len(train_shapes)} workloads x ({train_trials[0]} random + "
        f"{train_trials[1]} xgb-tuned) trials in {time.perf_counter() - start:.0f}s")
    model = train_model(train_uri, work, "dense-model")
    results = []
    for i, shape in enumerate(held_out):
        job = job_of("dense", dict(zip("MNK", shape, strict=True)), "xgb", tune_trials, 100 + i)
        results.append({"weight": 1, **evaluate_layer(model, job, str(shape), tune_trials, rounds, work, 100 + i)})
    log("zero-shot dense ratios from the fastest round: top-1 {:.3f}, best of 5 {:.3f}, random best of 5 {:.3f}".format(
        *(mean_ratio(results, k, "min") for k in ("top1_gflops", "best5_gflops", "random_best5_gflops"))))
    return {"zeroshot_top1": mean_ratio(results, "top1_gflops"), "zeroshot_best5": mean_ratio(results, "best5_gflops"),
            "random_best5": mean_ratio(results, "random_best5_gflops"),
            "time_ratio": sum(r["tune_s"] for r in results) / max(sum(r["zero_shot_s"] for r in results), 1e-9),
            "workloads": results}


# ---- zero-shot: whole networks, and transfer across targets ----------------------------------

CONFIGS = REPO / "configs" / "models"
#: Held-out networks (their tasks as `lorien extract` wrote them) and the operators judged on them.
NETWORKS = ("resnet18", "mobilenet_v2", "bert_base_layer")
OPERATORS = {"conv": "conv2d_NCHWc.x86", "dw": "depthwise_conv2d_nchw.x86", "bmm": "batch_matmul.x86"}
#: The layers --quick evaluates (the full run evaluates every layer of these templates).
QUICK_LAYERS = {"resnet18": ("resnet18/layer2.0.conv2", "resnet18/layer3.0.downsample.0"),
                "mobilenet_v2": ("mobilenet_v2/features.3.conv.1.0", "mobilenet_v2/features.8.conv.1.0",
                                 "mobilenet_v2/features.8.conv.0.0"),
                "bert_base_layer": ("bert_base_layer/attention.scores",)}


def source_target() -> str:
    """The transfer benchmark's second target, a different machine measured here: AVX2 code
    on one thread on an AVX-512 host; SSE code (128-bit vectors) on one thread on an AVX2 one,
    so the two targets' vector widths, and best tiles, differ either way."""
    from lorien.engine.cpu import host_cpu

    return "llvm -mcpu=haswell -num-cores=1" if host_cpu().lanes > 8 else "llvm -mcpu=x86-64 -num-cores=1"


def held_out_layers(quick: bool) -> list[dict]:
    """(network, layer name, weight, job) of every held-out layer of the judged templates."""
    from lorien.tune.config import load_tune_config

    layers = []
    for network in NETWORKS:
        for job in load_tune_config(CONFIGS / f"{network}.yaml").jobs:
            if job["task_name"] not in OPERATORS.values():
                continue
            if quick and job["name"] not in QUICK_LAYERS[network]:
                continue
            layers.append({"network": network, "name": job["name"], "weight": job.get("weight", 1),
                           "job": job_of_task(job)})
    return layers


def job_of_task(job: dict) -> dict:
    """A config's job as the benchmark tunes it (this host, its task and args)."""
    from lorien.target import host_target

    return {"dialect": "autotvm", "task_name": job["task_name"], "args": job["args"], "target": host_target().canonical,
            "tuner": "xgb", "trials": 0, "seed": 0, "commit_nbest": 20, "measure": {}}


def spread_jobs(quick: bool, target: str | None = None) -> list[dict]:
    """The training spread of the judged operators (``lorien generate --size medium``), without
    any task of the extracted models (configs/models/all.yaml: the held-out networks and
    ResNet-50); --quick takes every third workload."""
    from lorien.costmodel.generate import config_workload_keys, training_jobs

    excluded = config_workload_keys([CONFIGS / "all.yaml"])
    jobs = training_jobs("medium", target=target, ops=["conv2d", "depthwise_conv2d", "batch_matmul"],
                         exclude=excluded)
    if len(jobs) != len(training_jobs("medium", target=target, ops=["conv2d", "depthwise_conv2d", "batch_matmul"])):
        raise SystemExit("the training spread holds a task of an extracted model")
    return jobs[::3] if quick else jobs


def random_sweeps(work: Path, quick: bool, trials: int, target: str | None = None) -> str:
    """The spread's random sweeps for ``target`` (default this host) into the transfer store:
    the same seeds, so the same configs, on every target. Returns the store URI."""
    from lorien.tune.local import tune_workload

    uri = f"parquet:{work / 'transfer-store'}"
    start = time.perf_counter()
    jobs = spread_jobs(quick, target)
    for job in jobs:
        tune_workload({**job, "tuner": "random", "trials": trials}, uri, log_dir=work / "logs", progress=False)
    log(f"{len(jobs)} workloads x {trials} random configs measured for {jobs[0]['target']!r} in "
        f"{time.perf_counter() - start:.0f}s")
    return uri


def zero_shot_networks(work: Path, quick: bool, sweeps_uri: str, tuned_trials: int, tune_trials: int,
                       rounds: int = 15) -> dict:
    """Train on the spread (this host's random sweeps plus xgb tuning runs), propose for every
    held-out layer, compare with tuning."""
    from lorien.target import host_target
    from lorien.warehouse import open_store

    jobs = spread_jobs(quick)
    train_uri = f"parquet:{work / 'ops-train-store'}"
    with open_store(sweeps_uri) as sweeps, open_store(train_uri) as train:
        train.commit(sweeps.scan({"target": host_target().canonical}))
    start = time.perf_counter()
    measure_training_set(jobs, train_uri, work, 0, tuned_trials)
    log(f"zero-shot ops: {len(jobs)} training workloads, their random sweeps plus {tuned_trials} xgb-tuned trials "
        f"each ({time.perf_counter() - start:.0f}s)")
    model = train_model(train_uri, work, "ops-model")
    layers = held_out_layers(quick)
    for i, layer in enumerate(layers):
        layer.update(evaluate_layer(model, layer["job"], layer["name"], tune_trials, rounds,
                                    work, 200 + i))
        del layer["job"]
    result: dict = {"layers": layers, "operators": {}, "networks": {}}
    for op, template in OPERATORS.items():
        entries = [layer for layer in layers if layer["task_name"] == template]
        result["operators"][op] = operator_summary(entries)
        for network in NETWORKS:
            of_network = [e for e in entries if e["network"] == network]
            if of_network:
                result["networks"][f"{network}/{op}"] = operator_summary(of_network)
    for name, summary in [*result["networks"].items(), *result["operators"].items()]:
        log(f"zero-shot {name}: {summary['layers']} layers; network top-1 {summary['top1']:.3f}, best of 5 "
            f"{summary['best5']:.3f}, random best of 5 {summary['random_best5']:.3f} of tuned; per layer top-1 "
            f"{summary['layer_top1_min']:.2f}-{summary['layer_top1_max']:.2f} (mean {summary['layer_top1_mean']:.3f}); "
            f"time saved: {summary['tune_s']:.0f}s of tuning vs {summary['zero_shot_s']:.1f}s "
            f"({summary['time_ratio']:.0f}x)")
    return result


def operator_summary(entries: list[dict]) -> dict:
    """Network-level ratios (layers weighted as the network runs them), per-layer range, times."""
    if not entries:
        return {"layers": 0, **dict.fromkeys(("top1", "best5", "random_best5", "layer_top1_mean", "layer_top1_min",
                                              "layer_top1_max", "tune_s", "zero_shot_s", "time_ratio"), math.nan)}
    per_layer = [e["median"]["top1_gflops"] / e["median"]["tuned_gflops"] for e in entries
                 if e["median"]["tuned_gflops"] > 0]
    tune_s, zero_shot_s = sum(e["tune_s"] for e in entries), sum(e["zero_shot_s"] for e in entries)
    return {"layers": len(entries), "top1": network_ratio(entries, "top1_gflops"),
            "best5": network_ratio(entries, "best5_gflops"), "random_best5": network_ratio(entries, "random_best5_gflops"),
            "layer_top1_mean": float(np.mean(per_layer)), "layer_top1_min": float(np.min(per_layer)),
            "layer_top1_max": float(np.max(per_layer)), "tune_s": tune_s, "zero_shot_s": zero_shot_s,
            "time_ratio": tune_s / max(zero_shot_s, 1e-9)}


def transfer(work: Path, quick: bool, random_trials: int, folds: int) -> dict:
    """The spread's random sweeps measured for the source target too (same seeds, so the same
    configs); per template, a model of the source's records plus k% of this host's against a
    model of this host's k% alone, on held-out host workloads."""
    from lorien.costmodel import train_cost_model
    from lorien.features import featurize
    from lorien.target import host_target

    source = source_target()
    transfer_uri = random_sweeps(work, quick, random_trials, source)
    featurize(work / "transfer-features", store=transfer_uri, jobs=2, progress=False)
    destination = host_target().canonical
    report = train_cost_model(work / "transfer-features", work / "transfer-model", kind="xgb-rank",
                              templates=sorted(OPERATORS.values()), folds=folds, target=destination,
                              transfer_from=source, target_fraction=0.1, curve=[0.0, 0.05, 0.1, 1.0],
                              progress=False)
    curves = {template: entry["transfer_curve"] for template, entry in report["templates"].items()}
    for template, curve in curves.items():
        for fraction, point in curve.items():
            own = point["own"]
            log(f"transfer {template}: {float(fraction):.0%} of {destination!r} "
                f"({point['destination_rows']:.0f} rows per fold): with {source!r} top-1 "
                f"{point['transfer']['top1']:.3f} top-5 {point['transfer']['top5']:.3f} pairwise "
                f"{point['transfer']['pairwise_accuracy']:.3f}"
                + (f"; alone top-1 {own['top1']:.3f} top-5 {own['top5']:.3f} pairwise {own['pairwise_accuracy']:.3f}"
                   if own else "; alone: no data"))

    def mean_over_templates(fraction: str, model: str, metric: str) -> float:
        return float(np.mean([curve[fraction][model][metric] for curve in curves.values()]))

    return {"transfer10_top5": mean_over_templates("0.1", "transfer", "top5"),
            "own10_top5": mean_over_templates("0.1", "own", "top5"), "curves": curves,
            "plots": {t: e.get("plots", {}).get("transfer") for t, e in report["templates"].items()}}



# ---- pre-trained program-feature models in tuning (issue 22) -----------------------------------

PRETRAINED_DIALECTS = ("autotvm", "auto_scheduler", "meta_schedule")
#: Held-out networks of the pre-trained benchmark: every conv2d / depthwise / dense /
#: batch_matmul layer of these (the full run), and one layer per dialect with --quick.
PRETRAINED_NETWORKS = ("resnet50", "mobilenet_v2", "bert_base_layer")
PRETRAINED_QUICK = {"autotvm": "resnet50/layer3.1.conv2", "auto_scheduler": "mobilenet_v2/features.8.conv.0.0",
                    "meta_schedule": "bert_base_layer/attention.query"}
#: The full run's layers, every one in every dialect (``--pretrained-layers all``: every layer
#: of the three networks, 60 of them: days on 2 cores).
PRETRAINED_FULL = ("resnet50/layer1.0.conv2", "resnet50/layer3.1.conv2", "resnet50/layer4.0.conv3",
                   "mobilenet_v2/features.8.conv.0.0", "mobilenet_v2/features.8.conv.1.0",
                   "bert_base_layer/attention.query", "bert_base_layer/attention.scores",
                   "bert_base_layer/ffn.intermediate")
#: The training spread: op shorthands of no layer of any extracted network (checked), tuned in
#: every dialect with the random tuner. --quick takes the first six.
PRETRAINED_SPREAD = [
    ("conv2d", {"C": 32, "H": 28, "W": 28, "K": 64, "kernel": 3, "padding": 1}),
    ("dense", {"M": 32, "N": 512, "K": 256}),
    ("conv2d", {"C": 96, "H": 14, "W": 14, "K": 160, "kernel": 1}),
    ("batch_matmul", {"B": 8, "M": 64, "N": 96, "K": 48}),
    ("depthwise_conv2d", {"C": 96, "H": 28, "W": 28, "kernel": 3, "padding": 1}),
    ("conv2d", {"C": 48, "H": 20, "W": 20, "K": 80, "kernel": 3, "padding": 1, "stride": 2}),
    ("dense", {"M": 64, "N": 384, "K": 640}),
    ("conv2d", {"C": 160, "H": 7, "W": 7, "K": 320, "kernel": 3, "padding": 1}),
    ("batch_matmul", {"B": 4, "M": 96, "N": 64, "K": 96}),
    ("depthwise_conv2d", {"C": 240, "H": 14, "W": 14, "kernel": 3, "padding": 1, "stride": 2}),
    ("conv2d", {"C": 80, "H": 42, "W": 42, "K": 48, "kernel": 1}),
    ("dense", {"M": 16, "N": 1536, "K": 384}),
    # more of other shapes, reached when the training time budget allows (--pretrained-train-s)
    ("conv2d", {"C": 24, "H": 32, "W": 32, "K": 40, "kernel": 3, "padding": 1}),
    ("dense", {"M": 8, "N": 768, "K": 512}),
    ("batch_matmul", {"B": 12, "M": 32, "N": 128, "K": 64}),
    ("depthwise_conv2d", {"C": 144, "H": 20, "W": 20, "kernel": 3, "padding": 1}),
    ("conv2d", {"C": 64, "H": 16, "W": 16, "K": 96, "kernel": 3, "padding": 1, "stride": 2}),
    ("dense", {"M": 48, "N": 256, "K": 1024}),
    ("conv2d", {"C": 120, "H": 10, "W": 10, "K": 200, "kernel": 1}),
    ("batch_matmul", {"B": 6, "M": 128, "N": 48, "K": 80}),
    ("depthwise_conv2d", {"C": 320, "H": 10, "W": 10, "kernel": 3, "padding": 1}),
    ("conv2d", {"C": 40, "H": 24, "W": 24, "K": 120, "kernel": 1}),
    ("dense", {"M": 128, "N": 192, "K": 320}),
    ("conv2d", {"C": 56, "H": 12, "W": 12, "K": 72, "kernel": 3, "padding": 1}),
]
OPS = ("conv2d", "depthwise_conv2d", "dense", "batch_matmul")


def network_layers(networks=PRETRAINED_NETWORKS) -> list[tuple[str, str, dict]]:
    """(layer name, op, params) of every tunable layer of the networks' extracted YAMLs (epilogues
    left out: the benchmark tunes the operator itself, the same way in every dialect)."""
    import yaml

    layers = []
    for network in networks:
        for entry in yaml.safe_load((CONFIGS / f"{network}.yaml").read_text())["workloads"]:
            op = next((key for key in OPS if key in entry), None)
            if op is not None:
                layers.append((entry["name"], op, dict(entry[op])))
    return layers


def _canonical(op: str, params: dict) -> tuple:
    defaults = {"N": 1, "stride": 1, "padding": 0, "kernel": 1 if op == "conv2d" else 3}
    return (op, tuple(sorted({**defaults, **params}.items())))


def check_spread_held_out(spread: list) -> None:
    """No training shape is a layer of any extracted network (configs/models: the held-out ones and the rest)."""
    networks = [path.stem for path in CONFIGS.glob("*.yaml") if path.stem not in ("all", "mutate-rules")]
    taken = {_canonical(op, params) for _, op, params in network_layers(networks)}
    clash = [item for item in spread if _canonical(*item) in taken]
    if clash:
        raise SystemExit(f"the pre-trained benchmark's training spread holds network layers: {clash}")


def _job(dialect: str, op: str, params: dict, tuner: str, trials: int, seed: int, batch_size: int = 8,
         cost_model: str | None = None) -> dict:
    from lorien.dialect import get_dialect
    from lorien.target import host_target

    task_name, args = get_dialect(dialect).expand_workload(op, params)
    job = {"dialect": dialect, "task_name": task_name, "args": args, "tuner": tuner, "trials": trials,
           "batch_size": batch_size, "seed": seed, "target": host_target().canonical}
    if cost_model:
        job["cost_model"] = cost_model
    return job


def train_program_model(work: Path, spread: list, trials: int, budget_s: float | None = None,
                        store_path: Path | None = None, tuned_trials: int = 0) -> tuple[str, dict]:
    """Tune the spread in every dialect (random tuner, ``trials`` each; with ``tuned_trials``, also
    the xgb tuner, that many trials, another seed: what a warehouse of tuning runs holds, the
    programs a search converged to beside random samples) into a store, featurize its program
    features, train an XGBoost ranking model; returns (model path, facts). With ``budget_s``,
    workloads are measured in spread order (every dialect of one, then the next) until the
    budget is spent, the whole spread at most; without it, the whole spread. ``store_path``: a
    store kept between runs (default: a fresh one in ``work``): a job whose records it already
    holds (by the job's source tag: same workload, dialect, seed, target) is not measured again,
    and one cut short is resumed, so the same store gives the same training set, and the model
    trained on it is the same from run to run."""
    from lorien.costmodel import train_cost_model
    from lorien.features import featurize
    from lorien.tune.loop import tune_job
    from lorien.tune.resume import SOURCE_PREFIX, earlier_records, job_source
    from lorien.warehouse import open_store

    uri = f"parquet:{store_path or work / 'program-train-store'}"
    start = time.perf_counter()
    done = reused = 0
    with open_store(uri) as store:
        # what the store holds, in one scan (a store of 144 jobs took 105 s asked job by job)
        held = store.scan({}, columns=["source", "config"]).group_by("source").aggregate(
            [("config", "count_distinct")]).to_pydict()
        held = dict(zip(held["source"], held["config_count_distinct"], strict=True))
        for i, (op, params) in enumerate(spread):
            if budget_s is not None and done and time.perf_counter() - start >= budget_s:
                break
            for dialect in PRETRAINED_DIALECTS:
                for tuner, count, seed in (("random", trials, 100 + i), ("xgb", tuned_trials, 200 + i)):
                    if count < 1:
                        continue
                    job = _job(dialect, op, params, tuner, count, seed=seed)
                    source = job_source(job, dialect)
                    if held.get(source, 0) >= count:
                        reused += held[source]
                        continue
                    earlier = earlier_records(store, source.removeprefix(SOURCE_PREFIX), target=job["target"])
                    tune_job(job, store, resume=earlier)
            done += 1
    measured_s = time.perf_counter() - start
    start = time.perf_counter()
    features = work / "program-features"
    if features.exists():
        shutil.rmtree(features)
    report = featurize(features, store=uri, extractor="program", jobs=1, progress=False)
    featurize_s = time.perf_counter() - start
    train_cost_model(features, work / "program-model", kind="xgb-rank", templates=["program"],
                     folds=3, baseline=None, plots=False, progress=False, name="warehouse-program")
    facts = {"records": report.records_featurized, "workloads": done * len(PRETRAINED_DIALECTS),
             "random_trials": trials, "tuned_trials": tuned_trials,
             "reused_records": reused, "store": uri, "measure_s": round(measured_s, 1),
             "featurize_s": round(featurize_s, 2),
             "featurize_rps": round(report.records_featurized / featurize_s, 1) if featurize_s else math.nan}
    log(f"pre-trained model: {facts['records']} records of {facts['workloads']} (dialect, workload) pairs "
        f"({reused} of them reused from {uri}, the rest measured in {measured_s:.0f}s), program features at "
        f"{facts['featurize_rps']} records/s")
    return str(work / "program-model"), facts


def _curve(records: list) -> list[float]:
    """Best latency so far (seconds) after each trial, in measurement order (inf before the first valid)."""
    best, curve = math.inf, []
    for record in records:
        cost = record.cost_s if record.is_valid else None
        if cost is not None and cost < best:
            best = cost
        curve.append(best)
    return curve


def trials_to_reach(curve: list[float], threshold_s: float) -> int | None:
    """First trial (1-based) whose best so far is within ``threshold_s``; None if never."""
    for trial, best in enumerate(curve, start=1):
        if best <= threshold_s:
            return trial
    return None


def retime_candidates(runs: dict[str, list], top: int, first: int = 0) -> list[str]:
    """Configs to re-time for a layer: in every run, its ``first`` first valid configs (its first
    batch: a guided run's are the model's picks, and one measured slow under load would otherwise
    never count), each config that was the run's best so far when measured (the points its curve
    steps at, lucky noisy ones included) and its ``top`` fastest by first measurement; each config
    once (by its config string), in first-seen order."""
    chosen: dict[str, None] = {}
    for records in runs.values():
        valid = [r for r in records if r.is_valid and r.cost_s is not None]
        for record in valid[:first]:
            chosen.setdefault(record.config, None)
        best = math.inf
        for record in valid:
            if record.cost_s < best:
                best = record.cost_s
                chosen.setdefault(record.config, None)
        for record in sorted(valid, key=lambda r: r.cost_s)[:top]:
            chosen.setdefault(record.config, None)
    return list(chosen)


def retimed_curve(records: list, latency_s: dict[str, float]) -> list[float]:
    """Best re-timed latency so far after each trial: the fastest re-timed latency of the configs
    the run had measured by then (configs not re-timed, or failed, do not count; inf before the first)."""
    best, curve = math.inf, []
    for record in records:
        cost = latency_s.get(record.config) if record.is_valid else None
        if cost is not None and cost < best:
            best = cost
        curve.append(best)
    return curve


def retime_samples(dialect: str, records: list, rounds: int, repeat: int = 3) -> dict[str, list[list[float]]]:
    """Time records' configs side by side in this process: each config is built once, then all
    take turns for ``rounds`` rounds (order rotated every round, so every config of both runs sees
    the same load); a turn is an untimed run, then ``repeat`` timed single runs (the tuner's
    ``MeasureOption`` defaults: 1 run x 3 repeats). Returns each config's seconds per run, one
    list per round. Configs that fail to build or run are left out."""
    from lorien.dialect import get_dialect
    from lorien.engine.arrays import argument_arrays
    from lorien.engine.measure import MeasureOption
    from lorien.engine.race import rotated

    option = MeasureOption()
    owner = get_dialect(dialect)
    kernels: list[tuple[str, object, list]] = []
    for record in records:
        try:
            # on the threads its measurement ran on (a meta_schedule job times on TVM's runtime threads,
            # 1 on a 2-CPU x86-64 host; re-timed on every CPU, runs tuned for one thread were judged on two)
            kernel = owner.compile_record(record, target=record.measured_target)
            arrays = argument_arrays(kernel.args, option.seed)
            kernel(*arrays)  # warm: first touch of the output, code paged in
        except Exception as err:  # noqa: BLE001 - a config that failed to build drops out of the re-timing
            log(f"    re-timing: {dialect} config left out ({type(err).__name__}: {err})")
            continue
        kernels.append((record.config, kernel, arrays))
    times: dict[str, list[list[float]]] = {config: [] for config, _, _ in kernels}
    for r in range(rounds if kernels else 0):
        for config, kernel, arrays in rotated(kernels, r):
            kernel(*arrays)  # the untimed run before the timed repeats, as the tuner's measurement
            costs = kernel.time(*arrays, number=option.number, repeat=repeat,
                                min_repeat_ms=option.min_repeat_ms, flush_cache=option.flush_cache, warmup=False)
            times[config].append([float(c) for c in costs])
    return times


def retimed_latency(rounds: list[list[float]], statistic: str = "min") -> float:
    """A config's re-timed latency from its rounds of timed runs. ``min``: its fastest run. Other
    jobs on the cores only ever add time to a run (a thread that loses its core, caches evicted),
    never take it away, so the fastest of many runs is the run least disturbed, and it nears the
    kernel's own time from above as runs are added. ``median-of-means`` (the re-timing until
    issue 22's follow-up, kept to compare): the median over rounds of each round's mean, which
    follows the load of the moments the rounds ran in."""
    if statistic == "min":
        return float(min(min(costs) for costs in rounds))
    if statistic == "median-of-means":
        return float(np.median([np.mean(costs) for costs in rounds]))
    raise ValueError(f"retimed_latency: unknown statistic {statistic!r}; use 'min' or 'median-of-means'")


def retimed_curves(dialect: str, runs: dict) -> tuple[dict, dict[str, float]]:
    """Each run's best-so-far curve on re-timed latencies (``runs``: label -> its records), and
    the re-timed latency of each config: the candidate configs of all runs
    (:func:`retime_candidates`) re-timed together in ``RETIME_ROUNDS`` rotated rounds
    (:func:`retime_configs`), so the runs are compared on one timing."""
    candidates = retime_candidates({str(label): records for label, records in runs.items()}, RETIME_TOP, RETIME_FIRST)
    by_config = {}
    for records in runs.values():
        for record in records:
            by_config.setdefault(record.config, record)
    latency = retime_configs(dialect, [by_config[c] for c in candidates], RETIME_ROUNDS)
    return {label: retimed_curve(records, latency) for label, records in runs.items()}, latency


def retime_configs(dialect: str, records: list, rounds: int, repeat: int = 3,
                   statistic: str = "min") -> dict[str, float]:
    """Re-time records' configs side by side (:func:`retime_samples`); a config's latency is
    :func:`retimed_latency` of its runs (default: the fastest of its ``rounds x repeat`` runs)."""
    return {config: retimed_latency(t, statistic)
            for config, t in retime_samples(dialect, records, rounds, repeat).items() if t}


def ranking_quality(model_path: str, dialect: str, records: list, k: int = 8, permutations: int = 200) -> dict:
    """How the pre-trained model, as trained (before any online update), ranks a held-out
    layer's measured configs: NDCG@k with gain = throughput / the best throughput (each
    config's fastest first-measurement repeat, which the first-repeat wake-up does not touch),
    beside the mean NDCG@k of random orders of the same configs (the chance level), and the
    throughput of the model's top pick / the best."""
    from lorien.costmodel.pretrained import ProgramModel
    from lorien.dialect import get_dialect
    from lorien.features.program import schedule_features
    from lorien.target import host_target

    owner = get_dialect(dialect)
    rows, fastest, seen = [], [], set()
    for record in records:
        if not record.is_valid or record.config in seen:
            continue
        seen.add(record.config)
        rows.append(schedule_features(*owner.schedule_record(record)))
        fastest.append(min(record.costs))
    if len(rows) < 2:
        return {"ndcg": math.nan, "ndcg_random": math.nan, "top1": math.nan, "configs": len(rows)}
    gains = (1.0 / np.asarray(fastest)) / (1.0 / min(fastest))
    # scored with the target features of the threads the layer was timed on, as the guide scores it
    timed_for = next((record.measured_target for record in records if record.is_valid), None)
    scores = ProgramModel(model_path, timed_for or host_target().canonical).score(np.vstack(rows))
    chance = ndcg_of_random_orders(gains, k, permutations, np.random.default_rng(0))
    return {"ndcg": ndcg_at(scores, gains, k), "ndcg_random": chance,
            "top1": float(gains[int(np.argmax(scores))]), "configs": len(rows)}


#: --quick's pre-trained section: the three layers in every dialect (a dialect's figure is a
#: geomean of three layers, not one layer's ratio), this many trials per run, and this time
#: budget (seconds) for measuring the training spread.
QUICK_TRIALS = 32
QUICK_TRAIN_S = 180.0
#: xgb-tuned trials of each (spread workload, dialect) in the pre-trained model's training set,
#: beside the random ones (0: random samples only, as before 2026-11-29).
TRAIN_TUNED_TRIALS = 32
#: Re-timing of the pre-trained section: rounds per config, and each run's fastest configs (by
#: first measurement) re-timed beside the configs its curve stepped at.
RETIME_ROUNDS = 15
RETIME_TOP = 16
#: Each run's first configs re-timed as well (the xgb tuner's first batch): a good one measured
#: at several times its speed under load was neither a curve step nor among the fastest.
RETIME_FIRST = 8


#: The dialects whose guided runs ``--pretrained-transfer`` gives the job option ``transfer``.
TRANSFER_DIALECTS = ("auto_scheduler", "meta_schedule")


def layer_job(dialect: str, op: str, params: dict, trials: int, seed: int, cost_model: str | None,
              transfer_store: str | None) -> tuple[dict, str | None]:
    """One run of a held-out layer: its job and the store it reads (None: none). A guided run
    (``cost_model``) of a :data:`TRANSFER_DIALECTS` dialect, given ``transfer_store``, takes the
    job option ``transfer`` with it; every other run gets no store, so its ``transfer`` (on by
    default in auto_scheduler) has nothing to read: a scratch run never learns from the store."""
    job = _job(dialect, op, params, "xgb", trials, seed=seed, cost_model=cost_model)
    if cost_model and transfer_store and dialect in TRANSFER_DIALECTS:
        job["transfer"] = True
        return job, transfer_store
    return job, None


def pretrained_layer(dialect: str, name: str, op: str, params: dict, trials: int, model: str, seed: int = 0,
                     transfer_store: str | None = None) -> dict:
    """Tune one held-out layer from scratch and with the model, the same budget and ``seed``
    (``transfer_store``: an auto_scheduler or meta_schedule run with the model also takes the
    job option ``transfer`` with that store, read only; the scratch run never does); then
    re-time both runs' candidate best configs together (:func:`retime_configs`) and count trials
    on the re-timed latencies: the target is 95 % of the throughput of the scratch run's re-timed
    best, and a run's count is the first trial by which it had measured a config whose re-timed
    latency is within it. The first measurements' figures are kept beside them (``raw_*``)."""
    from lorien.tune.loop import tune_job

    runs = {}
    for label, cost_model in (("scratch", None), ("pretrained", model)):
        records: list = []
        start = time.perf_counter()
        job, store = layer_job(dialect, op, params, trials, seed, cost_model, transfer_store)
        tune_job(job, store, commit=False, on_batch=lambda state, batch, records=records: records.extend(batch))
        runs[label] = {"raw_curve": _curve(records), "seconds": time.perf_counter() - start, "records": records}
    start = time.perf_counter()
    curves, latency = retimed_curves(dialect, {k: v["records"] for k, v in runs.items()})
    retime_s = time.perf_counter() - start
    for label, run in runs.items():
        run["curve"] = curves[label]
    scratch, guided = runs["scratch"]["curve"], runs["pretrained"]["curve"]
    best = scratch[-1]
    threshold = best / 0.95  # 95 % of the throughput of the scratch run's re-timed best
    without = trials_to_reach(scratch, threshold)
    with_model = trials_to_reach(guided, threshold)
    censored = with_model is None
    with_count = with_model if with_model is not None else trials + 1
    known = min(best, guided[-1]) / 0.95  # 95 % of the best either run found: nearer a long run's best
    known_without = trials_to_reach(scratch, known)
    known_with = trials_to_reach(guided, known)
    known_without = known_without if known_without is not None else trials + 1
    known_with = known_with if known_with is not None else trials + 1
    raw_best = runs["scratch"]["raw_curve"][-1]
    raw_without = trials_to_reach(runs["scratch"]["raw_curve"], raw_best / 0.95)
    raw_with = trials_to_reach(runs["pretrained"]["raw_curve"], raw_best / 0.95)
    quality = ranking_quality(model, dialect, runs["scratch"]["records"])
    first = runs["pretrained"]["records"][0]
    first_latency = latency.get(first.config) if first.is_valid else None
    random_costs = sorted(r.cost_s for r in runs["scratch"]["records"][:8] if r.is_valid)  # the scratch run's random first batch
    spread = random_costs[-1] / random_costs[0] if len(random_costs) > 1 else math.nan
    entry = {"dialect": dialect, "layer": name, "seed": seed, "trials": trials, "scratch_best_ms": best * 1e3,
             "pretrained_best_ms": guided[-1] * 1e3, "trials_scratch": without, "trials_pretrained": with_count,
             "censored": censored, "speedup": without / with_count, "final_vs_scratch": best / guided[-1],
             "known_trials_scratch": known_without, "known_trials_pretrained": known_with,
             "known_speedup": known_without / known_with,
             "zeroshot_top1": best / first_latency if first_latency else 0.0, "random_spread": spread,
             "retimed_configs": len(latency), "retime_rounds": RETIME_ROUNDS,
             "ndcg8": quality["ndcg"], "ndcg8_random": quality["ndcg_random"], "model_top1": quality["top1"],
             "raw_scratch_best_ms": raw_best * 1e3, "raw_trials_scratch": raw_without,
             "raw_trials_pretrained": raw_with if raw_with is not None else trials + 1,
             "curve_scratch_ms": [c * 1e3 for c in scratch], "curve_pretrained_ms": [c * 1e3 for c in guided],
             "raw_curve_scratch_ms": [c * 1e3 for c in runs["scratch"]["raw_curve"]],
             "raw_curve_pretrained_ms": [c * 1e3 for c in runs["pretrained"]["raw_curve"]],
             "seconds": {**{k: round(v["seconds"], 1) for k, v in runs.items()}, "retime": round(retime_s, 1)}}
    log(f"  {dialect:15s} {name:40s} seed {seed}: 95% of {best * 1e3:.4f} ms (re-timed, {len(latency)} configs): {without} trials "
        f"from scratch, {'>' if censored else ''}{with_count if not censored else trials} with the model "
        f"(x{entry['speedup']:.2f}; to 95% of the best of both runs: {known_without} vs {known_with}, "
        f"x{entry['known_speedup']:.2f}; first measurements: {raw_without} vs "
        f"{'>' + str(trials) if raw_with is None else raw_with} of {raw_best * 1e3:.4f} ms); final "
        f"{entry['final_vs_scratch']:.3f}; zero-shot top-1 {entry['zeroshot_top1']:.3f} "
        f"(random configs span x{spread:.2f}); the model on the scratch run's {quality['configs']} configs: "
        f"NDCG@8 {quality['ndcg']:.3f} (random orders {quality['ndcg_random']:.3f}), top-1 {quality['top1']:.3f}")
    return entry


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def geomean_interval(values: list[float], level: float = 0.9, rounds: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap interval of the geomean of ``values`` (pairs of runs): the geomeans of
    ``rounds`` resamples (with replacement, as many as there are values), their central ``level``
    share. How far one benchmark run's figure can move with the luck of its pairs: one layer's
    count on one seed ranges from a lucky first pick to a run that never reaches the line, so
    six pairs a dialect do not tell 1.5x from 3x. NaN, NaN without a positive finite value."""
    logs = np.log([v for v in values if v > 0 and math.isfinite(v)])
    if len(logs) == 0:
        return math.nan, math.nan
    means = np.random.default_rng(seed).choice(logs, size=(rounds, len(logs)), replace=True).mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(math.exp(low)), float(math.exp(high))


def pretrained_benchmark(work: Path, quick: bool, trials: int, layer_set: str = "some",
                         train_s: float | None = None, train_store: Path | None = None,
                         dialects: tuple[str, ...] = PRETRAINED_DIALECTS, seeds: int = 1,
                         tuned_trials: int = TRAIN_TUNED_TRIALS, transfer: bool = False) -> dict:
    """Train on the spread, tune the held-out layers both ways in every dialect. ``layer_set``:
    ``one`` (one layer per dialect, :data:`PRETRAINED_QUICK`), ``three`` (those three layers in
    every dialect, --quick's; the spread measured with 16 trials each), ``some``
    (:data:`PRETRAINED_FULL` in every dialect) or ``all`` (every layer of the three networks).
    ``train_store``: the training spread's store, kept between runs (:func:`train_program_model`).
    ``dialects``: the dialects whose layers are tuned (the others' figures are NaN); ``seeds``: each
    layer's pair of runs is made with seeds 0 .. seeds - 1, the geomeans taken over all of them.
    ``tuned_trials``: xgb-tuned trials of every spread job in the training set (:func:`train_program_model`).
    ``transfer``: the guided runs of :data:`TRANSFER_DIALECTS` also take the job option
    ``transfer`` with the training store."""
    spread = PRETRAINED_SPREAD
    check_spread_held_out(spread)
    spread_trials = 16 if layer_set in ("one", "three") else 48
    if train_s is None:
        train_s = QUICK_TRAIN_S if quick else 240.0 if layer_set == "one" else 600.0 if layer_set == "three" else None
    model, facts = train_program_model(work, spread, trials=spread_trials, budget_s=train_s,
                                       store_path=train_store, tuned_trials=tuned_trials)
    layers = network_layers()
    entries = []
    for dialect in dialects:
        if layer_set == "one":
            chosen = [layer for layer in layers if layer[0] == PRETRAINED_QUICK[dialect]]
        elif layer_set == "three":
            chosen = [layer for layer in layers if layer[0] in PRETRAINED_QUICK.values()]
        else:
            chosen = layers if layer_set == "all" else [layer for layer in layers if layer[0] in PRETRAINED_FULL]
        for name, op, params in chosen:
            for seed in range(seeds):
                entries.append(pretrained_layer(dialect, name, op, params, trials, model, seed,
                                                facts["store"] if transfer else None))
    result = {"training": facts, "layers": entries, "trials": trials, "seeds": seeds}
    for dialect in PRETRAINED_DIALECTS:
        result[f"pretrained_trials_speedup_{dialect}"] = geomean([e["speedup"] for e in entries
                                                                   if e["dialect"] == dialect])
    result["pretrained_final_vs_scratch"] = geomean([e["final_vs_scratch"] for e in entries])
    for dialect in PRETRAINED_DIALECTS:
        pairs = [e["speedup"] for e in entries if e["dialect"] == dialect]
        result[f"pretrained_speedup_interval_{dialect}"] = geomean_interval(pairs)
    log("trials to 95 %, without / with the model, 90 % bootstrap interval of the geomean over each dialect's pairs: "
        + " ".join(f"{dialect}={result[f'pretrained_trials_speedup_{dialect}']:.3f} "
                   f"[{result[f'pretrained_speedup_interval_{dialect}'][0]:.2f}, "
                   f"{result[f'pretrained_speedup_interval_{dialect}'][1]:.2f}] "
                   f"({sum(e['dialect'] == dialect for e in entries)} pairs)" for dialect in PRETRAINED_DIALECTS))
    for dialect in PRETRAINED_DIALECTS:
        result[f"known_trials_speedup_{dialect}"] = geomean([e["known_speedup"] for e in entries
                                                             if e["dialect"] == dialect])
    log("trials to 95 % of the best either run found (the scratch run's best where it was the faster): "
        + " ".join(f"{dialect}={result[f'known_trials_speedup_{dialect}']:.3f}" for dialect in PRETRAINED_DIALECTS))
    result["ndcg8_heldout"] = float(np.mean([e["ndcg8"] for e in entries]))
    result["ndcg8_random"] = float(np.mean([e["ndcg8_random"] for e in entries]))
    log(f"held-out ranking: NDCG@8 of the model on the scratch runs' configs {result['ndcg8_heldout']:.3f} "
        f"(mean of {len(entries)} layers; random orders {result['ndcg8_random']:.3f})")
    discriminating = [e for e in entries if e["random_spread"] >= 1.2]
    result["zeroshot_top1_discriminating"] = geomean([e["zeroshot_top1"] for e in discriminating])
    log(f"zero-shot top-1 (the model's first pick / the scratch best) on the {len(discriminating)} layers whose "
        f"random configs differ by >= 1.2x: {result['zeroshot_top1_discriminating']:.3f}")
    return result


def engine_available() -> str | None:
    """None when the engine can measure; else why not."""
    try:
        import lorien.engine.measure  # noqa: F401
        from lorien.tune.local import tune_workload  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--jobs", type=int, default=2, help="featurization workers")
    parser.add_argument("--tune-trials", type=int,
                        help="trials of the tuned reference of each held-out workload (default 300, 48 with --quick)")
    parser.add_argument("--skip-featurize", action="store_true", help="no featurization figures")
    parser.add_argument("--skip-zeroshot", action="store_true", help="no zero-shot figures (dense and networks)")
    parser.add_argument("--skip-transfer", action="store_true", help="no transfer figures")
    parser.add_argument("--skip-pretrained", action="store_true",
                        help="no pre-trained-model figures (trials to 95%% with and without the model)")
    parser.add_argument("--pretrained-trials", type=int,
                        help=f"trials of each run of the pre-trained benchmark (default 300; 48 with --pretrained-layers "
                             f"one or three; {QUICK_TRIALS} with --quick)")
    parser.add_argument("--pretrained-layers", choices=["one", "three", "some", "all"],
                        help="pre-trained section: one layer per dialect, the three layers of PRETRAINED_QUICK in "
                             "every dialect (--quick's default), the 8 layers of PRETRAINED_FULL in every dialect "
                             "(the full default), or all 60 layers of the networks")
    parser.add_argument("--pretrained-train-s", type=float, metavar="SECONDS",
                        help=f"time budget for measuring the pre-trained model's training spread (default: "
                             f"{QUICK_TRAIN_S:.0f} with --quick, 240 with --pretrained-layers one, 600 with three, "
                             f"the whole spread otherwise)")
    parser.add_argument("--pretrained-train-store", metavar="DIR",
                        help="a parquet store directory for the pre-trained model's training spread, kept between "
                             "runs: jobs whose records it holds are not measured again (the same training set and "
                             "model every run); missing ones are measured into it. Default: a fresh store in the "
                             "work directory")
    parser.add_argument("--pretrained-train-tuned", type=int, default=TRAIN_TUNED_TRIALS, metavar="TRIALS",
                        help=f"pre-trained section: besides the random trials, tune every spread workload in every "
                             f"dialect with the xgb tuner for this many trials into the training set (what a "
                             f"warehouse of tuning runs holds; default {TRAIN_TUNED_TRIALS}; 0: random samples only)")
    parser.add_argument("--pretrained-transfer", action="store_true",
                        help="pre-trained section: the guided auto_scheduler and meta_schedule runs also take "
                             "the job option transfer with the training store (seeds: the best program of each of "
                             "its other workloads of the same function, adapted; auto_scheduler also primes its "
                             "own model with their records); the scratch runs stay from scratch")
    parser.add_argument("--pretrained-dialects", metavar="DIALECT[,DIALECT]",
                        default=",".join(PRETRAINED_DIALECTS),
                        help="pre-trained section: tune only these dialects' layers (comma-separated; default all "
                             "three); the others' figures on the last line are nan")
    parser.add_argument("--pretrained-seeds", type=int, default=1, metavar="N",
                        help="pre-trained section: tune each layer's pair of runs (scratch, guided) with seeds 0 .. "
                             "N-1; the speedups are geomeans over layers and seeds (default 1: seed 0)")
    parser.add_argument("--curves", metavar="JSON",
                        help="write the pre-trained benchmark's per-layer curves (best so far per trial) here")
    parser.add_argument("--workdir", help="keep intermediate stores here (default: a temporary directory)")
    args = parser.parse_args()
    pretrained_dialects = tuple(name.strip() for name in args.pretrained_dialects.split(",") if name.strip())
    unknown = sorted(set(pretrained_dialects) - set(PRETRAINED_DIALECTS))
    if unknown or not pretrained_dialects:
        parser.error(f"--pretrained-dialects: unknown dialect(s) {unknown} (known: {', '.join(PRETRAINED_DIALECTS)})")
    if args.pretrained_train_tuned < 0:
        parser.error(f"--pretrained-train-tuned must be at least 0, got {args.pretrained_train_tuned}")
    if args.pretrained_seeds < 1:
        parser.error(f"--pretrained-seeds must be at least 1, got {args.pretrained_seeds}")

    tune_trials = args.tune_trials or (48 if args.quick else 300)
    speed_records = 100_000 if args.quick else 500_000
    memory_records = 300_000 if args.quick else 2_000_000
    values = dict.fromkeys(("featurize_rps", "peak_mib_2m", "zeroshot_top1", "zeroshot_best5", "time_ratio",
                            "random_best5", "zeroshot_conv_top1", "zeroshot_dw_top1", "zeroshot_bmm_top1",
                            "transfer10_top5", "own10_top5", "pretrained_trials_speedup_autotvm",
                            "pretrained_trials_speedup_auto_scheduler", "pretrained_trials_speedup_meta_schedule",
                            "pretrained_final_vs_scratch"), math.nan)
    with tempfile.TemporaryDirectory(prefix="lorien-bench-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.skip_featurize:
            log("featurize: skipped (--skip-featurize)")
        else:
            with section("featurize"):
                log(f"building synthetic stores ({speed_records} and {memory_records} records) ...")
                speed_uri = synthetic_store(work / "speed-store", speed_records)
                featurize_run(speed_uri, work / "speed-features", args.jobs)
                memory_uri = synthetic_store(work / "memory-store", memory_records)
                large = featurize_run(memory_uri, work / "memory-features", args.jobs)
            # Throughput is the larger run's: the smaller one carries the same fixed start-up
            # cost (worker processes, phase 2) over fewer records. Both are printed above.
            values.update(featurize_rps=large["rps"], peak_mib_2m=large["peak_mib"])

        missing = engine_available()
        if missing:
            log(f"zero-shot and transfer: skipped, the engine cannot measure here ({missing})")
        if args.skip_zeroshot:
            log("zero-shot: skipped (--skip-zeroshot)")
        elif not missing:
            held_out = HELD_OUT[:1] if args.quick else HELD_OUT
            train_shapes = TRAIN_SHAPES[::4] if args.quick else TRAIN_SHAPES
            with section("zeroshot_dense"):
                dense = zero_shot_dense(work, train_trials=(8, 16) if args.quick else (32, 64),
                                        tune_trials=tune_trials, held_out=held_out,
                                        train_shapes=train_shapes)
            (work / "zeroshot.json").write_text(json.dumps(dense, indent=2))
            values.update({k: dense[k] for k in ("zeroshot_top1", "zeroshot_best5", "time_ratio", "random_best5")})
        sweep_trials = 32 if args.quick else 64
        if not missing and not (args.skip_zeroshot and args.skip_transfer):
            with section("sweeps"):
                sweeps_uri = random_sweeps(work, args.quick, sweep_trials)
        if not missing and not args.skip_zeroshot:
            with section("zeroshot_networks"):
                networks = zero_shot_networks(work, args.quick, sweeps_uri, tuned_trials=16 if args.quick else 64,
                                              tune_trials=tune_trials)
            (work / "zeroshot-networks.json").write_text(json.dumps(networks, indent=2))
            values.update({f"zeroshot_{op}_top1": networks["operators"][op]["top1"] for op in OPERATORS})
        if args.skip_transfer:
            log("transfer: skipped (--skip-transfer)")
        elif not missing:
            with section("transfer"):
                result = transfer(work, args.quick, sweep_trials, folds=3 if args.quick else 5)
            (work / "transfer.json").write_text(json.dumps(result, indent=2))
            values.update({k: result[k] for k in ("transfer10_top5", "own10_top5")})
        if args.skip_pretrained:
            log("pre-trained models: skipped (--skip-pretrained)")
        elif not missing:
            layer_set = args.pretrained_layers or ("three" if args.quick else "some")
            pretrained_trials = args.pretrained_trials or (QUICK_TRIALS if args.quick else 48 if layer_set in (
                "one", "three") else 300)
            log(f"pre-trained models: {pretrained_trials} trials per run ...")
            with section("pretrained"):
                result = pretrained_benchmark(work, args.quick, pretrained_trials, layer_set, args.pretrained_train_s,
                                              Path(args.pretrained_train_store) if args.pretrained_train_store
                                              else None, pretrained_dialects, args.pretrained_seeds,
                                              args.pretrained_train_tuned, args.pretrained_transfer)
            (work / "pretrained.json").write_text(json.dumps(result, indent=2))
            if args.curves:
                Path(args.curves).write_text(json.dumps(result, indent=2))
            values.update({k: result[k] for k in ("pretrained_trials_speedup_autotvm",
                                                  "pretrained_trials_speedup_auto_scheduler",
                                                  "pretrained_trials_speedup_meta_schedule",
                                                  "pretrained_final_vs_scratch")})
    timings = {**SECTION_SECONDS, "total": sum(SECTION_SECONDS.values())}
    log("section seconds: " + " ".join(f"{name}={seconds:.0f}" for name, seconds in timings.items()))
    formats = {"featurize_rps": ".0f", "peak_mib_2m": ".0f", "time_ratio": ".1f"}
    log(" ".join(f"{name}={value:{formats.get(name, '.3f')}}" for name, value in values.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
