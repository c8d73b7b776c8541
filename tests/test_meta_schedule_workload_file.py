"""Jobs that name a TVM task by structural hash in a JSONDatabase workload file (what
``lorien extract --dialect meta_schedule`` writes) are tuned without TVM, keeping TVM's entry."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from lorien.errors import ConfigError
from lorien.tune.config import load_tune_config
from lorien.tune.loop import tune_job

RELAX_CONVNET = Path(__file__).parent / "data" / "relax_convnet" / "database_workload.json"
CONV_TASK = "7142770395618065490"  # fused conv2d(8 -> 16, 3x3, pad 1) + bias + relu
RESHAPE_TASK = "12171635865472079267"  # a reshape: no block to tile


def _config(tmp_path: Path, *keys: str) -> Path:
    directory = tmp_path / "tasks"
    directory.mkdir()
    shutil.copy(RELAX_CONVNET, directory / "database_workload.json")
    lines = ["dialect: meta_schedule", "workload_file: database_workload.json", "target: llvm", "tuner: random",
             "trials: 2", "batch_size: 2", "measure: {number: 1, repeat: 1, min_repeat_ms: 0}", "workloads:"]
    lines += [f"  - {{name: task{i}, workload_key: '{key}', weight: 2}}" for i, key in enumerate(keys)]
    path = directory / "model.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_relative_workload_file_is_read_beside_the_yaml(tmp_path):
    config = load_tune_config(_config(tmp_path, CONV_TASK))
    assert config.jobs[0]["workload_file"] == str((tmp_path / "tasks" / "database_workload.json").resolve())
    assert config.jobs[0]["workload_key"] == CONV_TASK and config.jobs[0]["weight"] == 2


def test_a_hash_the_workload_file_lacks_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="no workload with structural hash 123"):
        load_tune_config(_config(tmp_path, "123"))


# the reshape's 12 points (unroll step x jobs per core) lower to one program, measured once
@pytest.mark.parametrize(("key", "records"), [(CONV_TASK, 2), (RESHAPE_TASK, 1)])
def test_a_task_of_the_file_is_tuned_and_its_records_keep_tvms_hash_and_module(tmp_path, key, records):
    job = load_tune_config(_config(tmp_path, key)).jobs[0]
    progress = tune_job(job)
    assert len(progress.records) == records and all(record.error_no == 0 for record in progress.records)
    entry = next(orjson.loads(line) for line in RELAX_CONVNET.read_text().splitlines() if orjson.loads(line)[0] == key)
    for record in progress.records:
        assert record.workload_key == key
        assert orjson.loads(record.extra)["workload"] == entry
