"""`lorien warehouse dynamodb ...` against a real moto server process."""

from __future__ import annotations

import json
import uuid

import pytest

from lorien.cli import main
from lorien.record import TuningRecord
from lorien.warehouse import open_store

TARGET = "llvm -keys=cpu -mcpu=znver3"


@pytest.fixture
def table() -> str:
    return f"lorien-cli-{uuid.uuid4().hex[:10]}"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def endpoint_args(moto_server: str) -> list[str]:
    return ["--endpoint-url", moto_server, "--region", "us-west-2"]


def test_create_then_list_and_describe_show_the_seed_schema(moto_server, table, capsys):
    assert run(capsys, "warehouse", "dynamodb", "create", table, *endpoint_args(moto_server))[0] == 0
    code, out, _ = run(capsys, "warehouse", "dynamodb", "list", *endpoint_args(moto_server))
    assert code == 0 and table in out.split()
    code, out, _ = run(capsys, "warehouse", "dynamodb", "describe", table, *endpoint_args(moto_server))
    assert "hash key: Target" in out and "range key: PrimaryRangeKey" in out
    assert "TargetIDKeysIndex (TargetIDKeys, PrimaryRangeKey)" in out


def test_scan_lists_each_item_with_its_best_latency(moto_server, table, capsys):
    run(capsys, "warehouse", "dynamodb", "create", table, *endpoint_args(moto_server))
    with open_store(f"dynamodb:{table}?endpoint_url={moto_server}&region=us-west-2") as store:
        store.commit([TuningRecord(dialect="meta_schedule", target=TARGET, target_key="llvm_cpu",
                                   workload_key="dense#64", task_name="dense", args="[]", layout="NA",
                                   config=f'{{"trace": {i}}}', costs=[(i + 1) * 1e-3], timestamp=float(i))
                      for i in range(3)])
    code, out, _ = run(capsys, "warehouse", "dynamodb", "scan", table, *endpoint_args(moto_server))
    assert code == 0
    assert out.splitlines() == [f"{TARGET}\tdense#64\t3\t0.001"]


def test_a_scan_dump_loads_into_another_table_unchanged(moto_server, table, capsys, tmp_path):
    run(capsys, "warehouse", "dynamodb", "create", table, *endpoint_args(moto_server))
    with open_store(f"dynamodb:{table}?endpoint_url={moto_server}&region=us-west-2") as store:
        store.commit([TuningRecord(dialect="meta_schedule", target=TARGET, target_key="llvm_cpu",
                                   workload_key=f"dense#{i}", task_name="dense", args="[]", layout="NA",
                                   config='{"trace": 1}', costs=[1e-3], timestamp=float(i), error_no=i % 2)
                      for i in range(30)])
        store.put_workloads({"a" * 32: '["123", {"module": 1}]'})  # what MetaSchedule records name
    code, out, _ = run(capsys, "warehouse", "dynamodb", "scan", table, "--json", *endpoint_args(moto_server))
    dump = tmp_path / "items.jsonl"
    dump.write_text(out)
    copy = f"{table}-copy"
    run(capsys, "warehouse", "dynamodb", "create", copy, *endpoint_args(moto_server))
    code, out, _ = run(capsys, "warehouse", "dynamodb", "load", copy, str(dump), *endpoint_args(moto_server))
    assert code == 0 and out.strip() == f"loaded 31 items into {copy}"
    _, copied, _ = run(capsys, "warehouse", "dynamodb", "scan", copy, "--json", *endpoint_args(moto_server))
    assert sorted(copied.splitlines()) == sorted(dump.read_text().splitlines())
    keys = sorted(json.loads(line)["PrimaryRangeKey"]["S"] for line in copied.splitlines())
    assert keys == sorted([f"dense#{i}" for i in range(30)] + ["a" * 32])
    with open_store(f"dynamodb:{copy}?endpoint_url={moto_server}&region=us-west-2") as store:
        assert store.get_workloads(["a" * 32]) == {"a" * 32: '["123", {"module": 1}]'}
        assert len(store.workloads()) == 30  # the entry is no workload of the table


def test_loading_a_file_that_is_no_dump_names_its_line(moto_server, table, capsys, tmp_path):
    run(capsys, "warehouse", "dynamodb", "create", table, *endpoint_args(moto_server))
    dump = tmp_path / "items.jsonl"
    dump.write_text('{"Target": {"S": "llvm"}, "PrimaryRangeKey": {"S": "a"}}\nnot json\n')
    code, _, err = run(capsys, "warehouse", "dynamodb", "load", table, str(dump), *endpoint_args(moto_server))
    assert code == 1 and f"{dump}:2" in err


def test_delete_removes_the_table(moto_server, table, capsys):
    run(capsys, "warehouse", "dynamodb", "create", table, *endpoint_args(moto_server))
    assert run(capsys, "warehouse", "dynamodb", "delete", table, "--yes", *endpoint_args(moto_server))[0] == 0
    _, out, _ = run(capsys, "warehouse", "dynamodb", "list", *endpoint_args(moto_server))
    assert table not in out.split()


def test_describing_a_missing_table_says_how_to_create_it(moto_server, table, capsys):
    code, _, err = run(capsys, "warehouse", "dynamodb", "describe", table, *endpoint_args(moto_server))
    assert code == 1
    assert f"lorien warehouse dynamodb create {table}" in err


def test_an_unreachable_endpoint_fails_with_one_clear_line(capsys):
    code, _, err = run(capsys, "warehouse", "dynamodb", "list", "--endpoint-url", "http://127.0.0.1:9")
    assert code == 1
    assert "http://127.0.0.1:9 is unreachable" in err and len(err.strip().splitlines()) == 1
