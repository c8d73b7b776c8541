"""`lorien tune` on one machine: records stream into the store, logs are kept, a summary is
printed, an interrupted run keeps what it measured; the YAML is validated; compile from the
warehouse uses the best record or says it fell back."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from lorien.cli import main
from lorien.errors import ConfigError
from lorien.formats import read_log
from lorien.tune.config import load_tune_config, parse_tune_config
from lorien.tune.loop import tune_job
from lorien.warehouse import open_store

TINY_DENSE = {"dense": {"M": 16, "N": 16, "K": 16}}
MEASURE = {"repeat": 2, "build_timeout_s": 60, "run_timeout_s": 20}


def write_config(tmp_path: Path, trials: int, batch_size: int = 4, **extra) -> Path:
    document = {"tuner": "random", "trials": trials, "batch_size": batch_size, "measure": MEASURE,
                "workloads": [TINY_DENSE], **extra}
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def lorien_cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lorien.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_lorien_tune_commits_records_keeps_logs_and_prints_a_summary(tmp_path, store_uri):
    config = write_config(tmp_path, trials=8)
    proc = lorien_cli("tune", str(config), "--store", store_uri, "--no-progress")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "best GFLOPS" in stdout and "dense_pack.x86 16x16 16x16" in stdout
    with open_store(store_uri) as store:
        table = store.scan()
    assert table.num_rows == 8
    assert set(table.column("dialect").to_pylist()) == {"autotvm"}
    logs = list((Path(store_uri.split(":", 1)[1]) / "logs").glob("*.log"))
    assert len(logs) == 1
    log = read_log(logs[0])
    assert len(log.records) == 8 and not log.errors
    assert {r.record_id for r in log.records} == set(table.column("record_id").to_pylist())


def test_interrupted_tune_keeps_every_record_it_measured(tmp_path, store_uri):
    config = write_config(tmp_path, trials=400, batch_size=2)
    log_dir = tmp_path / "logs"
    proc = lorien_cli("tune", str(config), "--store", store_uri, "--log-dir", str(log_dir), "--no-progress")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        logs = list(log_dir.glob("*.log"))
        if logs and len(logs[0].read_text().splitlines()) >= 4:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("no batch was measured in time")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "(interrupted)" in stdout
    logged = {r.record_id for r in read_log(next(log_dir.glob("*.log"))).records}
    with open_store(store_uri) as store:
        stored = set(store.scan().column("record_id").to_pylist())
    assert len(logged) >= 4
    assert logged <= stored
    assert len(stored) < 400


def test_the_tuning_loop_runs_a_team_job_dict_and_commits_each_batch(store_uri):
    job = {"dialect": "autotvm", "task_name": "dense_pack.x86",
           "args": [["TENSOR", [8, 16], "float32"], ["TENSOR", [16, 16], "float32"], None, "float32"],
           "target": "llvm", "tuner": "ga", "trials": 6, "measure": MEASURE, "commit_nbest": 2, "seed": 1,
           "batch_size": 3}
    batches = []
    records = tune_job(job, store_uri, on_batch=lambda p, r: batches.append(len(r))).records
    assert batches == [3, 3]
    assert len(records) == 6 and all(r.target_key == "llvm_cpu" for r in records)
    with open_store(store_uri) as store:
        assert store.scan().num_rows == 6
        best = store.best(records[0].workload_key, records[0].target, k=5)
    assert best[0].cost_s == min(r.cost_s for r in records if r.is_valid)


RESUME_JOB = {"dialect": "autotvm", "task_name": "dense_pack.x86",
              "args": [["TENSOR", [8, 16], "float32"], ["TENSOR", [16, 16], "float32"], None, "float32"],
              "target": "llvm", "tuner": "random", "trials": 6, "measure": MEASURE, "seed": 2, "batch_size": 2}


def test_a_resumed_job_measures_only_the_rest_of_its_budget_and_no_config_twice(store_uri):
    first = tune_job(RESUME_JOB, None, commit=False).records
    seen = []
    rest = tune_job(RESUME_JOB, store_uri, resume=first[:4],
                    on_batch=lambda progress, records: seen.append((progress.trials, progress.resumed,
                                                                    len(records)))).records
    assert seen == [(4, 4, 0), (6, 4, 2)]
    assert len(rest) == 2
    assert {r.config for r in rest}.isdisjoint(r.config for r in first[:4])
    with open_store(store_uri) as store:
        assert store.scan().num_rows == 2  # the resumed records are the earlier attempt's, not committed again


def test_a_job_resumed_with_its_whole_budget_measures_nothing(store_uri):

    first = tune_job(RESUME_JOB, None, commit=False).records
    again = tune_job(RESUME_JOB, store_uri, resume=first)
    assert (again.records, again.trials, again.resumed) == ([], 6, 6)
    assert again.best_cost_s == min(record.cost_s for record in first if record.is_valid)


def test_records_that_do_not_fit_the_jobs_space_are_refused_naming_them(shared_data):
    from lorien.errors import DialectError

    foreign = read_log(shared_data / "tophub" / "llvm_v0.04.log").records[0]
    with pytest.raises(DialectError, match=f"record {foreign.record_id} of dense_pack.x86 does not fit its search"):
        tune_job(RESUME_JOB, None, commit=False, resume=[foreign])


def test_another_jobs_record_that_does_not_fit_the_space_is_known_but_not_an_error(store_uri):
    measured = tune_job(RESUME_JOB, None, commit=False).records[0]
    entity = json.loads(measured.config)
    entity["entity"][0][2] = [-1, 999, 1]  # no split of this workload's extent
    older = measured.with_changes(config=json.dumps(entity), source="an older template's run", record_id="")
    with open_store(store_uri) as store:
        store.commit([older])
    progress = tune_job({**RESUME_JOB, "seed": 3}, store_uri)
    assert progress.trials == RESUME_JOB["trials"] and progress.resumed == 0 and progress.errors == 0


def test_lorien_tune_killed_mid_workload_resumes_where_it_stopped(tmp_path, store_uri):
    """SIGKILL `lorien tune` once two batches are committed, run it again: the second run
    measures only the rest, so the store holds the budget, each config once."""
    config = write_config(tmp_path, trials=10, batch_size=2)
    proc = lorien_cli("tune", str(config), "--store", store_uri, "--no-progress")
    deadline = time.monotonic() + 240
    committed = 0
    while committed < 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        if (Path(store_uri.split(":", 1)[1]) / "records").exists():
            with open_store(store_uri) as store:
                committed = store.scan(columns=["record_id"]).num_rows
    proc.kill()
    proc.communicate()
    assert 4 <= committed < 10, "the run was not killed mid-workload"
    with open_store(store_uri) as store:
        committed = store.scan(columns=["record_id"]).num_rows
    again = lorien_cli("tune", str(config), "--store", store_uri, "--no-progress")
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr
    assert f"10 ({committed} resumed)" in stdout
    with open_store(store_uri) as store:
        table = store.scan(columns=["config", "source"])
    assert table.num_rows == 10
    assert len(set(table.column("config").to_pylist())) == 10
    assert len(set(table.column("source").to_pylist())) == 1


def test_yaml_shorthands_expand_to_autotvm_tasks(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"trials": 4, "tuner": {"kind": "ga", "pop_size": 8}, "workloads": [
        {"dense": {"M": 4, "N": 8, "K": 16}},
        {"conv2d": {"C": 3, "H": 8, "W": 8, "K": 4, "kernel": 3, "padding": 1, "layout": "NHWC"}, "trials": 2},
        {"task_name": "batch_matmul.x86", "args": [["TENSOR", [2, 4, 4], "float32"],
                                                     ["TENSOR", [2, 4, 4], "float32"], None]},
    ]}))
    config = load_tune_config(path)
    dense, conv, bmm = config.jobs
    assert dense["task_name"] == "dense_nopack.x86" and dense["args"][1] == ["TENSOR", [8, 16], "float32"]  # M < 16
    assert dense["tuner"] == "ga" and dense["tuner_options"] == {"pop_size": 8}
    assert conv["task_name"] == "conv2d_nhwc.x86" and conv["trials"] == 2
    assert conv["args"][1] == ["TENSOR", [3, 3, 3, 4], "float32"]
    assert bmm["task_name"] == "batch_matmul.x86"
    assert all(job["target"].startswith("llvm") for job in config.jobs)


@pytest.mark.parametrize("document, message", [
    ({"workloads": [TINY_DENSE], "trails": 3}, "trails"),
    ({"workloads": [TINY_DENSE], "tuner": "annealing"}, "annealing"),
    ({"workloads": [{"dense": {"M": 4, "N": 4}}]}, "K"),
    ({"workloads": [{"gemm": {"M": 4}}]}, "gemm"),
    ({"workloads": []}, "workloads"),
    ({"workloads": [TINY_DENSE], "measure": {"repeats": 2}}, "repeats"),
    ({"workloads": [TINY_DENSE], "measure": {"stop_slower_repeats": "maybe"}}, "stop_slower_repeats must be true"),
])
def test_invalid_configs_are_rejected_naming_the_problem(document, message):
    with pytest.raises(ConfigError, match=message):
        parse_tune_config(document, source="t.yaml")


def test_lorien_tune_with_a_bad_measure_value_writes_nothing(tmp_path, capsys):
    """The value is refused when the config is read: no store, no log directory is left behind."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"trials": 2, "measure": {"check_correctness": "maybe"},
                                    "workloads": [TINY_DENSE]}))
    store = tmp_path / "store"
    assert main(["tune", str(path), "--store", f"parquet:{store}", "--no-progress"]) != 0
    assert "check_correctness must be true or false, got 'maybe'" in capsys.readouterr().err
    assert not store.exists()


