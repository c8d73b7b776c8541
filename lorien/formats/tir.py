"""Read what Lorien needs from a MetaSchedule workload: the TIR module TVM stores, base64 encoded,
in ``database_workload.json``.

TVM (0.2x) stores the IRModule as an 8-byte little-endian length followed by its JSON graph
(``{"root_index", "nodes": [{"type", "data"}...]}``, node fields refer to other nodes by index).
From it we take the block names and a FLOP count: for every block with iteration variables,
the product of their extents times the arithmetic operations (add, sub, mul, div, min, max)
of the stored value that compute in the stored buffer's dtype. Index and condition arithmetic
have other dtypes and count nothing, as padding and layout copies should.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
from dataclasses import dataclass
from typing import Any

import orjson

from lorien.workload import FLOP_UNKNOWN

logger = logging.getLogger(__name__)

_ARITHMETIC = {"Add", "Sub", "Mul", "Div", "FloorDiv", "FloorMod", "Mod", "Min", "Max"}
#: Expression fields walked when counting operations (loads and their indices are not walked).
_EXPR_FIELDS = ("a", "b", "value", "args", "true_value", "false_value", "condition")


@dataclass(frozen=True)
class TirSummary:
    """Block names (main compute first) and FLOP count (None when it cannot be counted)."""

    block_names: tuple[str, ...]
    main_block: str
    flop: float | None


def decode_module(encoded: str) -> dict[str, Any]:
    """The JSON graph of a base64 workload module (with or without TVM's length header)."""
    raw = base64.b64decode(encoded, validate=True)
    if raw[:1] != b"{" and len(raw) >= 8:
        length = int.from_bytes(raw[:8], "little")
        raw = raw[8:8 + length]
    return orjson.loads(raw)


def _kind(node: dict[str, Any]) -> str:
    return str(node.get("type", "")).rsplit(".", 1)[-1]


class _Graph:
    def __init__(self, graph: dict[str, Any]) -> None:
        self.nodes: list[dict[str, Any]] = graph["nodes"]

    def node(self, index: int) -> dict[str, Any]:
        return self.nodes[index]

    def data(self, index: int) -> Any:
        return self.nodes[index]["data"]

    def array(self, index: int) -> list[int]:
        node = self.nodes[index]
        if _kind(node) != "Array":
            raise ValueError(f"node {index} is {node.get('type')}, expected an array")
        return node["data"]

    def int_value(self, index: int) -> int:
        node = self.nodes[index]
        if _kind(node) != "IntImm":
            raise ValueError(f"node {index} is {node.get('type')}, expected a constant")
        value = self.nodes[node["data"]["value"]]
        return int(value["data"])

    def dtype(self, type_index: int) -> str:
        node = self.nodes[type_index]
        if _kind(node) == "BufferType":
            return self.dtype(node["data"]["dtype"])
        return str(node["data"].get("dtype", "")) if isinstance(node["data"], dict) else ""

    def string(self, index: int) -> str:
        return str(self.nodes[index]["data"])

    def stores(self, index: int) -> list[dict[str, Any]]:
        node = self.nodes[index]
        kind = _kind(node)
        if kind == "BufferStore":
            return [node["data"]]
        if kind == "SeqStmt":
            return [store for child in self.array(node["data"]["seq"]) for store in self.stores(child)]
        return []

    def count_ops(self, index: int, dtype: str) -> int:
        node = self.nodes[index]
        kind = _kind(node)
        if kind in ("TensorLoad", "BufferLoad", "ProducerLoad"):
            return 0
        if kind == "Array":
            return sum(self.count_ops(child, dtype) for child in node["data"])
        data = node.get("data")
        if not isinstance(data, dict):
            return 0
        own = 1 if kind in _ARITHMETIC and self.dtype(data["ty"]) == dtype else 0
        return own + sum(self.count_ops(data[name], dtype) for name in _EXPR_FIELDS
                         if name in data and isinstance(data[name], int) and data[name] > 0)


def summarize(encoded: str) -> TirSummary:
    """Block names and FLOP count of a base64 workload module."""
    graph = _Graph(decode_module(encoded))
    names: list[str] = []
    main = ""
    flop = 0.0
    countable = True
    for node in graph.nodes:
        if _kind(node) not in ("SBlock", "Block"):
            continue
        block = node["data"]
        iter_vars = graph.array(block["iter_vars"])
        if not iter_vars:
            continue  # the root block
        name = graph.string(block["name_hint"])
        names.append(name)
        try:
            extents = [graph.int_value(graph.data(graph.data(iv)["dom"])["extent"]) for iv in iter_vars]
            if not main and any(graph.data(iv)["iter_type"] == 2 for iv in iter_vars):
                main = name
            ops = 0
            for store in graph.stores(block["body"]):
                ops += graph.count_ops(store["value"], graph.dtype(graph.data(store["buffer"])["ty"]))
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            logger.warning(FLOP_UNKNOWN + "block %r of a MetaSchedule workload: %s", name, exc)
            countable = False
            continue
        flop += math.prod(extents) * ops
    return TirSummary(tuple(names), main or (names[-1] if names else ""), flop if countable and names else None)


def safe_summarize(encoded: Any) -> TirSummary:
    """:func:`summarize`, or an empty summary (flop unknown) when the module cannot be read."""
    if not isinstance(encoded, str):
        return TirSummary((), "", None)
    try:
        return summarize(encoded)
    except (binascii.Error, ValueError, KeyError, TypeError, IndexError, orjson.JSONDecodeError) as exc:
        logger.warning("cannot read a MetaSchedule workload module: %s", exc)
        return TirSummary((), "", None)
