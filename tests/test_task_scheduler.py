"""The task scheduler and network tuning: one trial budget over weighted tasks, resumed from the warehouse."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from lorien.cli import main
from lorien.errors import ConfigError
from lorien.search.task_scheduler import SchedulerTask, TaskScheduler
from lorien.tune.config import parse_tune_config
from lorien.tune.network import format_network_summary, round_spec, tune_network
from lorien.warehouse import open_store


def _scheduler(*tasks: SchedulerTask, strategy: str = "gradient", **options) -> TaskScheduler:
    return TaskScheduler(list(tasks), strategy=strategy, **options)


def test_every_task_gets_a_warm_up_round_first_in_order():
    scheduler = _scheduler(SchedulerTask("a", 1), SchedulerTask("b", 5))
    assert scheduler.next_task() == 0
    scheduler.update(0, 8, 1e-3)
    assert scheduler.next_task() == 1


def test_round_robin_takes_tasks_in_turn_and_skips_busy_ones():
    scheduler = _scheduler(SchedulerTask("a"), SchedulerTask("b"), SchedulerTask("c"), strategy="round-robin")
    for task_id in range(3):
        scheduler.update(task_id, 8, 1e-3)
    assert [scheduler.next_task() for _ in range(4)] == [0, 1, 2, 0]
    assert scheduler.next_task(busy={1}) == 2


def test_gradient_prefers_the_task_with_more_weight_times_latency_to_win():
    scheduler = _scheduler(SchedulerTask("light", 1), SchedulerTask("heavy", 4))
    for task_id in (0, 1):
        scheduler.update(task_id, 8, 2e-3)
    assert scheduler.next_task() == 1
    assert scheduler.gradient(1) == pytest.approx(4 * scheduler.gradient(0))


def test_gradient_prefers_a_task_still_improving_over_one_that_stopped():
    scheduler = _scheduler(SchedulerTask("improving"), SchedulerTask("flat"), backward_window_size=2)
    for cost in (8e-3, 4e-3, 2e-3):
        scheduler.update(0, 8, cost)
    for _ in range(3):
        scheduler.update(1, 8, 2e-3)
    assert scheduler.gradient(0) < scheduler.gradient(1) < 0
    assert scheduler.next_task() == 0


def test_a_task_far_below_the_throughput_of_a_similar_task_is_preferred():
    scheduler = _scheduler(SchedulerTask("slow", 1, flop=1e9, group="conv"), SchedulerTask("fast", 1, flop=1e9, group="conv"),
                           beta=1.0)
    for _ in range(4):
        scheduler.update(0, 8, 1e-2)  # 100 GFLOPS
        scheduler.update(1, 8, 1e-3)  # 1000 GFLOPS: the slow one could reach 1 ms
    assert scheduler.next_task() == 0


def test_tasks_that_keep_failing_or_measure_nothing_are_left_alone():
    scheduler = _scheduler(SchedulerTask("broken"), SchedulerTask("exhausted"), SchedulerTask("fine"),
                           max_failed_rounds=2)
    scheduler.update(0, 8, math.inf)
    scheduler.update(0, 8, math.inf)
    scheduler.update(1, 0, 1e-3)
    scheduler.update(2, 8, 1e-3)
    assert scheduler.dead == {0, 1}
    assert scheduler.next_task() == 2 and scheduler.next_task(busy={2}) is None


def test_resumed_trials_count_as_rounds_and_the_latency_is_weight_times_best():
    scheduler = _scheduler(SchedulerTask("a", 2), SchedulerTask("b", 1))
    scheduler.resume(0, 40, 1e-3, round_trials=16)
    assert scheduler.rounds[0] == 3 and scheduler.total_trials == 40
    assert math.isinf(scheduler.estimated_latency_s())
    scheduler.update(1, 16, 5e-3)
    assert scheduler.estimated_latency_s() == pytest.approx(2e-3 + 5e-3)


@pytest.mark.parametrize(("tasks", "strategy", "message"), [
    ([SchedulerTask("a", 0)], "gradient", "weight must be positive"),
    ([SchedulerTask("a")], "fastest", "unknown task scheduler strategy 'fastest'"),
    ([], "gradient", "at least one task"),
])
def test_bad_scheduler_settings_are_refused(tasks, strategy, message):
    with pytest.raises(ConfigError, match=message):
        TaskScheduler(tasks, strategy=strategy)


# ---------------------------------------------------------------- networks

NETWORK = {
    "dialect": "auto_scheduler", "tuner": "random", "batch_size": 4, "target": "llvm -keys=cpu",
    "measure": {"repeat": 1},
    "task_scheduler": {"strategy": "gradient", "trials": 16, "round_trials": 4},
    "workloads": [
        {"name": "fc", "weight": 2, "dense": {"M": 2, "N": 32, "K": 16, "bias": True}},
        {"name": "conv", "conv2d": {"C": 4, "H": 6, "W": 6, "K": 8, "padding": 1, "relu": True}},
    ],
}


def _network(tmp_path, **changes):
    document = json.loads(json.dumps(NETWORK))
    for key, value in changes.items():
        document[key] = value
    path = tmp_path / "network.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _configs(store_uri: str) -> list[str]:
    with open_store(store_uri) as store:
        return store.scan(columns=["config"]).column("config").to_pylist()


def test_each_round_of_a_task_gets_its_own_seed_and_leaves_the_weight_behind():
    job = {"task_name": "dense_layer", "seed": 5, "weight": 3, "trials": 99}
    first, second = round_spec(job, 16, 1), round_spec(job, 8, 2)
    assert (first["seed"], second["seed"]) == (5, 6)
    assert (first["trials"], second["trials"], second["round"]) == (16, 8, 2)
    assert "weight" not in first and job["weight"] == 3


def test_a_network_is_tuned_in_rounds_under_one_budget_and_reports_latency_over_time(tmp_path, store_uri):
    config = parse_tune_config(yaml.safe_load(_network(tmp_path).read_text()))
    summary = tune_network(config, config.task_scheduler, store_uri, log_dir=tmp_path / "logs", progress=False)
    assert summary.trials == 16 and all(t.trials >= 4 for t in summary.tasks)  # every task has a warm-up round
    assert [t.weight for t in summary.tasks] == [2.0, 1.0]
    latencies = [latency for _, _, latency in summary.history]
    assert math.isinf(latencies[0]) and math.isfinite(latencies[-1])
    assert all(b <= a for a, b in zip(latencies, latencies[1:], strict=False))
    assert summary.latency_s == pytest.approx(sum(t.weight * t.best_cost_s for t in summary.tasks))
    assert len(_configs(store_uri)) == 16
    assert sorted(p.suffix for p in (tmp_path / "logs").iterdir()) == [".json", ".json"]
    text = format_network_summary(summary)
    assert "network (gradient): 16 trials of a budget of 16" in text and "estimated latency over time" in text


def test_a_network_run_resumes_from_the_warehouse_without_measuring_again(tmp_path, store_uri, capsys):
    assert main(["tune", str(_network(tmp_path)), "--store", store_uri, "--no-progress"]) == 0
    assert main(["tune", str(_network(tmp_path)), "--store", store_uri, "--no-progress", "--trials", "24",
                 "--strategy", "round-robin"]) == 0
    out = capsys.readouterr().out
    assert "network (round-robin): 24 trials, 16 resumed of a budget of 24" in out
    configs = _configs(store_uri)
    assert len(configs) == len(set(configs)) == 24


def test_a_network_run_resumes_from_an_ansor_log(tmp_path, store_uri, capsys):
    first = f"parquet:{tmp_path / 'first'}"
    assert main(["tune", str(_network(tmp_path)), "--store", first, "--no-progress",
                 "--log-dir", str(tmp_path / "logs")]) == 0
    log = tmp_path / "all.json"
    log.write_text("".join(p.read_text() for p in sorted((tmp_path / "logs").iterdir())))
    assert main(["tune", str(_network(tmp_path)), "--store", store_uri, "--no-progress", "--trials", "20",
                 "--resume-log", str(log)]) == 0
    assert "20 trials, 16 resumed of a budget of 20" in capsys.readouterr().out
    assert len(set(_configs(store_uri))) == 20


def test_a_network_runs_on_the_local_manager(tmp_path, store_uri):
    config = parse_tune_config(yaml.safe_load(_network(tmp_path).read_text()))
    settings = {**config.task_scheduler, "trials": 8}
    summary = tune_network(config, settings, store_uri, manager="local", workers=2, progress=False)
    assert summary.trials == 8 and not summary.failures and math.isfinite(summary.latency_s)


def test_a_network_runs_on_the_dask_manager(tmp_path, store_uri):
    pytest.importorskip("distributed")
    config = parse_tune_config(yaml.safe_load(_network(tmp_path).read_text()))
    settings = {**config.task_scheduler, "trials": 8}
    summary = tune_network(config, settings, store_uri, manager="dask", workers=2, progress=False)
    assert summary.trials == 8 and not summary.failures and math.isfinite(summary.latency_s)


@pytest.mark.parametrize("dialect", ["autotvm", "meta_schedule"])
def test_the_task_scheduler_tunes_every_dialect_in_rounds_without_measuring_a_config_twice(tmp_path, store_uri,
                                                                                          dialect):
    path = _network(tmp_path, dialect=dialect, task_scheduler={"strategy": "round-robin", "trials": 8,
                                                                "round_trials": 4},
                    workloads=[{"name": "fc", "dense": {"M": 2, "N": 16, "K": 16}}])
    config = parse_tune_config(yaml.safe_load(path.read_text()))
    summary = tune_network(config, config.task_scheduler, store_uri, log_dir=tmp_path / "logs", progress=False)
    configs = _configs(store_uri)
    assert summary.trials == 8 and len(configs) == 8  # two rounds of one task
    assert len(set(configs)) == 8  # the second round resumed from the first one's records


@pytest.mark.parametrize(("changes", "message"), [
    ({"task_scheduler": {"trials": 0}}, "task_scheduler 'trials' must be a positive integer"),
    ({"task_scheduler": {"trials": 8, "rounds": 2}}, "unknown task_scheduler keys \\['rounds'\\]"),
    ({"workloads": [{"weight": -1, "dense": {"M": 2, "N": 8, "K": 8}}]}, "'weight'.*must be a positive number"),
])
def test_bad_network_configs_name_the_problem(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        parse_tune_config(yaml.safe_load(_network(tmp_path, **changes).read_text()))
