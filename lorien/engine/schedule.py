"""Schedules: a replayable sequence of primitive steps applied to the stages of a computation.

Every primitive is recorded in ``Schedule.steps`` as a JSON-serializable dict that names its
stage and axes, so ``replay(s.steps, outputs)`` rebuilds the same schedule. Axis names are
unique inside a stage: ``split`` makes ``<axis>.outer``/``<axis>.inner``, ``fuse`` makes
``<a>.<b>.fused``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from lorien.engine import te
from lorien.errors import LorienError

LOOP_KINDS = ("serial", "parallel", "unrolled", "vectorized")


_ATOMS = (str, int, float, bool, type(None))


def _copy_step(value):
    """A deep copy of a step (JSON-like: dicts, lists, strings, numbers), without
    ``copy.deepcopy``'s bookkeeping (replaying a trace copied every step through it); any
    other value goes through ``copy.deepcopy``."""
    kind = type(value)
    if kind is dict:
        return {key: _copy_step(item) for key, item in value.items()}
    if kind is list:
        return [_copy_step(item) for item in value]
    if kind in _ATOMS:
        return value
    return copy.deepcopy(value)


class ScheduleError(LorienError, ValueError):
    """A primitive that cannot be applied (unknown axis, wrong order, bad factor...)."""


class Stage:
    """The loop structure of one compute op: leaf axes, split/fuse relations, annotations."""

    def __init__(self, schedule: Schedule, tensor: te.Tensor, op: te.ComputeOp):
        self.schedule, self.tensor, self.op, self.name = schedule, tensor, op, tensor.name
        self.axes: dict[str, te.IterVar] = {}
        self.leaf: list[str] = []
        self.relations: list[tuple] = []
        self.annotations: dict[str, str] = {}
        self.attach: str | tuple[str, str] | None = None
        self.alignments: dict[str, tuple[int, int]] = {}
        self._reset_axes()

    def _reset_axes(self) -> None:
        self.axes = {iv.name: iv for iv in self.op.axis + self.op.reduce_axis}
        if len(self.axes) != len(self.op.axis) + len(self.op.reduce_axis):
            raise ScheduleError(f"stage {self.name!r}: axis names are not unique")
        self.leaf = list(self.axes)

    @property
    def root_axes(self) -> list[te.IterVar]:
        return self.op.axis + self.op.reduce_axis

    def _name(self, axis: te.IterVar | str) -> str:
        name = axis if isinstance(axis, str) else axis.name
        if name not in self.leaf:
            raise ScheduleError(f"stage {self.name!r}: {name!r} is not a leaf axis (leaves: {self.leaf})")
        return name

    def _new_axis(self, name: str, kind: str) -> te.IterVar:
        if name in self.axes:
            raise ScheduleError(f"stage {self.name!r}: axis name {name!r} already used")
        self.axes[name] = te.IterVar(name, None, kind)
        return self.axes[name]

    # Public primitives: each records one step and applies it.
    def split(self, axis: te.IterVar | str, factor: int | None = None, nparts: int | None = None):
        """Split ``axis`` into (outer, inner) by inner ``factor`` or outer ``nparts``."""
        step = {"kind": "split", "stage": self.name, "axis": self._name(axis)}
        step.update({"factor": factor} if factor is not None else {"nparts": nparts})
        return self.schedule.apply(step)

    def tile(self, x: te.IterVar | str, y: te.IterVar | str, x_factor: int, y_factor: int):
        """Split ``x`` and ``y`` and order them (x.outer, y.outer, x.inner, y.inner); recorded as
        the split and reorder steps it is made of."""
        xo, xi = self.split(x, factor=x_factor)
        yo, yi = self.split(y, factor=y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def reorder(self, *axes: te.IterVar | str) -> None:
        """Put the named leaves in this order (in the positions they occupy now)."""
        self.schedule.apply({"kind": "reorder", "stage": self.name, "axes": [self._name(a) for a in axes]})

    def fuse(self, *axes: te.IterVar | str) -> te.IterVar:
        """Fuse adjacent leaves (outermost first) into one axis."""
        return self.schedule.apply({"kind": "fuse", "stage": self.name, "axes": [self._name(a) for a in axes]})

    def vectorize(self, axis: te.IterVar | str) -> None:
        self.schedule.apply({"kind": "annotate", "stage": self.name, "axis": self._name(axis), "ann": "vectorized"})

    def unroll(self, axis: te.IterVar | str) -> None:
        self.schedule.apply({"kind": "annotate", "stage": self.name, "axis": self._name(axis), "ann": "unrolled"})

    def parallel(self, axis: te.IterVar | str) -> None:
        self.schedule.apply({"kind": "annotate", "stage": self.name, "axis": self._name(axis), "ann": "parallel"})

    def compute_at(self, parent: Stage, axis: te.IterVar | str) -> None:
        """Compute this stage inside ``parent``'s loop ``axis`` (only the region needed there)."""
        self.schedule.apply({"kind": "compute_at", "stage": self.name, "target": parent.name,
                             "axis": parent._name(axis)})

    def storage_align(self, axis: te.IterVar | str, factor: int, offset: int) -> None:
        """Ask for the buffer row stride at ``axis`` to be ``factor * k + offset`` (TVM's
        storage_align, against shared-memory bank conflicts). Recorded; a no-op on the CPU."""
        self.schedule.apply({"kind": "storage_align", "stage": self.name, "axis": self._name(axis),
                             "factor": int(factor), "offset": int(offset)})

    def compute_inline(self) -> None:
        """Substitute this stage's expression into its consumers."""
        self.schedule.apply({"kind": "compute_inline", "stage": self.name})

    def reverse_compute_inline(self) -> None:
        """Compute this element-wise stage inside the loops of its one producer (TVM's
        reverse_compute_inline): this stage takes the producer's loops, splits and place, and
        the producer is inlined into it. The producer must be a spatial stage this one reads only
        at its own indices."""
        self.schedule.apply({"kind": "reverse_compute_inline", "stage": self.name})

    def compute_root(self) -> None:
        self.schedule.apply({"kind": "compute_root", "stage": self.name})

    # Step implementations.
    def _split(self, axis: str, factor: int | None, nparts: int | None):
        if (factor is None) == (nparts is None) or int(factor or nparts) < 1:
            raise ScheduleError(f"stage {self.name!r}: split of {axis!r} needs one positive factor or nparts, "
                                f"got factor={factor} nparts={nparts}")
        kind = self.axes[axis].kind
        outer, inner = self._new_axis(f"{axis}.outer", kind), self._new_axis(f"{axis}.inner", kind)
        pos = self.leaf.index(axis)
        self.leaf[pos : pos + 1] = [outer.name, inner.name]
        self.relations.append(("split", axis, outer.name, inner.name, factor, nparts))
        self._move_attached([axis], inner.name)
        return outer, inner

    def _reorder(self, names: list[str]) -> None:
        if len(set(names)) != len(names):
            raise ScheduleError(f"stage {self.name!r}: reorder names an axis twice: {names}")
        positions = sorted(self.leaf.index(n) for n in names)
        for pos, name in zip(positions, names, strict=False):
            self.leaf[pos] = name

    def _fuse(self, names: list[str]) -> te.IterVar:
        positions = [self.leaf.index(n) for n in names]
        if positions != list(range(positions[0], positions[0] + len(names))):
            raise ScheduleError(f"stage {self.name!r}: fuse needs adjacent leaves in order, got {names} in {self.leaf}")
        kinds = {self.axes[n].kind for n in names}
        if len(kinds) != 1:
            raise ScheduleError(f"stage {self.name!r}: cannot fuse spatial with reduce axes {names}")
        kind, fused = kinds.pop(), names[0]
        for name in names[1:]:
            new = self._new_axis(f"{fused}.{name}.fused", kind)
            self.relations.append(("fuse", fused, name, new.name))
            fused = new.name
        self.leaf[positions[0] : positions[-1] + 1] = [fused]
        self._move_attached(names, fused)
        return self.axes[fused]

    def _move_attached(self, old: list[str], new: str) -> None:
        """Stages computed at a loop that is split move to its innermost part; at a loop that is
        fused, to the fused loop (each iteration still computes what the old loop body needed)."""
        for other in self.schedule.stages:
            if isinstance(other.attach, tuple) and other.attach[0] == self.name and other.attach[1] in old:
                other.attach = (self.name, new)


