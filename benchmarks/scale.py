"""Scale and fault-tolerance benchmark of the tuning master (issue 5).

1. N small jobs through a Dask cluster of 2 worker processes while a worker is SIGKILLed
   every 10 seconds: every job must finish, no record lost, none duplicated.
2. The same jobs through the local process pool (no kills): jobs/s beside the Dask run's.
3. DynamoDB commits with concurrent committers (benchmarks/dynamodb_commit.py) against a
   moto server process on 127.0.0.1 (its version is printed on the line): configs lost by
   Lorien's conditional merge vs. a plain read-modify-write.
4. A master process SIGKILLed at a third of the jobs, restarted on its trace, SIGKILLed again
   at two thirds, and resumed to the end: jobs finished before a kill are not measured again
   (``resumed_rerun`` must be 0; ``master_kills`` says how many kills).
5. Mid-job kills (issue 14): jobs of 8 trials through the local pool, each job's first worker
   SIGKILLed halfway; the retry resumes from the batches committed before the kill.
   ``remeasured`` counts committed trials measured again across retries in phases 1, 4 and 5
   (goal 0): records of one job with the same config in the store. ``repeated_in_flight``
   counts, from the synthetic runner's measurement log, measurements that completed in a worker
   SIGKILLed before it committed them: they died with the process and were measured again
   (at most a batch per kill; no system can keep a result its process never handed over).

Small jobs are synthetic by default (each trial sleeps, records carry wall-clock timestamps
so a job measured twice would show up as duplicates); ``--real`` tunes dense 16x16x16 with
2 trials through the autotvm dialect instead (phase 5 needs the synthetic runner's self-kill
and is skipped).

    python benchmarks/scale.py            # 500 jobs
    python benchmarks/scale.py --quick    # 60 jobs, kills every 3 s
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from lorien.tune.jobspec import Job
from lorien.tune.managers.base import source_tag
from lorien.tune.managers.dask import DaskManager
from lorien.tune.managers.local import LocalManager
from lorien.tune.managers.synthetic import synthetic_runner
from lorien.tune.master import run_jobs
from lorien.tune.trace import read_events, read_trace
from lorien.warehouse import open_store

MASTER_SCRIPT = """
import json, sys
from lorien.tune.master import run_jobs
from lorien.tune.managers.synthetic import synthetic_runner
jobs = json.load(open(sys.argv[1]))
runner = synthetic_runner if sys.argv[4] == "synthetic" else None
run_jobs(jobs, store_uri=sys.argv[2], trace_file=sys.argv[3], runner=runner, workers=2, measure_slots=2,
         log=lambda message: None)
