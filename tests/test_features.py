"""Featurization: records -> per-template CSV/.meta/Parquet, on the real TopHub logs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from lorien.cli import main
from lorien.errors import LorienError
from lorien.features import (
    FeatureMeta,
    featurize,
    featurize_table,
    load_features,
    output_paths,
    record_features,
)
from lorien.record import records_to_table

X86_TEMPLATE = "conv2d_NCHWc.x86"


@pytest.fixture
def llvm_log(shared_data: Path) -> Path:
    return shared_data / "tophub" / "llvm_v0.04.log"


def _log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _write_lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_tophub_x86_log_featurizes_into_csv_meta_and_parquet(tmp_path, llvm_log):
    report = featurize(tmp_path / "out", paths=[llvm_log], jobs=1, progress=False)
    paths = output_paths(tmp_path / "out", X86_TEMPLATE)
    assert all(path.is_file() for path in paths.values())
    csv = pd.read_csv(paths["csv"])
    assert len(csv) == len(_log_lines(llvm_log)) == report.records_featurized
    assert csv.columns[-1] == "thrpt"
    assert {"sp_tile_ic_0", "sp_tile_oc_1", "sp_tile_ow_0", "ot_unroll_kw", "in_1", "attr_0"} <= set(csv.columns)
    assert list(csv.columns[:-1]) == FeatureMeta.read(paths["meta"]).names


def test_every_shared_tophub_log_featurizes_without_drops(tmp_path, shared_data):
    report = featurize(tmp_path / "out", paths=[shared_data / "tophub"], jobs=1, progress=False)
    assert report.records_featurized == report.records_read > 1000
    assert report.dropped == {}
    assert {"conv2d_nchw.cuda", "conv2d_packed.vta", X86_TEMPLATE} <= set(report.templates)


def test_numeric_features_are_standardized_with_the_mean_and_std_in_meta(tmp_path, llvm_log):
    featurize(tmp_path / "out", paths=[llvm_log], jobs=1, progress=False)
    frame, meta = load_features(tmp_path / "out", X86_TEMPLATE)
    raw_channels = np.array([line["input"][2][0][1][1] for line in _log_lines(llvm_log)], dtype=float)
    in_1 = next(c for c in meta.columns if c.name == "in_1")
    assert in_1.kind == "numeric"
    assert in_1.mean == pytest.approx(raw_channels.mean())
    assert in_1.std == pytest.approx(raw_channels.std())
    assert frame["in_1"].mean() == pytest.approx(0.0, abs=1e-9)
    assert frame["in_1"].std(ddof=0) == pytest.approx(1.0)


def test_constant_numeric_feature_gets_std_one(tmp_path, llvm_log):
    featurize(tmp_path / "out", paths=[llvm_log], jobs=1, progress=False)
    _, meta = load_features(tmp_path / "out", X86_TEMPLATE)
    batch = next(c for c in meta.columns if c.name == "in_0")  # batch size is 1 everywhere
    assert (batch.mean, batch.std) == (1.0, 1.0)


def test_string_features_are_enumerated_by_their_position_in_meta(tmp_path, llvm_log):
    featurize(tmp_path / "out", paths=[llvm_log], jobs=1, progress=False)
    frame, meta = load_features(tmp_path / "out", X86_TEMPLATE)
    dtype = next(c for c in meta.columns if c.name == "in_4")
    assert dtype.kind == "category" and dtype.categories == ["float32"]
    assert set(frame["in_4"]) == {0.0}
    assert "in_4,category,float32" in output_paths(tmp_path / "out", X86_TEMPLATE)["meta"].read_text()


def test_failed_records_get_zero_throughput_and_are_counted(tmp_path, llvm_log):
    lines = _log_lines(llvm_log)
    for line in lines[:5]:
        line["result"][1] = 4  # RUNTIME_DEVICE
    log = _write_lines(tmp_path / "failed.log", lines)
    report = featurize(tmp_path / "out", paths=[log], jobs=1, progress=False)
    frame, _ = load_features(tmp_path / "out", X86_TEMPLATE)
    assert (frame["thrpt"] == 0).sum() == 5
    assert report.zeroed == {"failed measurement (error_no != 0)": 5}
    assert report.records_featurized == len(lines)


def test_nan_and_infinite_costs_get_zero_throughput_and_are_counted(llvm_log):
    from lorien.formats import read_log

    records = read_log(llvm_log).records
    broken = [records[0].with_changes(costs=[math.nan]), records[1].with_changes(costs=[math.inf]),
              *records[2:]]
    outputs, counts = featurize_table(records_to_table(broken))
    thrpt = outputs[X86_TEMPLATE]["thrpt"].to_numpy()
    assert (thrpt == 0).sum() == 2 and (thrpt > 0).sum() == len(records) - 2
    assert counts["zeroed"] == {"NaN, infinite, empty or non-positive costs": 2}


def test_unparsable_config_is_dropped_counted_and_shown(tmp_path, llvm_log):
    lines = _log_lines(llvm_log)
    lines[0]["config"]["entity"] = [["tile_ic", "zz", [1, 3]]]
    log = _write_lines(tmp_path / "bad.log", lines)
    report = featurize(tmp_path / "out", paths=[log], jobs=1, progress=False)
    assert report.records_featurized == len(lines) - 1
    assert report.dropped == {f"{X86_TEMPLATE}: features not extractable": 1}
    assert any("'zz'" in example for example in report.examples)


def test_records_without_a_feature_extractor_are_dropped_and_counted(llvm_log):
    from lorien.formats import read_log

    records = read_log(llvm_log).records
    foreign = [r.with_changes(dialect="no_such_dialect") for r in records[:3]]
    outputs, counts = featurize_table(records_to_table(foreign + records[3:]))
    assert outputs[X86_TEMPLATE].num_rows == len(records) - 3
    assert counts["dropped"] == {"dialect 'no_such_dialect' has no feature extractor": 3}


def test_unknown_template_is_an_error_naming_the_templates_found(tmp_path, llvm_log):
    with pytest.raises(LorienError, match=r"no featurizable records|no records"):
        featurize(tmp_path / "out", paths=[llvm_log], templates=["dense_pack.x86"], jobs=1, progress=False)
    featurize(tmp_path / "out", paths=[llvm_log], jobs=1, progress=False)
    with pytest.raises(LorienError, match=r"unknown template 'dense_pack.x86'.*conv2d_NCHWc.x86"):
        load_features(tmp_path / "out", "dense_pack.x86")


def test_empty_store_is_a_clear_error(tmp_path, store_uri):
    with pytest.raises(LorienError, match="no records to featurize in store"):
        featurize(tmp_path / "out", store=store_uri, jobs=1, progress=False)


def test_missing_feature_columns_are_reported_not_silently_filled(tmp_path, llvm_log):
    featurize(tmp_path / "out", paths=[llvm_log], jobs=1, progress=False)
    paths = output_paths(tmp_path / "out", X86_TEMPLATE)
    paths["parquet"].unlink()
    frame = pd.read_csv(paths["csv"]).drop(columns=["sp_tile_ic_0"])
    frame.to_csv(paths["csv"], index=False)
    with pytest.raises(LorienError, match=r"\['sp_tile_ic_0'\] are missing"):
        load_features(tmp_path / "out", X86_TEMPLATE)


def test_knobs_absent_from_some_configs_are_counted_as_missing_values(tmp_path, llvm_log):
    report = featurize(tmp_path / "out", paths=[llvm_log], jobs=1, progress=False)
    lines = _log_lines(llvm_log)
    without_tile_oh = sum(1 for line in lines if "tile_oh" not in [e[0] for e in line["config"]["entity"]])
    assert report.missing_values[X86_TEMPLATE]["ot_tile_oh"] == without_tile_oh > 0


def test_store_and_log_featurization_give_the_same_features(tmp_path, llvm_log, store_uri):
    from lorien.formats import read_log
    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        store.commit(read_log(llvm_log).records)
    from_store = featurize(tmp_path / "store_out", store=store_uri, jobs=1, progress=False)
    featurize(tmp_path / "log_out", paths=[llvm_log], jobs=1, progress=False)
    store_frame, _ = load_features(tmp_path / "store_out", X86_TEMPLATE)
    log_frame, _ = load_features(tmp_path / "log_out", X86_TEMPLATE)
    key = ["workload_key", "thrpt"]
    pd.testing.assert_frame_equal(store_frame.sort_values(key).reset_index(drop=True),
                                  log_frame.sort_values(key).reset_index(drop=True))
    assert from_store.source["kind"] == "store" and from_store.source["files"] >= 1
    assert from_store.records_read == 35
    assert all(f["path"].startswith("records/target_key=") for f in from_store.source["file_list"])


def test_a_half_published_commit_in_the_store_is_not_featurized(tmp_path, llvm_log, store_uri):
    """Featurization streams only files of complete commits, like every store reader."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lorien.formats import read_log
    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        store.commit(read_log(llvm_log).records)
        published = sorted(store.visible_record_files())
    root = tmp_path / "warehouse"
    source = root / published[0]
    orphan = source.parent / "part-0123456789abcdef0123456789abcdef-1of2.parquet"
    table = pq.read_table(source)
    fresh_ids = pa.array([f"{index:032x}" for index in range(table.num_rows)])
    # One file of a two-file commit whose writer was killed: records not stored anywhere else.
    pq.write_table(table.set_column(table.schema.get_field_index("record_id"), "record_id", fresh_ids), orphan)

    report = featurize(tmp_path / "out", store=store_uri, jobs=1, progress=False)
    assert report.records_read == 35
    assert all(not f["path"].endswith("1of2.parquet") for f in report.source["file_list"])


