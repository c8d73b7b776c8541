"""Tasks of a torch module (the ``torch`` extra): built by a factory, traced with torch.export.

A factory is ``module:function`` or ``module:function(key=value, ...)`` with literal
arguments, e.g. ``torchvision.models:resnet18`` or
``torch.nn:TransformerEncoderLayer(d_model=768, nhead=12, batch_first=True)``. The module is
built on the meta device, so no weights are allocated, downloaded or initialized, put in
eval mode and exported with example inputs of the ``--input`` shapes; shapes come from the
exported graph. The ATen operators map to tasks as the ONNX ones do (conv2d / convolution,
linear / addmm / mm, matmul, bmm; scaled_dot_product_attention as its two batched
matmuls) and the same epilogues are fused (bias, eval-mode
batch_norm as bias, residual add, relu, hardtanh to [0, 6] as relu6; eval-mode dropout
passes through).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import math
import re
import sys
from collections.abc import Sequence
from typing import Any

from lorien.models.frontend import (
    DeclaredInput,
    ExtractError,
    InputSpec,
    ModelReport,
    TaskCollector,
    resolve_inputs,
)
from lorien.models.tasks import channel_vector, conv_task, matmul_task, same_pads

logger = logging.getLogger(__name__)

#: Schemas of the torchvision operators whose fake kernels torchvision registers on import
#: even when its C++ extension did not load.
TORCHVISION_FAKE_OPS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def parse_factory(spec: str) -> tuple[str, list[str], list[Any], dict[str, Any]]:
    """``module:attr.path(args)`` -> (module, attribute path, positional args, keyword args);
    arguments must be Python literals."""
    module, sep, call = spec.partition(":")
    if not sep or not module or not call:
        raise ExtractError(f"{spec!r}: a torch factory is module:function, e.g. torchvision.models:resnet18")
    try:
        expr = ast.parse(call.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExtractError(f"{spec!r}: cannot parse {call!r} ({exc.msg})") from exc
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if isinstance(expr, ast.Call):
        try:
            args = [ast.literal_eval(arg) for arg in expr.args]
            kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in expr.keywords if kw.arg}
        except ValueError as exc:
            raise ExtractError(f"{spec!r}: factory arguments must be literals (numbers, strings, lists): {exc}") from exc
        expr = expr.func
    path: list[str] = []
    while isinstance(expr, ast.Attribute):
        path.insert(0, expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        raise ExtractError(f"{spec!r}: {call!r} is not a function name or a call of one")
    return module, [expr.id, *path], args, kwargs


def import_module(name: str) -> Any:
    """Import a module; when torchvision aborts its import because its C++ operators did not
    load (a torchvision build made for another torch), declare the operators it registers
    fake kernels for and import again: its models, which need none of them, then build."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ExtractError(f"cannot import {name!r}: {exc}") from exc
    except RuntimeError as exc:
        if not re.search(r"operator torchvision::\w+ does not exist", str(exc)):
            raise ExtractError(f"importing {name!r} failed: {exc}") from exc
        _declare_torchvision_ops()
        logger.warning("torchvision's C++ operators do not load beside torch %s (%s); its models build, its "
                       "detection operators (nms, roi_align, ...) will not run", _torch_version(), exc)
        for loaded in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[loaded]
        return importlib.import_module(name)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _declare_torchvision_ops() -> None:
    import torch

    for op, schema in TORCHVISION_FAKE_OPS.items():
        if not hasattr(torch.ops.torchvision, op):
            torch.library.define(f"torchvision::{op}", schema)