"""


def make_jobs(count: int, real: bool, log_dir: Path, trials: int, sleep_s: float) -> list[dict[str, Any]]:
    """``count`` distinct small jobs."""
    if real:
        return [{"dialect": "autotvm", "task_name": "dense_nopack.x86",
                 "args": [["TENSOR", [16, 16], "float32"], ["TENSOR", [16, 16], "float32"], None, "float32"],
                 "target": "llvm", "tuner": "random", "trials": 2, "seed": index} for index in range(count)]
    return [{"dialect": "autotvm", "task_name": "dense", "args": [index + 1, 16, 16], "target": "llvm",
             "trials": trials, "batch_size": 1, "measure": {"sleep_s": sleep_s, "log_dir": str(log_dir)}}
            for index in range(count)]


def audit(jobs: list[dict[str, Any]], store_uri: str, expected_per_job: int | None) -> tuple[int, int]:
    """(records lost, records duplicated) in the store, counted per job against its trials."""
    with open_store(store_uri) as store:
        stored = Counter(store.scan(columns=["source"]).column("source").to_pylist())
    lost = duplicated = 0
    for job in jobs:
        expected = expected_per_job if expected_per_job is not None else int(job["trials"])
        have = stored.get(source_tag(Job.from_spec(job).job_id), 0)
        lost += max(0, expected - have)
        duplicated += max(0, have - expected)
    return lost, duplicated


def remeasured(log_dir: Path, store_uri: str, real: bool) -> tuple[int, int]:
    """(committed trials measured again, measurements repeated in all).

    The first: extra records per (job, config) in the store -- a trial measured again after
    its record was committed (goal 0). The second, for synthetic jobs: extra measurements per
    (job, trial) in the runner's log, which also counts a measurement that completed in a
    worker killed before the worker could commit it (lost with the process, so measured again:
    at most a batch per kill)."""
    with open_store(store_uri) as store:
        table = store.scan(columns=["source", "config"])
    stored = Counter(zip(table.column("source").to_pylist(), table.column("config").to_pylist(), strict=True))
    committed_again = sum(count - 1 for count in stored.values())
    if real:
        return committed_again, committed_again
    log = log_dir / "measured.log"
    measured = Counter(log.read_text().splitlines()) if log.exists() else Counter()
    return committed_again, sum(count - 1 for count in measured.values())


def worker_killer(manager: DaskManager, every_s: float, stop: threading.Event, kills: list[int]) -> None:
    """SIGKILL one worker process of the cluster every ``every_s`` seconds, alternating."""
    turn = 0
    while not stop.wait(every_s):
        pids = manager.worker_pids()
        if not pids:
            continue
        victim = pids[turn % len(pids)]
        turn += 1
        try:
            os.kill(victim, signal.SIGKILL)
            kills.append(victim)
        except ProcessLookupError:
            continue


def run_dask(jobs: list[dict[str, Any]], workdir: Path, runner: Any, kill_every_s: float) -> dict[str, Any]:
    store_uri = f"parquet:{workdir / 'dask-warehouse'}"
    manager = DaskManager(store_uri=store_uri, runner=runner, workers=2, measure_slots=2)
    stop, kills = threading.Event(), []
    killer = threading.Thread(target=worker_killer, args=(manager, kill_every_s, stop, kills), daemon=True)
    try:
        killer.start()
        summary = run_jobs(jobs, manager=manager, store_uri=store_uri, runner=runner, max_retries=10,
                           trace_file=workdir / "dask-trace.jsonl", log=lambda message: None)
    finally:
        stop.set()
        killer.join()
        manager.close()
    lost, duplicated = audit(jobs, store_uri, None if runner else 2)
    again, repeated = remeasured(workdir / "logs-dask", store_uri, runner is None)
    print(f"dask: {summary.line()} workers_killed={len(kills)} jobs_per_s={summary.jobs_per_s:.2f} "
          f"records_lost={lost} records_duplicated={duplicated} remeasured={again} repeated_in_flight={repeated - again}")
    return {"summary": summary, "lost": lost, "duplicated": duplicated, "kills": len(kills), "remeasured": again,
            "in_flight": repeated - again}


def run_local(jobs: list[dict[str, Any]], workdir: Path, runner: Any) -> dict[str, Any]:
    store_uri = f"parquet:{workdir / 'local-warehouse'}"
    manager = LocalManager(store_uri=store_uri, runner=runner, workers=2, measure_slots=2)
    summary = run_jobs(jobs, manager=manager, store_uri=store_uri, runner=runner, log=lambda message: None)
    manager.close()
    lost, duplicated = audit(jobs, store_uri, None if runner else 2)
    print(f"local: {summary.line()} jobs_per_s={summary.jobs_per_s:.2f} records_lost={lost} "
          f"records_duplicated={duplicated}")
    return {"summary": summary, "lost": lost, "duplicated": duplicated}


def run_dynamodb(quick: bool) -> dict[str, float]:
    """Figures of benchmarks/dynamodb_commit.py, NaN where it is missing."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import dynamodb_commit
    except ImportError as exc:
        print(f"dynamodb: benchmarks/dynamodb_commit.py not available ({exc}); ddb_lost=nan")
        return {"ddb_lost": math.nan, "naive_lost": math.nan}
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(name, value)
    committers, records = (4, 10) if quick else (8, 24)
    from importlib.metadata import version

    server = f"moto_server {version('moto')} (one thread)"
    with dynamodb_commit.moto_server() as endpoint:
        result = dynamodb_commit.run(endpoint, committers=committers, records_per_committer=records)
    print(f"dynamodb [{server} at {endpoint}]: {result['committers']} committers, {result['records']} records: "
          f"conditional {result['ddb_rps']} records/s, {result['ddb_lost']} configs lost; "
          f"seed read-modify-write {result['naive_rps']} records/s, {result['naive_lost']} lost")
    return {"ddb_lost": result.get("ddb_lost", math.nan), "naive_lost": result.get("naive_lost", math.nan)}


