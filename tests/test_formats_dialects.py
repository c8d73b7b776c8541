"""The auto_scheduler and meta_schedule dialects: found through entry points, featurize their records."""

from __future__ import annotations

import pytest

from lorien.dialect import Dialect, get_dialect
from lorien.errors import DialectError
from lorien.formats import read_log


@pytest.mark.parametrize(("name", "formats"), [("auto_scheduler", ["ansor"]), ("meta_schedule", ["meta_schedule"])])
def test_dialect_loads_through_its_entry_point(name, formats):
    dialect = get_dialect(name)
    assert isinstance(dialect, Dialect) and dialect.name == name and dialect.record_formats() == formats


def test_auto_scheduler_features_name_split_factors_pragmas_and_throughput(shared_data):
    record = read_log(shared_data / "ansor" / "matmul.json").records[0]
    features = get_dialect("auto_scheduler").featurize(record)
    assert [features[f"attr_{i}"] for i in range(4)] == [1024, 1024, 1024, "float32"]
    assert [features["sp_0_0"], features["sp_0_1"], features["sp_0_2"]] == [2, 1, 4]
    assert features["ot_10"] == 8 and features["n_SP"] == 3
    assert list(features)[-1] == "thrpt" and features["thrpt"] == pytest.approx(record.gflops, abs=1e-3)


def test_auto_scheduler_features_of_unknown_flop_have_zero_throughput(shared_data):
    record = read_log(shared_data / "ansor" / "resnet-50-NHWC-B1-llvm.json").records[0]
    assert get_dialect("auto_scheduler").featurize(record)["thrpt"] == 0.0


def test_auto_scheduler_refuses_an_unknown_step_kind(shared_data):
    record = read_log(shared_data / "ansor" / "matmul.json").records[0]
    with pytest.raises(DialectError, match="'XX'"):
        get_dialect("auto_scheduler").featurize(record.with_changes(config='[["XX", 1]]'))


def test_meta_schedule_features_name_sampling_decisions(shared_data):
    record = read_log(shared_data / "meta_schedule" / "matmul_128").records[0]
    features = get_dialect("meta_schedule").featurize(record)
    assert [features[f"sp_4_{j}"] for j in range(4)] == [2, 8, 4, 2]
    assert features["ot_15"] == 1 and features["n_SamplePerfectTile"] == 3
    assert [features[f"in_{i}"] for i in range(6)] == [128] * 6
    assert list(features)[-1] == "thrpt" and features["thrpt"] > 0


def test_meta_schedule_refuses_a_config_that_is_not_a_trace(shared_data):
    record = read_log(shared_data / "meta_schedule" / "matmul_128").records[0]
    with pytest.raises(DialectError, match="not a trace"):
        get_dialect("meta_schedule").featurize(record.with_changes(config='{"a": 1}'))