def build_module(spec: str) -> Any:
    """The module a factory spec builds, on the meta device, in eval mode."""
    try:
        import torch
    except ImportError as exc:
        raise ExtractError(f"{spec!r}: torch modules need PyTorch: pip install 'lorien[torch]'") from exc
    module_name, path, args, kwargs = parse_factory(spec)
    factory = import_module(module_name)
    for attr in path:
        if not hasattr(factory, attr):
            raise ExtractError(f"{spec!r}: {module_name} has no attribute {'.'.join(path)!r}")
        factory = getattr(factory, attr)
    if not callable(factory):
        raise ExtractError(f"{spec!r}: {'.'.join(path)} is not callable")
    try:
        with torch.device("meta"):
            model = factory(*args, **kwargs)
    except Exception as exc:  # the user's factory: any failure is reported with its cause
        raise ExtractError(f"{spec!r}: building the module failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise ExtractError(f"{spec!r}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


def _declared_inputs(model: Any) -> list[DeclaredInput]:
    """The forward arguments without defaults (shapes unknown until --input gives them)."""
    parameters = inspect.signature(model.forward).parameters.values()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [DeclaredInput(p.name, None) for p in parameters if p.kind in kinds and p.default is p.empty]


def _val(node: Any) -> Any:
    return node.meta.get("val") if hasattr(node, "meta") else None


def _shape(node: Any, where: Any) -> list[int]:
    value = _val(node)
    if value is None or not hasattr(value, "shape"):
        raise ExtractError(f"node {where.name} ({where.target}): no static shape for argument {node!r}")
    return [int(d) for d in value.shape]


def _dtype(node: Any) -> str:
    return str(_val(node).dtype).removeprefix("torch.")


def _op_name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return str(packet).removeprefix("aten.")
    return getattr(target, "__name__", str(target))


def _arguments(node: Any, names: Sequence[str], defaults: dict[str, Any]) -> dict[str, Any]:
    values = dict(defaults)
    values.update(zip(names, node.args, strict=False))
    values.update(node.kwargs)
    return values


def _pair(value: Any) -> list[int]:
    values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return values * 2 if len(values) == 1 else values


class _Walker:
    """One pass over an exported graph, reporting to a TaskCollector."""

    def __init__(self, program: Any, collector: TaskCollector):
        signature = program.graph_signature
        self.constants = {*signature.inputs_to_parameters, *signature.inputs_to_buffers,
                          *signature.inputs_to_lifted_tensor_constants}
        self.collector = collector
        self.claimed: set[Any] = set()
        self.nodes = list(program.graph.nodes)

    def run(self) -> None:
        handlers = {"conv2d": self.conv2d, "convolution": self.convolution, "linear": self.linear,
                    "addmm": self.addmm, "mm": self.mm, "matmul": self.matmul, "bmm": self.matmul,
                    "scaled_dot_product_attention": self.attention}
        for node in self.nodes:
            if node.op != "call_function" or node in self.claimed:
                continue
            name = _op_name(node.target)
            if name == "getitem" or name.startswith(("_assert", "sym_")):
                continue
            handler = handlers.get(name)
            if handler is None:
                self.collector.skip(name)
            else:
                handler(node)

    # ---- tunable operators

    def _conv(self, node: Any, values: dict[str, Any]) -> None:
        data = _shape(values["input"], node)
        if len(data) != 4:
            self.collector.skip(f"{_op_name(node.target)} ({len(data) - 2}-d)")
            return
        kernel = _shape(values["weight"], node)
        stride, dilation = _pair(values["stride"]), _pair(values["dilation"])
        padding = values["padding"]
        if padding == "same":
            pads = same_pads(data[2:], kernel[2:], stride, dilation, upper=True)
        elif padding == "valid":
            pads = (0, 0, 0, 0)
        else:
            ph, pw = _pair(padding)
            pads = (ph, pw, ph, pw)
        op, params = conv_task(data, kernel, stride, pads, dilation, int(values["groups"]), _dtype(values["input"]))
        parts = ["bias"] if values["bias"] is not None else []
        self._add(node, op, params, parts + self._epilogue(node, 1))

    def conv2d(self, node: Any) -> None:
        self._conv(node, _arguments(node, ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
                                    {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}))

    def convolution(self, node: Any) -> None:
        values = _arguments(node, ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                                   "output_padding", "groups"), {})
        if values["transposed"]:
            self.collector.skip("convolution (transposed)")
            return
        self._conv(node, values)

    def linear(self, node: Any) -> None:
        values = _arguments(node, ("input", "weight", "bias"), {"bias": None})
        data, weight = _shape(values["input"], node), _shape(values["weight"], node)
        params = {"M": math.prod(data[:-1]), "N": weight[0], "K": data[-1], "dtype": _dtype(values["input"])}
        parts = ["bias"] if values["bias"] is not None else []
        self._add(node, "dense", params, parts + self._epilogue(node, -1))

    def addmm(self, node: Any) -> None:
        values = _arguments(node, ("bias", "mat1", "mat2"), {})
        self._matmul(node, values["mat1"], values["mat2"], ["bias"])

    def mm(self, node: Any) -> None:
        self._matmul(node, node.args[0], node.args[1], [])

    def matmul(self, node: Any) -> None:
        self._matmul(node, node.args[0], node.args[1], [])

    def _matmul(self, node: Any, a: Any, b: Any, parts: list[str]) -> None:
        op, params = matmul_task(_shape(a, node), _shape(b, node), _dtype(a))
        self._add(node, op, params, parts + self._epilogue(node, -1))

    def attention(self, node: Any) -> None:
        """Fused attention: the two batched matmuls around its softmax (scores, then context)."""
        query, key, value = (_shape(arg, node) for arg in node.args[:3])
        batch, dtype = math.prod(query[:-2]), _dtype(node.args[0])
        self._add(node, "batch_matmul", {"B": batch, "M": query[-2], "N": key[-2], "K": query[-1], "dtype": dtype},
                  [], ".scores")
        self._add(node, "batch_matmul", {"B": batch, "M": query[-2], "N": value[-1], "K": key[-2], "dtype": dtype},
                  self._epilogue(node, -1), ".context")

    def _add(self, node: Any, op: str, params: dict[str, Any], parts: list[str], suffix: str = "") -> None:
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        self.collector.add(op, params, parts, (path or node.name) + suffix)

    # ---- epilogues

    def _epilogue(self, node: Any, channel_axis: int) -> list[str]:
        parts: list[str] = []
        current = node
        while len(current.users) == 1:
            user = next(iter(current.users))
            if user.op != "call_function" or user in self.claimed:
                break
            part = self._fusible(user, current, channel_axis)
            if part is None:
                break
            if part:
                parts.append(part)
            self.claimed.add(user)
            current = user
        return parts

    def _fusible(self, node: Any, value: Any, channel_axis: int) -> str | None:
        name = _op_name(node.target)
        if name in ("relu", "relu_"):
            return "relu"
        if name in ("hardtanh", "hardtanh_", "clamp", "clamp_"):
            low, high = (list(node.args[1:3]) + [None, None])[:2]
            return "relu6" if low == 0 and high == 6 else None
        if name in ("dropout", "dropout_"):
            return "" if len(node.args) > 2 and node.args[2] is False else None
        if name == "batch_norm":
            return "bias" if node.args[0] is value and not _arguments(
                node, ("input", "weight", "bias", "running_mean", "running_var", "training"), {})["training"] else None
        if name in ("add", "add_") and len(node.args) == 2 and node.kwargs.get("alpha", 1) == 1:
            other = node.args[1] if node.args[0] is value else node.args[0]
            if other is value or not hasattr(other, "meta"):
                return None
            shape, other_shape = _shape(value, node), _shape(other, node)
            if other.op == "placeholder" and other.name in self.constants and channel_vector(other_shape, shape,
                                                                                               channel_axis):
                return "bias"
            if other_shape == shape:
                return "add"
        return None


