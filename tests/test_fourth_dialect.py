"""The plugin boundary, proven: a fourth dialect shipped outside Lorien (tests/plugins: the
``tiny`` dialect, its own workload, knob and log format, registered through the
``lorien.dialects`` entry point of its own distribution) gets tune, resume, query, export,
ingest and featurize from the CLI as a user runs it, with nothing in ``lorien/`` naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"


def lorien(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "lorien.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A store with the tiny dialect's records of one workload, tuned twice (the second run resumes)."""
    workdir = tmp_path_factory.mktemp("tiny")
    config = workdir / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "dialect": "tiny", "tuner": "grid", "trials": 4, "batch_size": 2, "target": "llvm",
        "measure": {"number": 1, "repeat": 2, "min_repeat_ms": 0},
        "workloads": [{"vscale": {"N": 4096}}]}))
    store = f"parquet:{workdir / 'warehouse'}"
    first = lorien("tune", str(config), "--store", store, "--json", cwd=workdir)
    second = lorien("tune", str(config), "--store", store, "--json", cwd=workdir)
    return workdir, store, first, second


def test_a_fourth_dialect_tunes_into_the_store_and_writes_its_own_log(tuned):
    workdir, store, first, _ = tuned
    assert first.returncode == 0, first.stderr
    (workload,) = json.loads(first.stdout)["workloads"]
    assert (workload["trials"], workload["committed"], workload["errors"]) == (4, 4, 0)
    assert workload["workload_key"] == "vscale#4096"
    log = Path(workload["log_path"])
    assert log.name.endswith(".tiny.jsonl") and len(log.read_text().splitlines()) == 4
    stats = lorien("warehouse", "stats", "--store", store, "--json", cwd=workdir)
    assert json.loads(stats.stdout)["records"] == 4


def test_a_fourth_dialect_resumes_and_measures_nothing_twice(tuned):
    _, _, _, second = tuned
    assert second.returncode == 0, second.stderr
    (workload,) = json.loads(second.stdout)["workloads"]
    assert (workload["trials"], workload["resumed"], workload["committed"]) == (4, 4, 0)


def test_a_fourth_dialects_records_are_queried_by_their_key(tuned):
    workdir, store, _, _ = tuned
    query = lorien("query", "--workload-key", "vscale#4096", "--target", "llvm", "--nbest", "2", "--format",
                   "json", "--store", store, cwd=workdir)
    assert query.returncode == 0, query.stderr
    best = json.loads(query.stdout)
    assert len(best) == 2 and best[0]["cost_us"] <= best[1]["cost_us"] and best[0]["gflops"] > 0
    lines = lorien("query", "--workload-key", "vscale#4096", "--target", "llvm", "--format", "tiny",
                   "--store", store, cwd=workdir)
    assert json.loads(lines.stdout)["tiny"] == 1


def test_a_fourth_dialects_export_ingests_back_as_nothing_new(tuned):
    workdir, store, _, _ = tuned
    exported = workdir / "all.tiny.jsonl"
    export = lorien("export", "--target", "llvm", "--format", "tiny", "--all", "-o", str(exported), "--store", store,
                    cwd=workdir)
    assert export.returncode == 0, export.stderr
    assert len(exported.read_text().splitlines()) == 4
    ingest = lorien("ingest", str(exported), "--store", store, cwd=workdir)
    assert ingest.returncode == 0, ingest.stderr
    assert "4 records, 0 stored, 4 already stored" in ingest.stderr + ingest.stdout


def test_a_fourth_dialects_records_are_featurized(tuned):
    workdir, store, _, _ = tuned
    featurize = lorien("featurize", "--store", store, "-o", str(workdir / "features"), "--jobs", "1", "--json",
                       cwd=workdir)
    assert featurize.returncode == 0, featurize.stderr
    report = json.loads(featurize.stdout)
    assert report["records_featurized"] == 4 and "vscale" in report["templates"]

