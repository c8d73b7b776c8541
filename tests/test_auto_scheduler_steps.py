"""Ansor steps replayed on Lorien's engine: TVM's logs build kernels that compute what NumPy does."""

from __future__ import annotations

import json
import re

import numpy as np
import orjson
import pytest

from dialects.auto_scheduler.compile import check_kernel, compile_record, replay_log
from dialects.auto_scheduler.steps import StepError, replay_steps, split_lengths
from lorien import workload_registry
from lorien.engine import build, te
from lorien.engine.replay import auto_unroll
from lorien.formats import read_log

SMALL_MATMUL = workload_registry.make_workload_key("matmul_add", [16, 12, 24, "float32"])


def _replay(key: str, steps: list) -> float:
    """Largest error of the kernel of ``steps`` against NumPy (raises when it differs)."""
    replay = replay_steps(workload_registry.workload_dag(key), steps)
    return check_kernel(build(replay.schedule, replay.args), key)


def test_tvm_matmul_record_replays_into_a_kernel_matching_numpy(shared_data):
    record = read_log(shared_data / "ansor" / "matmul.json").records[0]
    kernel = compile_record(record)
    assert [a.name for a in kernel.args] == ["A", "B", "C", "out"] and kernel.notes == []
    assert check_kernel(kernel, record.workload_key) < 1e-3


def test_tvm_cuda_conv2d_record_runs_on_the_cpu_with_gpu_bindings_as_loops(shared_data):
    record = read_log(shared_data / "ansor" / "conv2d.json").records[0]
    kernel = compile_record(record, target=record.target)  # a cuda target still builds for this CPU
    assert kernel.notes == ["GPU bindings run as CPU loops: blockIdx.x -> parallel, threadIdx.x -> serial, "
                            "vthread -> serial"]
    check_kernel(kernel, record.workload_key)


def test_replaying_the_shared_logs_reports_every_record(shared_data):
    outcomes = [o for name in ("matmul.json", "conv2d.json", "resnet-50-NHWC-B1-llvm.json")
                for o in replay_log(shared_data / "ansor" / name)]
    ok = [o for o in outcomes if o.status == "ok"]
    unregistered = [o for o in outcomes if o.status == "unregistered"]
    assert len(ok) == 2 and len(unregistered) == len(outcomes) - 2
    assert "d7b65649a4dd54becea0a52aabbc5af5" in unregistered[0].message
    assert unregistered[0].summary().startswith("resnet-50-NHWC-B1-llvm.json:3 ")


def test_a_line_that_does_not_parse_is_reported_and_the_replay_goes_on(shared_data, tmp_path):
    log = tmp_path / "broken.json"
    lines = (shared_data / "ansor" / "matmul.json").read_text().splitlines()
    log.write_text("\n".join([lines[1][:80], lines[1]]) + "\n")
    first, second = replay_log(log, check=False)
    assert first.status == "failed" and first.summary().startswith("broken.json:1: failed: ")
    assert second.status == "ok" and second.line == 2


def test_split_inner_to_outer_and_follow_splits_take_the_lengths_of_the_split_they_follow():
    steps = [["SP", 2, 0, 1024, [2, 1, 4], 1], ["FSP", 4, 0, 0, 2], ["FFSP", 4, 0, [0, 0], 2, 0]]
    assert split_lengths(steps, 0) == ([2, 1, 4], True)
    assert split_lengths(steps, 1) == ([2, 4], True)  # the last levels multiplied
    assert split_lengths(steps, 2) == ([16], False)  # level 2 of both, by nparts


def test_cache_read_rfactor_split_by_nparts_and_storage_align_replay_and_compute_right():
    steps = [["CHR", 1, "local", [2]],  # B.local, a stage after B: matmul is now stage 3
             ["SP", 3, 2, 12, [4], 1], ["RF", 3, 3, 0],  # k split, k.1 factored: matmul.rf is stage 3
             ["SP", 3, 2, 24, [2, 3], 0],  # j of matmul.rf -> 2 x 3 x 4 by nparts
             ["CA", 2, 3, 1], ["SA", 2, 0, 16, 1], ["AN", 4, 0, 3]]
    replay = replay_steps(workload_registry.workload_dag(SMALL_MATMUL), steps)
    assert replay.stage_names == ["A", "B", "B.local", "matmul.rf", "matmul", "C", "out"]
    assert _replay(SMALL_MATMUL, steps) < 1e-3


def test_auto_unroll_unrolls_inner_loops_while_extent_times_statements_fit():
    key = workload_registry.make_workload_key("matmul_add", [8, 8, 8, "float32"])
    steps = [["SP", 2, 0, 8, [2, 2], 1], ["SP", 2, 4, 8, [8], 1], ["RE", 2, [0, 1, 4, 5, 2, 3]],
             ["AN", 2, 5, 2]]
    replay = replay_steps(workload_registry.workload_dag(key), steps)
    matmul = replay.schedule["matmul"]
    # loops i.0 (2), i.1 (2), k.0 (1), k.1 (8), i.2 (2), j (8, vectorized: one statement)
    assert auto_unroll(matmul, matmul.leaf[0], 16) == ["i.inner", "k.inner"]  # 2 x 1, then 8 x 2 = 16
    # k.0 has extent 1; i.1 encloses the reduction's initialization: the walk stops there
    assert matmul.annotations == {"j": "vectorized", "i.inner": "unrolled", "k.inner": "unrolled"}


