"""A BERT-style transformer encoder layer as an ONNX graph built with ``onnx.helper``.

For tests, benchmarks and sample configs where no model may be downloaded: the layer of
BERT-base is ``bert_encoder_layer()`` (hidden 768, 12 heads, feed-forward 3072). Batch and
sequence length are dynamic (``batch``, ``seq``), so extraction needs ``--input``. The
projections are MatMul + Add (query, key, value, output) and Gemm (feed-forward, on the
flattened tokens); attention is two batched MatMuls around a Softmax; layer normalization
and GELU are spelled out in elementwise ops. Weights are zeros: only shapes matter.

    python -m lorien.models.bert -o bert_base_layer.onnx
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any


def bert_encoder_layer(hidden: int = 768, heads: int = 12, ffn: int = 3072, opset: int = 17) -> Any:
    """The ModelProto of one post-norm encoder layer, input ``hidden_states[batch, seq, hidden]``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
    head_dim = hidden // heads
    nodes: list[Any] = []
    initializers: list[Any] = []

    def const(name: str, value: Any) -> str:
        initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: Sequence[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, list(inputs), [output], name=output, **attrs))
        return output

    def weight(name: str, *shape: int) -> str:
        return const(name, np.zeros(shape, dtype=np.float32))

    def layer_norm(x: str, prefix: str) -> str:
        mean = node("ReduceMean", [x], f"{prefix}.mean", axes=[-1], keepdims=1)
        centered = node("Sub", [x, mean], f"{prefix}.centered")
        variance = node("ReduceMean", [node("Pow", [centered, const(f"{prefix}.two", np.float32(2))],
                                            f"{prefix}.square")], f"{prefix}.variance", axes=[-1], keepdims=1)
        std = node("Sqrt", [node("Add", [variance, const(f"{prefix}.eps", np.float32(1e-12))], f"{prefix}.var_eps")],
                   f"{prefix}.std")
        scaled = node("Mul", [node("Div", [centered, std], f"{prefix}.normed"), weight(f"{prefix}.weight", hidden)],
                      f"{prefix}.scaled")
        return node("Add", [scaled, weight(f"{prefix}.bias", hidden)], f"{prefix}.out")

    x = "hidden_states"
    split_heads = const("shape.split_heads", np.array([0, 0, heads, head_dim], dtype=np.int64))
    projections = {}
    for part, perm in (("query", [0, 2, 1, 3]), ("key", [0, 2, 3, 1]), ("value", [0, 2, 1, 3])):
        projected = node("Add", [node("MatMul", [x, weight(f"attention.{part}.weight", hidden, hidden)],
                                      f"attention.{part}.matmul"), weight(f"attention.{part}.bias", hidden)],
                         f"attention.{part}.out")
        projections[part] = node("Transpose", [node("Reshape", [projected, split_heads], f"attention.{part}.heads")],
                                 f"attention.{part}.t", perm=perm)
    scores = node("MatMul", [projections["query"], projections["key"]], "attention.scores")
    scaled = node("Div", [scores, const("attention.scale", np.float32(math.sqrt(head_dim)))], "attention.scaled")
    probs = node("Softmax", [scaled], "attention.probs", axis=-1)
    context = node("MatMul", [probs, projections["value"]], "attention.context")
    merged = node("Reshape", [node("Transpose", [context], "attention.context.t", perm=[0, 2, 1, 3]),
                              const("shape.merge_heads", np.array([0, 0, hidden], dtype=np.int64))],
                  "attention.merged")
    attended = node("Add", [node("Add", [node("MatMul", [merged, weight("attention.output.weight", hidden, hidden)],
                                              "attention.output.matmul"),
                                         weight("attention.output.bias", hidden)], "attention.output.biased"), x],
                    "attention.residual")
    normed = layer_norm(attended, "attention.norm")
    tokens = node("Reshape", [normed, const("shape.tokens", np.array([-1, hidden], dtype=np.int64))], "ffn.tokens")
    inner = node("Gemm", [tokens, weight("ffn.intermediate.weight", ffn, hidden), weight("ffn.intermediate.bias", ffn)],
                 "ffn.intermediate", transB=1)
    erf = node("Erf", [node("Div", [inner, const("gelu.sqrt2", np.float32(math.sqrt(2)))], "gelu.scaled")], "gelu.erf")
    gelu = node("Mul", [node("Mul", [inner, node("Add", [erf, const("gelu.one", np.float32(1))], "gelu.shifted")],
                             "gelu.product"), const("gelu.half", np.float32(0.5))], "gelu.out")
    output = node("Gemm", [gelu, weight("ffn.output.weight", hidden, ffn), weight("ffn.output.bias", hidden)],
                  "ffn.output", transB=1)
    restored = node("Reshape", [output, node("Shape", [normed], "ffn.shape")], "ffn.restored")
    result = layer_norm(node("Add", [restored, normed], "ffn.residual"), "ffn.norm")

    graph = helper.make_graph(
        nodes, "bert_encoder_layer",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", "seq", hidden])],
        [helper.make_tensor_value_info(result, TensorProto.FLOAT, ["batch", "seq", hidden])],
        initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="lorien")
    onnx.checker.check_model(model)
    return model


def main(argv: Sequence[str] | None = None) -> int:
    """Write the layer to an ONNX file."""
    import onnx

    parser = argparse.ArgumentParser(prog="python -m lorien.models.bert", description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", required=True, help="ONNX file to write")
    parser.add_argument("--hidden", type=int, default=768, help="hidden size (default 768, BERT-base)")
    parser.add_argument("--heads", type=int, default=12, help="attention heads (default 12)")
    parser.add_argument("--ffn", type=int, default=3072, help="feed-forward size (default 3072)")
    args = parser.parse_args(argv)
    onnx.save(bert_encoder_layer(args.hidden, args.heads, args.ffn), args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
