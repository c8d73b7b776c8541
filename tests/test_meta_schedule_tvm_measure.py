"""TVM-true latencies: a record says what measured it; a meta_schedule job with
``measure_with: tvm`` is built and timed by TVM; export says how many records carry the
engine's latencies, or re-measures them with TVM."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import matmul_32_dag

from lorien.cli import main
from lorien.errors import ConfigError
from lorien.record import MEASURED_BY_ENGINE, MEASURED_BY_LOG, MEASURED_BY_TVM, TuningRecord
from lorien.tune.job import TuneJob
from lorien.warehouse import open_store

MEASURE = {"number": 20, "repeat": 5, "min_repeat_ms": 0}


def _without_tvm(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "tvm" or m.startswith("tvm.")] + ["tvm"]:
        monkeypatch.setitem(sys.modules, name, None)  # apache-tvm not installed


def _record(build: str) -> TuningRecord:
    return TuningRecord(dialect="meta_schedule", target="llvm", target_key="llvm_cpu", workload_key="1",
                        task_name="t", args="[]", layout="NA", config="[]", costs=[1e-6], build=build)


def test_a_record_says_whether_the_engine_tvm_or_an_ingested_log_measured_it():
    from lorien.engine.build import build_info

    assert json.loads(build_info())["measured_by"] == MEASURED_BY_ENGINE
    assert _record(build_info()).measured_by == MEASURED_BY_ENGINE
    assert _record('{"engine": "lorien-0.1.0"}').measured_by == MEASURED_BY_ENGINE  # stored before the field
    assert _record('{"measured_by": "tvm", "tvm_version": "0.27.0"}').measured_by == MEASURED_BY_TVM
    assert _record("{}").measured_by == MEASURED_BY_LOG


def test_measure_with_tvm_without_tvm_is_an_error_naming_what_to_install(monkeypatch):
    _without_tvm(monkeypatch)
    spec = {"dialect": "meta_schedule", "task_name": "dense_layer", "args": [4, 8, 16, False, False, "float32"],
            "measure_with": "tvm"}
    with pytest.raises(ConfigError, match=r"measure_with: tvm.*pip install 'lorien\[tvm\]'"):
        TuneJob.from_spec(spec)
    assert TuneJob.from_spec({**spec, "measure_with": "lorien"}).option("measure_with") == "lorien"


def test_measure_with_names_who_may_measure():
    spec = {"dialect": "meta_schedule", "task_name": "dense_layer", "args": [4, 8, 16, False, False, "float32"],
            "measure_with": "tvm-rpc"}
    with pytest.raises(ConfigError, match=r"'measure_with' must be one of \['lorien', 'tvm'\], got 'tvm-rpc'"):
        TuneJob.from_spec(spec)


def test_export_says_how_many_records_carry_engine_latencies(tmp_path, store_uri, shared_data, capsys):
    from dialects.meta_schedule.tuning import tune_dag

    tune_dag(matmul_32_dag(), {"trials": 2, "batch_size": 2, "measure": MEASURE, "tuner": "random"}, store_uri)
    assert main(["ingest", str(shared_data / "meta_schedule" / "matmul_128"), "--store", store_uri]) == 0
    capsys.readouterr()
    out = tmp_path / "db"
    assert main(["export", "--all", "--target", "llvm", "--format", "meta_schedule", "--lorien-workloads",
                 "--store", store_uri, "-o", str(out)]) == 0
    assert "2 of 34 records carry latencies measured by Lorien's engine, not by TVM" in capsys.readouterr().err
    assert main(["export", "--all", "--target", "llvm", "--format", "meta_schedule", "--lorien-workloads",
                 "--store", store_uri, "-o", str(tmp_path / "db2"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == 34 and summary["engine_measured_records"] == 2
    assert summary["remeasured_with_tvm"] == 0


def test_export_measure_with_tvm_without_tvm_is_an_error_and_writes_nothing(tmp_path, store_uri, monkeypatch,
                                                                             capsys):
    from dialects.meta_schedule.tuning import tune_dag

    tune_dag(matmul_32_dag(), {"trials": 2, "batch_size": 2, "measure": MEASURE, "tuner": "random"}, store_uri)
    _without_tvm(monkeypatch)
    out = tmp_path / "db"
    assert main(["export", "--target", "llvm", "--format", "meta_schedule", "--lorien-workloads",
                 "--measure-with-tvm", "--store", store_uri, "-o", str(out)]) == 1
    assert "pip install 'lorien[tvm]'" in capsys.readouterr().err
    assert not out.exists()


def _same_order(measured_s, direct_s):
    """Whether a latency in a record is in TVM's unit and magnitude for that trace: a check of
    units (ms or us written as seconds are 1000x off), never of speed. Two timings of one kernel
    on a busy shared machine differ by 2-5x at times, so the bound is 20x either way; that the
    latency is TVM's and not the engine's is checked apart, by value."""
    return direct_s / 20 <= measured_s <= direct_s * 20


def _tvm_latency_s(dag, trace, measure):
    """The trace timed with TVM's own API, nothing of Lorien's measuring in between: the
    fastest repeat (what a busy shared machine disturbs least)."""
    tvm = pytest.importorskip("tvm")
    from tvm import s_tir

    from dialects.meta_schedule.tvm_database import tvm_block_names, tvm_module_of
    from lorien.engine.cpu import host_cpu_name

    schedule = s_tir.Schedule(tvm_module_of(dag))
    s_tir.schedule.Trace.apply_json_to_schedule(tvm_block_names(trace), schedule)
    kernel = tvm.tirx.build(schedule.mod, target=tvm.target.Target({"kind": "llvm", "mcpu": host_cpu_name()}))
    rng = np.random.default_rng(0)
    arrays = [tvm.runtime.tensor(rng.uniform(-1, 1, t.shape).astype(t.dtype)) for t in dag.io_tensors]
    evaluator = kernel.time_evaluator(kernel.entry_name, tvm.cpu(0), number=measure["number"],
                                      repeat=measure["repeat"], min_repeat_ms=measure["min_repeat_ms"])
    return min(evaluator(*arrays).results)


@pytest.mark.tvm
def test_a_job_measured_with_tvm_commits_records_with_tvm_s_latency(store_uri, capsys):
    tvm = pytest.importorskip("tvm")
    from dialects.meta_schedule.tuning import tune_dag

    dag = matmul_32_dag()
    progress = tune_dag(dag, {"trials": 3, "batch_size": 3, "measure": MEASURE, "tuner": "random",
                              "measure_with": "tvm"}, store_uri)
    with open_store(store_uri) as store:
        records = [TuningRecord.from_row(row) for row in store.scan({}).to_pylist()]
    assert len(records) == 3 and all(record.error_no == 0 for record in records)
    for record in records:
        build = json.loads(record.build)
        assert record.measured_by == MEASURED_BY_TVM and build["tvm_version"] == tvm.__version__
        direct_s = _tvm_latency_s(dag, orjson.loads(record.config), MEASURE)
        assert _same_order(min(record.costs), direct_s)

    best = min(records, key=lambda record: record.cost_s)
    capsys.readouterr()
    assert main(["query", "--workload-key", best.workload_key, "--target", "llvm", "--format", "json",
                 "--store", store_uri]) == 0
    answer = json.loads(capsys.readouterr().out)[0]
    assert answer["measured_by"] == "tvm" and answer["cost_us"] == pytest.approx(progress.best_cost_s * 1e6, rel=1e-3)


@pytest.mark.tvm
def test_export_measure_with_tvm_writes_tvm_s_latencies_of_engine_measured_records(tmp_path, store_uri, capsys):
    pytest.importorskip("tvm")
    from dialects.meta_schedule.tuning import tune_dag
    from dialects.meta_schedule.tvm_measure import EXPORT_MEASURE
    from lorien.formats.meta_schedule import iter_records

    dag = matmul_32_dag()
    progress = tune_dag(dag, {"trials": 2, "batch_size": 2, "measure": MEASURE, "tuner": "random"}, store_uri)
    engine_s = {record.cost_s for record in progress.records}
    capsys.readouterr()
    out = tmp_path / "db"
    assert main(["export", "--all", "--target", "llvm", "--format", "meta_schedule", "--measure-with-tvm",
                 "--store", store_uri, "-o", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["remeasured_with_tvm"] == 2 and summary["engine_measured_records"] == 0
    assert "engine, not by TVM" not in captured.err
    written = list(iter_records(out))  # run_secs as TVM reads them
    assert len(written) == 2
    for record in written:
        direct_s = _tvm_latency_s(dag, orjson.loads(record.config), EXPORT_MEASURE)  # as export times it
        assert _same_order(min(record.costs), direct_s)
        assert record.cost_s not in engine_s


def test_remeasure_with_tvm_without_tvm_is_an_error_naming_what_to_install(monkeypatch):
    spec = {"dialect": "meta_schedule", "task_name": "dense_layer", "args": [4, 8, 16, False, False, "float32"]}
    with pytest.raises(ConfigError, match=r"'remeasure_with_tvm' is how many .* got -1"):
        TuneJob.from_spec({**spec, "remeasure_with_tvm": -1})
    _without_tvm(monkeypatch)
    with pytest.raises(ConfigError, match=r"remeasure_with_tvm: 2.*pip install 'lorien\[tvm\]'"):
        TuneJob.from_spec({**spec, "remeasure_with_tvm": 2})
    assert TuneJob.from_spec(spec).option("remeasure_with_tvm") == 0


def test_export_for_tvm_prefers_a_workload_s_tvm_measured_record_to_a_faster_engine_measured_one(
        tmp_path, store_uri):
    """The engine's latencies do not rank against TVM's: a record TVM measured is exported even
    where the engine timed another trace of the workload faster."""
    from lorien.engine.build import build_info
    from lorien.warehouse.query import export_records

    dag = matmul_32_dag()
    from dialects.meta_schedule.compile import lorien_entry
    from dialects.meta_schedule.workload import workload_key_of

    key = workload_key_of(dag)
    base = {"dialect": "meta_schedule", "target": "llvm", "target_key": "llvm_cpu", "workload_key": key,
            "task_name": "C", "args": "[]", "layout": "NA", "extra": json.dumps({"workload": lorien_entry(dag)})}
    engine_fast = TuningRecord(**base, config='[[], ["engine"]]', costs=[1e-6], build=build_info())
    tvm_slow = TuningRecord(**base, config='[[], ["tvm"]]', costs=[5e-6],
                            build='{"measured_by": "tvm", "tvm_version": "0.27.0"}')
    engine_only = TuningRecord(**{**base, "workload_key": "7"}, config='[[], ["other"]]', costs=[2e-6],
                               build=build_info())
    with open_store(store_uri) as store:
        store.commit([engine_fast, tvm_slow, engine_only])
        exported = {record.workload_key: record for record in export_records(store, "llvm", "meta_schedule")}
        assert exported[key].config == tvm_slow.config
        assert exported["7"].config == engine_only.config  # no TVM record: the engine's best
        # other formats rank by latency alone, as before
        assert export_records(store, "llvm", "meta_schedule", best_only=False).__len__() == 3


@pytest.mark.tvm
def test_remeasure_with_tvm_commits_the_best_traces_timed_by_tvm_and_export_writes_those(tmp_path, store_uri, capsys):
    tvm = pytest.importorskip("tvm")
    from dialects.meta_schedule.tuning import tune_dag
    from lorien.formats.meta_schedule import iter_records

    dag = matmul_32_dag()
    job = {"trials": 4, "batch_size": 4, "measure": MEASURE, "tuner": "random", "remeasure_with_tvm": 2}
    progress = tune_dag(dag, job, store_uri)
    assert progress.trials == 4
    with open_store(store_uri) as store:
        records = [TuningRecord.from_row(row) for row in store.scan({}).to_pylist()]
    engine = sorted((r for r in records if r.measured_by == MEASURED_BY_ENGINE), key=lambda r: r.cost_s)
    timed = [r for r in records if r.measured_by == MEASURED_BY_TVM]
    assert len(engine) == 4 and len(timed) == 2
    assert {r.config for r in timed} == {r.config for r in engine[:2]}  # the engine's two fastest traces
    for record in timed:
        assert json.loads(record.build)["tvm_version"] == tvm.__version__ and record.error_no == 0
        direct_s = _tvm_latency_s(dag, orjson.loads(record.config), MEASURE)
        assert _same_order(min(record.costs), direct_s)

    tune_dag(dag, {**job, "trials": 2, "batch_size": 2}, store_uri)  # 2 more: no trace timed by TVM twice
    with open_store(store_uri) as store:
        timed = [r for r in (TuningRecord.from_row(row) for row in store.scan({}).to_pylist())
                 if r.measured_by == MEASURED_BY_TVM]
    assert len(timed) == 4 and len({r.config for r in timed}) == 4
    capsys.readouterr()
    out = tmp_path / "db"
    assert main(["export", "--target", "llvm", "--format", "meta_schedule", "--store", store_uri, "-o", str(out),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["engine_measured_records"] == 0
    (written,) = list(iter_records(out))
    best_tvm = min(timed, key=lambda r: r.cost_s)
    assert orjson.loads(written.config) == orjson.loads(best_tvm.config)
    assert written.costs == pytest.approx(best_tvm.costs)


@pytest.mark.tvm
def test_remeasure_with_tvm_times_its_finalists_in_more_rounds_than_a_tuning_job(store_uri):
    """The job's 5 rounds time every engine candidate; its finalists are timed by TVM in at least
    REMEASURE_ROUNDS rounds (one busy round moves a mean of 3 by a third), and a job asking for more
    rounds keeps its own number."""
    pytest.importorskip("tvm")
    from dialects.meta_schedule.tuning import REMEASURE_ROUNDS, tune_dag

    assert REMEASURE_ROUNDS > MEASURE["repeat"]
    every_round = {**MEASURE, "stop_slower_repeats": False}  # a slow candidate would stop after its first
    job = {"trials": 2, "batch_size": 2, "measure": every_round, "tuner": "random", "remeasure_with_tvm": 1}
    tune_dag(matmul_32_dag(), job, store_uri)
    more = {**every_round, "repeat": REMEASURE_ROUNDS + 2, "min_repeat_ms": 0}
    tune_dag(matmul_32_dag(), {**job, "measure": more}, store_uri)  # 2 more candidates, 1 more finalist
    with open_store(store_uri) as store:
        records = [TuningRecord.from_row(row) for row in store.scan({}).to_pylist()]
    engine_rounds = sorted(len(r.costs) for r in records if r.measured_by == MEASURED_BY_ENGINE)
    tvm_rounds = sorted(len(r.costs) for r in records if r.measured_by == MEASURED_BY_TVM)
    assert engine_rounds == [MEASURE["repeat"]] * 2 + [REMEASURE_ROUNDS + 2] * 2
    assert tvm_rounds == [REMEASURE_ROUNDS, REMEASURE_ROUNDS + 2]


def test_a_build_in_a_forked_worker_returns_its_artifact_and_raises_its_error():
    from dialects.meta_schedule.tvm_measure import build_in_fork

    assert build_in_fork(lambda: "/tmp/artifact.tar", timeout_s=60) == "/tmp/artifact.tar"

    def fails() -> str:
        raise ValueError("no such intrinsic 'llvm.foo'")

    with pytest.raises(RuntimeError, match=r"ValueError: no such intrinsic 'llvm.foo'"):
        build_in_fork(fails, timeout_s=60)


def test_a_build_past_its_limit_is_stopped_and_raises_build_timeout():
    import time

    from dialects.meta_schedule.tvm_measure import BuildTimeout, build_in_fork

    with pytest.raises(BuildTimeout, match=r"ran past its 0.5 s limit"):
        build_in_fork(lambda: time.sleep(600) or "never", timeout_s=0.5)


def test_a_build_worker_that_dies_is_an_error_with_its_exit_code():
    import os

    from dialects.meta_schedule.tvm_measure import build_in_fork

    with pytest.raises(RuntimeError, match=r"worker died \(exit code 3\)"):
        build_in_fork(lambda: os._exit(3), timeout_s=60)


def test_builds_in_forks_give_each_build_its_own_outcome_in_order():
    import os
    import time

    from dialects.meta_schedule.tvm_measure import BuildTimeout, build_in_forks

    def fails() -> str:
        raise ValueError("bad schedule")

    outcomes = build_in_forks([lambda: "/tmp/a.so", fails, lambda: time.sleep(600) or "never", lambda: os._exit(3),
                               lambda: "/tmp/e.so"], timeout_s=2, parallel=2)
    assert outcomes[0] == "/tmp/a.so" and outcomes[4] == "/tmp/e.so"
    assert isinstance(outcomes[1], RuntimeError) and "ValueError: bad schedule" in str(outcomes[1])
    assert isinstance(outcomes[2], BuildTimeout)
    assert isinstance(outcomes[3], RuntimeError) and "exit code 3" in str(outcomes[3])


def _meet(mine: Path, theirs: Path) -> str:
    """Leave ``mine`` and wait (up to 5 s) for ``theirs``: only builds that run at once both return."""
    import time

    mine.touch()
    deadline = time.monotonic() + 5
    while not theirs.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{theirs} never appeared")
        time.sleep(0.01)
    return str(mine)


def test_builds_in_forks_run_parallel_builds_at_once_and_one_at_a_time_when_told(tmp_path):
    import functools

    from dialects.meta_schedule.tvm_measure import build_in_forks

    a, b = tmp_path / "a", tmp_path / "b"
    together = build_in_forks([functools.partial(_meet, a, b), functools.partial(_meet, b, a)], timeout_s=60,
                              parallel=2)
    assert together == [str(a), str(b)]
    c, d = tmp_path / "c", tmp_path / "d"
    alone = build_in_forks([functools.partial(_meet, c, d), functools.partial(_meet, d, c)], timeout_s=60,
                           parallel=1)
    assert isinstance(alone[0], RuntimeError) and "TimeoutError" in str(alone[0])
    assert alone[1] == str(d)


@pytest.mark.tvm
def test_the_forked_builder_fails_a_candidate_whose_llvm_build_stalls_and_builds_the_next():
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    from pathlib import Path

    from tvm import te

    from dialects.meta_schedule.tvm_measure import forked_builder

    stalls = tvm.script.from_source((Path(__file__).parent / "data" / "softmax_llvm_stall.tvmscript").read_text())
    a, b = te.placeholder((16, 16), "float32", name="A"), te.placeholder((16, 16), "float32", name="B")
    k = te.reduce_axis((0, 16), name="k")
    matmul = tvm.IRModule({"main": te.create_prim_func(
        [a, b, te.compute((16, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")])})
    # for an AVX-512 CPU whatever this host is (only built, never run): LLVM's stall is in its
    # AVX-512 code generation (64-lane gathers); for generic x86-64 or an AVX2 znver3 it builds in seconds
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    stalled, built = forked_builder(timeout_s=5).build(
        [ms.builder.BuilderInput(stalls, target), ms.builder.BuilderInput(matmul, target)])
    assert stalled.artifact_path is None and "BuildTimeout: the build ran past its 5 s limit" in stalled.error_msg
    assert built.error_msg is None and Path(built.artifact_path).is_file()


@pytest.mark.tvm
def test_a_tvm_measured_candidate_past_build_timeout_s_is_a_build_timeout_record(store_uri):
    pytest.importorskip("tvm")
    from dialects.meta_schedule.tuning import tune_dag
    from lorien.record import ErrorNo

    tune_dag(matmul_32_dag(), {"trials": 2, "batch_size": 2, "tuner": "random", "measure_with": "tvm",
                            "measure": {**MEASURE, "build_timeout_s": 0.001}}, store_uri)
    with open_store(store_uri) as store:
        records = [TuningRecord.from_row(row) for row in store.scan({}).to_pylist()]
    assert len(records) == 2
    assert all(record.error_no == ErrorNo.BUILD_TIMEOUT for record in records)


@pytest.mark.tvm
def test_tvm_times_the_traces_of_one_call_taking_turns_and_a_failed_one_keeps_its_error(monkeypatch):
    pytest.importorskip("tvm")
    from dialects.meta_schedule.space import TraceSpace
    from dialects.meta_schedule.tvm_measure import TvmMeasurer
    from lorien.record import ErrorNo

    dag = matmul_32_dag()
    space = TraceSpace(dag)
    good = [space.get(0), space.get(len(space) - 1)]
    broken = [[["GetSBlock", [], ["no_such_block", "main"], ["b0"]]], []]
    measurer = TvmMeasurer(dag, {"number": 2, "repeat": 3, "min_repeat_ms": 0}, "llvm")
    timed, time_once = [], measurer._time_once

    def recording(kernel, arrays, *rest):
        timed.append(id(kernel))
        return time_once(kernel, arrays, *rest)

    monkeypatch.setattr(measurer, "_time_once", recording)
    first, failed, second = measurer([good[0], broken, good[1]])
    assert failed.error_no == ErrorNo.INSTANTIATION_ERROR and "no_such_block" in failed.error_msg
    assert first.error_no == second.error_no == ErrorNo.NO_ERROR
    assert len(first.costs) == len(second.costs) == 3 and all(cost > 0 for cost in first.costs + second.costs)
    # a warm-up round (not recorded), then 3 rounds, the two traces taking turns in each
    assert len(timed) == 8 and timed[0] != timed[1] and timed[0::2] == [timed[0]] * 4 and timed[1::2] == [timed[1]] * 4


@pytest.mark.tvm
def test_later_rounds_start_from_the_run_count_the_first_round_reached(monkeypatch):
    """TVM's evaluator finds the runs that fill ``min_repeat_ms`` anew in every call; the rounds
    after the first start from the count it reached, and every timing still lasts min_repeat_ms."""
    pytest.importorskip("tvm")
    from dialects.meta_schedule.space import TraceSpace
    from dialects.meta_schedule.tvm_measure import TvmMeasurer

    dag = matmul_32_dag()
    measurer = TvmMeasurer(dag, {"number": 1, "repeat": 4, "min_repeat_ms": 5}, "llvm")
    asked, time_once = [], measurer._time_once

    def recording(kernel, arrays, number=None):
        asked.append(number)
        return time_once(kernel, arrays, number)

    monkeypatch.setattr(measurer, "_time_once", recording)
    result, = measurer([TraceSpace(dag).get(0)])
    assert len(result.costs) == 4 and len(asked) == 5 and asked[0] is None  # the warm-up round is not recorded
    assert len(set(asked[1:])) == 1 and asked[1] > 1  # a 32x32 matmul runs in microseconds: many runs a timing
    assert asked[1] * min(result.costs) * 1e3 >= 5 * 0.5  # about min_repeat_ms of runs, not one run
    assert measurer._calibrated_number(0.001) == 6 and measurer._calibrated_number(0.1) == 1
    measurer.option.min_repeat_ms = 0
    assert measurer._calibrated_number(1e-6) == 1


@pytest.mark.tvm
def test_re_measured_finalists_race_a_clearly_slower_one_is_timed_no_more(monkeypatch):
    """From ``race_from`` on, a finalist whose fastest timing is slower than the leader's slowest
    stops; close ones (overlapping timings) run every round; the rounds end when one is left."""
    pytest.importorskip("tvm")
    from dialects.meta_schedule.space import TraceSpace
    from dialects.meta_schedule.tvm_measure import TvmMeasurer

    assert TvmMeasurer._race({0: [1.0, 1.1, 1.2], 1: [1.3, 1.25, 1.4], 2: [1.15, 1.0, 1.3]}) == {1}
    assert TvmMeasurer._race({0: [2.0, 2.2], 1: [1.0, 1.1]}) == {0} and TvmMeasurer._race({3: [1.0]}) == set()
    dag = matmul_32_dag()
    space = TraceSpace(dag)
    traces = [space.get(0), space.get(1), space.get(len(space) - 1)]
    scripted = {0: iter([9.0, 1.0, 1.1, 1.0, 1.05, 1.0, 1.1]), 1: iter([9.0, 1.08, 1.12, 1.04, 1.1, 1.06, 1.12]),
                2: iter([9.0, 3.0, 2.9, 3.1, 3.0, 3.0, 3.0])}  # first: the warm-up round, not recorded
    kernels: dict[int, int] = {}

    def scripted_time(kernel, arrays, number=None):
        position = kernels.setdefault(id(kernel), len(kernels))
        return next(scripted[position])

    measurer = TvmMeasurer(dag, {"number": 1, "repeat": 6, "min_repeat_ms": 0}, "llvm", race_from=3)
    monkeypatch.setattr(measurer, "_time_once", scripted_time)
    close, also_close, slow = measurer(traces)
    assert len(close.costs) == len(also_close.costs) == 6  # overlapping: every round
    assert slow.costs == [3.0, 2.9, 3.1]  # behind from the third round on: timed no more
    kernels.clear()
    scripted.update({0: iter([9.0, 1.0, 1.0, 1.0, 1.0]), 1: iter([9.0, 2.0, 2.0, 2.0, 2.0]), 2: iter([9.0] + [3.0] * 4)})
    first, second, third = measurer(traces)
    assert len(first.costs) == len(second.costs) == len(third.costs) == 3  # one left after round 3: done
    kernels.clear()
    scripted.update({0: iter([1.0] * 7), 1: iter([2.0] * 7), 2: iter([3.0] * 7)})
    measurer.race_from = None
    assert [len(result.costs) for result in measurer(traces)] == [6, 6, 6]  # no racing: every round


@pytest.mark.tvm
def test_re_measured_finalists_that_tie_end_the_race():
    """Finalists whose timings overlap but whose medians are within RACE_TIE of the leader's are a
    tie: all but the leader are timed no more (which wins moves the latency by less than that);
    3 % apart they race on."""
    pytest.importorskip("tvm")
    from dialects.meta_schedule.tvm_measure import RACE_TIE, TvmMeasurer

    assert RACE_TIE == pytest.approx(0.02)
    tie = {0: [1.0, 1.05, 0.99], 1: [1.01, 0.98, 1.1], 2: [1.02, 1.0, 1.06]}  # medians 1.0, 1.01, 1.02
    assert TvmMeasurer._race(tie) == {1, 2}
    assert TvmMeasurer._race({0: [1.0, 1.05, 0.99], 1: [1.03, 0.98, 1.1]}) == set()  # 3 % apart: not a tie
    # one clearly behind, the others tied: all but the leader stop
    assert TvmMeasurer._race({0: [1.0, 1.05, 0.99], 1: [1.01, 0.98, 1.1], 2: [2.0, 2.1, 2.2]}) == {1, 2}


RELAX_BERT = Path(__file__).resolve().parent / "data" / "relax_bert_layer"


def test_a_re_measured_trace_is_linked_by_ld_itself_and_runs_as_the_compiler_driver_linked_one(tmp_path, monkeypatch):
    """``_export_built`` links the module's object with ``link_shared`` (``ld -shared``, libm for
    erf/exp), not g++'s driver; the library TVM loads computes what the g++-linked one does."""
    tvm = pytest.importorskip("tvm")
    import tvm.s_tir.meta_schedule as ms
    from tvm.driver import build as tvm_build

    from dialects.meta_schedule import tvm_measure

    records = ms.database.JSONDatabase(work_dir=str(RELAX_BERT), allow_missing=False).get_all_tuning_records()
    record = next(r for r in records if "erf" in r.workload.mod.script())  # the FFN's GELU: calls libm's erff
    schedule = tvm.s_tir.Schedule(record.workload.mod)
    record.trace.apply_to_schedule(schedule, remove_postproc=False)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    links = []
    real_link = tvm_measure.link_shared
    monkeypatch.setattr(tvm_measure, "link_shared", lambda *args, **kwargs: links.append(args) or real_link(*args, **kwargs))
    ours = tvm.runtime.load_module(tvm_measure._export_built(schedule.mod, target, str(tmp_path / "ld.so")))
    assert len(links) == 1 and all(name.endswith(".o") for name in links[0][1])
    tvm_build(schedule.mod, target=target).export_library(str(tmp_path / "gxx.so"))
    theirs = tvm.runtime.load_module(str(tmp_path / "gxx.so"))
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(0.1, 1, [int(d) for d in p.shape]).astype(str(p.dtype))
              for p in schedule.mod["main"].params]
    outputs = []
    for module in (ours, theirs):
        arrays = [tvm.runtime.tensor(value.copy()) for value in inputs]
        module[module.entry_name](*arrays)
        outputs.append([array.numpy() for array in arrays])
    for got, want in zip(*outputs, strict=True):
        np.testing.assert_array_equal(got, want)


