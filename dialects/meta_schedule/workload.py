"""MetaSchedule workloads as Lorien computations.

A MetaSchedule workload is a TIR PrimFunc (the module of a ``database_workload.json`` line):
one block per computed buffer, each block with spatial and reduce iteration variables and a
``BufferStore`` of an expression over loads of other buffers (a reduction keeps its ``init``
apart and adds, maxes or mins into the stored buffer). :func:`dag_of_module` reads such a
function into Lorien's compute DSL, one compute op per block named after it, axes in block
order, so a trace's block and loop names mean the same thing here. Lorien's own workloads
(the registered layer functions of :mod:`lorien.builtin_workloads`) are keyed the MetaSchedule way by
:func:`workload_key_of`, a structural hash of their compute DAG.
"""

from __future__ import annotations

from typing import Any

import orjson

from lorien.engine import te
from lorien.engine.dag import ComputeDAG
from lorien.errors import WorkloadError
from lorien.formats.tir import _Graph, _kind, decode_module

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "FloorDiv": "floordiv",
           "FloorMod": "mod", "Mod": "mod", "LT": "lt", "LE": "le", "EQ": "eq", "NE": "ne",
           "And": "and", "Or": "or"}
_REDUCERS = {"Add": "sum", "Max": "max", "Min": "min"}
_ITER_REDUCE = 2


class _Reader:
    """Converts the expressions of one PrimFunc's blocks to compute-DSL expressions."""

    def __init__(self, graph: _Graph):
        self.graph = graph
        self.tensors: dict[int, te.Tensor] = {}
        self.variables: dict[int, te.Expr] = {}

    def buffer_dtype(self, var_index: int) -> str:
        return self.graph.dtype(self.graph.node(var_index)["data"]["ty"])

    def buffer_shape(self, var_index: int) -> list[int]:
        buffer_type = self.graph.node(self.graph.node(var_index)["data"]["ty"])["data"]
        return [self.graph.int_value(i) for i in self.graph.array(buffer_type["shape"])]

    def name(self, index: int) -> str:
        return self.graph.string(self.graph.node(index)["data"]["name"])

    def expr(self, index: int) -> te.Expr:
        node = self.graph.node(index)
        kind, data = _kind(node), node.get("data")
        if kind == "Var":
            if index not in self.variables:
                raise WorkloadError(f"variable {self.name(index)!r} is not an iteration variable of its block")
            return self.variables[index]
        if kind == "IntImm":
            dtype = self.graph.dtype(data["ty"])
            return te.Const(bool(self.graph.int_value(index)) if dtype == "bool" else self.graph.int_value(index),
                            "bool" if dtype == "bool" else te.INDEX_DTYPE)
        if kind == "FloatImm":
            return te.Const(float(data["value"]), self.graph.dtype(data["ty"]))
        if kind in _BINARY:
            return te.BinOp(_BINARY[kind], self.expr(data["a"]), self.expr(data["b"]))
        if kind in ("GT", "GE"):
            return te.BinOp("lt" if kind == "GT" else "le", self.expr(data["b"]), self.expr(data["a"]))
        if kind in ("Max", "Min"):
            return (te.maximum if kind == "Max" else te.minimum)(self.expr(data["a"]), self.expr(data["b"]))
        if kind == "Select":
            return te.Select(self.expr(data["condition"]), self.expr(data["true_value"]), self.expr(data["false_value"]))
        if kind == "Cast":
            return te.cast(self.expr(data["value"]), self.graph.dtype(data["ty"]))
        if kind in ("TensorLoad", "BufferLoad"):
            source = data.get("source", data.get("buffer"))
            if source not in self.tensors:
                raise WorkloadError(f"a block reads buffer {self.name(source)!r} before any block writes it")
            return te.Load(self.tensors[source], [self.expr(i) for i in self.graph.array(data["indices"])])
        if kind == "Call":
            op = str(self.graph.node(data["op"])["data"])
            args = [self.expr(i) for i in self.graph.array(data["args"])]
            if op.endswith("if_then_else") and len(args) == 3:
                return te.Select(*args)
            if op.rsplit(".", 1)[-1] in te.INTRINSICS and len(args) == 1:
                return te.intrinsic(op.rsplit(".", 1)[-1], args[0])
            if op.rsplit(".", 1)[-1] in te.BINARY_INTRINSICS and len(args) == 2:
                return te.Call(op.rsplit(".", 1)[-1], tuple(args), args[0].dtype)
            raise WorkloadError(f"call of {op!r} is not supported in a MetaSchedule workload")
        raise WorkloadError(f"expression node {node.get('type')!r} is not supported in a MetaSchedule workload")

    def block(self, block: dict[str, Any]) -> tuple[int, te.Tensor]:
        """(buffer node, tensor) of the compute op of one block."""
        graph = self.graph
        axis, reduce_axis = [], []
        for iv_index in graph.array(block["iter_vars"]):
            iv = graph.data(iv_index)
            extent = graph.int_value(graph.data(iv["dom"])["extent"])
            name = self.name(iv["var"]).removeprefix("v_")
            kind = "reduce" if iv["iter_type"] == _ITER_REDUCE else "spatial"
            var = te.IterVar(name, extent, kind)
            (reduce_axis if kind == "reduce" else axis).append(var)
            self.variables[iv["var"]] = var
        stores = graph.stores(block["body"])
        if len(stores) != 1:
            raise WorkloadError(f"block {graph.string(block['name_hint'])!r} stores {len(stores)} times; one is supported")
        store = stores[0]
        target = store["buffer"]
        indices = [self.expr(i) for i in graph.array(store["indices"])]
        if [getattr(i, "name", None) for i in indices] != [a.name for a in axis]:
            raise WorkloadError(f"block {graph.string(block['name_hint'])!r} stores at {indices}, not at its spatial "
                                f"iteration variables in order")
        value_node = graph.node(store["value"])
        if reduce_axis:
            body = self._reduction(value_node, target, reduce_axis)
        else:
            body = self.expr(store["value"])
        name = graph.string(block["name_hint"])
        if body.dtype != self.buffer_dtype(target):
            body = te.cast(body, self.buffer_dtype(target))
        tensor = te.Tensor([a.extent for a in axis], self.buffer_dtype(target), name,
                           te.ComputeOp(name, axis, body, tag=name))
        self.tensors[target] = tensor
        return target, tensor

    def _reduction(self, value_node: dict[str, Any], target: int, reduce_axis: list[te.IterVar]) -> te.Reduce:
        kind, data = _kind(value_node), value_node.get("data") or {}
        combiner = _REDUCERS.get(kind)
        if combiner is None:
            raise WorkloadError(f"a reduction block updates with {value_node.get('type')!r}; add, max or min are supported")
        for own, other in (("a", "b"), ("b", "a")):
            operand = self.graph.node(data[own])
            if _kind(operand) in ("TensorLoad", "BufferLoad") and operand["data"].get(
                    "source", operand["data"].get("buffer")) == target:
                return te.Reduce(combiner, self.expr(data[other]), reduce_axis)
        raise WorkloadError("a reduction block does not update its own buffer")


