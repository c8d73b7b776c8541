"""The text of an auto-scheduler workload key, shared by the registry (``["func", args...]``)
and the compute DAG (``[hash, *shapes]``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def dump_key(values: Sequence[Any]) -> str:
    """A workload key as TVM writes it (``json.dumps`` with its default separators)."""
    return json.dumps(list(values))
