"""`lorien ingest | query | export | warehouse` on the real TopHub, Ansor and MetaSchedule logs,
through main(argv) and through a real `lorien` process, including every error path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lorien.cli import main
from lorien.formats import read_log
from lorien.warehouse import open_store

SKYLAKE = "llvm -mcpu=skylake-avx512"


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def native_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture(scope="module")
def tophub_store(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding every TopHub log, ingested once for the read-only tests."""
    uri = f"parquet:{tmp_path_factory.mktemp('tophub') / 'warehouse'}"
    assert main(["ingest", str(shared_data / "tophub"), "--store", uri]) == 0
    return uri


@pytest.fixture
def llvm_log(shared_data: Path) -> Path:
    return shared_data / "tophub" / "llvm_v0.04.log"


def test_ingest_of_the_tophub_logs_stores_every_distinct_record(shared_data, tophub_store):
    logs = sorted((shared_data / "tophub").glob("*.log"))
    expected = {record.record_id for log in logs for record in read_log(log).records}
    assert open_store(tophub_store).stats()["records"] == len(expected)


def test_ingest_reports_counts_per_file_and_in_total(capsys, llvm_log, store_uri):
    code, out, _ = run_cli(capsys, "ingest", str(llvm_log), "--store", store_uri)
    assert code == 0
    assert f"{llvm_log} [autotvm]: 35 records, 35 stored, 0 already stored, 0 bad lines" in out
    assert "1 files, 35 records, 35 stored" in out.splitlines()[-1]


def test_ingesting_a_log_twice_stores_nothing_new(capsys, llvm_log, store_uri):
    run_cli(capsys, "ingest", str(llvm_log), "--store", store_uri)
    code, out, _ = run_cli(capsys, "ingest", str(llvm_log), "--store", store_uri)
    assert code == 0
    assert "35 records, 0 stored, 35 already stored" in out


def test_ingest_walks_directories_and_detects_each_format(capsys, shared_data, store_uri):
    code, out, _ = run_cli(capsys, "ingest", str(shared_data), "--store", store_uri)
    assert code == 0
    assert "[ansor]" in out and "[meta_schedule]" in out and "[autotvm]" in out
    assert "README" not in out
    assert len([line for line in out.splitlines() if " records, " in line]) == 10  # 9 logs + total


def test_a_malformed_line_is_reported_with_file_and_line_and_skipped(capsys, llvm_log, tmp_path, store_uri):
    lines = llvm_log.read_text().splitlines()
    broken = tmp_path / "broken.log"
    broken.write_text("\n".join([lines[2], lines[3][:40], *lines[4:6]]) + "\n")
    code, out, _ = run_cli(capsys, "ingest", str(broken), "--store", store_uri)
    assert code == 0
    assert f"{broken}:2:" in out
    assert open_store(store_uri).stats()["records"] == 3


def test_strict_ingest_of_a_malformed_line_commits_nothing(capsys, llvm_log, tmp_path, store_uri):
    lines = llvm_log.read_text().splitlines()
    broken = tmp_path / "broken.log"
    broken.write_text("\n".join([lines[2], lines[3], lines[4][:50]]) + "\n")
    code, _, err = run_cli(capsys, "ingest", str(llvm_log), str(broken), "--strict", "--store", store_uri)
    assert code == 1
    assert f"{broken}:3:" in err and "nothing was committed" in err
    assert open_store(store_uri).stats()["records"] == 0


def test_ingest_of_a_file_in_no_known_format_fails_naming_it(capsys, tmp_path, store_uri):
    notes = tmp_path / "notes.log"
    notes.write_text("this is not a tuning log\n")
    code, _, err = run_cli(capsys, "ingest", str(notes), "--store", store_uri)
    assert code == 1
    assert str(notes) in err