def dag_of_module(encoded: str) -> ComputeDAG:
    """The compute DAG of a base64 MetaSchedule workload module (its one PrimFunc)."""
    try:
        graph = _Graph(decode_module(encoded))
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError) as exc:
        raise WorkloadError(f"cannot decode the MetaSchedule workload module: {exc}") from exc
    functions = [i for i, node in enumerate(graph.nodes) if _kind(node) == "PrimFunc"]
    if len(functions) != 1:
        raise WorkloadError(f"a MetaSchedule workload module holds {len(functions)} PrimFuncs; one is supported")
    reader = _Reader(graph)
    try:
        params = graph.array(graph.data(functions[0])["params"])
        for param in params:
            name = reader.name(param)
            reader.tensors[param] = te.placeholder(reader.buffer_shape(param), reader.buffer_dtype(param), name)
        inputs = dict(reader.tensors)
        written: dict[int, te.Tensor] = {}
        for node in graph.nodes:
            if _kind(node) in ("SBlock", "Block") and graph.array(node["data"]["iter_vars"]):
                target, tensor = reader.block(node["data"])
                written[target] = tensor
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise WorkloadError(f"cannot read the MetaSchedule workload module: {exc!r}") from exc
    io = [written.get(p, inputs[p]) for p in params]
    if not any(isinstance(t.op, te.ComputeOp) for t in io):
        raise WorkloadError("no block of the MetaSchedule workload writes a parameter buffer")
    return ComputeDAG(io)


def workload_key_of(dag: ComputeDAG) -> str:
    """The MetaSchedule-style workload key of a Lorien computation: a 64-bit structural hash
    of its DAG, in decimal like TVM's ``shash`` (equal computations, equal keys)."""
    return str(int(dag.hash_key()[:16], 16))
