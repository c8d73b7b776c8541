"""Warehouse benchmark: ingest speed and memory, best() latency warm and cold, against DuckDB
and indexed pandas on the same Parquet files.

A synthetic AutoTVM log of N records (1,000,000 by default) is made by varying the TopHub
logs in ../shared/data/tophub: each real line becomes several workloads (the batch size of
its first tensor changes) and each workload many measured configs (index, cost, timestamp
change). The log is ingested into a fresh local parquet store in a child process (so its
peak memory is its own; with the allocator options `lorien ingest` sets, lorien.allocator), then:

- ``best()`` is timed warm in this process over random workloads (p50 / p99), after its
  serving index is built (build time printed and on the last line);
- a cold ``lorien query`` process is timed end to end (median of several runs);
- DuckDB answers the same queries from the same Parquet files, as a user of those files
  would: ``SELECT config, cost_s FROM read_parquet(..., hive_partitioning = true) WHERE
  target_key = ? AND workload_key = ? AND target = ? AND cost_s IS NOT NULL ORDER BY cost_s
  LIMIT 1`` (the partition filter prunes directories), once over every record file and once
  over Lorien's serving files (``best/``, the top-``nbest`` per workload); warm p50 in one
  connection, and cold (a fresh process: import duckdb, connect, one query). The faster of the
  two is the baseline on the last line;
- pandas answers them from a frame of the same records indexed once: read (timed), sorted by
  (workload_key, target, cost_s) with a MultiIndex (timed), then ``.loc[(key, target)]`` and
  the first row, warm p50;
- TVM's MetaSchedule JSONDatabase, where apache-tvm is importable (otherwise one line says why
  it was skipped). It does not read AutoTVM logs, so this baseline has records of its own: a
  JSONDatabase of ``--tvm-records`` records (20,000 by default, 2,000 with ``--quick``) made from
  the real pairs in ../shared/data/meta_schedule (the workloads unchanged, their records repeated
  with varied run_secs). A fresh process imports TVM, loads the database and asks get_top_k for
  one workload (import time reported apart), then times get_top_k warm; Lorien ingests the same
  database into a fresh parquet store (ingest_paths) and answers the same workloads with
  ``best()`` warm and a cold ``lorien query`` process. Warm latencies are p50 per workload
  (get_top_k's cost depends on the workload), summarized as their mean. TVM's best records are
  checked against Lorien's, and Lorien's export of its best records is loaded back by TVM.

The last line is ``records=... ingest_rps=... best_p50_ms=... best_p99_ms=... index_build_s=...
cold_query_s=... duckdb_p50_ms=... duckdb_cold_s=... vs_duckdb_warm=... vs_duckdb_cold=...
pandas_p50_ms=... pandas_load_s=... pandas_index_s=... vs_pandas_indexed_warm=...
ingest_peak_rss_mib=... ingest_rss_growth=... best_p99_cpu_ms=... first_warm_query_s=...
cold_vs_duckdb=... featurize_peak_mib=... index_bytes_per_record=...`` (and
``tenset_tree_vs_one_log=...`` with ``--tenset-files``); each ``vs_*`` is the baseline's time /
Lorien's (> 1: Lorien is faster).
``ingest_rss_growth`` is the ingest's peak RSS at N records over its peak RSS at
``--rss-reference`` records (1,000,000 by default; a second ingest in the same invocation when N
is larger, 1.00 otherwise). With ``--tenset-files F`` a tree laid out as TenSet's measure
records (F auto-scheduler logs of ``--tenset-lines`` lines, one per task and platform, made from
../shared/data/ansor with DAG-hashed keys) is ingested and timed against one log of the same
lines. Every answer is checked
against Lorien's (the same best cost).
"""

from __future__ import annotations

import argparse
import importlib.util
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
MS_WORKLOAD_FILE = "database_workload.json"
MS_RECORD_FILE = "database_tuning_record.json"

INGEST_CHILD = """
import json, resource, sys, time
from lorien.allocator import release_freed_memory, set_ingest_allocator_env
set_ingest_allocator_env()  # as `lorien ingest` does, before pyarrow loads
from lorien.ingest import ingest_paths
from lorien.warehouse import open_store
from lorien.warehouse.base import build_serving_indexes_of
import lorien.formats, lorien.warehouse.parquet
def cpu_s():  # this process and its finished children (the codec's decoding workers)
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
def peak_mib():  # VmHWM: ru_maxrss survives exec
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) / 1024
cpu_before = cpu_s()
started = time.perf_counter()
report = ingest_paths([sys.argv[1]], store_uri=sys.argv[2], nbest=int(sys.argv[3]), serving_index=False)
commit_peak = peak_mib()
release_freed_memory()  # as ingest_paths does before its index build
try:  # the index build's own peak: "5" resets VmHWM to the present RSS (Linux)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
except OSError:
    pass
index_started = time.perf_counter()
with open_store(sys.argv[2]) as store:
    build_serving_indexes_of(store)
index_s = time.perf_counter() - index_started
print(json.dumps({"records": report.records, "stored": report.stored, "errors": len(report.errors),
                  "seconds": report.seconds, "index_s": index_s, "cpu_s": cpu_s() - cpu_before,
                  "peak_rss_mib": max(commit_peak, peak_mib()), "peak_rss_commit_mib": commit_peak,
                  "peak_rss_index_mib": peak_mib(),
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

# A new process's first best() (after `import lorien.warehouse`): open the store, one query;
# timed from open_store to the answer, and says which index answered.
FIRST_WARM_CHILD = """
import json, sys, time
started = time.perf_counter()
from lorien.warehouse import open_store
imported = time.perf_counter()
store = open_store(sys.argv[1])
found = store.best(sys.argv[2], sys.argv[3], k=1)
answered = time.perf_counter()
assert found
print(json.dumps({"import_s": imported - started, "first_s": answered - imported,
                  "index": sorted({type(index).__name__ for index in store._indexes.values()})}))
