"""Warehouse benchmark: ingest speed and memory, best() latency warm and cold, against pandas.

A synthetic AutoTVM log of N records (1,000,000 by default) is made by varying the TopHub
logs in ../shared/data/tophub: each real line becomes several workloads (the batch size of
its first tensor changes) and each workload many measured configs (index, cost, timestamp
change). The log is ingested into a fresh local parquet store in a child process (so its
peak memory is its own), then:

- ``best()`` is timed warm in this process over random workloads (p50 / p99);
- a cold ``lorien query`` process is timed end to end (median of several runs);
- the baseline answers the same queries with a plain pandas scan of the same records
  (boolean filter + sort on an in-memory DataFrame), and cold (a fresh Python process that
  reads the Parquet records with pandas, then filters) for the cold comparison;
- TVM's JSONDatabase is timed loading the same records when apache-tvm is importable.

The last line is ``ingest_rps=... best_p50_ms=... best_p99_ms=... cold_query_s=... speedup_vs_pandas=...``
(speed-up = pandas p50 / best() p50, both warm).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("LORIEN_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
CONFIGS_PER_WORKLOAD = 50

INGEST_CHILD = """
import json, resource, sys, time
from lorien.ingest import ingest_paths
import lorien.formats, lorien.warehouse.parquet
def cpu_s():  # this process and its finished children (the codec's decoding workers)
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
cpu_before = cpu_s()
started = time.perf_counter()
report = ingest_paths([sys.argv[1]], store_uri=sys.argv[2], nbest=int(sys.argv[3]))
seconds = time.perf_counter() - started
print(json.dumps({"records": report.records, "stored": report.stored, "errors": len(report.errors),
                  "seconds": seconds, "cpu_s": cpu_s() - cpu_before,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "peak_rss_workers_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

# The same ingest split in two: parse only (the codec, which may use worker processes), then
# commit the parsed tables (the store, in this process).
SPLIT_CHILD = """
import json, shutil, sys, time
from lorien.formats import iter_log_tables
from lorien.warehouse import open_store
started = time.perf_counter()
tables = [table for table, _ in iter_log_tables(sys.argv[1])]
parse_s = time.perf_counter() - started
shutil.rmtree(sys.argv[2], ignore_errors=True)
store = open_store("parquet:" + sys.argv[2])
started, cpu_started = time.perf_counter(), time.process_time()
with store.transaction(nbest=int(sys.argv[3]), publish_each_batch=True) as commit:
    for table in tables:
        commit.add(table)
print(json.dumps({"records": sum(t.num_rows for t in tables), "parse_s": parse_s,
                  "commit_s": time.perf_counter() - started, "commit_cpu_s": time.process_time() - cpu_started}))
"""

PANDAS_COLD_QUERY = """
import sys
import pandas as pd
frame = pd.read_parquet(sys.argv[1], columns=["workload_key", "target", "cost_s", "config"])
hits = frame[(frame["workload_key"] == sys.argv[2]) & (frame["target"] == sys.argv[3])]
print(hits.dropna(subset=["cost_s"]).nsmallest(1, "cost_s").to_json(orient="records"))
"""


def tophub_lines(data: Path) -> list[dict]:
    lines = []
    for path in sorted((data / "tophub").glob("*.log")):
        for line in path.read_bytes().splitlines():
            if line.strip() and not line.lstrip().startswith(b"#"):
                lines.append(orjson.loads(line))
    return lines


def write_synthetic_log(path: Path, records: int, seed: int = 0) -> int:
    """An AutoTVM log of ``records`` lines varying the TopHub lines, formatted as TVM writes
    them; returns the workload count."""
    rng = random.Random(seed)
    base = tophub_lines(SHARED_DATA)
    workloads = -(-records // CONFIGS_PER_WORKLOAD)
    written = 0
    with open(path, "wb") as out:
        for number in range(workloads):
            line = base[number % len(base)]
            batch = 1 + number // len(base)
            target, task, args, kwargs = line["input"]
            args = json.loads(json.dumps(args))
            if args and isinstance(args[0], list) and args[0][:1] == ["TENSOR"]:
                args[0][1][0] = batch
            cost = line["result"][0][0] * batch
            for config in range(min(CONFIGS_PER_WORKLOAD, records - written)):
                varied = dict(line)
                varied["input"] = [target, task, args, kwargs]
                varied["config"] = dict(line["config"], index=line["config"]["index"] + config)
                varied["result"] = [[cost * (1 + rng.random())], 0, line["result"][2],
                                    line["result"][3] + config]
                out.write(json.dumps(varied).encode() + b"\n")  # TVM writes json.dumps lines
                written += 1
    return workloads


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50,000 records instead of 1,000,000")
    parser.add_argument("--records", type=int, help="number of synthetic records")
    parser.add_argument("--queries", type=int, default=2000, help="warm best() calls timed")
    parser.add_argument("--cold-runs", type=int, default=5, help="cold `lorien query` processes timed")
    parser.add_argument("--nbest", type=int, default=20, help="serving depth committed")
    parser.add_argument("--workdir", help="keep the log and store here (default: a temporary directory)")
    options = parser.parse_args()
    records = options.records or (50_000 if options.quick else 1_000_000)

    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="lorien-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"synthetic-{records}.log"
    store_dir = workdir / "warehouse"
    store_uri = f"parquet:{store_dir}"
    try:
        started = time.perf_counter()
        workloads = write_synthetic_log(log_path, records)
        print(f"synthetic log: {records:,} records, {workloads:,} workloads, "
              f"{log_path.stat().st_size / 2**20:.0f} MiB, made in {time.perf_counter() - started:.1f} s")

        shutil.rmtree(store_dir, ignore_errors=True)
        child = subprocess.run([sys.executable, "-c", INGEST_CHILD, str(log_path), store_uri, str(options.nbest)],
                               capture_output=True, text=True, check=True)
        ingest = json.loads(child.stdout.strip().splitlines()[-1])
        ingest_rps = ingest["records"] / ingest["seconds"]
        workers_rss = ingest["peak_rss_workers_mib"]
        print(f"ingest: {ingest['records']:,} records ({ingest['stored']:,} stored, {ingest['errors']} bad) "
              f"in {ingest['seconds']:.2f} s = {ingest_rps:,.0f} records/s wall, "
              f"{ingest['records'] / ingest['cpu_s']:,.0f} records per CPU second (decoding workers included), "
              f"peak RSS {ingest['peak_rss_mib']:.0f} MiB"
              + (f" (+ decoding workers, largest {workers_rss:.0f} MiB)" if workers_rss else ""))
        split = subprocess.run([sys.executable, "-c", SPLIT_CHILD, str(log_path), str(workdir / "split-store"),
                                str(options.nbest)], capture_output=True, text=True, check=True)
        split = json.loads(split.stdout.strip().splitlines()[-1])
        shutil.rmtree(workdir / "split-store", ignore_errors=True)
        print(f"  the same in two steps: parsing (lorien.formats) {split['records'] / split['parse_s']:,.0f} "
              f"records/s wall; committing (parquet store) {split['records'] / split['commit_s']:,.0f} records/s "
              f"wall, {split['records'] / split['commit_cpu_s']:,.0f} per CPU second")

        from lorien.warehouse import open_store

        store = open_store(store_uri)
        keys = store.scan(columns=["workload_key", "target"]).to_pandas().drop_duplicates()
        rng = random.Random(1)
        queries = [tuple(keys.iloc[rng.randrange(len(keys))]) for _ in range(options.queries)]

        started = time.perf_counter()
        for target_key_query in {store_target for _, store_target in queries}:
            store.best(queries[0][0], target_key_query)  # first lookups build the indexes
            store.best(queries[0][0], target_key_query)
        warmup_s = time.perf_counter() - started
        latencies = []
        for workload_key, target in queries:
            started = time.perf_counter()
            found = store.best(workload_key, target, k=1)
            latencies.append(time.perf_counter() - started)
            assert found, (workload_key, target)
        best_p50_ms, best_p99_ms = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
        print(f"best() warm: p50 {best_p50_ms:.3f} ms, p99 {best_p99_ms:.3f} ms over {len(queries)} queries "
              f"(index build {warmup_s:.2f} s)")

        cold = []
        for workload_key, target in queries[:options.cold_runs]:
            started = time.perf_counter()
            subprocess.run(["lorien", "query", "--workload-key", workload_key, "--target", target,
                            "--store", store_uri, "--format", "json"], check=True, capture_output=True)
            cold.append(time.perf_counter() - started)
        cold_query_s = statistics.median(cold)
        print(f"cold `lorien query`: median {cold_query_s:.3f} s (runs: {', '.join(f'{s:.2f}' for s in cold)})")

        import pandas as pd

        started = time.perf_counter()
        frame = pd.read_parquet(store_dir / "records", columns=["workload_key", "target", "cost_s", "config"])
        pandas_load_s = time.perf_counter() - started
        pandas_latencies = []
        for workload_key, target in queries[:max(20, options.queries // 20)]:
            started = time.perf_counter()
            hits = frame[(frame["workload_key"] == workload_key) & (frame["target"] == target)]
            hits.dropna(subset=["cost_s"]).nsmallest(1, "cost_s")
            pandas_latencies.append(time.perf_counter() - started)
        pandas_p50_ms = percentile(pandas_latencies, 0.5) * 1e3
        del frame
        pandas_cold = []
        for workload_key, target in queries[:options.cold_runs]:
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", PANDAS_COLD_QUERY, str(store_dir / "records"), workload_key, target],
                           check=True, capture_output=True)
            pandas_cold.append(time.perf_counter() - started)
        pandas_cold_s = statistics.median(pandas_cold)
        print(f"pandas baseline: read {records:,} records in {pandas_load_s:.2f} s, filter+sort p50 "
              f"{pandas_p50_ms:.2f} ms warm; a cold pandas process (import, read, filter) {pandas_cold_s:.3f} s")
        speedup = pandas_p50_ms / best_p50_ms
        print(f"speed-up vs pandas: warm {speedup:.0f}x, cold {pandas_cold_s / cold_query_s:.1f}x")

        try:
            import tvm  # noqa: F401
        except ImportError:
            print("TVM JSONDatabase baseline: skipped (apache-tvm is not installed)")
        else:
            print("TVM JSONDatabase baseline: skipped (apache-tvm found, but records are AutoTVM, "
                  "which JSONDatabase does not load)")

        load_1, load_5, _ = os.getloadavg()
        print(f"machine: {os.cpu_count()} cores, load average {load_1:.1f} (1 min) {load_5:.1f} (5 min)")
        print(f"ingest_rps={ingest_rps:.0f} best_p50_ms={best_p50_ms:.3f} best_p99_ms={best_p99_ms:.3f} "
              f"cold_query_s={cold_query_s:.3f} speedup_vs_pandas={speedup:.1f}")
    finally:
        if not options.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
