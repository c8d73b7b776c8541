"""`lorien tune` with the orchestration flags, on real autotvm jobs (JIT-compiled kernels)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from lorien.cli import main
from lorien.tune.trace import read_events, read_trace
from lorien.warehouse import open_store

DENSE_16 = {"dialect": "autotvm", "task_name": "dense_nopack.x86",
            "args": [["TENSOR", [16, 16], "float32"], ["TENSOR", [16, 16], "float32"], None, "float32"],
            "target": "llvm", "tuner": "random", "trials": 2}

CONFIG = """
target: llvm
trials: 2
workloads:
  - dense: {M: 16, N: 16, K: 16}
  - dense: {M: 16, N: 32, K: 16}
  - task_name: dense_nopack.x86
    args: [["TENSOR", [16, -4], "float32"], ["TENSOR", [16, 16], "float32"], null, "float32"]
"""


@pytest.fixture(autouse=True)
def private_measure_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("LORIEN_MEASURE_LOCK_DIR", str(tmp_path / "locks"))


def test_tune_job_runs_one_spec_here_and_a_second_run_measures_nothing(tmp_path, store_uri, capsys):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(DENSE_16))
    assert main(["tune", "--job", str(spec), "--store", store_uri]) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["records"], first["reused"], first["error"]) == (2, False, "")
    assert main(["tune", "--job", str(spec), "--store", store_uri]) == 0
    assert json.loads(capsys.readouterr().out)["reused"] is True
    with open_store(store_uri) as store:
        table = store.scan(columns=["source", "error_no"])
    assert table.num_rows == 2
    assert set(table.column("source").to_pylist()) == {f"lorien-job:{first['job_id']}"}


def test_tune_job_refuses_a_python_tag_with_a_clear_message(tmp_path, store_uri, capsys):
    spec = tmp_path / "evil.yaml"
    spec.write_text("dialect: !!python/object/apply:os.getcwd []\ntarget: llvm\n")
    assert main(["tune", "--job", str(spec), "--store", store_uri]) == 1
    assert "evil.yaml:1: refused YAML tag" in capsys.readouterr().err


def test_a_config_through_the_local_manager_fails_only_the_bad_workload(tmp_path, store_uri, capsys):
    config = tmp_path / "tune.yaml"
    config.write_text(CONFIG)
    trace_file = tmp_path / "trace.jsonl"
    code = main(["tune", str(config), "--manager", "local", "--workers", "2", "--trace-file", str(trace_file),
                 "--store", store_uri])
    assert code == 1
    assert "jobs=3 done=2 failed=1" in capsys.readouterr().out
    states = read_trace(trace_file)
    failed = [state for state in states.values() if state.state == "failed"]
    assert len(failed) == 1 and "WorkloadError" in failed[0].error and "K=-4" in failed[0].error
    assert sum(state.records for state in states.values() if state.state == "done") == 4


def test_a_manager_run_shows_each_job_and_prints_json_with_the_store(tmp_path, store_uri, capsys):
    config = tmp_path / "tune.yaml"
    config.write_text(CONFIG)
    code = main(["tune", str(config), "--manager", "local", "--workers", "2", "--store", store_uri, "--json"])
    captured = capsys.readouterr()
    assert code == 1
    summary = json.loads(captured.out)
    assert (summary["store"], summary["done"], summary["failed"], summary["records"]) == (store_uri, 2, 1, 4)
    lines = [line for line in captured.err.splitlines() if line.startswith("tune: ")]
    assert [line.split(" - ")[0] for line in lines] == ["tune: 1/3 jobs", "tune: 2/3 jobs", "tune: 3/3 jobs"]
    assert lines[-1].endswith("done 2, running 0, failed 1")


def test_tune_without_config_or_job_says_what_to_give(capsys):
    assert main(["tune", "--manager", "local"]) == 1
    assert "give a tuning CONFIG.yaml" in capsys.readouterr().err


@pytest.mark.slow
def test_a_killed_lorien_tune_master_resumes_and_no_finished_job_is_measured_twice(tmp_path):
    workloads = "\n".join(f"  - dense: {{M: 16, N: {16 * (index + 1)}, K: 16}}" for index in range(5))
    config = tmp_path / "tune.yaml"
    config.write_text(f"target: llvm\ntrials: 2\nworkloads:\n{workloads}\n")
    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    trace_file = tmp_path / "trace.jsonl"
    command = [sys.executable, "-m", "lorien.cli", "tune", str(config), "--manager", "local", "--workers", "1",
               "--trace-file", str(trace_file), "--store", store_uri]
    master = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and master.poll() is None:
        if trace_file.exists() and any(s.state == "done" for s in read_trace(trace_file).values()):
            break
        time.sleep(0.05)
    os.kill(master.pid, signal.SIGKILL)
    master.wait()
    done_before = {job_id for job_id, state in read_trace(trace_file).items() if state.state == "done"}
    assert 1 <= len(done_before) < 5
    events_before = len(read_events(trace_file)[0])

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)

    assert resumed.returncode == 0, resumed.stderr
    assert f"skipped={len(done_before)}" in resumed.stdout
    new_events = read_events(trace_file)[0][events_before:]
    assert not {event["job_id"] for event in new_events if event["state"] == "running"} & done_before
    assert all(state.state == "done" for state in read_trace(trace_file).values())
    with open_store(store_uri) as store:
        per_job = Counter(store.scan(columns=["source"]).column("source").to_pylist())
    assert sorted(per_job.values()) == [2] * 5
    assert Path(trace_file).read_text().count('"state": "done"') == 5
