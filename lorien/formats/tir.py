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


#: Deepest nesting of expressions or statements walked; a real TIR expression is a few dozen deep,
#: so anything deeper is a damaged graph (or a cycle), not a workload.
MAX_DEPTH = 256


class _Graph:
    """The node list of a module graph; every lookup checks what it finds, so a damaged graph
    raises ValueError, KeyError, TypeError or IndexError (never loops or recurses without end)."""

    def __init__(self, graph: Any) -> None:
        nodes = graph.get("nodes") if isinstance(graph, dict) else None
        if not isinstance(nodes, list) or not all(isinstance(node, dict) for node in nodes):
            raise ValueError("a module graph is an object whose 'nodes' is a list of objects")
        self.nodes: list[dict[str, Any]] = nodes

    def node(self, index: Any) -> dict[str, Any]:
        if type(index) is not int or not 0 <= index < len(self.nodes):
            raise IndexError(f"node reference {index!r} is not a node of the graph ({len(self.nodes)} nodes)")
        return self.nodes[index]

    def data(self, index: Any) -> Any:
        return self.node(index)["data"]

    def array(self, index: Any) -> list[int]:
        node = self.node(index)
        if _kind(node) != "Array" or not isinstance(node.get("data"), list):
            raise ValueError(f"node {index} is {node.get('type')}, expected an array")
        return node["data"]

    def int_value(self, index: Any) -> int:
        node = self.node(index)
        if _kind(node) != "IntImm":
            raise ValueError(f"node {index} is {node.get('type')}, expected a constant")
        return int(self.data(node["data"]["value"]))

    def dtype(self, type_index: Any, depth: int = 0) -> str:
        node = self.node(type_index)
        if _kind(node) == "BufferType" and depth < MAX_DEPTH:
            return self.dtype(node["data"]["dtype"], depth + 1)
        return str(node["data"].get("dtype", "")) if isinstance(node.get("data"), dict) else ""

    def string(self, index: Any) -> str:
        return str(self.data(index))

    def stores(self, index: Any, depth: int = 0) -> list[dict[str, Any]]:
        if depth > MAX_DEPTH:
            raise ValueError(f"statements nested more than {MAX_DEPTH} deep at node {index}")
        node = self.node(index)
        kind = _kind(node)
        if kind == "BufferStore" and isinstance(node.get("data"), dict):
            return [node["data"]]
        if kind == "SeqStmt":
            return [store for child in self.array(node["data"]["seq"]) for store in self.stores(child, depth + 1)]
        return []

    def count_ops(self, index: Any, dtype: str, depth: int = 0) -> int:
        if depth > MAX_DEPTH:
            raise ValueError(f"expressions nested more than {MAX_DEPTH} deep at node {index}")
        node = self.node(index)
        kind = _kind(node)
        if kind in ("TensorLoad", "BufferLoad", "ProducerLoad"):
            return 0
        if kind == "Array":
            return sum(self.count_ops(child, dtype, depth + 1) for child in self.array(index))
        data = node.get("data")
        if not isinstance(data, dict):
            return 0
        own = 1 if kind in _ARITHMETIC and self.dtype(data["ty"]) == dtype else 0
        return own + sum(self.count_ops(data[name], dtype, depth + 1) for name in _EXPR_FIELDS
                         if name in data and type(data[name]) is int and data[name] > 0)


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
        block = node.get("data")
        if not isinstance(block, dict):
            raise ValueError(f"block node {node!r:.80} has no fields")
        iter_vars = graph.array(block["iter_vars"])
        if not iter_vars:
            continue  # the root block
        name = graph.string(block["name_hint"])
        names.append(name)
        try:
            extents = [graph.int_value(graph.data(graph.data(iv)["dom"])["extent"]) for iv in iter_vars]
            if any(extent < 0 for extent in extents):
                raise ValueError(f"negative loop extent in {extents}")
            if not main and any(graph.data(iv)["iter_type"] == 2 for iv in iter_vars):
                main = name
            ops = 0
            for store in graph.stores(block["body"]):
                ops += graph.count_ops(store["value"], graph.dtype(graph.data(store["buffer"])["ty"]))
            flop += math.prod(extents) * ops
        except (KeyError, ValueError, TypeError, IndexError, OverflowError) as exc:
            logger.warning(FLOP_UNKNOWN + "block %r of a MetaSchedule workload: %s", name, exc)
            countable = False
    if not math.isfinite(flop):
        countable = False
    return TirSummary(tuple(names), main or (names[-1] if names else ""), flop if countable and names else None)


def safe_summarize(encoded: Any) -> TirSummary:
    """:func:`summarize`, or an empty summary (flop unknown) when the module cannot be read."""
    if not isinstance(encoded, str):
        return TirSummary((), "", None)
    try:
        return summarize(encoded)
    except (binascii.Error, ValueError, KeyError, TypeError, IndexError, OverflowError, orjson.JSONDecodeError) as exc:
        logger.warning("cannot read a MetaSchedule workload module: %s", exc)
        return TirSummary((), "", None)