def run_master_kill(jobs: list[dict[str, Any]], workdir: Path, real: bool, log_dir: Path,
                    kill_points: tuple[float, ...] = (1 / 3, 2 / 3)) -> dict[str, Any]:
    """Run the master as a process and SIGKILL it once a ``kill_points`` fraction of the jobs is
    done, restart it on the same trace, kill it again at the next point, ...; the last run
    finishes in this process. Counts jobs finished before a kill that were measured again."""
    store_uri = f"parquet:{workdir / 'resume-warehouse'}"
    trace_file = workdir / "resume-trace.jsonl"
    jobs_file = workdir / "resume-jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    executions = log_dir / "executions.log"

    def runs() -> Counter:
        return Counter(line.split()[0] for line in executions.read_text().splitlines()) if executions.exists() \
            else Counter()

    snapshots = []  # (jobs done at the kill, trace events at the kill, executions per job at the kill)
    for point in kill_points:
        master = subprocess.Popen([sys.executable, "-c", MASTER_SCRIPT, str(jobs_file), store_uri, str(trace_file),
                                   "real" if real else "synthetic"])
        target_done = max(1, math.ceil(len(jobs) * point))
        while master.poll() is None:
            states = read_trace(trace_file) if trace_file.exists() else {}
            if sum(state.state == "done" for state in states.values()) >= target_done:
                break
            time.sleep(0.05)
        os.kill(master.pid, signal.SIGKILL)
        master.wait()
        done = {job_id for job_id, state in read_trace(trace_file).items() if state.state == "done"}
        snapshots.append((done, len(read_events(trace_file)[0]), runs()))
        print(f"resume: master killed at {len(done)}/{len(jobs)} jobs done (kill point {point:.2f})")
    summary = run_jobs(jobs, store_uri=store_uri, trace_file=trace_file,
                       runner=None if real else synthetic_runner, workers=2, measure_slots=2,
                       log=lambda message: None)
    events, runs_after = read_events(trace_file)[0], runs()
    rerun_jobs: set[str] = set()
    for done, events_at_kill, runs_at_kill in snapshots:
        measured_again = {event["job_id"] for event in events[events_at_kill:]
                          if event["state"] == "done" and not event.get("reused")}
        rerun_jobs |= {job_id for job_id in done if runs_after[job_id] > runs_at_kill[job_id] or job_id in measured_again}
    lost, duplicated = audit(jobs, store_uri, None if not real else 2)
    again, repeated = remeasured(log_dir, store_uri, real)
    print(f"resume: {len(kill_points)} master kills, finished: {summary.line()} rerun_of_finished={len(rerun_jobs)} "
          f"records_lost={lost} records_duplicated={duplicated} remeasured={again} repeated_in_flight={repeated - again}")
    return {"rerun": len(rerun_jobs), "kills": len(kill_points), "summary": summary, "lost": lost,
            "duplicated": duplicated, "remeasured": again, "in_flight": repeated - again}


