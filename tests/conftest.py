"""Shared fixtures: the real public logs in ../shared/data, temporary stores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["servers"]

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("LORIEN_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def store_uri(tmp_path: Path) -> str:
    """A fresh local parquet store."""
    return f"parquet:{tmp_path / 'warehouse'}"
