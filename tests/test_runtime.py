"""The engine runtime: built with llvmlite by default (no C compiler anywhere), or from C.

Each runtime runs in a process of its own ($LORIEN_RUNTIME is read once per process), with a
fresh cache directory, so nothing compiled earlier can stand in for what is being tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

PARALLEL_KERNEL = """
import json, os
import numpy as np
from lorien.engine import build, runtime, te
from lorien.engine.schedule import create_schedule

a = te.placeholder((4096,), name="a")
out = te.compute((4096,), lambda i: a[i] * 2.0 + 1.0, name="out")
s = create_schedule(out)
o, inner = s[out].split(out.op.axis[0], factor=64)
s[out].parallel(o)
s[out].vectorize(inner)
kernel = build(s, [a, out])
x = np.arange(4096, dtype="float32")
y = np.zeros(4096, "float32")
kernel(x, y)
pid = os.fork()  # a forked measurement worker starts the pool again
if pid == 0:
    z = np.zeros(4096, "float32")
    kernel(x, z)
    os._exit(0 if np.allclose(z, x * 2 + 1) else 3)
_, status = os.waitpid(pid, 0)
print(json.dumps({"runtime": runtime.backend(), "threads": runtime.num_threads(),
                  "correct": bool(np.allclose(y, x * 2 + 1)), "child_status": status,
                  "cost_s": min(kernel.time(x, y, number=10, repeat=3))}))
"""


def without_a_compiler(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a slim image: no gcc on PATH, $CC pointing nowhere, an empty cache."""
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir(exist_ok=True)
    env = {name: value for name, value in os.environ.items() if name not in ("LORIEN_RUNTIME", "LORIEN_STORE")}
    env.update(PATH=str(empty_bin), CC=str(tmp_path / "no-such-cc"), LORIEN_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(REPO_ROOT), **extra)
    return env


def run_python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("runtime", ["llvm", "c"])
def test_both_runtimes_run_parallel_kernels_before_and_after_fork(tmp_path, runtime):
    env = {**os.environ, "LORIEN_RUNTIME": runtime, "LORIEN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO_ROOT), "LORIEN_NUM_THREADS": "2"}
    done = run_python(PARALLEL_KERNEL, env, tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {**result, "runtime": runtime, "threads": 2, "correct": True, "child_status": 0}
    assert result["cost_s"] > 0


def test_the_default_runtime_needs_no_c_compiler(tmp_path):
    done = run_python(PARALLEL_KERNEL, without_a_compiler(tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runtime"] == "llvm"
    assert not list((tmp_path / "cache").glob("runtime-*.so"))


def test_the_c_runtime_without_a_compiler_says_what_to_do(tmp_path):
    done = run_python(PARALLEL_KERNEL, without_a_compiler(tmp_path, LORIEN_RUNTIME="c"), tmp_path)
    assert done.returncode != 0
    assert "LORIEN_RUNTIME=llvm needs none" in done.stderr


def test_an_unknown_runtime_name_is_refused(tmp_path):
    done = run_python(PARALLEL_KERNEL, without_a_compiler(tmp_path, LORIEN_RUNTIME="gpu"), tmp_path)
    assert done.returncode != 0
    assert "LORIEN_RUNTIME='gpu' is not a runtime" in done.stderr


def test_lorien_tune_commits_its_records_with_no_c_compiler(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text("trials: 4\nbatch_size: 2\nworkloads:\n  - dense: {M: 16, N: 16, K: 16}\n"
                      "  - conv2d: {C: 8, H: 8, W: 8, K: 16, kernel: 3, stride: 1, padding: 1, layout: NCHWc}\n")
    env = without_a_compiler(tmp_path)
    tuned = subprocess.run([sys.executable, "-m", "lorien.cli", "tune", str(config), "--json"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert tuned.returncode == 0, tuned.stderr
    summary = json.loads(tuned.stdout)
    assert summary["engine_runtime"] == "llvm"
    assert summary["errors"] == 0 and summary["committed"] == summary["trials"] == 8
    stats = subprocess.run([sys.executable, "-m", "lorien.cli", "warehouse", "stats", "--json"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert json.loads(stats.stdout)["valid_records"] == 8