def test_ingest_with_an_unknown_format_name_fails(capsys, llvm_log, store_uri):
    code, _, err = run_cli(capsys, "ingest", str(llvm_log), "--format", "tophub", "--store", store_uri)
    assert code == 1
    assert "unknown log format 'tophub'" in err


def test_ingest_of_a_missing_path_fails(capsys, tmp_path, store_uri):
    code, _, err = run_cli(capsys, "ingest", str(tmp_path / "missing.log"), "--store", store_uri)
    assert code == 1
    assert "missing.log" in err


def test_ingest_without_store_uses_the_default_store_in_the_working_directory(capsys, llvm_log, tmp_path,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LORIEN_STORE", raising=False)
    assert run_cli(capsys, "ingest", str(llvm_log))[0] == 0
    assert (tmp_path / "lorien-warehouse" / "records").is_dir()


def test_query_prints_the_tophub_line_of_a_workload_as_autotvm(capsys, llvm_log, tophub_store):
    original = native_lines(llvm_log)[5]
    record = read_log(llvm_log).records[5]
    code, out, _ = run_cli(capsys, "query", "--workload-key", record.workload_key, "--target", SKYLAKE,
                           "--format", "autotvm", "--store", tophub_store)
    assert code == 0
    assert json.loads(out) == original


def test_query_of_a_store_uri_with_options_reads_the_store_at_its_path(capsys, llvm_log, tophub_store):
    original = native_lines(llvm_log)[5]
    record = read_log(llvm_log).records[5]
    for options in ("?preload=true", "?fsync=true&preload=true"):
        code, out, err = run_cli(capsys, "query", "--workload-key", record.workload_key, "--target", SKYLAKE,
                                 "--format", "autotvm", "--store", tophub_store + options)
        assert code == 0, err
        assert json.loads(out) == original


def test_query_as_json_lists_the_best_records_fastest_first(capsys, llvm_log, tophub_store):
    record = read_log(llvm_log).records[0]
    code, out, _ = run_cli(capsys, "query", "--workload-key", "conv2d_NCHWc.x86#", "--prefix", "--nbest", "3",
                           "--target", record.target_raw, "--format", "json", "--store", tophub_store)
    rows = json.loads(out)
    assert code == 0
    assert len(rows) == 3
    assert [row["cost_us"] for row in rows] == sorted(row["cost_us"] for row in rows)
    assert all(row["workload_key"].startswith("conv2d_NCHWc.x86#") for row in rows)


def test_query_as_a_table_shows_cost_and_throughput(capsys, llvm_log, tophub_store):
    record = read_log(llvm_log).records[0]
    code, out, _ = run_cli(capsys, "query", "--workload-key", record.workload_key, "--target", SKYLAKE,
                           "--store", tophub_store)
    assert code == 0
    assert "cost_us" in out.splitlines()[0]
    assert f"{record.cost_s * 1e6:.3f}" in out


def test_query_of_an_unknown_workload_fails_with_a_message(capsys, tophub_store):
    code, _, err = run_cli(capsys, "query", "--workload-key", "no_such_op#1", "--target", SKYLAKE,
                           "--store", tophub_store)
    assert code == 1
    assert "no valid record of workload 'no_such_op#1'" in err


def test_query_with_an_unparseable_target_fails_naming_it(capsys, tophub_store):
    code, _, err = run_cli(capsys, "query", "--workload-key", "k", "--target", "tpu9 -x=1", "--store", tophub_store)
    assert code == 1
    assert "'tpu9'" in err


def test_query_of_an_unreadable_store_fails_naming_it(capsys, tmp_path):
    not_a_store = tmp_path / "file.txt"
    not_a_store.write_text("x")
    code, _, err = run_cli(capsys, "query", "--workload-key", "k", "--target", SKYLAKE,
                           "--store", f"parquet:{not_a_store}")
    assert code == 1
    assert str(not_a_store) in err


def test_query_of_an_unknown_store_scheme_fails(capsys):
    code, _, err = run_cli(capsys, "query", "--workload-key", "k", "--target", SKYLAKE, "--store", "mysql:db")
    assert code == 1
    assert "unknown store URI 'mysql:db'" in err


def test_export_best_only_gives_back_the_tophub_log(capsys, llvm_log, tmp_path, store_uri):
    run_cli(capsys, "ingest", str(llvm_log), "--store", store_uri)
    exported = tmp_path / "exported.log"
    code, _, _ = run_cli(capsys, "export", "--target", SKYLAKE, "--format", "autotvm", "-o", str(exported),
                         "--store", store_uri)
    assert code == 0
    key = lambda line: json.dumps(line, sort_keys=True)  # noqa: E731
    assert sorted(map(key, native_lines(exported))) == sorted(map(key, native_lines(llvm_log)))


def test_export_keeps_only_the_fastest_record_per_workload(capsys, llvm_log, tmp_path, store_uri):
    line = native_lines(llvm_log)[0]
    slower = json.loads(json.dumps(line))
    slower["result"][0] = [line["result"][0][0] * 2]
    log = tmp_path / "two.log"
    log.write_text(json.dumps(slower) + "\n" + json.dumps(line) + "\n")
    run_cli(capsys, "ingest", str(log), "--store", store_uri)
    code, out, _ = run_cli(capsys, "export", "--target", SKYLAKE, "--format", "autotvm", "--store", store_uri)
    assert code == 0
    assert [json.loads(text) for text in out.splitlines()] == [line]
    code, out, _ = run_cli(capsys, "export", "--all", "--target", SKYLAKE, "--format", "autotvm", "--store", store_uri)
    assert len(out.splitlines()) == 2


def test_export_follows_the_query_target_rule(capsys, llvm_log, tmp_path, store_uri):
    line = native_lines(llvm_log)[0]
    faster_elsewhere = json.loads(json.dumps(line))
    faster_elsewhere["input"][0] = "llvm -mcpu=skylake-avx512 -num-cores=4"
    faster_elsewhere["result"][0] = [line["result"][0][0] / 2]
    log = tmp_path / "two.log"
    log.write_text(json.dumps(faster_elsewhere) + "\n" + json.dumps(line) + "\n")
    run_cli(capsys, "ingest", str(log), "--store", store_uri)
    exported = lambda *flags: [json.loads(text) for text in run_cli(  # noqa: E731
        capsys, "export", "--target", *flags, "--format", "autotvm", "--store", store_uri)[1].splitlines()]
    assert exported(SKYLAKE) == [line]  # the query's own target first
    assert exported("llvm") == [faster_elsewhere]  # both match equally: the faster
    assert exported("llvm", "--exact") == []
    assert exported("llvm -mcpu=skylake-avx512 -num-cores=4", "--exact") == [faster_elsewhere]


def test_export_of_ansor_records_round_trips(capsys, shared_data, tmp_path, store_uri):
    log = shared_data / "ansor" / "resnet-50-NHWC-B1-llvm.json"
    run_cli(capsys, "ingest", str(log), "--store", store_uri)
    exported = tmp_path / "ansor.json"
    code, _, _ = run_cli(capsys, "export", "--all", "--target", "llvm -mcpu=core-avx2", "--format", "ansor",
                         "-o", str(exported), "--store", store_uri)
    assert code == 0
    key = lambda line: json.dumps(line, sort_keys=True)  # noqa: E731
    assert sorted(map(key, native_lines(exported))) == sorted(map(key, native_lines(log)))


def test_exported_log_ingests_back_to_the_same_records(capsys, llvm_log, tmp_path, store_uri):
    run_cli(capsys, "ingest", str(llvm_log), "--store", store_uri)
    exported = tmp_path / "exported.log"
    run_cli(capsys, "export", "--target", SKYLAKE, "--format", "autotvm", "-o", str(exported), "--store", store_uri)
    again = f"parquet:{tmp_path / 'again'}"
    run_cli(capsys, "ingest", str(exported), "--store", again)
    ids = lambda uri: sorted(open_store(uri).scan(columns=["record_id"]).column("record_id").to_pylist())  # noqa: E731
    assert ids(again) == ids(store_uri)


def test_export_as_meta_schedule_needs_an_output_directory(capsys, shared_data, store_uri):
    run_cli(capsys, "ingest", str(shared_data / "meta_schedule"), "--store", store_uri)
    target = open_store(store_uri).scan(columns=["target"]).column("target")[0].as_py()
    code, _, err = run_cli(capsys, "export", "--target", target, "--format", "meta_schedule", "--store", store_uri)
    assert code == 1
    assert "-o DIR" in err


def test_export_with_an_unknown_format_fails(capsys, tophub_store):
    code, _, err = run_cli(capsys, "export", "--target", SKYLAKE, "--format", "tophub", "--store", tophub_store)
    assert code == 1
    assert "unknown log format 'tophub'" in err


def test_export_of_a_target_without_records_fails(capsys, tophub_store):
    code, _, err = run_cli(capsys, "export", "--target", "llvm -mcpu=znver3", "--format", "autotvm",
                           "--store", tophub_store)
    assert code == 1
    assert "no autotvm records" in err


def test_warehouse_stats_counts_the_records(capsys, tophub_store):
    code, out, _ = run_cli(capsys, "warehouse", "stats", "--json", "--store", tophub_store)
    stats = json.loads(out)
    assert code == 0
    assert stats["records"] == open_store(tophub_store).scan(columns=["record_id"]).num_rows
    assert "llvm_cpu" in stats["target_keys"]


def test_warehouse_workloads_lists_the_keys_of_a_target(capsys, llvm_log, tophub_store):
    code, out, _ = run_cli(capsys, "warehouse", "workloads", "--target", SKYLAKE, "--store", tophub_store)
    assert code == 0
    assert [line.split("\t")[0] for line in out.splitlines()] == sorted(
        {record.workload_key for record in read_log(llvm_log).records})


def test_warehouse_workloads_names_each_workload_by_task_and_shapes(capsys, shared_data, store_uri):
    for log in ("meta_schedule", "ansor/matmul.json", "tophub/llvm_v0.04.log"):
        run_cli(capsys, "ingest", str(shared_data / log), "--store", store_uri)
    code, out, _ = run_cli(capsys, "warehouse", "workloads", "--store", store_uri)
    names = dict(line.split("\t") for line in out.splitlines())
    assert code == 0
    assert names["7945140434223946842"] == "conv 1x56x56x64 3x3x64x64 1x56x56x64"  # TVM's conv_56_64 module
    assert names["8977967321216436469"] == "C 128x128 128x128 128x128"  # TVM's matmul_128 module
    assert names['["matmul_add", 1024, 1024, 1024, "float32"]'] == 'matmul_add 1024,1024,1024,"float32"'
    assert "conv2d_NCHWc.x86 1x3x224x224 64x3x7x7" in names.values()


def test_warehouse_compact_keeps_query_answers(capsys, shared_data, store_uri):
    for log in sorted((shared_data / "tophub").glob("*.log")):
        run_cli(capsys, "ingest", str(log), "--store", store_uri)
    key = open_store(store_uri).workloads("cuda -model=tx2")[0]
    query = ("query", "--workload-key", key, "--target", "cuda -model=tx2", "--nbest", "3", "--format", "json",
             "--store", store_uri)
    before = run_cli(capsys, *query)
    assert run_cli(capsys, "warehouse", "compact", "--store", store_uri)[0] == 0
    assert run_cli(capsys, *query) == before


def test_warehouse_without_an_action_prints_its_help(capsys):
    code, out, _ = run_cli(capsys, "warehouse")
    assert code == 2
    assert "stats" in out and "compact" in out and "workloads" in out


def test_a_real_lorien_process_answers_a_query(llvm_log, tophub_store):
    record = read_log(llvm_log).records[3]
    done = subprocess.run([sys.executable, "-m", "lorien.cli", "query", "--workload-key", record.workload_key,
                           "--target", SKYLAKE, "--format", "json", "--store", tophub_store],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["record_id"] == record.record_id


def test_a_real_lorien_process_reports_an_error_in_one_line_and_exits_nonzero(tophub_store):
    done = subprocess.run([sys.executable, "-m", "lorien.cli", "query", "--workload-key", "k", "--target", "",
                           "--store", tophub_store], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0
    assert "lorien query: error: unparseable target" in done.stderr


def test_strict_ingest_into_an_s3_store_publishes_every_record(capsys, llvm_log, moto_server, s3_bucket):
    uri = f"parquet:s3://{s3_bucket}/wh?endpoint_url={moto_server}&region=us-east-1"
    code, out, _ = run_cli(capsys, "ingest", str(llvm_log), "--strict", "--store", uri)
    assert code == 0, out
    record = read_log(llvm_log).records[7]
    code, out, _ = run_cli(capsys, "query", "--workload-key", record.workload_key, "--target", SKYLAKE,
                           "--format", "json", "--store", uri)
    assert code == 0
    assert json.loads(out)[0]["record_id"] == record.record_id
    assert open_store(uri).stats()["records"] == 35


def test_lorien_store_in_the_environment_names_the_default_store(capsys, llvm_log, store_uri, monkeypatch):
    monkeypatch.setenv("LORIEN_STORE", store_uri)
    assert run_cli(capsys, "ingest", str(llvm_log))[0] == 0
    from lorien import Warehouse

    with Warehouse.open() as warehouse:
        assert warehouse.uri == store_uri
        assert len(warehouse.workloads(SKYLAKE)) == 35


def test_reading_a_store_directory_that_does_not_exist_is_an_error_naming_it(tmp_path, capsys):
    missing = tmp_path / "no-such-warehouse"
    for argv in (["warehouse", "stats"], ["warehouse", "workloads"],
                 ["query", "--workload-key", "k", "--target", "llvm"]):
        for options in ("", "?preload=true"):
            assert main([*argv, "--store", f"parquet:{missing}{options}"]) == 1
            assert f"no warehouse at '{missing}'" in capsys.readouterr().err
    assert not missing.exists()


def test_a_meta_schedule_database_exported_by_another_process_comes_back_json_equal(capsys, shared_data, tmp_path):
    """The warehouse keeps each workload entry once (not in every record), and a fresh process,
    which never read the database, exports it from there."""
    database = shared_data / "meta_schedule" / "conv_56_64"
    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    run_cli(capsys, "ingest", str(database), "--store", store_uri)
    kept = sorted(path.name for path in (tmp_path / "warehouse" / "workloads").iterdir())
    workload_lines = (database / "database_workload.json").read_text().splitlines()
    assert len(kept) == len(workload_lines)
    store = open_store(store_uri)
    assert store.stats()["workload_entries"] == len(workload_lines)
    assert max(len(extra) for extra in store.scan(columns=["extra"]).column("extra").to_pylist()) < 200
    target = store.scan(columns=["target"]).column("target")[0].as_py()
    out = tmp_path / "exported"
    subprocess.run([sys.executable, "-m", "lorien.cli", "export", "--target", target, "--format", "meta_schedule",
                    "--all", "--store", store_uri, "-o", str(out)], check=True, capture_output=True)
    lines = lambda path: sorted(json.dumps(json.loads(line), sort_keys=True)  # noqa: E731
                                for line in path.read_text().splitlines())
    assert lines(out / "database_workload.json") == lines(database / "database_workload.json")
    assert lines(out / "database_tuning_record.json") == lines(database / "database_tuning_record.json")