"""

# `lorien featurize` of the whole store (jobs=2, as the CLI on 2 cores), its memory sampled
# every 0.1 s: this process's high-water mark (VmHWM: getrusage's ru_maxrss would carry over the
# parent's peak across exec) and the resident memory of its worker processes, which the
# forkserver starts (grandchildren: RUSAGE_CHILDREN never sees them).
FEATURIZE_CHILD = """
import json, sys, threading, time
import psutil
from lorien.features import featurize
if __name__ == "__main__":
    me = psutil.Process()
    peaks = {"workers": 0, "all": 0}
    done = threading.Event()
    def sample():
        while not done.wait(0.1):
            try:
                workers = [child.memory_info().rss for child in me.children(recursive=True)]
            except psutil.Error:
                continue
            peaks["workers"] = max(peaks["workers"], max(workers, default=0))
            peaks["all"] = max(peaks["all"], me.memory_info().rss + sum(workers))
    threading.Thread(target=sample, daemon=True).start()
    started = time.perf_counter()
    report = featurize(sys.argv[2], store=sys.argv[1], jobs=int(sys.argv[3]), progress=False)
    done.set()
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(json.dumps({"seconds": time.perf_counter() - started, "records": report.records_featurized,
                      "peak_rss_mib": hwm / 1024, "peak_rss_workers_mib": peaks["workers"] / 2**20,
                      "peak_rss_all_mib": peaks["all"] / 2**20}))
"""

DUCKDB_QUERY = ("SELECT config, cost_s FROM read_parquet('{files}', hive_partitioning = true) "
                "WHERE target_key = $1 AND workload_key = $2 AND target = $3 AND cost_s IS NOT NULL "
                "ORDER BY cost_s LIMIT 1")

# A fresh process answering one query with DuckDB: import, connect, query (timed by the parent).
DUCKDB_COLD_QUERY = """
import sys
import duckdb
print(duckdb.connect().execute(sys.argv[1], sys.argv[2:]).fetchall())
"""

# A fresh process answering "the best record of this workload" from a MetaSchedule JSONDatabase:
# import TVM, decode the first workload's module, load the database, commit_workload + get_top_k.
# It reports when that answer was ready (epoch seconds, so the parent can time the process end to
# end), then times get_top_k warm over every workload and gives each workload's best run_secs.
TVM_CHILD = """
import json, statistics, sys, time
started = time.perf_counter()
from tvm.s_tir.meta_schedule.database import JSONDatabase, Workload
import_s = time.perf_counter() - started
directory, warm_queries = sys.argv[1], int(sys.argv[2])
with open(directory + "/database_workload.json") as handle:
    entries = [json.loads(line) for line in handle if line.strip()]
started = time.perf_counter()
database = JSONDatabase(path_workload=directory + "/database_workload.json",
                        path_tuning_record=directory + "/database_tuning_record.json", allow_missing=False)
load_s = time.perf_counter() - started
started = time.perf_counter()
first = database.commit_workload(Workload.from_json(entries[0]).mod)
top = database.get_top_k(first, 1)
query_s = time.perf_counter() - started
answered_at = time.time()
assert top, "get_top_k found no record of the first workload"
workloads = [database.commit_workload(Workload.from_json(entry).mod) for entry in entries]
best = {}
for entry, workload in zip(entries, workloads):
    found = database.get_top_k(workload, 1)
    best[str(entry[0])] = statistics.fmean(float(s) for s in found[0].run_secs) if found else None
latencies = {str(entry[0]): [] for entry in entries}
for number in range(warm_queries):
    entry, workload = entries[number % len(entries)], workloads[number % len(workloads)]
    started = time.perf_counter()
    database.get_top_k(workload, 1)
    latencies[str(entry[0])].append(time.perf_counter() - started)
print(json.dumps({"records": len(database), "import_s": import_s, "load_s": load_s, "query_s": query_s,
                  "answered_at": answered_at, "best": best,
                  "warm_s_by_workload": {key: values for key, values in latencies.items() if values}}))
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


TENSET_PLATFORMS = ("llvm -mcpu=skylake-avx512", "llvm -mcpu=core-avx2", "cuda -model=t4")


