"""Scripts and people both served: --json on the long commands, progress on stderr, and
warnings that would repeat per workload said once per file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lorien.cli import main

MEASURE = '{"number": 1, "repeat": 1}'


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ingest_json_reports_every_file_and_the_totals(capsys, shared_data, store_uri):
    code, out, err = run(capsys, "ingest", str(shared_data / "ansor"), "--store", store_uri, "--json")
    assert code == 0
    report = json.loads(out)
    assert [Path(entry["path"]).name for entry in report["files"]] == [
        "conv2d.json", "matmul.json", "resnet-50-NHWC-B1-llvm.json"]
    assert report["records"] == report["stored"] == 28 and report["bad_lines"] == 0
    assert report["store"] == store_uri
    assert "ingest: 3/3 files" in err  # progress lines (stderr is not a terminal here)


def test_unknown_flops_are_said_once_per_file_not_once_per_workload(capsys, shared_data, store_uri):
    code, out, err = run(capsys, "ingest", str(shared_data / "ansor" / "resnet-50-NHWC-B1-llvm.json"),
                         "--store", store_uri)
    assert code == 0
    assert "flop unknown for task" not in err
    notes = [line for line in out.splitlines() if "FLOPs unknown" in line]
    assert len(notes) == 1 and "FLOPs unknown for 12 task(s)" in notes[0]
    code, out, _ = run(capsys, "ingest", str(shared_data / "ansor" / "resnet-50-NHWC-B1-llvm.json"),
                       "--store", store_uri, "--json")
    assert len(json.loads(out)["files"][0]["flop_unknown_tasks"]) == 12


def test_export_json_needs_a_file_for_the_records(capsys, shared_data, store_uri, tmp_path):
    run(capsys, "ingest", str(shared_data / "tophub" / "llvm_v0.04.log"), "--store", store_uri)
    code, _, err = run(capsys, "export", "--target", "llvm", "--format", "autotvm", "--store", store_uri, "--json")
    assert code == 1 and "-o FILE" in err
    out_file = tmp_path / "best.log"
    code, out, _ = run(capsys, "export", "--target", "llvm", "--format", "autotvm", "--store", store_uri,
                       "--json", "-o", str(out_file))
    assert code == 0
    summary = json.loads(out)
    assert summary["records"] == len(out_file.read_text().splitlines()) == summary["workloads"] > 0
    assert summary["stored_targets"] == ["llvm -keys=cpu -mcpu=skylake-avx512"]


def test_featurize_and_train_print_their_reports_as_json(capsys, shared_data, tmp_path):
    log = shared_data / "tophub" / "llvm_v0.04.log"
    code, out, _ = run(capsys, "featurize", str(log), "-o", str(tmp_path / "features"), "--jobs", "1", "--json")
    assert code == 0
    featurized = json.loads(out)
    assert featurized["records_featurized"] == 35 and "conv2d_NCHWc.x86" in featurized["templates"]
    code, out, err = run(capsys, "train", str(tmp_path / "features"), "-o", str(tmp_path / "model"),
                         "--no-plots", "--baseline", "none", "--folds", "2", "--n-estimators", "5", "--json")
    assert code == 0
    trained = json.loads(out)
    assert trained == json.loads((tmp_path / "model" / "report.json").read_text())
    assert "conv2d_NCHWc.x86" in trained["templates"]
    assert "train: " in err


def test_generate_json_lists_each_workload_with_its_key(capsys, tmp_path):
    store = f"parquet:{tmp_path / 'generated'}"
    code, out, err = run(capsys, "generate", "--size", "none", "--workload", "dense:M=8,N=8,K=8",
                         "--trials", "2", "--store", store, "--json")
    assert code == 0
    summary = json.loads(out)
    (workload,) = summary["workloads"]
    assert workload["trials"] == workload["committed"] == 2
    assert workload["workload_key"].startswith("dense_")
    assert summary["store"] == store
    assert "generate: 1/1 workload" in err


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    # `lorien warehouse workloads | head -1`: the pipe closes while Lorien is still printing.
    (tmp_path / "store").mkdir()
    script = (
        "import os, sys\n"
        "from lorien.cli import main\n"
        "read_end, write_end = os.pipe()\n"
        "os.close(read_end)\n"
        "sys.stdout = os.fdopen(write_end, 'w', buffering=1)\n"
        f"code = main(['warehouse', 'stats', '--store', 'parquet:{tmp_path / 'store'}'])\n"
        "sys.stderr.write(f'code={code}')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert "code=141" in done.stderr