def test_parallel_workers_write_the_same_features_as_one_process(tmp_path, shared_data):
    logs = [shared_data / "tophub"]
    featurize(tmp_path / "serial", paths=logs, jobs=1, batch_size=200, progress=False)
    report = featurize(tmp_path / "parallel", paths=logs, jobs=2, batch_size=200, progress=False)
    for template in report.templates:
        serial, _ = load_features(tmp_path / "serial", template)
        parallel, _ = load_features(tmp_path / "parallel", template)
        key = list(serial.columns)
        pd.testing.assert_frame_equal(serial.sort_values(key).reset_index(drop=True),
                                      parallel.sort_values(key).reset_index(drop=True))


def test_manifest_records_the_source_files_filters_and_counts(tmp_path, shared_data):
    featurize(tmp_path / "out", paths=[shared_data / "tophub"], filters={"target_key": "llvm_cpu"},
              jobs=1, progress=False)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["source"]["kind"] == "logs"
    assert {Path(f["path"]).name for f in manifest["source"]["files"]} == {
        "cuda_v0.10.log", "llvm_v0.04.log", "rocm_v0.05.log", "vta_v0.10.log"}
    assert manifest["filters"] == {"target_key": "llvm_cpu"}
    assert X86_TEMPLATE in manifest["templates"] and "conv2d_nchw.cuda" not in manifest["templates"]
    assert manifest["records_featurized"] == sum(t["rows"] for t in manifest["templates"].values())