def derived_extents(relations: list[tuple], extents: dict[str, int]) -> dict[str, int]:
    """Add to ``extents`` (loop name -> extent) the extent of every loop that ``relations``
    split or fuse from loops it knows (a split that does not divide rounds its outer loop
    up); returns it."""
    for rel in relations:
        if rel[0] == "split" and rel[1] in extents:
            _, parent, outer, inner, factor, nparts = rel
            if factor is not None:
                extents[inner] = min(int(factor), extents[parent])
                extents[outer] = -(-extents[parent] // extents[inner])
            else:
                extents[outer] = min(int(nparts), extents[parent])
                extents[inner] = -(-extents[parent] // extents[outer])
        elif rel[0] == "fuse" and rel[1] in extents and rel[2] in extents:
            extents[rel[3]] = extents[rel[1]] * extents[rel[2]]
    return extents


def leaf_extents(stage: Stage) -> dict[str, int]:
    """Static extents of a stage's loops (root extents through its splits and fuses; for a
    stage computed at another loop these are upper bounds)."""
    return derived_extents(stage.relations, {iv.name: int(iv.extent) for iv in stage.op.axis + stage.op.reduce_axis})


def _connected(relations: list[tuple], axis: str) -> set[str]:
    """``axis``, the loops it was split or fused from, and every loop derived from those."""
    touched = {axis}
    for rel in reversed(relations):
        if rel[0] == "split" and (rel[2] in touched or rel[3] in touched):
            touched.add(rel[1])
        elif rel[0] == "fuse" and rel[3] in touched:
            touched.update(rel[1:3])
    for rel in relations:
        if rel[0] == "split" and rel[1] in touched:
            touched.update(rel[2:4])
        elif rel[0] == "fuse" and (rel[1] in touched or rel[2] in touched):
            touched.add(rel[3])
    return touched


def _loads(expr: te.Expr) -> list[te.Load]:
    return [node for node in te.walk(expr) if isinstance(node, te.Load)]


class Schedule:
    """Stages of every compute op reachable from ``outputs`` plus the steps applied so far."""

    def __init__(self, outputs: Sequence[te.Tensor]):
        self.outputs = list(outputs)
        tensors = te.topo_order(self.outputs)
        self.tensors: dict[str, te.Tensor] = {t.name: t for t in tensors}
        self.stages: list[Stage] = [Stage(self, t, t.op) for t in tensors if isinstance(t.op, te.ComputeOp)]
        self.steps: list[dict] = []

    def __getitem__(self, tensor: te.Tensor | str) -> Stage:
        name = tensor if isinstance(tensor, str) else tensor.name
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ScheduleError(f"no stage named {name!r} (stages: {[s.name for s in self.stages]})")

    def cache_write(self, tensor: te.Tensor, scope: str = "local") -> te.Tensor:
        """Compute ``tensor`` into a new cache stage; ``tensor``'s stage becomes a copy out of it."""
        return self.apply({"kind": "cache_write", "stage": tensor.name, "scope": scope})

    def cache_read(self, tensor: te.Tensor, scope: str, readers: Sequence[te.Tensor | str]) -> te.Tensor:
        """A new stage ``<tensor>.<scope>`` copying ``tensor`` (an input or a computed tensor);
        ``readers`` read the copy instead, so ``compute_at`` can stage a tile of it near its use."""
        names = [r if isinstance(r, str) else r.name for r in readers]
        return self.apply({"kind": "cache_read", "stage": tensor.name, "scope": scope, "readers": names})

    def rfactor(self, tensor: te.Tensor, axis: te.IterVar | str, factor_axis: int = 0) -> te.Tensor:
        """Factor a reduction: a new stage ``<tensor>.rf`` keeps the reduce loop ``axis`` (a leaf
        split or fused from the reduce axes) as a spatial axis at position ``factor_axis`` and
        reduces the rest; ``tensor`` then reduces ``<tensor>.rf`` over ``<axis>.v``.

        The partial results can be computed in parallel or vectorized along ``axis``.
        """
        name = axis if isinstance(axis, str) else axis.name
        return self.apply({"kind": "rfactor", "stage": tensor.name, "axis": name, "factor_axis": int(factor_axis)})

    def apply(self, step: dict):
        """Apply one serialized step (as found in ``steps``) and record it."""
        kind = step.get("kind")
        handler = getattr(self, f"_apply_{kind}", None)
        if handler is None:
            raise ScheduleError(f"unknown schedule step kind {kind!r} in {step}")
        if kind == "cache_read":  # the cached tensor may be an input, which has no stage
            result = handler(self._tensor(step["stage"]), step)
            self.steps.append(_copy_step(step))
            return result
        stage = self[step["stage"]]
        for key in ("axis",):
            if key in step and kind != "compute_at" and step[key] not in stage.leaf:
                raise ScheduleError(f"step {step}: {step[key]!r} is not a leaf axis of {stage.name!r} ({stage.leaf})")
        result = handler(stage, step)
        self.steps.append(_copy_step(step))
        return result

    def _apply_split(self, stage: Stage, step: dict):
        return stage._split(step["axis"], step.get("factor"), step.get("nparts"))

    def _apply_reorder(self, stage: Stage, step: dict):
        for name in step["axes"]:
            stage._name(name)
        stage._reorder(list(step["axes"]))

    def _apply_fuse(self, stage: Stage, step: dict):
        for name in step["axes"]:
            stage._name(name)
        return stage._fuse(list(step["axes"]))

    def _apply_annotate(self, stage: Stage, step: dict):
        if step["ann"] not in LOOP_KINDS:
            raise ScheduleError(f"unknown annotation {step['ann']!r}; expected one of {LOOP_KINDS}")
        stage.annotations[step["axis"]] = step["ann"]

    def _apply_storage_align(self, stage: Stage, step: dict):
        if int(step["factor"]) < 1 or int(step["offset"]) < 0:
            raise ScheduleError(f"storage_align: factor must be >= 1 and offset >= 0, got {step}")
        stage.alignments[step["axis"]] = (int(step["factor"]), int(step["offset"]))

    def _apply_compute_at(self, stage: Stage, step: dict):
        target = self[step["target"]]
        if step["axis"] not in target.leaf:
            raise ScheduleError(f"compute_at: {step['axis']!r} is not a leaf of {target.name!r} ({target.leaf})")
        if target is stage:
            raise ScheduleError(f"compute_at: stage {stage.name!r} cannot be computed at itself")
        stage.attach = (target.name, step["axis"])

    def _apply_compute_inline(self, stage: Stage, step: dict):
        if stage.op.reduce_axis:
            raise ScheduleError(f"compute_inline: {stage.name!r} is a reduction and cannot be inlined")
        if any(stage.tensor is out for out in self.outputs):
            raise ScheduleError(f"compute_inline: {stage.name!r} is an output")
        stage.attach = "inline"

    def _apply_reverse_compute_inline(self, stage: Stage, step: dict):
        op = stage.op
        producers = {load.tensor.name for load in _loads(op.body)} & {st.name for st in self.stages}
        if len(producers) != 1 or op.reduce_axis:
            raise ScheduleError(f"reverse_compute_inline: {stage.name!r} must be element-wise and read one computed "
                                f"stage, it reads {sorted(producers)}")
        producer = self[producers.pop()]
        if producer.op.reduce_axis or producer.attach == "inline" or stage.relations or \
                producer.tensor.shape != stage.tensor.shape or any(producer.tensor is out for out in self.outputs):
            raise ScheduleError(f"reverse_compute_inline: producer {producer.name!r} of {stage.name!r} must be a "
                                "spatial, not inlined, non-output stage of the same shape")
        if any(load.tensor.name == producer.name and list(load.indices) != list(op.axis) for load in _loads(op.body)):
            raise ScheduleError(f"reverse_compute_inline: {stage.name!r} reads {producer.name!r} at other indices "
                                "than its own")
        axes = producer.op.axis
        mapping = dict(zip(op.axis, axes, strict=True))

        def fold(load: te.Load, indices: tuple) -> te.Expr:
            return producer.op.body if load.tensor.name == producer.name else te.Load(load.tensor, indices)

        stage.op = te.ComputeOp(stage.name, axes, te.substitute(op.body, mapping, fold), op.tag, op.attrs)
        stage.axes, stage.leaf = dict(producer.axes), list(producer.leaf)
        stage.relations, stage.annotations = list(producer.relations), dict(producer.annotations)
        stage.attach, stage.alignments = producer.attach, dict(producer.alignments)
        for other in self.stages:
            if isinstance(other.attach, tuple) and other.attach[0] == producer.name:
                other.attach = (stage.name, other.attach[1])
        producer.attach = "inline"

    def _apply_compute_root(self, stage: Stage, step: dict):
        stage.attach = None

    def _apply_cache_write(self, stage: Stage, step: dict) -> te.Tensor:
        if stage.relations:
            raise ScheduleError(f"cache_write: stage {stage.name!r} was already split/fused; cache_write first")
        op = stage.op
        fresh = {iv: te.IterVar(iv.name, iv.extent, iv.kind) for iv in op.axis + op.reduce_axis}
        body = te.substitute(op.body, fresh)
        if isinstance(body, te.Reduce):
            body = te.Reduce(body.combiner, body.source, [fresh[a] for a in op.body.axes])
        cache_name = f"{stage.name}.{step['scope']}"
        cache_op = te.ComputeOp(cache_name, [fresh[a] for a in op.axis], body, op.tag, op.attrs)
        cache = te.Tensor(stage.tensor.shape, stage.tensor.dtype, cache_name, cache_op)
        copy_axes = [te.IterVar(iv.name, iv.extent, "spatial") for iv in op.axis]
        stage.op = te.ComputeOp(stage.name, copy_axes, cache[tuple(copy_axes)], op.tag, op.attrs)
        stage._reset_axes()
        cache_stage = Stage(self, cache, cache_op)
        self.stages.insert(self.stages.index(stage), cache_stage)
        self.tensors[cache_name] = cache
        return cache

    def _apply_rfactor(self, stage: Stage, step: dict) -> te.Tensor:
        op, axis, pos = stage.op, step["axis"], step["factor_axis"]
        if not isinstance(op.body, te.Reduce) or stage.axes[axis].kind != "reduce":
            raise ScheduleError(f"rfactor: {axis!r} of stage {stage.name!r} is not a reduce loop")
        if not 0 <= pos <= len(op.axis):
            raise ScheduleError(f"rfactor: factor_axis {pos} of stage {stage.name!r} is not in 0..{len(op.axis)}")
        spatial = {iv.name for iv in op.axis}
        if any(rel[1] in spatial for rel in stage.relations) or any(
                isinstance(st.attach, tuple) and st.attach[0] == stage.name for st in self.stages):
            raise ScheduleError(f"rfactor: stage {stage.name!r} has split/fused spatial loops or stages computed "
                                "at its loops; rfactor it first")
        ext = derived_extents(stage.relations, {iv.name: int(iv.extent) for iv in op.reduce_axis})
        touched = _connected(stage.relations, axis)
        factored = te.IterVar(axis, ext[axis], "spatial")
        rf_spatial = [te.IterVar(iv.name, iv.extent, "spatial") for iv in op.axis]
        untouched = [iv for iv in op.reduce_axis if iv.name not in touched]
        rf_reduce = [te.IterVar(iv.name, iv.extent, "reduce") for iv in untouched]
        rf_reduce += [te.IterVar(leaf, ext[leaf], "reduce") for leaf in stage.leaf if leaf in touched and leaf != axis]
        values: dict[str, te.Expr] = {iv.name: iv for iv in rf_reduce}
        values[axis] = factored
        conditions = []
        for rel in reversed(stage.relations):
            if rel[0] == "split" and rel[1] in touched:
                _, parent, outer, inner, _, _ = rel
                values[parent] = values[outer] * ext[inner] + values[inner]
                if ext[outer] * ext[inner] != ext[parent]:
                    conditions.append(values[parent] < ext[parent])
            elif rel[0] == "fuse" and rel[3] in touched:
                _, a, b, fused = rel
                values[a], values[b] = values[fused] // ext[b], values[fused] % ext[b]
        mapping = dict(zip(op.axis, rf_spatial, strict=True))
        mapping.update(zip(untouched, rf_reduce, strict=False))
        mapping.update({iv: values[iv.name] for iv in op.reduce_axis if iv.name in touched})
        source = te.substitute(op.body.source, mapping)
        if conditions:
            source = te.if_then_else(te.all(*conditions), source, op.body.identity())
        rf_body = te.Reduce(op.body.combiner, source, rf_reduce) if rf_reduce else source
        rf_name = f"{stage.name}.rf"
        rf_op = te.ComputeOp(rf_name, rf_spatial[:pos] + [factored] + rf_spatial[pos:], rf_body, op.tag, op.attrs)
        rf = te.Tensor([ax.extent for ax in rf_op.axis], stage.tensor.dtype, rf_name, rf_op)
        out_axes = [te.IterVar(iv.name, iv.extent, "spatial") for iv in op.axis]
        over = te.reduce_axis(ext[axis], f"{axis}.v")
        indices = out_axes[:pos] + [over] + out_axes[pos:]
        stage.op = te.ComputeOp(stage.name, out_axes, te.Reduce(op.body.combiner, rf[tuple(indices)], [over]),
                                op.tag, op.attrs)
        stage.relations, stage.annotations = [], {}
        stage._reset_axes()
        self.stages.insert(self.stages.index(stage), Stage(self, rf, rf_op))
        self.tensors[rf_name] = rf
        return rf

    def _tensor(self, name: str) -> te.Tensor:
        if name not in self.tensors:
            raise ScheduleError(f"no tensor named {name!r} (tensors: {sorted(self.tensors)})")
        return self.tensors[name]

    def _apply_cache_read(self, tensor: te.Tensor, step: dict) -> te.Tensor:
        readers = [self[name] for name in step["readers"]]
        if not readers:
            raise ScheduleError(f"cache_read of {tensor.name!r}: no reader stages given")
        for reader in readers:
            if all(load.tensor.name != tensor.name for load in _loads(reader.op.body)):
                raise ScheduleError(f"cache_read: stage {reader.name!r} does not read {tensor.name!r}")
        cache_name = f"{tensor.name}.{step['scope']}"
        if cache_name in self.tensors:
            raise ScheduleError(f"cache_read: a tensor named {cache_name!r} already exists")
        axes = [te.IterVar(f"ax{d}", n, "spatial") for d, n in enumerate(tensor.shape)]
        cache_op = te.ComputeOp(cache_name, axes, tensor[tuple(axes)], "cache_read")
        cache = te.Tensor(tensor.shape, tensor.dtype, cache_name, cache_op)

        def redirect(load: te.Load, indices: tuple) -> te.Expr:
            return te.Load(cache if load.tensor.name == tensor.name else load.tensor, indices)

        for reader in readers:
            op = reader.op
            reader.op = te.ComputeOp(op.name, op.axis, te.substitute(op.body, {}, redirect), op.tag, op.attrs)
        self.stages.insert(min(self.stages.index(r) for r in readers), Stage(self, cache, cache_op))
        self.tensors[cache_name] = cache
        return cache


def create_schedule(outputs: te.Tensor | Sequence[te.Tensor]) -> Schedule:
    """A fresh schedule (all stages at root, loops in definition order) for ``outputs``."""
    return Schedule([outputs] if isinstance(outputs, te.Tensor) else list(outputs))


def replay(steps: Sequence[dict], outputs: te.Tensor | Sequence[te.Tensor]) -> Schedule:
    """Rebuild a schedule from its serialized ``steps`` (see ``Schedule.steps``)."""
    s = create_schedule(outputs)
    for step in steps:
        s.apply(step)
    return s
