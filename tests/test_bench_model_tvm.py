"""benchmarks/model_tvm.py: one clear line without TVM; its models are what it says they are."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    yield load_benchmark("model_tvm.py", "bench_model_tvm")
    sys.modules.pop("bench_model_tvm", None)


def test_without_tvm_the_benchmark_prints_one_line_and_exits_0(bench, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "tvm" or m.startswith("tvm.")] + ["tvm"]:
        monkeypatch.setitem(sys.modules, name, None)  # apache-tvm not installed
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("model_tvm: skipped: needs the tvm extra")


def test_an_unknown_model_is_refused_by_name(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--models", "resnet18,vgg"])
    assert "unknown model(s) ['vgg']" in capsys.readouterr().err


def test_the_mobilenet_block_has_depthwise_convs_clip_and_a_residual_add(bench, tmp_path):
    from lorien.models import extract_models

    path, shapes = bench.mobilenet_block_onnx(tmp_path / "block.onnx")
    assert shapes == {}
    tasks = {task.op: task for task in extract_models([str(path)]).tasks}
    assert tasks["depthwise_conv2d"].params["C"] == 192 and dict(tasks["depthwise_conv2d"].epilogues) == {
        "bias+relu6": 1}
    conv_epilogues = {pattern for task in extract_models([str(path)]).tasks if task.op == "conv2d"
                      for pattern in task.epilogues}
    assert conv_epilogues == {"bias+relu6", "bias+add"}


def test_the_bert_layer_has_random_weights_so_that_builds_can_be_compared(bench, tmp_path):
    import onnx
    from onnx import numpy_helper

    path, shapes = bench.bert_layer_onnx(tmp_path / "bert.onnx")
    assert shapes == {"hidden_states": [1, 64, 256]}
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    assert np.std(weights["attention.query.weight"]) > 0.01 and weights["attention.query.weight"].shape == (256, 256)
    assert np.allclose(weights["ffn.norm.weight"].mean(), 1.0, atol=0.2)


def test_tvm_row_extracts_its_tasks_itself_and_times_it(bench, tmp_path):
    """TVM's row counts its own extraction (ONNX frontend, passes, extract_tasks) as Lorien's row
    counts ``lorien extract``; the tasks are those the benchmark selected, or it stops."""
    tvm = pytest.importorskip("tvm")
    import tvm.s_tir.meta_schedule as ms

    from dialects.meta_schedule.relax_tasks import fused_relax_module

    path, shapes = bench.mobilenet_block_onnx(tmp_path / "block.onnx")
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    selected = bench.select_tasks(ms.relax_integration.extract_tasks(fused_relax_module(str(path), shapes), target), 2)
    tasks, extract_s = bench.extract_as_tvm_user(path, shapes, target, 2, selected)
    assert [bench.task_key(t) for t in tasks] == [bench.task_key(t) for t in selected] and len(tasks) == 2
    assert extract_s > 0
    with pytest.raises(SystemExit, match="other tasks"):
        bench.extract_as_tvm_user(path, shapes, target, 2, selected[:1])


def test_a_cost_model_needs_the_xgb_tuner_and_a_model_directory(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--cost-model", str(tmp_path)])
    assert "--cost-model guides the xgb tuner: add --tuner xgb (got no --tuner)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--tuner", "xgb", "--cost-model", str(tmp_path)])
    assert f"cost_model {tmp_path}: no cost model there" in capsys.readouterr().err


def test_a_training_store_trains_the_guide_of_the_xgb_tuner_only(bench, tmp_path, capsys):
    for argv in (["--train-store", str(tmp_path)], ["--tuner", "random", "--train-store", str(tmp_path)],
                 ["--tuner", "xgb", "--cost-model", str(tmp_path), "--train-store", str(tmp_path)]):
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert "--train-store trains the model guiding --tuner xgb" in capsys.readouterr().err


def test_the_lorien_row_is_labelled_with_its_tuner(bench):
    assert bench.lorien_label(None, None) == "random (job default)"
    assert bench.lorien_label("xgb", None) == "xgb"
    assert bench.lorien_label("xgb", Path("/models/program")) == "xgb, cost model program"


def test_builds_are_timed_in_rotating_turns_each_after_its_own_untimed_call(bench):
    """No build is always timed after the same one (a build timed right after the untuned model
    paid for that model's data), and each timed call follows an untimed call of the same build."""
    calls = []
    medians = bench.time_taking_turns({name: (lambda name=name: calls.append(name)) for name in "abc"}, rounds=3)
    assert set(medians) == {"a", "b", "c"} and all(value >= 0 for value in medians.values())
    assert calls == ["a", "a", "b", "b", "c", "c", "b", "b", "c", "c", "a", "a", "c", "c", "a", "a", "b", "b"]


def test_short_builds_get_enough_rounds_for_the_timed_seconds_asked(bench):
    """The fastest build decides: a build that takes 1 ms a call gets 50 rounds for 0.05 s, never
    fewer than the rounds asked nor more than the cap; each build is called twice (an untimed
    call first) to find how long a call takes."""
    clock = [0.0]
    calls_made = []

    def build(name, seconds):
        def call():
            calls_made.append(name)
            clock[0] += seconds
        return call

    calls = {"fast": build("fast", 0.001), "slow": build("slow", 0.01)}
    original = bench.time.perf_counter
    bench.time.perf_counter = lambda: clock[0]
    try:
        assert bench.rounds_for(calls, rounds=10, min_timed_s=0.05) == 50
        assert calls_made == ["fast", "fast", "slow", "slow"]
        assert bench.rounds_for(calls, rounds=80, min_timed_s=0.05) == 80
        assert bench.rounds_for(calls, rounds=10, min_timed_s=100.0, cap=400) == 400
        assert bench.rounds_for({}, rounds=7, min_timed_s=1.0) == 7
    finally:
        bench.time.perf_counter = original