def test_meta_transform_of_raw_features_reproduces_the_csv_rows(tmp_path, llvm_log):
    from lorien.formats import read_log

    featurize(tmp_path / "out", paths=[llvm_log], jobs=1, progress=False)
    frame, meta = load_features(tmp_path / "out", X86_TEMPLATE)
    records = sorted(read_log(llvm_log).records, key=lambda r: r.gflops)
    raw = [record_features(r) for r in records]
    expected = frame.sort_values("thrpt")
    np.testing.assert_allclose([r.gflops for r in records], expected["thrpt"], rtol=1e-6)
    np.testing.assert_allclose(meta.transform(raw), expected[meta.names].to_numpy(), rtol=1e-5, atol=1e-5)


def test_feature_names_follow_lorien_conventions():
    args = [["TENSOR", [1, 64], "float32"], ["TENSOR", [32, 64], "float32"], None, "float32"]
    entity = [["tile_y", "sp", [1, 1]], ["tile_x", "sp", [4, 8]], ["ann", "an", ["unroll", "vec"]],
              ["order", "re", [1, 0]], ["unroll_kw", "ot", True]]
    from dialects.autotvm.features import knob_features, workload_features

    features = {**workload_features(args), **knob_features(entity)}
    assert features == {"attr_0": "None", "attr_1": "float32", "in_0": 1, "in_1": 64, "in_2": "float32",
                        "in_3": 32, "in_4": 64, "in_5": "float32", "sp_tile_y_0": 1, "sp_tile_y_1": 1,
                        "sp_tile_x_0": 4, "sp_tile_x_1": 8, "an_ann": "unroll;vec", "re_order": "1;0",
                        "ot_unroll_kw": 1}


