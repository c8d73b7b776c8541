"""One function resolves which store a command uses."""

from __future__ import annotations

import pytest

from lorien.errors import StoreError
from lorien.warehouse import open_store, resolve_store_uri


def test_the_flag_wins_over_the_config_and_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LORIEN_STORE", "parquet:/from/env")
    assert resolve_store_uri("parquet:/from/flag", "parquet:/from/config") == "parquet:/from/flag"
    assert resolve_store_uri(None, "parquet:/from/config") == "parquet:/from/config"
    assert resolve_store_uri() == "parquet:/from/env"


def test_without_anything_named_it_is_lorien_warehouse_in_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("LORIEN_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_store_uri() == f"parquet:{tmp_path / 'lorien-warehouse'}"


@pytest.mark.parametrize(("given", "resolved"), [
    ("wh", "parquet:{cwd}/wh"),
    ("./wh?fsync=1", "parquet:{cwd}/wh?fsync=1"),
    ("parquet:wh", "parquet:{cwd}/wh"),
    ("file:///data/wh", "parquet:/data/wh"),
    ("s3://bucket/prefix?region=us-east-1", "parquet:s3://bucket/prefix?region=us-east-1"),
    ("parquet:s3://bucket/prefix", "parquet:s3://bucket/prefix"),
    ("dynamodb:table?region=us-west-2", "dynamodb:table?region=us-west-2"),
])
def test_local_paths_become_absolute_and_remote_uris_stay(monkeypatch, tmp_path, given, resolved):
    monkeypatch.chdir(tmp_path)
    assert resolve_store_uri(given) == resolved.format(cwd=tmp_path)


def test_an_unknown_scheme_is_an_error_naming_the_uri():
    with pytest.raises(StoreError, match="unknown store URI 'mongodb:x'"):
        open_store("mongodb:x")


def test_a_uri_naming_no_directory_is_an_error():
    with pytest.raises(StoreError, match="names no directory"):
        resolve_store_uri("parquet:")
