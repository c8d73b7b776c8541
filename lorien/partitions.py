"""Partition directory names of a parquet store (``target_key=llvm_cpu``), importable without
pyarrow: a one-shot ``lorien query`` finds its serving files with these alone."""

from __future__ import annotations

from urllib.parse import quote, unquote

#: Serving view files, one directory per target key.
SERVING_DIR = "best"
#: Hive's name for an empty partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def encode_partition(value: str) -> str:
    return quote(value, safe="") if value else NULL_PARTITION


def decode_partition(text: str) -> str:
    return "" if text == NULL_PARTITION else unquote(text)


def serving_dir(target_key: str) -> str:
    return f"{SERVING_DIR}/target_key={encode_partition(target_key)}"