def test_auto_unroll_pragma_is_applied_when_the_replay_ends():
    key = workload_registry.make_workload_key("matmul_add", [8, 8, 8, "float32"])
    steps = [["SP", 2, 1, 8, [8], 1], ["PR", 2, 0, "auto_unroll_max_step$64"], ["AN", 2, 2, 2]]
    replay = replay_steps(workload_registry.workload_dag(key), steps)
    assert replay.schedule["matmul"].annotations == {"j.inner": "vectorized", "k": "unrolled"}
    assert _replay(key, steps) < 1e-3


@pytest.mark.parametrize(("step", "message"), [
    (["SP", 2, 0, 100, [4], 1], "extent 16, the record says 100"),
    (["SP", 9, 0, 16, [4], 1], "stage 9 is not one of the 5 stages"),
    (["SP", 0, 0, 16, [4], 1], "stage 0 ('A') is an input"),
    (["SP", 2, 7, 16, [4], 1], "iterator 7 is not one of the 3 loops"),
    (["SP", 2, 0, 16, [None], 1], "not all positive integers"),
    (["FSP", 4, 0, 0, 1], "step 0 is not an earlier SP step"),
    (["RE", 2, [0, 1]], "not a permutation of the 3 loops"),
    (["AN", 2, 0, 11], "annotation 11 (tensorize) has no CPU equivalent"),
    (["PR", 2, 0, "debug_skip_region"], "pragma 'debug_skip_region' is not supported"),
    (["CI", 2], "reduction and cannot be inlined"),
    (["XX", 2], "unknown step kind 'XX'"),
])
def test_a_step_that_cannot_be_applied_is_reported_with_its_index_and_why(step, message):
    steps = [["CR", 4], step]
    with pytest.raises(StepError, match=re.escape(message)) as info:
        replay_steps(workload_registry.workload_dag(SMALL_MATMUL), steps)
    assert info.value.index == 1 and info.value.step == step
    assert str(info.value).startswith(f"step 1 {json.loads(json.dumps(step))}")


def test_a_record_of_another_computation_is_caught_by_its_split_extent(shared_data):
    record = read_log(shared_data / "ansor" / "matmul.json").records[0]
    other = record.with_changes(workload_key=SMALL_MATMUL)
    with pytest.raises(StepError, match="step 0 .*extent 16, the record says 1024"):
        compile_record(other)


def test_a_record_of_a_registered_hashed_dag_replays(monkeypatch):
    from lorien.engine.dag import ComputeDAG

    monkeypatch.setattr(workload_registry, "WORKLOAD_FUNC_REGISTRY", dict(workload_registry.WORKLOAD_FUNC_REGISTRY))
    a = te.placeholder((8, 6), name="a")
    k = te.reduce_axis(6, name="k")
    out = te.compute((8,), lambda i: te.sum(a[i, k] * a[i, k], axis=k), name="sumsq")
    key = workload_registry.register_workload_tensors(ComputeDAG([a, out]).workload_key(), [a, out])
    steps = [["SP", 1, 1, 6, [3], 1], ["RF", 1, 2, 1], ["AN", 1, 0, 3]]
    assert _replay(key, steps) < 1e-4
    x = np.ones((8, 6), "float32")
    assert workload_registry.reference_of(key)(x)[0].tolist() == [6.0] * 8


def test_steps_of_a_record_survive_json(shared_data):
    record = read_log(shared_data / "ansor" / "conv2d.json").records[0]
    steps = orjson.loads(record.config)
    dag = workload_registry.workload_dag(record.workload_key)
    assert replay_steps(dag, json.loads(json.dumps(steps))).stage_names[-1] == "T_relu"


def test_cli_apply_replays_an_ansor_log_line_and_measures_it_beside_the_logged_latency(shared_data, capsys):
    from lorien.cli import main

    code = main(["apply", "--log", str(shared_data / "ansor" / "matmul.json"), "--line", "2",
                 "--measure", '{"repeat": 1, "build_timeout_s": 60, "run_timeout_s": 60}'])
    out = capsys.readouterr().out
    assert code == 0 and 'workload  ["matmul_add", 1024, 1024, 1024, "float32"]' in out
    assert "logged    4.4742 ms on llvm -keys=cpu" in out and "GFLOPS" in out


def test_cli_apply_of_steps_by_workload_key_commits_an_ansor_record(store_uri, capsys):
    from lorien.cli import main

    steps = '[["SP", 2, 1, 24, [8], 1], ["AN", 2, 2, 2], ["AN", 2, 0, 3]]'
    assert main(["apply", "--workload-key", SMALL_MATMUL, "--config", steps, "--store", store_uri, "--commit"]) == 0
    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        (record,) = store.best(SMALL_MATMUL, store.scan(columns=["target"]).column("target")[0].as_py())
    assert record.dialect == "auto_scheduler" and orjson.loads(record.config) == json.loads(steps)


@pytest.mark.parametrize(("argv", "message"), [
    (["--log", "resnet-50-NHWC-B1-llvm.json", "--line", "3"],
     "resnet-50-NHWC-B1-llvm.json:3: DAG-hashed workload d7b65649a4dd54becea0a52aabbc5af5"),
    (["--workload-key", SMALL_MATMUL, "--config", '[["SP", 2, 5, 24, [8], 1]]'],
     "step 0 ['SP', 2, 5, 24, [8], 1]: iterator 5 is not one of the 3 loops of stage 'matmul'"),
    (["--log", "matmul.json", "--line", "1"], "matmul.json:1 is a comment or blank"),
])
def test_cli_apply_errors_name_the_record_or_the_step(shared_data, capsys, argv, message):
    from lorien.cli import main

    argv = [str(shared_data / "ansor" / a) if a.endswith(".json") else a for a in argv]
    assert main(["apply", *argv]) == 1
    assert message in capsys.readouterr().err