def test_cli_featurize_writes_outputs_and_prints_counts(tmp_path, llvm_log, capsys):
    assert main(["featurize", str(llvm_log), "-o", str(tmp_path / "out"), "--jobs", "1", "--quiet"]) == 0
    assert f"{X86_TEMPLATE}: 35 rows" in capsys.readouterr().out
    assert output_paths(tmp_path / "out", X86_TEMPLATE)["csv"].is_file()


def test_cli_featurize_without_a_source_reads_the_default_store(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LORIEN_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["featurize", "-o", str(tmp_path / "out")]) == 1
    assert f"no warehouse at '{tmp_path / 'lorien-warehouse'}'" in capsys.readouterr().err


def test_cli_featurize_takes_logs_or_a_store_not_both(tmp_path, llvm_log, capsys):
    assert main(["featurize", str(llvm_log), "--store", str(tmp_path), "-o", str(tmp_path / "out")]) == 1
    assert "not both" in capsys.readouterr().err


def test_phase1_table_batches_are_featurized_per_template(llvm_log):
    from lorien.formats import read_log

    table = records_to_table(read_log(llvm_log).records)
    outputs, counts = featurize_table(pa.concat_tables([table, table]))
    assert list(outputs) == [X86_TEMPLATE]
    assert counts["featurized"] == 2 * table.num_rows


def test_batch_featurizer_gives_the_features_of_featurize_record_by_record(tmp_path, shared_data):
    logs = [shared_data / "tophub"]
    fast = featurize(tmp_path / "fast", paths=logs, extractor="auto", jobs=1, progress=False)
    featurize(tmp_path / "dialect", paths=logs, extractor="dialect", jobs=1, progress=False)
    for template in fast.templates:
        builtin_frame, builtin_meta = load_features(tmp_path / "fast", template)
        dialect_frame, dialect_meta = load_features(tmp_path / "dialect", template)
        assert builtin_meta.names == dialect_meta.names
        key = list(builtin_frame.columns)
        pd.testing.assert_frame_equal(builtin_frame.sort_values(key).reset_index(drop=True),
                                      dialect_frame.sort_values(key).reset_index(drop=True))


def test_records_stored_twice_by_racing_writers_are_featurized_once(tmp_path, llvm_log, store_uri):
    import shutil

    from lorien.formats import read_log
    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        store.commit(read_log(llvm_log).records)
    root = Path(store_uri.removeprefix("parquet:"))
    original = next((root / "records").rglob("*.parquet"))
    shutil.copy(original, original.with_name("part-copy-of-a-racing-writer.parquet"))
    report = featurize(tmp_path / "out", store=store_uri, jobs=1, progress=False)
    assert report.records_read == 35 and report.source["duplicates_dropped"] > 0


def test_seen_prefixes_tell_fresh_ids_from_repeats_as_a_set_does():
    import numpy as np

    from lorien.features.sources import SeenPrefixes

    rng = np.random.default_rng(0)
    pool = rng.integers(0, 2**64, size=5000, dtype=np.uint64, endpoint=False)
    pool[:3] = [0, 2**64 - 1, 2**56]  # the ends of the first and last partitions, and a border
    seen, model = SeenPrefixes(), set()
    for _ in range(40):
        batch = rng.choice(pool, size=300)  # repeats within a batch and across batches
        fresh = seen.add(batch)
        expected = []
        for value in batch.tolist():
            expected.append(value not in model)
            model.add(value)
        assert fresh.tolist() == expected
    assert len(seen) == len(model)


def test_a_store_batch_ends_at_its_byte_bound_before_its_row_bound():
    import pyarrow as pa

    from lorien.features.sources import _rebatch

    small = pa.RecordBatch.from_arrays([pa.array(["x" * 1000] * 10)], names=["config"])  # about 10 kB
    tables = list(_rebatch(iter([small] * 10), batch_size=1000, batch_bytes=3 * small.nbytes))
    assert [table.num_rows for table in tables] == [30, 30, 30, 10]
    assert [table.num_rows for table in _rebatch(iter([small] * 10), batch_size=1000)] == [100]
