"""The README's first command, as a new user runs it: an empty directory, no store named
anywhere. Everything it measured must land in the default store and be found by a query."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT


def readme_tune_config() -> Path:
    """The config of the README's first command (``pip install -e . && lorien tune CONFIG``)."""
    first_block = re.search(r"```bash\n(.*?)```", (REPO_ROOT / "README.md").read_text(), re.S).group(1)
    command = re.search(r"lorien tune (\S+)", first_block)
    assert command, f"README's first command does not run lorien tune: {first_block!r}"
    return REPO_ROOT / command.group(1)


def lorien(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lorien.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def new_user_env() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "LORIEN_STORE"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def test_readme_first_command_lands_every_trial_in_the_default_store(tmp_path, new_user_env):
    config = readme_tune_config()
    tuned = lorien(tmp_path, new_user_env, "tune", str(config), "--json")
    assert tuned.returncode == 0, tuned.stderr
    summary = json.loads(tuned.stdout)
    assert summary["store"] == f"parquet:{tmp_path / 'lorien-warehouse'}"
    assert summary["trials"] > 0 and summary["committed"] == summary["trials"]
    store_dir = tmp_path / "lorien-warehouse"
    # the serving index is built by the run that committed, not by the first query that reads
    assert list(store_dir.glob("_index/best/*/*.lsi")), sorted(p.name for p in store_dir.rglob("*"))
    files_after_tune = sorted(p for p in store_dir.rglob("*") if p.is_file())

    stats = lorien(tmp_path, new_user_env, "warehouse", "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    counts = json.loads(stats.stdout)
    assert counts["records"] == summary["trials"]
    assert counts["workloads"] == len(summary["workloads"])

    for workload in summary["workloads"]:
        found = lorien(tmp_path, new_user_env, "query", "--target", "llvm", "--workload-key",
                       workload["workload_key"], "--format", "json")
        assert found.returncode == 0, found.stderr
        (best,) = json.loads(found.stdout)
        assert best["cost_us"] == pytest.approx(workload["best_cost_s"] * 1e6, rel=1e-3)
        assert "matched stored target" in found.stderr
    assert sorted(p for p in store_dir.rglob("*") if p.is_file()) == files_after_tune  # queries wrote nothing


def test_a_store_named_by_the_environment_is_used_when_no_flag_names_one(tmp_path, new_user_env):
    elsewhere = tmp_path / "shared-warehouse"
    env = {**new_user_env, "LORIEN_STORE": str(elsewhere)}
    config = tmp_path / "one.yaml"
    config.write_text("trials: 4\nworkloads:\n  - dense: {M: 16, N: 16, K: 16}\n")
    assert lorien(tmp_path, env, "tune", str(config), "--no-progress").returncode == 0
    stats = json.loads(lorien(tmp_path / "..", env, "warehouse", "stats", "--json").stdout)
    assert stats["uri"] == f"parquet:{elsewhere}" and stats["records"] == 4
    assert not (tmp_path / "lorien-warehouse").exists()