def run_midjob_kills(count: int, workdir: Path, sleep_s: float) -> dict[str, Any]:
    """``count`` synthetic jobs of 8 trials (a batch each) through the local pool; each job's
    first worker SIGKILLs itself while measuring trial 4, after trials 0-3 were committed."""
    store_uri = f"parquet:{workdir / 'midjob-warehouse'}"
    log_dir, crash_dir = workdir / "logs-midjob", workdir / "midjob-crashed"
    log_dir.mkdir()
    crash_dir.mkdir()
    jobs = [{"dialect": "autotvm", "task_name": "dense", "args": [index + 1, 16, 16], "target": "llvm", "trials": 8,
             "batch_size": 1, "measure": {"sleep_s": sleep_s, "log_dir": str(log_dir), "crash_once_dir": str(crash_dir)}}
            for index in range(count)]
    summary = run_jobs(jobs, store_uri=store_uri, runner=synthetic_runner, workers=2, measure_slots=2,
                       log=lambda message: None)
    lost, duplicated = audit(jobs, store_uri, None)
    again, repeated = remeasured(log_dir, store_uri, False)
    print(f"midjob: {summary.line()} records_lost={lost} records_duplicated={duplicated} remeasured={again} "
          f"repeated_in_flight={repeated - again} "
          f"(before batch commits, the {summary.resumed} resumed trials would have been measured again)")
    return {"summary": summary, "lost": lost, "duplicated": duplicated, "remeasured": again,
            "in_flight": repeated - again}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 jobs, a kill every 3 s")
    parser.add_argument("--jobs", type=int, help="number of jobs (default 500, 60 with --quick)")
    parser.add_argument("--kill-every", type=float, help="seconds between worker kills (default 10, 3 with --quick)")
    parser.add_argument("--sleep-s", type=float, default=0.05, help="synthetic seconds per trial (default 0.05)")
    parser.add_argument("--trials", type=int, default=2, help="synthetic trials per job (default 2)")
    parser.add_argument("--real", action="store_true", help="real autotvm dense 16x16x16 jobs, 2 trials each")
    parser.add_argument("--skip-dynamodb", action="store_true", help="do not run the DynamoDB figures")
    args = parser.parse_args(argv)
    count = args.jobs or (60 if args.quick else 500)
    kill_every_s = args.kill_every or (3.0 if args.quick else 10.0)

    with tempfile.TemporaryDirectory(prefix="lorien-scale-") as temp:
        workdir = Path(temp)
        os.environ["LORIEN_MEASURE_LOCK_DIR"] = str(workdir / "locks")
        runner = None if args.real else synthetic_runner
        log_dirs = {name: workdir / f"logs-{name}" for name in ("dask", "local", "resume")}
        for directory in log_dirs.values():
            directory.mkdir()
        print(f"scale: {count} {'real' if args.real else 'synthetic'} jobs, 2 Dask worker processes, "
              f"a worker killed every {kill_every_s:g} s")
        dask_result = run_dask(make_jobs(count, args.real, log_dirs["dask"], args.trials, args.sleep_s),
                               workdir, runner, kill_every_s)
        local_result = run_local(make_jobs(count, args.real, log_dirs["local"], args.trials, args.sleep_s),
                                 workdir, runner)
        ddb = ({"ddb_lost": math.nan, "naive_lost": math.nan} if args.skip_dynamodb
               else run_dynamodb(args.quick))
        resume_jobs = make_jobs(max(12, count // 10), args.real, log_dirs["resume"], args.trials,
                                max(args.sleep_s, 0.1))
        resume = run_master_kill(resume_jobs, workdir, args.real, log_dirs["resume"])
        midjob = ({"lost": 0, "duplicated": 0, "remeasured": 0, "in_flight": 0} if args.real
                  else run_midjob_kills(max(12, count // 10), workdir, max(args.sleep_s, 0.05)))

    dask_summary = dask_result["summary"]
    lost = dask_result["lost"] + midjob["lost"]  # records missing, counted per job against its trials
    duplicated = dask_result["duplicated"] + resume["duplicated"] + midjob["duplicated"]
    again = dask_result["remeasured"] + resume["remeasured"] + midjob["remeasured"]
    in_flight = dask_result["in_flight"] + resume["in_flight"] + midjob["in_flight"]
    print(f"jobs_done={dask_summary.done} lost={lost} duplicated={duplicated} "
          f"dask_jobs_per_s={dask_summary.jobs_per_s:.2f} "
          f"local_jobs_per_s={local_result['summary'].jobs_per_s:.2f} "
          f"ddb_lost={ddb['ddb_lost']} naive_lost={ddb['naive_lost']} master_kills={resume['kills']} "
          f"resumed_rerun={resume['rerun']} "
          f"remeasured={again} repeated_in_flight={in_flight}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