def read_torch(spec: str, collector: TaskCollector, specs: Sequence[InputSpec], batch_size: int | None,
               used: set[int]) -> ModelReport:
    """The tasks of one torch module factory (see the module docstring)."""
    import torch

    model = build_module(spec)
    shapes = resolve_inputs(spec, _declared_inputs(model), specs, batch_size, used)
    try:
        example = tuple(torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
                        for shape, dtype in shapes.values())
    except (AttributeError, TypeError) as exc:
        raise ExtractError(f"{spec}: cannot make example inputs {shapes}: {exc}") from exc
    try:
        program = torch.export.export(model, example, strict=False)
    except Exception as exc:  # torch.export of the user's module: reported with its cause
        raise ExtractError(f"{spec}: torch.export failed with inputs {_describe(shapes)}: "
                           f"{type(exc).__name__}: {str(exc)[:2000]}") from exc
    _Walker(program, collector).run()
    return ModelReport(collector.model, spec, {name: shape for name, (shape, _) in shapes.items()},
                       collector.tunable_ops, list(collector.tasks.values()), collector.unsupported)


def _describe(shapes: dict[str, tuple[list[int], str]]) -> str:
    return ", ".join(f"{name}:{'x'.join(map(str, shape))}:{dtype}" for name, (shape, dtype) in shapes.items())