def test_yaml_python_tags_are_never_loaded(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("workloads: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="evil.yaml"):
        load_tune_config(path)


def test_sample_configs_parse():
    root = Path(__file__).resolve().parent.parent / "configs" / "samples"
    counts = {name: len(load_tune_config(root / f"{name}.yaml").jobs) for name in ("quick", "resnet18", "matmul")}
    assert counts == {"quick": 6, "resnet18": 12, "matmul": 4}


def test_compile_from_warehouse_uses_the_best_record(store_uri):
    import lorien

    job = {"dialect": "autotvm", "task_name": "dense_nopack.x86",
           "args": [["TENSOR", [8, 16], "float32"], ["TENSOR", [12, 16], "float32"], None, "float32"],
           "target": "llvm", "tuner": "random", "trials": 4, "measure": MEASURE, "batch_size": 4}
    records = tune_job(job, store_uri).records
    best = min((r for r in records if r.is_valid), key=lambda r: r.cost_s)
    kernel = lorien.compile(best.workload_key, "llvm", store=store_uri)
    assert kernel.from_warehouse and kernel.record.record_id == best.record_id
    data = np.random.default_rng(0).standard_normal((8, 16)).astype("float32")
    weight = np.random.default_rng(1).standard_normal((12, 16)).astype("float32")
    out = np.zeros((8, 12), "float32")
    kernel(data, weight, out)
    np.testing.assert_allclose(out, data @ weight.T, rtol=1e-4, atol=1e-4)


def test_compile_follows_the_query_target_rule(store_uri):
    import lorien
    from lorien.build import FallbackScheduleWarning
    from lorien.target import host_target

    job = {"dialect": "autotvm", "task_name": "dense_nopack.x86",
           "args": [["TENSOR", [4, 8], "float32"], ["TENSOR", [4, 8], "float32"], None, "float32"],
           "target": host_target().canonical, "tuner": "random", "trials": 2, "measure": MEASURE, "batch_size": 2}
    records = tune_job(job, store_uri).records
    key = records[0].workload_key
    assert lorien.compile(key, "llvm", store=store_uri).record.target == host_target().canonical
    with pytest.warns(FallbackScheduleWarning):
        assert not lorien.compile(key, "llvm", store=store_uri, exact=True).from_warehouse
    with pytest.warns(FallbackScheduleWarning):
        assert not lorien.compile(key, "llvm -mcpu=x86-64", store=store_uri).from_warehouse
    assert lorien.compile(key, "llvm -mcpu=x86-64", store=store_uri, by_alternate_key=True).from_warehouse


def test_tuning_for_another_cpu_measures_its_code_and_records_its_build(store_uri):
    import json


    job = {"dialect": "autotvm", "task_name": "dense_nopack.x86",
           "args": [["TENSOR", [4, 16], "float32"], ["TENSOR", [16, 16], "float32"], None, "float32"],
           "target": "llvm -mcpu=haswell -num-cores=1", "tuner": "random", "trials": 2, "measure": MEASURE}
    records = tune_job(job, store_uri).records
    assert {r.error_no for r in records} == {0}
    assert {r.target for r in records} == {"llvm -keys=cpu -mcpu=haswell -num-cores=1"}
    build = json.loads(records[0].build)
    assert (build["mcpu"], build["vector_lanes"], build["threads"]) == ("haswell", 8, 1)


def test_compile_without_records_falls_back_and_says_so(store_uri):
    import lorien
    from lorien.build import FallbackScheduleWarning

    key = "batch_matmul.x86#_TENSOR__2_4_8__float32_#_TENSOR__2_4_8__float32_#None"
    with pytest.warns(FallbackScheduleWarning, match="default schedule"):
        kernel = lorien.compile(key, "llvm", store=store_uri)
    assert kernel.from_warehouse is False and "no valid record" in kernel.fallback_reason
    x = np.ones((2, 4, 8), "float32")
    out = np.zeros((2, 4, 4), "float32")
    kernel(x, x, out)
    np.testing.assert_allclose(out, np.full((2, 4, 4), 8.0))


def test_query_build_flag_builds_the_default_schedule_when_the_store_is_empty(store_uri):
    key = "dense_pack.x86#_TENSOR__4_8__float32_#_TENSOR__8_8__float32_#None#float32"
    proc = lorien_cli("query", "--workload-key", key, "--target", "llvm", "--store", store_uri, "--build")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "DEFAULT schedule" in stderr


def test_xgb_transfer_reads_same_template_records_normalized_per_workload(store_uri):
    from dialects.autotvm.templates import instantiate
    from dialects.autotvm.tuning import transfer_history

    def dense_job(m):
        return {"dialect": "autotvm", "task_name": "dense_pack.x86", "target": "llvm", "tuner": "random",
                "args": [["TENSOR", [m, 16], "float32"], ["TENSOR", [16, 16], "float32"], None, "float32"],
                "trials": 4, "batch_size": 4, "measure": MEASURE}

    tune_job(dense_job(8), store_uri)
    tune_job(dense_job(16), store_uri)
    task = instantiate("dense_pack.x86", dense_job(32)["args"])
    with open_store(store_uri) as store:
        features, scores = transfer_history(task, store, "llvm_cpu")
    assert features.shape == (8, len(task.space.features_of(task.config(0))))
    assert sorted(scores)[-2:] == [1.0, 1.0] and 0 < scores.min() <= 1.0
    progress = tune_job({**dense_job(32), "tuner": "xgb", "transfer": True, "trials": 2, "batch_size": 2}, store_uri)
    assert progress.trials == 2


def dense_args(m: int, n: int, k: int) -> list:
    return [["TENSOR", [m, k], "float32"], ["TENSOR", [n, k], "float32"], None, "float32"]


def synthetic_dense_records(shapes, per_shape: int = 80) -> list:
    """dense_pack.x86 records whose throughput peaks at 8-wide inner x tiles and 8-deep k tiles."""
    from dialects.autotvm.records import make_record
    from dialects.autotvm.templates import instantiate
    from lorien.costmodel.zeroshot import sample_indices

    records = []
    for m, n, k in shapes:
        args = dense_args(m, n, k)
        space = instantiate("dense_pack.x86", args).space
        for index in sample_indices(len(space), per_shape, seed=m + n + k):
            config = space.get(int(index))
            tiles = {name: value for name, _, value in config.to_json_entity()}
            gflops = 40.0 * np.exp(-(np.log2(tiles["tile_x"][-1]) - 3) ** 2) * np.exp(
                -(np.log2(tiles["tile_k"][-1]) - 3) ** 2 / 2) + 0.1
            records.append(make_record("llvm", "dense_pack.x86", args, config, [float(2.0 * m * n * k / (gflops * 1e9))],
                                       0, 0.1, float(len(records)), source="synthetic"))
    return records


@pytest.fixture(scope="module")
def dense_cost_model(tmp_path_factory) -> Path:
    from lorien.costmodel import train_cost_model
    from lorien.features import featurize

    root = tmp_path_factory.mktemp("warm")
    uri = f"parquet:{root / 'warehouse'}"
    with open_store(uri) as store:
        store.commit(synthetic_dense_records([(16, 64, 64), (16, 128, 64), (32, 64, 128), (8, 128, 128)]))
    featurize(root / "features", store=uri, jobs=1, progress=False)
    train_cost_model(root / "features", root / "model", folds=2, params={"n_estimators": 40}, baseline=None,
                     plots=False, progress=False, name="synthetic-dense")
    return root / "model"


def test_warm_started_xgb_job_measures_what_the_model_ranks_high_first(dense_cost_model, store_uri):
    from dialects.autotvm.templates import instantiate
    from lorien.costmodel import load_cost_model
    from lorien.search import create

    args = dense_args(16, 96, 64)
    job = {"dialect": "autotvm", "task_name": "dense_pack.x86", "target": "llvm", "tuner": "xgb", "args": args,
           "trials": 8, "batch_size": 8, "measure": MEASURE, "warm_start_model": str(dense_cost_model)}
    first_batches = []
    tune_job(job, store_uri, on_batch=lambda progress, records: first_batches.append(records))
    assert len(first_batches) == 1 and len(first_batches[0]) == 8
    model = load_cost_model(dense_cost_model)
    warm = model.score_configs("dense_pack.x86", args, [__import__("orjson").loads(r.config)["entity"]
                                                         for r in first_batches[0]])
    space = instantiate("dense_pack.x86", args).space
    random_batch = create("random", space, seed=0).next_batch(8)
    cold = model.score_configs("dense_pack.x86", args, [space.get(i).to_json_entity() for i in random_batch])
    assert np.median(warm) > np.max(cold)


def test_warm_start_model_needs_the_xgb_tuner(dense_cost_model):

    job = {"task_name": "dense_pack.x86", "args": dense_args(16, 96, 64), "tuner": "random", "trials": 2,
           "warm_start_model": str(dense_cost_model)}
    with pytest.raises(ConfigError, match="warm_start_model needs tuner 'xgb'"):
        tune_job(job, None)
    with pytest.raises(ConfigError, match=r"workloads\[0\]: warm_start_model needs tuner 'xgb'"):
        parse_tune_config({"tuner": "ga", "warm_start_model": "m", "workloads": [TINY_DENSE]})
    assert parse_tune_config({"tuner": "xgb", "warm_start_model": "m",
                              "workloads": [TINY_DENSE]}).jobs[0]["warm_start_model"] == "m"