def test_link_shared_leaves_anything_but_object_files_to_tvm_s_create_shared(tmp_path, monkeypatch):
    pytest.importorskip("tvm")
    from tvm.support import cc

    from dialects.meta_schedule.tvm_measure import link_shared

    calls = []
    monkeypatch.setattr(cc, "create_shared", lambda *args, **kwargs: calls.append(args))
    link_shared(str(tmp_path / "a.so"), [str(tmp_path / "lib0.o"), str(tmp_path / "devc.c")])
    monkeypatch.setattr("shutil.which", lambda name: None)
    link_shared(str(tmp_path / "b.so"), [str(tmp_path / "lib0.o")])
    assert [call[0] for call in calls] == [str(tmp_path / "a.so"), str(tmp_path / "b.so")]


@pytest.mark.parametrize("environ", [{}, pytest.param({"TVM_NUM_THREADS": "2"}, marks=pytest.mark.slow),
                                     pytest.param({"OMP_NUM_THREADS": "1"}, marks=pytest.mark.slow)])
def test_tvm_runtime_threads_is_the_thread_count_tvms_runtime_starts_with(environ):
    pytest.importorskip("tvm")
    import os
    import subprocess

    env = {name: value for name, value in os.environ.items() if name not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    code = ("import tvm; from dialects.meta_schedule.tvm_measure import tvm_runtime_threads; "
            "print(tvm.get_global_func('runtime.NumThreads')(), tvm_runtime_threads())")
    out = subprocess.run([sys.executable, "-c", code], env={**env, **environ}, capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout.split()
    assert out[0] == out[1], f"TVM's runtime starts {out[0]} threads, tvm_runtime_threads() says {out[1]}"
