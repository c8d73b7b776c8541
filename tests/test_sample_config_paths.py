"""Issue 23's "done when": tuning the three sample configs (configs/samples/quick.yaml,
auto_scheduler.yaml, meta_schedule.yaml) reaches the engine's newer schedule paths, and each
record names its path the way ``lorien query`` shows it. Every workload of each config is tuned
as the config gives it, with two trials each (the first batch holds every path: path
coverage), and the paths its records name are compared with the table below, so a new sample
workload or a path lost from a space fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorien.record import schedule_path
from lorien.tune.config import load_tune_config
from lorien.tune.loop import tune_job

SAMPLES = Path(__file__).resolve().parent.parent / "configs" / "samples"
MEASURE = {"number": 1, "repeat": 1, "min_repeat_ms": 0}
TRIALS = 2   # every path knob of these spaces has at most two values

#: Per sample config, the paths the records of each workload name, in the config's order.
#: None: the workload's space chooses no path (one schedule).
EXPECTED_PATHS = {
    "quick": [
        {None},                          # dense 64x64x64: dense_pack.x86, one schedule
        {"rfactor"},                     # dense 1x256x256: dense_gemv.x86, named by its template
        {"packed_y", "panel"},           # batch_matmul
        {"direct", "pad_rows"},          # conv2d NCHWc 3x3, padding 1
        {"direct", "matmul"},            # conv2d NCHW 1x1
        {"channel_tile", "row_tile"},    # depthwise NCHW 3x3
    ],
    "auto_scheduler": [
        {"multi_level_tiling"},              # dense 64 + bias + relu
        {"multi_level_tiling", "rfactor"},   # dense 1x256x256: the GEMV sketch
        {"multi_level_tiling"},              # batch_matmul
        {"multi_level_tiling"},              # conv2d NHWC
        {"multi_level_tiling"},              # conv2d NCHW + bias + relu
        {"multi_level_tiling"},              # depthwise
    ],
    "meta_schedule": [
        {"multi_level_tiling"},              # dense 64 + bias + relu
        {"multi_level_tiling", "rfactor"},   # dense 1x256x256: the rfactor rule
        {"multi_level_tiling"},              # batch_matmul
        {"multi_level_tiling"},              # conv2d NHWC
        {"multi_level_tiling"},              # conv2d NCHW
    ],
}


@pytest.mark.parametrize("sample", sorted(EXPECTED_PATHS))
def test_tuning_a_sample_config_reaches_each_workloads_paths_and_its_records_name_them(store_uri, sample):
    jobs = load_tune_config(SAMPLES / f"{sample}.yaml").jobs
    assert len(jobs) == len(EXPECTED_PATHS[sample])
    named = []
    for job in jobs:
        job = {**job, "trials": TRIALS, "batch_size": TRIALS, "measure": MEASURE, "tuner": "random",
               "tuner_options": {}}
        records = tune_job(job, store_uri).records
        assert records and all(r.error_no == 0 for r in records), job["task_name"]   # the runner's NumPy check
        named.append({schedule_path(r) for r in records})
    assert named == EXPECTED_PATHS[sample]
