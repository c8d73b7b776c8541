"""AutoTVM records: measurements become codec records, features follow Lorien's naming,
TopHub lines apply to our engine and get measured."""

from __future__ import annotations

import json

import orjson
import pytest

from dialects.autotvm import DIALECT, apply_config
from dialects.autotvm.apply import apply_log_line, read_log_line
from dialects.autotvm.records import encode, make_record, native_line
from dialects.autotvm.templates import instantiate
from lorien.formats import decode_line, read_log

DENSE_ARGS = [["TENSOR", [8, 16], "float32"], ["TENSOR", [12, 16], "float32"], None, "float32"]


def test_measured_record_round_trips_through_the_autotvm_codec():
    task = instantiate("dense_pack.x86", DENSE_ARGS)
    config = task.config(5)
    record = make_record("llvm -mcpu=znver3", "dense_pack.x86", DENSE_ARGS, config, [1e-5, 2e-5], 0, 0.5, 1700000000.0)
    assert record.dialect == "autotvm" and record.target_key == "llvm_cpu"
    assert record.workload_key.startswith("dense_pack.x86#")
    assert record.flop == 2 * 8 * 12 * 16
    assert json.loads(encode(record)) == json.loads(native_line("llvm -mcpu=znver3", "dense_pack.x86", DENSE_ARGS,
                                                                config, [1e-5, 2e-5], 0, 0.5, 1700000000.0))
    assert decode_line(encode(record), "autotvm").record_id == record.record_id
    assert json.loads(record.build)["engine"].startswith("lorien")


def test_failed_measurement_is_recorded_with_its_error_code():
    task = instantiate("dense_pack.x86", DENSE_ARGS)
    record = make_record("llvm", "dense_pack.x86", DENSE_ARGS, task.config(0), [], 6, 10.0, 1700000000.0)
    assert record.error_no == 6 and not record.is_valid


def test_featurize_names_workload_and_knob_features_like_lorien(shared_data):
    records = read_log(shared_data / "tophub" / "llvm_v0.04.log").records
    features = DIALECT.featurize(records[0])
    assert features["in_0"] == 1 and features["in_1"] == 3 and features["in_4"] == "float32"
    assert features["attr_0"] == 2 and features["attr_1"] == 2
    assert features["sp_tile_ic_0"] == 1 and features["sp_tile_ic_1"] == 3
    assert features["sp_tile_oc_1"] == 32
    assert features["ot_unroll_kw"] == 0  # booleans count as numbers
    assert list(features)[-1] == "thrpt" and features["thrpt"] > 0
    assert DIALECT.template_of(records[0]) == "conv2d_NCHWc.x86"


def test_featurize_encodes_reorder_and_annotation_knobs():
    from dialects.autotvm.features import knob_features

    features = knob_features([["order", "re", [2, 0, 1]], ["ann", "an", ["unroll", "vec"]], ["u", "ot", 4]])
    assert features == {"re_order": "2;0;1", "an_ann": "unroll;vec", "ot_u": 4}


def test_read_log_line_rejects_comment_lines_with_file_and_line(shared_data):
    from lorien.errors import ConfigError

    with pytest.raises(ConfigError, match="llvm_v0.04.log:1"):
        read_log_line(shared_data / "tophub" / "llvm_v0.04.log", 1)


def test_tophub_line_is_applied_and_measured_on_this_host(shared_data):
    path = shared_data / "tophub" / "llvm_v0.04.log"
    line_no = 15  # [1, 64, 56, 56] x [256, 64, 1, 1], a 1x1 conv with tile_oh
    row = orjson.loads(path.read_text().splitlines()[line_no - 1])
    applied = apply_log_line(path, line_no, measure={"repeat": 2, "build_timeout_s": 60, "run_timeout_s": 30})
    assert applied.config.index == row["config"]["index"]
    assert applied.record.error_no == 0, applied.error_msg
    assert applied.gflops > 0
    assert applied.record.target != row["input"][0]  # measured here, not on the TopHub machine
    assert applied.logged_cost_s == row["result"][0][0] and applied.logged_target == row["input"][0]


def test_apply_config_accepts_an_index_and_commits_when_asked(store_uri):
    from lorien.warehouse import open_store

    applied = apply_config("dense_nopack.x86", DENSE_ARGS, 3, measure={"build_timeout_s": 60}, store_uri=store_uri)
    assert applied.record.is_valid
    with open_store(store_uri) as store:
        assert store.scan().column("record_id").to_pylist() == [applied.record.record_id]


def test_cli_apply_measures_a_config_given_by_workload_key():
    import subprocess
    import sys

    key = "dense_pack.x86#_TENSOR__8_16__float32_#_TENSOR__16_16__float32_#None#float32"
    config = '[["tile_y","sp",[-1,1,8]],["tile_x","sp",[-1,1,16]],["tile_k","sp",[-1,4]]]'
    proc = subprocess.run([sys.executable, "-m", "lorien.cli", "apply", "--workload-key", key, "--config", config,
                           "--measure", '{"build_timeout_s": 60}'], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "GFLOPS" in proc.stdout and '"tile_x", "sp", [-1, 1, 16]' in proc.stdout


def test_cli_apply_rejects_a_config_outside_the_space():
    import subprocess
    import sys

    key = "dense_pack.x86#_TENSOR__8_16__float32_#_TENSOR__16_16__float32_#None#float32"
    config = '[["tile_y","sp",[-1,1,3]],["tile_x","sp",[-1,1,16]],["tile_k","sp",[-1,4]]]'
    proc = subprocess.run([sys.executable, "-m", "lorien.cli", "apply", "--workload-key", key, "--config", config],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "tile_y" in proc.stderr


def test_transfer_from_an_empty_store_gives_no_history(store_uri):
    from dialects.autotvm.tuning import cached_task, transfer_history
    from lorien.warehouse import open_store

    task = cached_task("dense_nopack.x86", json.dumps(DENSE_ARGS))
    with open_store(store_uri) as store:
        features, scores = transfer_history(task, store, "llvm_cpu")
    assert features.shape[0] == 0 == len(scores)
