"""Ansor's layout rewrite: a weight laid out in the order its reader's loops walk it.

In a network, the weights of convolutions and dense layers are constants, so TVM's
auto-scheduler rewrites their layout to follow the multi-level tiling of the stage that reads
them (``layout_free_placeholders``; ``LayoutRewriteOption.REWRITE_FOR_PRE_TRANSFORMED``, the
option TVM's network tuning writes into its records as ``2``): the weight is transformed once,
outside the kernel, and the innermost loops read it contiguously. Lorien does the same.

After the steps are replayed, each loop of the reader that walks a weight dimension becomes a
dimension of the packed weight, in loop order (loops of extent 1 dropped); the reader loads
``packed[..., (a // inner) % extent, ...]``, which the engine's index simplification turns back
into the loop variables. The kernel's argument carries a :class:`~lorien.engine.arrays.Packing`
that makes the packed array from the logical one (a reshape and a transpose). A weight is left
as it is when its reader is not a single stage indexing it by plain loop variables, or when a
split of one of those loops does not divide it.
"""

from __future__ import annotations

from lorien.engine import te
from lorien.engine.arrays import Packing
from lorien.engine.dag import ComputeDAG, input_tensors
from lorien.engine.schedule import Schedule, Stage, derived_extents

#: TVM's value of ``layout_rewrite_option`` for weights transformed before the kernel runs.
REWRITE_FOR_PRE_TRANSFORMED = 2
#: Compute ops whose second input is a weight indexed by plain loop variables (TVM's topi marks
#: it ``layout_free_placeholders``); a depthwise kernel is read at ``[c // multiplier, ...]``.
LAYOUT_FREE_TAGS = ("conv2d_nchw", "conv2d_nhwc", "dense")


def layout_free_placeholders(dag: ComputeDAG) -> list[str]:
    """Names of the DAG's inputs that are weights: the second input of a convolution or dense op."""
    names = []
    for tensor in dag.ops:
        if isinstance(tensor.op, te.ComputeOp) and tensor.op.tag in LAYOUT_FREE_TAGS:
            inputs = input_tensors(tensor)
            if len(inputs) > 1 and isinstance(inputs[1].op, te.PlaceholderOp) and inputs[1].name not in names:
                names.append(inputs[1].name)
    return names


def rewrite_layouts(schedule: Schedule, args: list[te.Tensor], dag: ComputeDAG) -> list[te.Tensor]:
    """Rewrite the layout of every weight of ``dag`` its schedule allows; returns the kernel's
    arguments with the rewritten weights (placeholders carrying their ``packing``)."""
    args = list(args)
    for name in layout_free_placeholders(dag):
        position = next((i for i, t in enumerate(args) if t.name == name), None)
        if position is None:
            continue
        rewritten = _rewrite(schedule, args[position])
        if rewritten is not None:
            args[position] = rewritten
    return args


def _loads_of(stage: Stage, tensor: te.Tensor) -> list[te.Load]:
    return [node for node in te.walk(stage.op.body) if isinstance(node, te.Load) and node.tensor is tensor]


def _rewrite(schedule: Schedule, weight: te.Tensor) -> te.Tensor | None:
    readers = [(st, loads) for st in schedule.stages if st.attach != "inline" and (loads := _loads_of(st, weight))]
    if len(readers) != 1:
        return None
    ((stage, loads),) = readers
    indices = loads[0].indices
    roots = {iv.name: iv for iv in stage.root_axes}
    if (any(tuple(load.indices) != tuple(indices) for load in loads)
            or not all(isinstance(i, te.IterVar) and roots.get(i.name) is i for i in indices)
            or len({i.name for i in indices}) != len(indices)):
        return None
    extents = _exact_extents(stage)
    if extents is None:
        return None
    splits = {rel[1]: (rel[2], rel[3]) for rel in stage.relations if rel[0] == "split"}
    fuses = {rel[3]: (rel[1], rel[2]) for rel in stage.relations if rel[0] == "fuse"}

    def split_leaves(name: str) -> list[str]:  # outer to inner
        return split_leaves(splits[name][0]) + split_leaves(splits[name][1]) if name in splits else [name]

    def unfused(name: str) -> list[str]:
        return unfused(fuses[name][0]) + unfused(fuses[name][1]) if name in fuses else [name]

    dims, split_shape, position = [], [], {}
    for index in indices:
        leaves = [leaf for leaf in split_leaves(index.name) if extents[leaf] > 1]
        dims.append(leaves)
        for leaf in leaves:
            position[leaf] = len(split_shape)
            split_shape.append(extents[leaf])
    loop_order = [leaf for top in stage.leaf for leaf in unfused(top) if leaf in position]
    if sorted(loop_order) != sorted(position):
        return None
    packing = Packing(tuple(weight.shape), tuple(split_shape), tuple(position[leaf] for leaf in loop_order))
    if packing.perm == tuple(range(len(split_shape))):
        return None  # the loops already walk the weight in its own order
    packed = te.Tensor(packing.shape, weight.dtype, weight.name, te.PlaceholderOp(weight.name, packing))

    exprs: dict[str, te.Expr] = {}
    for index, leaves in zip(indices, dims, strict=True):
        inner = 1
        for leaf in reversed(leaves):
            expr: te.Expr = index if inner == 1 else te.BinOp("floordiv", index, te.const(inner))
            if inner * extents[leaf] < extents[index.name]:
                expr = te.BinOp("mod", expr, te.const(extents[leaf]))
            exprs[leaf] = expr
            inner *= extents[leaf]
    new_indices = [exprs[leaf] for leaf in loop_order]

    def load_fn(load: te.Load, idx: tuple) -> te.Expr:
        return te.Load(packed, new_indices) if load.tensor is weight else te.Load(load.tensor, idx)

    op = stage.op
    stage.op = te.ComputeOp(op.name, op.axis, te.substitute(op.body, {}, load_fn), op.tag, op.attrs)
    return packed


def _exact_extents(stage: Stage) -> dict[str, int] | None:
    """Static extents of a stage's loops when every split divides its loop, else None."""
    extents = derived_extents(stage.relations, {iv.name: iv.extent for iv in stage.root_axes})
    for _, parent, _, _, factor, nparts in (rel for rel in stage.relations if rel[0] == "split"):
        if extents[parent] % (factor if factor is not None else nparts):
            return None
    return extents
