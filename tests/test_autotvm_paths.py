"""The engine's newer schedules as a ``path`` knob of the autotvm templates: the packed-panel
batch_matmul, the 1x1 NCHW convolution as a matmul, the row-tiled NCHW depthwise, the NCHW[x]c
convolution padding per output row. Each path
matches NumPy, tuning finds it and its records name it, and a config written before the knob
existed still replays, on the old path."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_template

from dialects.autotvm.features import config_entity
from dialects.autotvm.templates import instantiate
from lorien.errors import DialectError
from lorien.tune.loop import tune_job

T = "TENSOR"
MEASURE = {"number": 1, "repeat": 1, "min_repeat_ms": 0}


def _has_stage(name: str):
    return lambda schedule: name in {stage.name for stage in schedule.stages}


def _pads_per_row(schedule) -> bool:
    """The NCHW[x]c convolution pads inside its parallel row loop (no parallel pass of its own)."""
    return schedule["data_pad"].attach is not None and "parallel" not in schedule["data_pad"].annotations.values()


# (task, args, old path, new path, the new path's tell-tale in the schedule, or None: the 2-d views)
PATHS = [
    ("batch_matmul.x86", [[T, [2, 8, 16], "float32"], [T, [2, 24, 16], "float32"], None],
     "packed_y", "panel", _has_stage("batch_matmul.y_pack")),
    ("batch_matmul.x86", [[T, [3, 4, 8], "float32"], [T, [1, 16, 8], "float32"], None],   # y broadcast over B
     "packed_y", "panel", _has_stage("batch_matmul.y_pack")),
    ("conv2d_nchw.x86", [[T, [1, 8, 6, 6], "float32"], [T, [12, 8, 1, 1], "float32"], [1, 1], [0, 0, 0, 0], [1, 1],
                         "float32"], "direct", "matmul", None),
    ("depthwise_conv2d_nchw.x86", [[T, [1, 4, 9, 9], "float32"], [T, [4, 1, 3, 3], "float32"], [1, 1],
                                   [1, 1, 1, 1], [1, 1], "float32"], "channel_tile", "row_tile",
     _has_stage("depthwise_conv2d_nchw.pad")),
    ("depthwise_conv2d_nchw.x86", [[T, [1, 4, 8, 8], "float32"], [T, [4, 2, 3, 3], "float32"], [2, 2],
                                   [1, 1, 1, 1], [1, 1], "float32"], "channel_tile", "row_tile",
     _has_stage("depthwise_conv2d_nchw.pad")),
    ("conv2d_NCHWc.x86", [[T, [1, 8, 9, 9], "float32"], [T, [16, 8, 3, 3], "float32"], [2, 2], [1, 1, 1, 1],
                          [1, 1], "NCHW", "NCHW", "float32"], "direct", "pad_rows", _pads_per_row),
]


def _run(task, config, rng):
    output, expected, schedule, tensors = run_template(task, config, rng)
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4, err_msg=f"{task.name} {config}")
    return schedule, tensors


@pytest.mark.parametrize("task_name, args, old, new, stage", PATHS)
def test_the_new_path_is_a_knob_and_matches_numpy(task_name, args, old, new, stage):
    task = instantiate(task_name, args)
    assert list(task.space.space_map)[-1] == "path"
    assert [e.val for e in task.space.space_map["path"]] == [old, new]
    rng = np.random.default_rng(11)
    on_new = [i for i in range(len(task.space)) if task.config(i)["path"].val == new]
    assert len(on_new) == len(task.space) // 2
    for index in sorted({on_new[0], on_new[-1], *rng.choice(on_new, size=3).tolist()}):
        schedule, tensors = _run(task, task.config(int(index)), rng)
        if stage is None:   # the 1x1 convolution's matmul runs on the 2-d views
            assert [len(t.shape) for t in tensors] == [2, 2, 2]
        else:
            assert stage(schedule)


@pytest.mark.parametrize("task_name, args, old, new, stage", PATHS)
def test_a_config_from_before_the_knob_replays_on_the_old_path(task_name, args, old, new, stage):
    task = instantiate(task_name, args)
    rng = np.random.default_rng(4)
    for index in (0, len(task.space) // 2 - 1, 3):
        config = task.config(index)
        assert config["path"].val == old         # the old configs keep their index: path is the top digit
        entity = [item for item in config.to_json_entity() if item[0] != "path"]
        replayed = task.space.from_json_entity(entity)
        assert replayed.index == index and replayed["path"].val == old
        schedule, tensors = _run(task, replayed, rng)
        if "NCHWc" not in task_name:   # the args' tensors (NCHW[x]c packs them in every config)
            assert [[int(x) for x in t.shape] for t in tensors[:2]] == [a[1] for a in args[:2]]
        assert stage is None or not stage(schedule)
        with pytest.raises(DialectError, match="missing"):   # other missing knobs are still an error
            task.space.from_json_entity(entity[1:])


def test_conv2d_nchw_has_no_path_knob_where_the_matmul_does_not_apply():
    strided = instantiate("conv2d_nchw.x86", [[T, [1, 8, 6, 6], "float32"], [T, [12, 8, 1, 1], "float32"], [2, 2],
                                              [0, 0, 0, 0], [1, 1], "float32"])
    padded3x3 = instantiate("conv2d_nchw.x86", [[T, [1, 8, 6, 6], "float32"], [T, [12, 8, 3, 3], "float32"], [1, 1],
                                                [1, 1, 1, 1], [1, 1], "float32"])
    assert "path" not in strided.space and "path" not in padded3x3.space


def test_conv2d_nchwc_has_no_path_knob_without_padding():
    unpadded = instantiate("conv2d_NCHWc.x86", [[T, [1, 8, 8, 8], "float32"], [T, [16, 8, 3, 3], "float32"], [1, 1],
                                                [0, 0, 0, 0], [1, 1], "NCHW", "NCHW", "float32"])
    pointwise = instantiate("conv2d_NCHWc.x86", [[T, [1, 8, 6, 6], "float32"], [T, [8, 8, 1, 1], "float32"], [1, 1],
                                                 [0, 0, 0, 0], [1, 1], "NCHW", "NCHW", "float32"])
    assert "path" not in unpadded.space and "path" not in pointwise.space


@pytest.mark.parametrize("task_name, args, old, new, stage", [PATHS[0], PATHS[2], PATHS[3], PATHS[5]])
def test_tuning_finds_the_new_path_and_the_records_name_it(store_uri, task_name, args, old, new, stage):
    job = {"dialect": "autotvm", "task_name": task_name, "args": args, "target": "llvm", "trials": 12,
           "batch_size": 6, "measure": MEASURE, "seed": 0, "tuner": "random"}
    records = tune_job(job, store_uri).records
    valid = [r for r in records if r.error_no == 0]
    assert valid and len(valid) == len(records)          # every kernel passed the runner's NumPy check
    paths = {dict((name, value) for name, _, value in config_entity(r.config))["path"] for r in valid}
    assert new in paths
    text = valid[0].config if isinstance(valid[0].config, str) else json.dumps(valid[0].config)
    assert '"path"' in text


def test_records_from_before_the_knob_feed_the_model_and_replay(store_uri, tmp_path):
    from dataclasses import replace

    from dialects.autotvm.compile import schedule_record
    from dialects.autotvm.tuning import transfer_history
    from lorien.warehouse import open_store

    task_name, args = PATHS[0][:2]
    job = {"dialect": "autotvm", "task_name": task_name, "args": args, "target": "llvm", "trials": 6,
           "batch_size": 6, "measure": MEASURE, "seed": 1, "tuner": "random"}
    records = [r for r in tune_job(job, store_uri).records if r.error_no == 0]
    old = []
    for r in records:
        config = json.loads(r.config)
        config["entity"] = [item for item in config["entity"] if item[0] != "path"]
        old.append(replace(r, config=json.dumps(config), record_id=""))
    old_uri = f"parquet:{tmp_path / 'old'}"
    with open_store(old_uri) as store:
        store.commit(old)
        features, _ = transfer_history(instantiate(task_name, args), store, "llvm_cpu")
    assert features.shape[0] == len(old)                       # none skipped for the missing knob
    task = instantiate(task_name, args)
    for r in old:
        schedule, tensors = schedule_record(r)
        assert not _has_stage("batch_matmul.y_pack")(schedule)   # the old path
        assert len(tensors) == 3
    assert task.space.optional == {"path"}


def test_a_template_named_by_its_one_path_is_registered_and_has_no_path_knob():
    from dialects.autotvm.dialect import TEMPLATE_PATHS

    one_path_args = {"dense_gemv.x86": [[T, [1, 64], "float32"], [T, [48, 64], "float32"], None, "float32"]}
    assert set(one_path_args) == set(TEMPLATE_PATHS)
    for task_name, args in one_path_args.items():
        assert "path" not in instantiate(task_name, args).space
