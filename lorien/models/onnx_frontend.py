"""Tasks of an ONNX model: Conv, Gemm and MatMul with the epilogues that follow them.

Shapes come from ONNX's own shape inference, run after the inputs are given concrete
shapes. Weights are dropped as soon as the file is parsed (external data is never read):
only their dimensions matter.
Conv (2-d) becomes conv2d, or depthwise_conv2d when every input channel is its own group;
Gemm and MatMul with a 2-d right operand become dense; MatMul with batched operands becomes
batch_matmul. After each, a chain of single-consumer elementwise nodes is fused: Add of a
per-channel constant (``bias``; also a Conv's or Gemm's own bias input), BatchNormalization
(``bias``: inference folds it into the weights and a bias), Add of a tensor of the same shape
(``add``, a residual), Relu (``relu``), Clip to [0, 6] (``relu6``); Identity and Dropout pass
through. Every other node is counted as unsupported by op type.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
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

#: Initializers larger than this keep their dimensions only (values of small ones, such as
#: reshape targets and clip bounds, are read).
LARGE_CONSTANT_BYTES = 4096
#: Nodes a fused chain passes through without changing the computation.
PASS_THROUGH = {"Identity", "Dropout"}


def load_onnx(path: str | Path) -> Any:
    """The ModelProto of an ONNX file, without external weight data; a file that is not a
    readable ONNX model is an ExtractError naming it."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.is_file():
        raise ExtractError(f"{path}: no such ONNX file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as exc:
        raise ExtractError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    if not model.HasField("graph") or not model.graph.node:
        raise ExtractError(f"{path}: not an ONNX model (no graph nodes; the file may be truncated or of another kind)")
    for tensor in model.graph.initializer:
        if tensor.ByteSize() > LARGE_CONSTANT_BYTES:  # weights: their dimensions are all that matters
            for name in ("raw_data", "float_data", "double_data", "int32_data", "int64_data"):
                tensor.ClearField(name)
    return model


def _dtype_name(elem_type: int) -> str:
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except KeyError:
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _declared_inputs(model: Any) -> list[DeclaredInput]:
    initializers = {init.name for init in model.graph.initializer}
    declared = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = None
        if tensor.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        declared.append(DeclaredInput(value.name, shape, _dtype_name(tensor.elem_type)))
    return declared


def _with_inputs(model: Any, shapes: dict[str, tuple[list[int], str]]) -> None:
    """Give the graph inputs the resolved shapes (in place)."""
    import numpy as np
    import onnx

    for value in model.graph.input:
        if value.name not in shapes:
            continue
        shape, dtype = shapes[value.name]
        tensor = value.type.tensor_type
        if dtype != _dtype_name(tensor.elem_type):  # --input NAME:SHAPE:DTYPE
            tensor.elem_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        tensor.ClearField("shape")
        for dim in shape:
            tensor.shape.dim.add().dim_value = dim


class _Graph:
    """Shapes, constants and consumers of an inferred ONNX graph."""

    def __init__(self, model: Any, source: str):
        import onnx

        self.source = source
        graph = model.graph
        self.nodes = list(graph.node)
        self.shapes: dict[str, list[int | None]] = {}
        self.dtypes: dict[str, str] = {}
        for value in [*graph.input, *graph.value_info, *graph.output]:
            tensor = value.type.tensor_type
            if tensor.HasField("shape"):
                self.shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
            self.dtypes[value.name] = _dtype_name(tensor.elem_type)
        self.constants: dict[str, Any] = {}
        for init in graph.initializer:
            self.constants[init.name] = init
            self.shapes[init.name] = list(init.dims)
            self.dtypes[init.name] = _dtype_name(init.data_type)
        self.outputs = {value.name for value in graph.output}
        self.consumers: dict[str, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for name in node.input:
                self.consumers.setdefault(name, []).append(index)
            if node.op_type == "Constant":
                value = next((a for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.constants[node.output[0]] = value.t
                    self.shapes[node.output[0]] = list(value.t.dims)
            elif node.op_type == "Identity" and node.input[0] in self.constants:
                self.constants[node.output[0]] = self.constants[node.input[0]]
        self.attribute = onnx.helper.get_attribute_value

    def attrs(self, node: Any) -> dict[str, Any]:
        return {a.name: self.attribute(a) for a in node.attribute}

    def shape(self, name: str, node: Any) -> list[int]:
        shape = self.shapes.get(name)
        if shape is None or any(d is None for d in shape):
            raise ExtractError(f"{self.source}: node {node.name or node.op_type!r} ({node.op_type}): the shape of "
                               f"{name!r} is unknown after shape inference ({shape}); check the --input shapes")
        return shape  # type: ignore[return-value]

    def value_of(self, name: str) -> Any:
        """The NumPy value of a constant, or None."""
        from onnx import numpy_helper

        tensor = self.constants.get(name)
        if tensor is None or (tensor.data_location == tensor.EXTERNAL):
            return None
        return numpy_helper.to_array(tensor)


def _epilogue(graph: _Graph, value: str, channel_axis: int, claimed: set[int]) -> list[str]:
    """Fuse the chain of single-consumer elementwise nodes after ``value``; returns its parts."""
    parts: list[str] = []
    out_shape = graph.shapes.get(value)
    while value not in graph.outputs and len(graph.consumers.get(value, [])) == 1 and out_shape:
        index = graph.consumers[value][0]
        node = graph.nodes[index]
        part = _fusible(graph, node, value, out_shape, channel_axis)
        if part is None or index in claimed:
            break
        if part:
            parts.append(part)
        claimed.add(index)
        value = node.output[0]
    return parts


def _fusible(graph: _Graph, node: Any, value: str, out_shape: list[int | None], channel_axis: int) -> str | None:
    """The epilogue part a node adds ('' when it passes through), or None when it ends the chain."""
    op = node.op_type
    if op in PASS_THROUGH and all(len(graph.consumers.get(out, [])) == 0 for out in node.output[1:]):
        return ""
    if op == "Relu":
        return "relu"
    if op == "Clip":
        attrs = graph.attrs(node)
        low = graph.value_of(node.input[1]) if len(node.input) > 1 and node.input[1] else attrs.get("min")
        high = graph.value_of(node.input[2]) if len(node.input) > 2 and node.input[2] else attrs.get("max")
        return "relu6" if low is not None and high is not None and float(low) == 0 and float(high) == 6 else None
    if op == "BatchNormalization" and len(node.output) == 1 and node.input[0] == value:
        return "bias"
    if op == "Add" and len(node.input) == 2:
        other = node.input[1] if node.input[0] == value else node.input[0]
        if other == value:
            return None
        other_shape = graph.shapes.get(other)
        if other in graph.constants and other_shape is not None and channel_vector(other_shape, out_shape, channel_axis):
            return "bias"
        if other not in graph.constants and other_shape == out_shape:
            return "add"
    return None


def _conv(graph: _Graph, node: Any, collector: TaskCollector, claimed: set[int]) -> None:
    data = graph.shape(node.input[0], node)
    if len(data) != 4:
        collector.skip(f"Conv ({len(data) - 2}-d)")
        return
    kernel = graph.shape(node.input[1], node)
    attrs = graph.attrs(node)
    kh, kw = attrs.get("kernel_shape", kernel[2:])
    stride = list(attrs.get("strides", [1, 1]))
    dilation = list(attrs.get("dilations", [1, 1]))
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(data[2:], (kh, kw), stride, dilation, upper=auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    else:
        top, left, bottom, right = attrs.get("pads", [0, 0, 0, 0])
        pads = (top, left, bottom, right)
    op, params = conv_task(data, [kernel[0], kernel[1], kh, kw], stride, pads, dilation,
                           int(attrs.get("group", 1)), graph.dtypes.get(node.input[0], "float32"))
    parts = ["bias"] if len(node.input) > 2 and node.input[2] else []
    parts += _epilogue(graph, node.output[0], 1, claimed)
    collector.add(op, params, parts, _name(node, graph))


def _gemm(graph: _Graph, node: Any, collector: TaskCollector, claimed: set[int]) -> None:
    attrs = graph.attrs(node)
    a, b = graph.shape(node.input[0], node), graph.shape(node.input[1], node)
    m, k = (a[1], a[0]) if attrs.get("transA", 0) else (a[0], a[1])
    n = b[0] if attrs.get("transB", 0) else b[1]
    parts = []
    if len(node.input) > 2 and node.input[2]:
        bias_shape = graph.shape(node.input[2], node)
        parts.append("bias" if channel_vector(bias_shape, [m, n], 1) else "add")
    parts += _epilogue(graph, node.output[0], -1, claimed)
    collector.add("dense", {"M": m, "N": n, "K": k, "dtype": graph.dtypes.get(node.input[0], "float32")},
                  parts, _name(node, graph))


def _matmul(graph: _Graph, node: Any, collector: TaskCollector, claimed: set[int]) -> None:
    a, b = graph.shape(node.input[0], node), graph.shape(node.input[1], node)
    op, params = matmul_task(a, b, graph.dtypes.get(node.input[0], "float32"))
    collector.add(op, params, _epilogue(graph, node.output[0], -1, claimed), _name(node, graph))


def _name(node: Any, graph: _Graph) -> str:
    """A readable name: the layer path of the node's weight (``layer1.0.conv1``), else the node's name."""
    weight = node.input[1] if len(node.input) > 1 else ""
    if weight in graph.constants and weight.endswith(".weight"):
        return weight.removesuffix(".weight")
    return node.name.strip("/") or node.op_type


TUNABLE = {"Conv": _conv, "Gemm": _gemm, "MatMul": _matmul}


def read_onnx(path: str, collector: TaskCollector, specs: Sequence[InputSpec], batch_size: int | None,
              used: set[int]) -> ModelReport:
    """The tasks of one ONNX file (see the module docstring)."""
    import onnx

    model = load_onnx(path)
    shapes = resolve_inputs(f"{path}", _declared_inputs(model), specs, batch_size, used)
    _with_inputs(model, shapes)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ExtractError(f"{path}: ONNX shape inference failed with inputs "
                           f"{ {name: shape for name, (shape, _) in shapes.items()} }: {exc}") from exc
    graph = _Graph(inferred, str(path))
    claimed: set[int] = set()
    for index, node in enumerate(graph.nodes):
        if index in claimed:
            continue
        handler = TUNABLE.get(node.op_type) if not node.domain or node.domain == "ai.onnx" else None
        if handler is not None:
            handler(graph, node, collector, claimed)
        elif node.op_type != "Constant" and not (node.op_type == "Identity" and node.output[0] in graph.constants):
            collector.skip(node.op_type if not node.domain or node.domain == "ai.onnx"
                           else f"{node.domain}.{node.op_type}")
    return ModelReport(collector.model, str(path), {name: shape for name, (shape, _) in shapes.items()},
                       collector.tunable_ops, list(collector.tasks.values()), collector.unsupported)
