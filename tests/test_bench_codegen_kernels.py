"""benchmarks/codegen_kernels.py on a store of two tuned candidates, and which builds skip LLVM's
machine scheduler (measurement builds) and which keep it (kernels built to be used)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
from conftest import matmul_32_dag

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "codegen_kernels.py"


def test_every_setting_builds_and_times_the_store_s_kernels(tmp_path):
    from dialects.meta_schedule.tuning import tune_dag
    from lorien.record import TuningRecord
    from lorien.warehouse import open_store

    store = f"parquet:{tmp_path / 'store'}"
    measure = {"number": 1, "repeat": 1, "min_repeat_ms": 0}
    tune_dag(matmul_32_dag(), {"trials": 2, "batch_size": 2, "measure": measure, "tuner": "random"}, store)
    with open_store(store) as opened:
        valid = sum(TuningRecord.from_row(row).is_valid for row in opened.scan().to_pylist())
    assert valid >= 1
    result = subprocess.run([sys.executable, str(BENCHMARK), store, "--rounds", "2"],
                            capture_output=True, text=True, check=True)
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(f"codegen_kernels: {valid} kernels of")
    last = lines[-1]
    assert last.startswith(f"kernels={valid} build_time_vs_engine=engine_again:")
    ratios = dict(pair.split(":") for pair in last.split("kernel_time_vs_engine=")[1].split(","))
    assert set(ratios) == {"engine_again", "measurement", "no_lsr"}
    assert all(0.2 < float(value) < 5 for value in ratios.values())


def test_an_empty_store_is_said_and_fails(tmp_path):
    result = subprocess.run([sys.executable, str(BENCHMARK), str(tmp_path / "none"), "--settings", "measurement"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "no valid engine-measured record" in result.stdout


def test_measurement_builds_skip_the_machine_scheduler_and_their_kernels_stay_right(monkeypatch):
    """A tuning candidate's build (the worker's ``build`` task) sets the measurement options (no pre-RA
    machine scheduler) before it compiles; a build of this process (``compile_object``, as ``build()``
    compiles) never asks for them; the candidate's kernel passes the runner's check against NumPy."""
    from dialects.meta_schedule.compile import DagReference, TraceBuilder, dag_text
    from dialects.meta_schedule.space import TraceSpace
    from lorien.engine import lower, measure
    from lorien.engine.codegen import llvm as llvm_codegen
    from lorien.engine.measure import MeasureInput, MeasureOption
    from lorien.engine.schedule import create_schedule

    set_options = []
    monkeypatch.setattr(llvm_codegen.llvm, "set_option", lambda owner, option: set_options.append(option))
    llvm_codegen.measurement_codegen_options.cache_clear()
    llvm_codegen._codegen_options.cache_clear()
    try:
        dag = matmul_32_dag()
        llvm_codegen.compile_object(llvm_codegen.render(lower(create_schedule(dag.outputs[0]), dag.io_tensors)))
        assert set_options == ["-post-RA-scheduler=false"]  # what build() compiles with: the scheduler kept
        text = dag_text(dag)
        trace = orjson.dumps(TraceSpace(dag).get(0)).decode()
        artifact = measure._task_build(pickle.dumps(MeasureInput(TraceBuilder(text, trace), DagReference(text))))
        assert set_options == ["-post-RA-scheduler=false", "-enable-misched=false"]
    finally:
        llvm_codegen.measurement_codegen_options.cache_clear()
        llvm_codegen._codegen_options.cache_clear()
    costs = measure._task_run((artifact, DagReference(text), MeasureOption(number=1, repeat=1), float("inf")))
    assert len(costs) == 1 and np.isfinite(costs[0])