def write_tenset_tree(root: Path, files: int, lines_per_file: int, data: Path = SHARED_DATA, seed: int = 0) -> int:
    """A directory laid out as TenSet's measure records: ``<platform>/([<dag hash>,<args>],<target>).json``,
    one auto-scheduler log per task and platform, made from the real lines in ``data/ansor`` (each
    file its own DAG hash, its lines varied in cost and timestamp). Returns the records written."""
    rng = random.Random(seed)
    base = [orjson.loads(line) for path in sorted((data / "ansor").glob("*.json"))
            for line in path.read_bytes().splitlines() if line.strip() and not line.lstrip().startswith(b"#")]
    for number in range(files):
        line = base[number % len(base)]
        target = TENSET_PLATFORMS[number % len(TENSET_PLATFORMS)]
        key = orjson.loads(line["i"][0][0])
        key[0] = f"{rng.getrandbits(128):032x}"
        directory = root / target.split()[0] / target.split()[-1].split("=")[-1]
        directory.mkdir(parents=True, exist_ok=True)
        name = f"([{','.join(str(part) for part in key)}],{target.split()[0]}).json"
        with open(directory / name, "wb") as out:
            for index in range(lines_per_file):
                varied = dict(line)
                varied["i"] = [[json.dumps(key), target, *line["i"][0][2:]], line["i"][1]]
                costs, error_no, all_cost, timestamp = line["r"]
                varied["r"] = [[cost * (1 + rng.random()) for cost in costs], error_no, all_cost, timestamp + index]
                out.write(orjson.dumps(varied) + b"\n")
    return files * lines_per_file


def run_child(what: str, args: list[str]) -> subprocess.CompletedProcess:
    """Run a child step; on failure stop with the step's name, exit status and its stderr's tail."""
    child = subprocess.run(args, capture_output=True, text=True)
    if child.returncode != 0:
        tail = "\n".join((child.stderr or child.stdout or "").strip().splitlines()[-20:])
        raise SystemExit(f"benchmark step {what!r} failed (exit status {child.returncode}):\n{tail}")
    return child


