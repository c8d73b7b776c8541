"""Shared fixtures: the real public logs in ../shared/data, temporary stores."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest_plugins = ["servers"]

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("LORIEN_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
F32 = "float32"
#: Small layers of the template-free dialects' tests: (registered workload function, args).
LAYER_OPS = {
    "dense": ("dense_layer", [4, 32, 16, False, False, F32]),
    "dense+bias+relu": ("dense_layer", [4, 32, 16, True, True, F32]),
    "batch_matmul": ("batch_matmul_layer", [2, 8, 16, 12, False, False, F32]),
    "conv2d NHWC+bias+relu": ("conv2d_nhwc_layer", [1, 8, 10, 10, 16, 3, 3, [1, 1], [1, 1], [1, 1], True, True, F32]),
    "conv2d NCHW stride 2": ("conv2d_nchw_layer", [1, 8, 9, 9, 16, 3, 3, [2, 2], [1, 1], [1, 1], False, False, F32]),
    "depthwise+bias+relu": ("depthwise_conv2d_nchw_layer", [1, 8, 10, 10, 1, 3, 3, [1, 1], [1, 1], [1, 1], True,
                                                            True, F32]),
}


def matmul_32_dag():
    """A 32x32x32 matmul as a Lorien compute DAG (a meta_schedule workload that tunes in seconds)."""
    from lorien.engine import te
    from lorien.engine.dag import ComputeDAG

    a, b = te.placeholder((32, 32), "float32", "A"), te.placeholder((32, 32), "float32", "B")
    k = te.reduce_axis(32, "k")
    c = te.compute((32, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return ComputeDAG([a, b, c])


def load_benchmark(filename: str, name: str) -> ModuleType:
    """``benchmarks/<filename>`` imported as module ``name`` (registered in ``sys.modules``: its
    dataclasses look their module up); a fixture pops it again when done."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def auto_scheduler_job(**changes) -> dict:
    """A small auto_scheduler tuning job (a fused dense layer, 8 random trials); ``changes`` override."""
    job = {"dialect": "auto_scheduler", "task_name": "dense_layer", "args": [8, 16, 16, True, True, F32],
           "tuner": "random", "trials": 8, "batch_size": 4, "target": "llvm -keys=cpu", "seed": 1,
           "measure": {"repeat": 1}}
    job.update(changes)
    return job


@pytest.fixture(autouse=True)
def main_thread_cpus():
    """The CPUs the test process's main thread may run on, given back after each test: TVM's
    thread pool pins the thread that runs a parallel TVM kernel to one core (a test that runs a
    relax VM or a TVM kernel itself), which would leave every later test on that core."""
    from dialects.meta_schedule.tvm_measure import keeping_thread_affinity

    with keeping_thread_affinity():
        yield


@pytest.fixture(autouse=True)
def journal_dir(tmp_path: Path, monkeypatch) -> Path:
    """Each test's MetaSchedule commit journals (dialects.meta_schedule.database.CommitJournal)
    in its own temporary folder, never under the user's home."""
    folder = tmp_path / "journal"
    monkeypatch.setenv("LORIEN_JOURNAL_DIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def store_uri(tmp_path: Path) -> str:
    """A fresh local parquet store."""
    return f"parquet:{tmp_path / 'warehouse'}"


@pytest.fixture(scope="session")
def featurized(tmp_path_factory):
    """``featurized(records, name)``: the `lorien featurize` output directory of a fresh store
    holding ``records``."""

    def make(records: list, name: str) -> Path:
        from lorien.features import featurize
        from lorien.warehouse import open_store

        root = tmp_path_factory.mktemp(name)
        uri = f"parquet:{root / 'warehouse'}"
        with open_store(uri) as store:
            store.commit(records)
        featurize(root / "features", store=uri, jobs=1, progress=False)
        return root / "features"

    return make


def run_template(task, config, rng):
    """An autotvm template's ``config`` built and run on random inputs: ``(output, NumPy
    reference, schedule, tensors)``."""
    import numpy as np

    from lorien.engine.build import build

    schedule, tensors = task.instantiate(config)
    kernel = build(schedule, tensors)
    inputs = [rng.standard_normal(t.shape).astype(t.dtype) for t in tensors[:-1]]
    output = np.zeros(tensors[-1].shape, dtype=tensors[-1].dtype)
    kernel(*inputs, output)
    (expected,) = task.reference(config, *inputs)
    return output, expected, schedule, tensors