def ingest_child(log: Path, store_dir: Path, nbest: int, keep: bool = False) -> dict:
    """Ingest a log into a fresh parquet store in a child process (its peak RSS its own)."""
    shutil.rmtree(store_dir, ignore_errors=True)
    child = run_child(f"ingest of {log}", [sys.executable, "-c", INGEST_CHILD, str(log), f"parquet:{store_dir}",
                                           str(nbest)])
    if not keep:
        shutil.rmtree(store_dir, ignore_errors=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def tenset_rates(workdir: Path, files: int, lines_per_file: int, nbest: int) -> dict:
    """Ingest rate of a TenSet-like tree of ``files`` logs against one log of the same lines."""
    tree = workdir / "tenset-tree"
    shutil.rmtree(tree, ignore_errors=True)
    records = write_tenset_tree(tree, files, lines_per_file)
    single = workdir / "tenset-one.json"
    with open(single, "wb") as out:
        for path in sorted(tree.rglob("*.json")):
            out.write(path.read_bytes())
    rates = {}
    for name, source in (("tree", tree), ("one_log", single)):
        result = ingest_child(source, workdir / f"tenset-warehouse-{name}", nbest)
        assert result["records"] == records and not result["errors"], result
        rates[name] = result
    shutil.rmtree(tree, ignore_errors=True)
    single.unlink()
    tree_rps, one_rps = (records / rates[name]["seconds"] for name in ("tree", "one_log"))
    print(f"TenSet layout: {files:,} files x {lines_per_file} lines: {tree_rps:,.0f} records/s "
          f"(peak RSS {rates['tree']['peak_rss_mib']:.0f} MiB); the same lines as one log {one_rps:,.0f} records/s "
          f"(peak RSS {rates['one_log']['peak_rss_mib']:.0f} MiB); tree / one log {tree_rps / one_rps:.2f}")
    return {"tree_rps": tree_rps, "one_log_rps": one_rps}


def duckdb_baseline(root: Path, glob: str, queries: list[tuple[str, str]], expected: dict, cold_runs: int) -> dict:
    """DuckDB answering ``queries`` from the Parquet files under ``root``: warm p50 in one
    connection (its first query timed apart), and cold processes; every answer checked."""
    import duckdb

    from lorien.target import alternate_key

    sql = DUCKDB_QUERY.format(files=f"{root}/{glob}")
    connection = duckdb.connect()
    started = time.perf_counter()
    connection.execute(sql, [alternate_key(queries[0][1]), *queries[0]]).fetchall()
    first_s = time.perf_counter() - started
    latencies = []
    for query in queries:
        target_key = alternate_key(query[1])  # the partition, as the caller knows it
        started = time.perf_counter()
        rows = connection.execute(sql, [target_key, *query]).fetchall()
        latencies.append(time.perf_counter() - started)
        assert rows and abs(rows[0][1] - expected[query]) <= 1e-12 * expected[query], (query, rows, expected[query])
    cold = []
    for query in queries[:cold_runs]:
        started = time.perf_counter()
        run_child("cold DuckDB query", [sys.executable, "-c", DUCKDB_COLD_QUERY, sql, alternate_key(query[1]), *query])
        cold.append(time.perf_counter() - started)
    result = {"p50_ms": percentile(latencies, 0.5) * 1e3, "p99_ms": percentile(latencies, 0.99) * 1e3,
              "first_s": first_s, "cold_s": statistics.median(cold)}
    print(f"DuckDB {duckdb.__version__} on {root.name}/ ({glob}): first query {first_s:.3f} s, warm p50 "
          f"{result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms over {len(queries)} queries; a cold process "
          f"(import, connect, query) {result['cold_s']:.3f} s")
    return result


def pandas_indexed_baseline(records_dir: Path, queries: list[tuple[str, str]], expected: dict) -> dict:
    """pandas answering ``queries`` from a frame of every record, indexed once by
    (workload_key, target) and sorted by cost; every answer checked."""
    import pandas as pd

    started = time.perf_counter()
    frame = pd.read_parquet(records_dir, columns=["workload_key", "target", "cost_s", "config"])
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    frame = frame.dropna(subset=["cost_s"]).astype({"workload_key": str, "target": str})
    indexed = frame.sort_values(["workload_key", "target", "cost_s"]).set_index(["workload_key", "target"])
    index_s = time.perf_counter() - started
    latencies = []
    for query in queries:
        started = time.perf_counter()
        best = indexed.loc[query].iloc[0]
        latencies.append(time.perf_counter() - started)
        assert abs(best["cost_s"] - expected[query]) <= 1e-12 * expected[query], (query, best, expected[query])
    result = {"p50_ms": percentile(latencies, 0.5) * 1e3, "load_s": load_s, "index_s": index_s}
    print(f"pandas {pd.__version__}, indexed: read {len(frame):,} valid records in {load_s:.2f} s, sorted MultiIndex "
          f"built in {index_s:.2f} s, .loc warm p50 {result['p50_ms']:.3f} ms over {len(queries)} queries")
    return result


def sample_queries(store_dir: Path, count: int, seed: int = 1) -> list[tuple[str, str]]:
    """``count`` random (workload_key, target) pairs of the store, read from its serving files
    (every valid group has rows there) with the key columns dictionary-encoded, so that even a
    20M-record store is sampled in little memory."""
    import pyarrow.parquet as pq

    pairs: set[tuple[str, str]] = set()
    for path in sorted((store_dir / "best").rglob("*.parquet")):
        table = pq.read_table(path, columns=["workload_key", "target"], read_dictionary=["workload_key", "target"])
        unique = table.unify_dictionaries().group_by(["workload_key", "target"], use_threads=False).aggregate([])
        pairs.update(zip(unique.column("workload_key").to_pylist(), unique.column("target").to_pylist(), strict=True))
    ordered = sorted(pairs)
    rng = random.Random(seed)
    return [ordered[rng.randrange(len(ordered))] for _ in range(count)]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def lorien_command() -> str:
    """The ``lorien`` script of this interpreter's environment when it has one, else the one on PATH."""
    beside = Path(sys.executable).parent / "lorien"
    return str(beside) if beside.is_file() else "lorien"


def tvm_unavailable() -> str | None:
    """Why TVM's MetaSchedule JSONDatabase cannot be used here, or None when it can.

    The import is tried in a child process, so a TVM build that crashes on import (a mismatched
    apache-tvm-ffi, say) is reported instead of ending the benchmark.
    """
    if importlib.util.find_spec("tvm") is None:
        return "apache-tvm is not installed"
    probe = subprocess.run([sys.executable, "-c", "import tvm.s_tir.meta_schedule.database"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        return (f"apache-tvm is installed but `import tvm.s_tir.meta_schedule.database` failed "
                f"(exit {probe.returncode}): {lines[-1] if lines else 'no message'}")
    return None


def meta_schedule_sources(data: Path) -> tuple[list[bytes], list[tuple[int, list]]]:
    """Workload lines of every shared MetaSchedule database (renumbered in directory order) and
    its records as (new workload index, [trace, run_secs, target, args_info])."""
    workload_lines: list[bytes] = []
    records: list[tuple[int, list]] = []
    for directory in sorted(path for path in (data / "meta_schedule").iterdir() if path.is_dir()):
        lines = [line for line in (directory / MS_WORKLOAD_FILE).read_bytes().splitlines() if line.strip()]
        for line in (directory / MS_RECORD_FILE).read_bytes().splitlines():
            if line.strip():
                index, fields = orjson.loads(line)
                records.append((len(workload_lines) + index, fields))
        workload_lines.extend(lines)
    if not records:
        raise FileNotFoundError(f"no MetaSchedule database pairs under {data / 'meta_schedule'}")
    return workload_lines, records


def write_meta_schedule_database(directory: Path, records: int, data: Path = SHARED_DATA, seed: int = 0) -> list[str]:
    """A MetaSchedule JSONDatabase pair of ``records`` records in ``directory``; returns the
    workloads' structural hashes.

    The workload file holds the shared databases' workloads unchanged; the record file cycles
    through their records, each copy with its run_secs scaled by a random factor in [1, 2) (so
    every record differs, and the real best stays the best). Lines are written as TVM writes them.
    """
    workload_lines, base = meta_schedule_sources(data)
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MS_WORKLOAD_FILE).write_bytes(b"".join(line + b"\n" for line in workload_lines))
    with open(directory / MS_RECORD_FILE, "wb") as out:
        for number in range(records):
            index, fields = base[number % len(base)]
            varied = list(fields)
            if varied[1] is not None:
                varied[1] = [cost * (1 + rng.random()) for cost in varied[1]]
            out.write(orjson.dumps([index, varied]) + b"\n")
    return [str(orjson.loads(line)[0]) for line in workload_lines]


def run_tvm_child(directory: Path, warm_queries: int) -> dict:
    """Run TVM_CHILD on a database; adds ``process_s``, from spawning it to its first answer."""
    spawned_at = time.time()
    child = subprocess.run([sys.executable, "-c", TVM_CHILD, str(directory), str(warm_queries)],
                           capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"TVM JSONDatabase child failed on {directory} (exit {child.returncode}): "
                           f"{child.stderr.strip()[-2000:]}")
    result = json.loads(child.stdout.strip().splitlines()[-1])
    result["process_s"] = result["answered_at"] - spawned_at
    return result


def same_cost(left: float | None, right: float | None) -> bool:
    """Costs equal up to TVM keeping run_secs as float32-typed values."""
    return left is not None and right is not None and abs(left - right) <= 1e-6 * max(abs(left), abs(right))


def tvm_baseline(workdir: Path, records: int, queries: int, cold_runs: int, nbest: int) -> str:
    """TVM's JSONDatabase beside Lorien on the same MetaSchedule records; prints the details and
    returns the summary line."""
    from lorien.formats import write_log
    from lorien.ingest import ingest_paths
    from lorien.warehouse import open_store
    from lorien.warehouse.query import export_records

    database = workdir / "meta_schedule-database"
    shashes = write_meta_schedule_database(database, records)
    print(f"MetaSchedule database: {records:,} records of {len(shashes)} real workloads, "
          f"{(database / MS_RECORD_FILE).stat().st_size / 2**20:.0f} MiB")

    tvm = run_tvm_child(database, queries)
    assert tvm["records"] == records, (tvm["records"], records)
    tvm_p50_ms = {shash: percentile(tvm["warm_s_by_workload"][shash], 0.5) * 1e3 for shash in shashes}
    tvm_warm_ms = statistics.fmean(tvm_p50_ms.values())
    print(f"  TVM: import {tvm['import_s']:.2f} s, JSONDatabase load {tvm['load_s']:.2f} s "
          f"({records / tvm['load_s']:,.0f} records/s), commit_workload+get_top_k {tvm['query_s'] * 1e3:.1f} ms; "
          f"fresh process to first answer {tvm['process_s']:.2f} s; get_top_k warm p50 by workload: "
          f"{', '.join(f'{shash} {value:.4f} ms' for shash, value in tvm_p50_ms.items())}")

    store_dir = workdir / "meta_schedule-warehouse"
    shutil.rmtree(store_dir, ignore_errors=True)
    store_uri = f"parquet:{store_dir}"
    report = ingest_paths([database], store_uri=store_uri, nbest=nbest)
    assert report.records == records and not report.errors, report.summary()
    ingest_rps = report.records / report.seconds
    store = open_store(store_uri)
    targets = dict(store.scan(columns=["workload_key", "target"]).to_pandas()
                   .drop_duplicates("workload_key").itertuples(index=False))
    pairs = [(shash, targets[shash]) for shash in shashes]
    lorien_best = {shash: store.best(shash, target, k=1)[0].cost_s for shash, target in pairs}
    for shash, target in pairs:  # warm up, as for the AutoTVM store
        store.best(shash, target, k=1)
    latencies: dict[str, list[float]] = {shash: [] for shash in shashes}
    for number in range(queries):
        shash, target = pairs[number % len(pairs)]
        started = time.perf_counter()
        found = store.best(shash, target, k=1)
        latencies[shash].append(time.perf_counter() - started)
        assert found, (shash, target)
    lorien_p50_ms = {shash: percentile(values, 0.5) * 1e3 for shash, values in latencies.items()}
    best_p50_ms = statistics.fmean(lorien_p50_ms.values())
    cold = []
    for number in range(cold_runs):
        shash, target = pairs[number % len(pairs)]
        started = time.perf_counter()
        run_child("cold lorien query", [lorien_command(), "query", "--workload-key", shash, "--target", target,
                                        "--store", store_uri, "--format", "json"])
        cold.append(time.perf_counter() - started)
    cold_s = statistics.median(cold)
    print(f"  Lorien: ingest {report.records:,} records in {report.seconds:.2f} s ({ingest_rps:,.0f} records/s), "
          f"best() warm p50 by workload: {', '.join(f'{shash} {value:.4f} ms' for shash, value in lorien_p50_ms.items())} "
          f"({queries} queries in all), "
          f"cold `lorien query` median {cold_s:.3f} s over {cold_runs} runs")

    disagree = [shash for shash in shashes if not same_cost(tvm["best"].get(shash), lorien_best[shash])]
    print("  best records: TVM and Lorien agree on every workload" if not disagree else
          f"  best records DISAGREE on {disagree}: TVM {tvm['best']}, Lorien {lorien_best}")
    exported = workdir / "meta_schedule-export"
    shutil.rmtree(exported, ignore_errors=True)
    export_dirs = {target: exported / str(n) for n, target in enumerate(sorted({target for _, target in pairs}))}
    written = sum(write_log(export_records(store, target, "meta_schedule"), "meta_schedule", directory)
                  for target, directory in export_dirs.items())
    store.close()
    round_trip = [run_tvm_child(directory, 0) for directory in export_dirs.values()]
    loaded = {shash: cost for result in round_trip for shash, cost in result["best"].items()}
    lost = [shash for shash in shashes if not same_cost(loaded.get(shash), lorien_best[shash])]
    print(f"  round trip: Lorien's export (best per workload, {written} records) loaded by TVM: "
          + ("the same best records" if not lost else f"MISMATCH for {lost}: TVM read {loaded}, Lorien {lorien_best}"))

    return (f"TVM JSONDatabase baseline: {records:,} records; load+top-k in a fresh process "
            f"{tvm['process_s']:.2f} s (import {tvm['import_s']:.2f} s, load {tvm['load_s']:.2f} s); "
            f"get_top_k warm p50 {tvm_warm_ms:.4f} ms; Lorien: ingest {ingest_rps:,.0f} records/s, "
            f"best() p50 {best_p50_ms:.4f} ms, cold query {cold_s:.3f} s (warm p50s: mean over the "
            f"{len(shashes)} workloads); "
            f"speed-up: warm {tvm_warm_ms / best_p50_ms:.2f}x, cold {tvm['process_s'] / cold_s:.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50,000 records instead of 1,000,000")
    parser.add_argument("--records", type=int, help="number of synthetic records")
    parser.add_argument("--queries", type=int, default=2000, help="warm best() calls timed")
    parser.add_argument("--cold-runs", type=int, default=5, help="cold `lorien query` processes timed")
    parser.add_argument("--nbest", type=int, default=20, help="serving depth committed")
    parser.add_argument("--tvm-records", type=int,
                        help="records of the MetaSchedule database for the TVM baseline "
                             "(default 20,000; 2,000 with --quick)")
    parser.add_argument("--workdir", help="keep the log and store here (default: a temporary directory)")
    parser.add_argument("--rss-reference", type=int, default=1_000_000,
                        help="records of the reference ingest for ingest_rss_growth (peak RSS at --records / "
                             "peak RSS at this size; run in the same invocation when --records is larger)")
    parser.add_argument("--tenset-files", type=int, default=0,
                        help="also time a TenSet-like tree of this many auto-scheduler logs against one log of "
                             "the same lines (0: skip)")
    parser.add_argument("--tenset-lines", type=int, default=500, help="lines per log of the TenSet-like tree")
    parser.add_argument("--light", action="store_true",
                        help="leave out what holds every record in memory (the parse/commit split, the pandas "
                             "baseline, the in-memory serving index): the default above 3,000,000 records")
    parser.add_argument("--reuse-store", action="store_true",
                        help="with --workdir: measure the store an earlier run left there (its ingest figures "
                             "are read back from ingest.json) instead of ingesting again")
    parser.add_argument("--skip-featurize", action="store_true", help="no featurize_peak_mib (lorien featurize)")
    parser.add_argument("--preload", action="store_true",
                        help="time the warm best() calls on a store opened with ?preload=true (each "
                             "persisted serving index read and mapped as it is opened, as a serving process "
                             "would; the open's time is printed as 'index open or build')")
    parser.add_argument("--featurize-jobs", type=int, default=2, help="worker processes of the featurize run")
    options = parser.parse_args()
    records = options.records or (50_000 if options.quick else 1_000_000)
    tvm_records = options.tvm_records or (2_000 if options.quick else 20_000)

    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="lorien-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"synthetic-{records}.log"
    store_dir = workdir / "warehouse"
    store_uri = f"parquet:{store_dir}"
    light = options.light or records > 3_000_000
    try:
        started = time.perf_counter()
        if log_path.exists():  # a kept --workdir: the same log (seeded) is not made again
            workloads = -(-records // CONFIGS_PER_WORKLOAD)
            print(f"synthetic log: {records:,} records, {workloads:,} workloads, "
                  f"{log_path.stat().st_size / 2**20:.0f} MiB, kept from an earlier run in {workdir}")
        else:
            workloads = write_synthetic_log(log_path, records)
            print(f"synthetic log: {records:,} records, {workloads:,} workloads, "
                  f"{log_path.stat().st_size / 2**20:.0f} MiB, made in {time.perf_counter() - started:.1f} s")

        saved = workdir / "ingest.json"  # what the ingest of a kept --workdir measured
        reused = options.reuse_store and saved.exists() and store_dir.exists()
        if reused:
            ingest, reference = json.loads(saved.read_text())
            print(f"(--reuse-store: the store and its ingest figures are those of an earlier run in {workdir})")
        else:
            ingest, reference = ingest_child(log_path, store_dir, options.nbest, keep=True), None
        ingest_rps = ingest["records"] / ingest["seconds"]
        workers_rss = ingest["peak_rss_workers_mib"]
        print(f"ingest: {ingest['records']:,} records ({ingest['stored']:,} stored, {ingest['errors']} bad) "
              f"in {ingest['seconds']:.2f} s = {ingest_rps:,.0f} records/s wall, "
              f"{ingest['records'] / ingest['cpu_s']:,.0f} records per CPU second (decoding workers included), "
              f"peak RSS {ingest['peak_rss_mib']:.0f} MiB"
              + (f" (+ decoding workers, largest {workers_rss:.0f} MiB)" if workers_rss else "")
              + f"; then the persisted serving index built in {ingest.get('index_s', 0):.2f} s"
              + (f" (peak RSS of the commits {ingest['peak_rss_commit_mib']:.0f} MiB, of the index build "
                 f"{ingest['peak_rss_index_mib']:.0f} MiB)" if "peak_rss_commit_mib" in ingest else ""))
        index_bytes = sum(path.stat().st_size for path in (store_dir / "_index").rglob("*.lsi"))
        index_bytes_per_record = index_bytes / ingest["records"]
        print(f"  persisted serving index: {index_bytes / 2**20:,.0f} MiB on disk, {index_bytes_per_record:.0f} bytes "
              f"per record "
              f"(serving files {sum(p.stat().st_size for p in (store_dir / 'best').rglob('*.parquet')) / 2**20:,.0f} MiB, "
              f"record files {sum(p.stat().st_size for p in (store_dir / 'records').rglob('*.parquet')) / 2**20:,.0f} MiB)")
        reference_rss = ingest["peak_rss_mib"]
        if records > options.rss_reference:
            if reference is None:
                reference_log = workdir / f"synthetic-{options.rss_reference}.log"
                write_synthetic_log(reference_log, options.rss_reference)
                reference = ingest_child(reference_log, workdir / "reference-warehouse", options.nbest)
                reference_log.unlink()
            reference_rss = reference["peak_rss_mib"]
            print(f"reference ingest: {reference['records']:,} records, "
                  f"{reference['records'] / reference['seconds']:,.0f} records/s wall, peak RSS {reference_rss:.0f} MiB"
                  + (f" (commits {reference['peak_rss_commit_mib']:.0f}, index build "
                     f"{reference['peak_rss_index_mib']:.0f})" if "peak_rss_commit_mib" in reference else ""))
        rss_growth = ingest["peak_rss_mib"] / reference_rss
        if options.workdir and not reused:
            saved.write_text(json.dumps([ingest, reference]))
        tenset = tenset_rates(workdir, options.tenset_files, options.tenset_lines, options.nbest) \
            if options.tenset_files else None
        if light:
            print("  (--light: the parse/commit split, the pandas baseline and the in-memory index are left out)")
        else:
            split = run_child("split-store ingest", [sys.executable, "-c", SPLIT_CHILD, str(log_path),
                                                     str(workdir / "split-store"), str(options.nbest)])
            split = json.loads(split.stdout.strip().splitlines()[-1])
            shutil.rmtree(workdir / "split-store", ignore_errors=True)
            print(f"  the same in two steps: parsing (lorien.formats) {split['records'] / split['parse_s']:,.0f} "
                  f"records/s wall; committing (parquet store) {split['records'] / split['commit_s']:,.0f} records/s "
                  f"wall, {split['records'] / split['commit_cpu_s']:,.0f} per CPU second")

        queries = sample_queries(store_dir, options.queries)
        # Time Lorien's processes as installed: with its modules' bytecode cached (pip compiles it;
        # a checkout under PYTHONDONTWRITEBYTECODE would compile them again in every process).
        import compileall

        import lorien
        compileall.compile_dir(Path(lorien.__file__).parent, quiet=1)
        first_warm = []
        for workload_key, target in queries[:options.cold_runs]:
            child = run_child("first warm query", [sys.executable, "-c", FIRST_WARM_CHILD, store_uri, workload_key,
                                                   target])
            first_warm.append(json.loads(child.stdout.strip().splitlines()[-1]))
        first_warm_query_s = statistics.median(run["first_s"] for run in first_warm)
        print(f"a new process's first best() (open_store + query, after imports of "
              f"{statistics.median(run['import_s'] for run in first_warm):.3f} s): median {first_warm_query_s:.3f} s "
              f"over {len(first_warm)} processes, answered by {first_warm[0]['index']}")

        from lorien.warehouse import open_store

        # A serving process does not run beside its own ingest's write-back: the pages an ingest
        # (or a test) just wrote are flushed before the warm timing, so that their write-back
        # does not sit inside the lookups' tail (the 20M ingest leaves about 16 GB to write).
        synced = time.perf_counter()
        os.sync()
        print(f"os.sync() before the warm timing: {time.perf_counter() - synced:.2f} s")
        store = open_store(store_uri + ("?preload=true" if options.preload else ""))

        started = time.perf_counter()
        for target_key_query in {store_target for _, store_target in queries}:
            store.best(queries[0][0], target_key_query)  # first lookups build the indexes
            store.best(queries[0][0], target_key_query)
        warmup_s = time.perf_counter() - started
        latencies, cpu_latencies = [], []
        import resource

        usage_before = resource.getrusage(resource.RUSAGE_SELF)
        for workload_key, target in queries:
            cpu_started, started = time.thread_time(), time.perf_counter()
            found = store.best(workload_key, target, k=1)
            latencies.append(time.perf_counter() - started)
            cpu_latencies.append(time.thread_time() - cpu_started)
            assert found, (workload_key, target)
        usage_after = resource.getrusage(resource.RUSAGE_SELF)
        faults_per_query = (usage_after.ru_minflt - usage_before.ru_minflt) / len(queries)
        # a major fault is a page read from disk: the index's pages were not in the page cache
        disk_faults_per_query = (usage_after.ru_majflt - usage_before.ru_majflt) / len(queries)
        best_p50_ms, best_p99_ms = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
        # the thread's CPU time per query: what the lookup costs, without the time this process
        # waited for a core (on a loaded machine that wait, not the lookup, makes the wall p99)
        best_p99_cpu_ms = percentile(cpu_latencies, 0.99) * 1e3
        print(f"best() warm: p50 {best_p50_ms:.3f} ms, p99 {best_p99_ms:.3f} ms over {len(queries)} queries "
              f"(CPU time per query: p50 {percentile(cpu_latencies, 0.5) * 1e3:.3f} ms, p99 {best_p99_cpu_ms:.3f} ms; "
              f"{faults_per_query:.2f} page faults per query, {disk_faults_per_query:.2f} from disk) "
              f"(index open or build {warmup_s:.2f} s, {', '.join(sorted({type(i).__name__ for i in store._indexes.values()}))}"
              + (", preloaded" if options.preload else "") + ")")
        if not light:  # the same queries from the index held in memory (as an S3 store keeps it)
            memory = open_store(store_uri)
            memory._files.is_local = False
            started = time.perf_counter()
            for target_key_query in {store_target for _, store_target in queries}:
                memory.best(queries[0][0], target_key_query)
                memory.best(queries[0][0], target_key_query)
            memory_build_s = time.perf_counter() - started
            memory_latencies = []
            for workload_key, target in queries:
                started = time.perf_counter()
                memory.best(workload_key, target, k=1)
                memory_latencies.append(time.perf_counter() - started)
            print(f"  the in-memory index (built in each process; S3 stores): build {memory_build_s:.2f} s, "
                  f"p50 {percentile(memory_latencies, 0.5) * 1e3:.3f} ms, p99 {percentile(memory_latencies, 0.99) * 1e3:.3f} ms")
            del memory

        cold = []
        for workload_key, target in queries[:options.cold_runs]:
            started = time.perf_counter()
            run_child("cold lorien query", [lorien_command(), "query", "--workload-key", workload_key,
                                            "--target", target, "--store", store_uri, "--format", "json"])
            cold.append(time.perf_counter() - started)
        cold_query_s = statistics.median(cold)
        print(f"cold `lorien query`: median {cold_query_s:.3f} s (runs: {', '.join(f'{s:.2f}' for s in cold)})")

        expected = {query: store.best(*query, k=1)[0].cost_s for query in queries}
        duckdb_queries = queries[:200] if light else queries  # DuckDB scans a partition per query
        duckdb_results = {name: duckdb_baseline(store_dir / subdir, glob, duckdb_queries, expected, options.cold_runs)
                          for name, subdir, glob in (("records", "records", "*/*/*.parquet"),
                                                     ("serving view", "best", "*/*.parquet"))}
        duckdb_name, duckdb = min(duckdb_results.items(), key=lambda item: item[1]["p50_ms"])
        duckdb_cold_s = min(result["cold_s"] for result in duckdb_results.values())
        pandas = None if light else pandas_indexed_baseline(store_dir / "records", queries, expected)
        vs_duckdb = duckdb["p50_ms"] / best_p50_ms
        vs_pandas = pandas["p50_ms"] / best_p50_ms if pandas else float("nan")
        print(f"best() against the baselines (warm p50): DuckDB on the {duckdb_name} {vs_duckdb:.1f}x, "
              f"indexed pandas {vs_pandas:.1f}x; cold process: DuckDB {duckdb_cold_s / cold_query_s:.2f}x")

        featurize_peak_mib = float("nan")
        if not options.skip_featurize:
            features = workdir / "features"
            shutil.rmtree(features, ignore_errors=True)
            child = subprocess.run([sys.executable, "-c", FEATURIZE_CHILD, store_uri, str(features),
                                    str(options.featurize_jobs)], capture_output=True, text=True)
            shutil.rmtree(features, ignore_errors=True)
            if child.returncode != 0:
                print(f"featurize failed (exit {child.returncode}): {child.stderr.strip()[-2000:]}")
            else:
                featurized = json.loads(child.stdout.strip().splitlines()[-1])
                # the whole process tree (main, forkserver, workers), as benchmarks/costmodel.py counts it
                featurize_peak_mib = max(featurized["peak_rss_all_mib"], featurized["peak_rss_mib"])
                print(f"featurize: {featurized['records']:,} records in {featurized['seconds']:.1f} s, peak RSS "
                      f"{featurized['peak_rss_mib']:.0f} MiB (largest worker {featurized['peak_rss_workers_mib']:.0f} "
                      f"MiB; all its processes together at most {featurized['peak_rss_all_mib']:.0f} MiB)")

        why_not = "--light" if light else tvm_unavailable()
        if why_not:
            print(f"TVM JSONDatabase baseline: skipped ({why_not})")
        else:
            print(tvm_baseline(workdir, tvm_records, options.queries, options.cold_runs, options.nbest))

        load_1, load_5, _ = os.getloadavg()
        print(f"machine: {os.cpu_count()} cores, load average {load_1:.1f} (1 min) {load_5:.1f} (5 min)")
        print(f"records={ingest['records']} ingest_rps={ingest_rps:.0f} best_p50_ms={best_p50_ms:.3f} "
              f"best_p99_ms={best_p99_ms:.3f} index_build_s={warmup_s:.2f} cold_query_s={cold_query_s:.3f} "
              f"duckdb_p50_ms={duckdb['p50_ms']:.3f} duckdb_cold_s={duckdb_cold_s:.3f} "
              f"vs_duckdb_warm={vs_duckdb:.1f} vs_duckdb_cold={duckdb_cold_s / cold_query_s:.2f} "
              + (f"pandas_p50_ms={pandas['p50_ms']:.3f} pandas_load_s={pandas['load_s']:.2f} "
                 f"pandas_index_s={pandas['index_s']:.2f} vs_pandas_indexed_warm={vs_pandas:.1f} " if pandas else "")
              + (f"tenset_tree_vs_one_log={tenset['tree_rps'] / tenset['one_log_rps']:.2f} " if tenset else "")
              + f"ingest_peak_rss_mib={ingest['peak_rss_mib']:.0f} ingest_rss_growth={rss_growth:.2f} "
              f"best_p99_cpu_ms={best_p99_cpu_ms:.3f} first_warm_query_s={first_warm_query_s:.3f} "
              f"cold_vs_duckdb={duckdb_cold_s / cold_query_s:.2f} featurize_peak_mib={featurize_peak_mib:.0f} "
              f"index_bytes_per_record={index_bytes_per_record:.0f}")
    finally:
        if not options.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
