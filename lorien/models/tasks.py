"""Tunable tasks found in models: the op shorthands of the ``lorien tune`` YAML, with weights.

A :class:`Task` is one op shorthand (``conv2d``, ``depthwise_conv2d``, ``dense``,
``batch_matmul``) with its parameters in canonical form, the number of times it occurs
(``weight``), the models it came from and the elementwise epilogues seen after it
(``bias``, ``add``, ``relu``, ``relu6``; a pattern such as ``bias+relu`` with its count).
Two occurrences with the same op and parameters are the same task whatever their epilogues:
the task is the anchor operator that a tuner schedules; the epilogue patterns stay recorded
for dialects that fuse them into their tasks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from lorien.errors import ConfigError
from lorien.workload import out_size, pad4

#: Per op: required integer fields and optional fields with their defaults.
OP_FIELDS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "conv2d": (("C", "H", "W", "K"),
               {"N": 1, "kernel": 3, "stride": 1, "padding": 0, "dilation": 1, "groups": 1, "dtype": "float32"}),
    "depthwise_conv2d": (("C", "H", "W"),
                         {"N": 1, "kernel": 3, "stride": 1, "padding": 0, "dilation": 1, "multiplier": 1,
                          "dtype": "float32"}),
    "dense": (("M", "N", "K"), {"dtype": "float32"}),
    "batch_matmul": (("B", "M", "N", "K"), {"dtype": "float32"}),
}
#: Fields holding a (height, width) pair, and the padding field (1, 2 or 4 values).
PAIR_FIELDS = ("kernel", "stride", "dilation")
#: Elementwise operators recognised after a tunable op, in the order they may appear.
EPILOGUE_PARTS = ("bias", "add", "relu", "relu6")
#: Keys of a workload entry that describe the task rather than its op (carried as they are).
TASK_KEYS = ("name", "weight", "models", "epilogue")


def _pair(value: Any, name: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    raise ConfigError(f"{name} must be an int or a pair of ints, got {value!r}")


def canonical_params(op: str, params: dict[str, Any]) -> dict[str, Any]:
    """Every field of ``op`` filled in: pairs as 2-tuples, padding as (top, left, bottom, right)."""
    if op not in OP_FIELDS:
        raise ConfigError(f"unknown op {op!r} (known: {', '.join(OP_FIELDS)})")
    required, optional = OP_FIELDS[op]
    unknown = set(params) - set(required) - set(optional)
    missing = [key for key in required if key not in params]
    if unknown or missing:
        raise ConfigError(f"{op}: missing {missing}, unknown {sorted(unknown)} "
                          f"(takes {list(required)} and optionally {sorted(optional)})")
    values = {**optional, **params}
    for key, value in values.items():
        if key in PAIR_FIELDS:
            values[key] = _pair(value, f"{op} {key}")
        elif key == "padding":
            try:
                values[key] = pad4(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{op} padding must be an int, a pair or four ints, got {value!r}") from exc
        elif key == "dtype":
            if not isinstance(value, str):
                raise ConfigError(f"{op} dtype must be a string such as 'float32', got {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{op} {key} must be an integer, got {value!r}")
    return values


def compact_params(op: str, values: dict[str, Any]) -> dict[str, Any]:
    """The YAML form of canonical parameters: square pairs as one int, defaults left out
    (``N``, ``kernel``, ``stride`` and ``padding`` of convolutions are always written)."""
    required, optional = OP_FIELDS[op]
    is_conv = op.endswith("conv2d")
    always = {"N", "kernel", "stride", "padding"} if is_conv else set()
    out: dict[str, Any] = {}
    for key in (("N",) if is_conv else ()) + required + tuple(optional):
        if key in out or key not in values:
            continue
        value = values[key]
        if key in PAIR_FIELDS:
            value = value[0] if value[0] == value[1] else list(value)
        elif key == "padding":
            top, left, bottom, right = value
            value = top if top == left == bottom == right else [top, left] if (top, left) == (bottom, right) \
                else list(value)
        if key in always or key in required or value != optional.get(key):
            out[key] = value
    return out


def output_hw(values: dict[str, Any]) -> tuple[int, int]:
    """Output height and width of a canonical convolution."""
    (kh, kw), (sh, sw), (dh, dw) = values["kernel"], values["stride"], values["dilation"]
    top, left, bottom, right = values["padding"]
    return (out_size(values["H"], kh, sh, top + bottom, dh), out_size(values["W"], kw, sw, left + right, dw))


def problems(op: str, values: dict[str, Any]) -> list[str]:
    """Why a canonical task cannot exist (non-positive sizes, empty output, groups that do
    not divide the channels); empty when it is valid."""
    found = []
    for key, value in values.items():
        if key == "padding":
            if min(value) < 0:
                found.append(f"padding {list(value)} is negative")
        elif key in PAIR_FIELDS:
            if min(value) < 1:
                found.append(f"{key} {list(value)} is not positive")
        elif key != "dtype" and value < 1:
            found.append(f"{key}={value} is not positive")
    if found or not op.endswith("conv2d"):
        return found
    oh, ow = output_hw(values)
    if oh < 1 or ow < 1:
        found.append(f"output {oh}x{ow} is empty (input {values['H']}x{values['W']}, "
                     f"kernel {list(values['kernel'])}, padding {list(values['padding'])})")
    groups = values.get("groups", 1)
    if op == "conv2d" and (values["C"] % groups or values["K"] % groups):
        found.append(f"groups={groups} does not divide C={values['C']} and K={values['K']}")
    return found


def task_flop(op: str, values: dict[str, Any]) -> float:
    """FLOPs of the task's main computation (its epilogues not counted), counted on its compute
    definition in the engine's DSL (:func:`lorien.engine.te.flop`); a grouped convolution
    counts as its per-group convolution over ``C / groups`` input channels."""
    return _dsl_flop(op, tuple(sorted(values.items())))


@lru_cache(maxsize=4096)
def _dsl_flop(op: str, items: tuple[tuple[str, Any], ...]) -> float:
    from lorien.engine import ops, te

    values = dict(items)
    if op == "dense":
        output = ops.dense(te.placeholder((values["M"], values["K"]), name="data"),
                           te.placeholder((values["N"], values["K"]), name="weight"))
    elif op == "batch_matmul":
        output = ops.batch_matmul(te.placeholder((values["B"], values["M"], values["K"]), name="x"),
                                  te.placeholder((values["B"], values["N"], values["K"]), name="y"))
    else:
        window = {"stride": values["stride"], "padding": values["padding"], "dilation": values["dilation"]}
        kh, kw = values["kernel"]
        if op == "depthwise_conv2d":
            data = te.placeholder((values["N"], values["C"], values["H"], values["W"]), name="data")
            kernel = te.placeholder((values["C"], values["multiplier"], kh, kw), name="kernel")
            output = ops.depthwise_conv2d_nchw(data, kernel, **window)
        else:
            channels = values["C"] // values["groups"]
            data = te.placeholder((values["N"], channels, values["H"], values["W"]), name="data")
            kernel = te.placeholder((values["K"], channels, kh, kw), name="kernel")
            output = ops.conv2d_nchw(data, kernel, **window)
    return te.flop([output])


@dataclass
class Task:
    """One tunable task: an op shorthand, how often it occurs, where it came from."""

    op: str
    params: dict[str, Any]
    weight: float = 1
    name: str = ""
    models: list[str] = field(default_factory=list)
    epilogues: Counter[str] = field(default_factory=Counter)
    #: Other keys of the workload entry it was read from (per-workload tuner, trials, ...).
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.params = canonical_params(self.op, self.params)

    @property
    def key(self) -> tuple[Any, ...]:
        """Identity: op and canonical parameters."""
        return (self.op, tuple(sorted(self.params.items())))

    @property
    def flop(self) -> float:
        return task_flop(self.op, self.params)

    def merge(self, other: Task) -> None:
        """Fold an occurrence of the same task in: weights and epilogue counts add, models unite."""
        self.weight += other.weight
        self.epilogues.update(other.epilogues)
        self.models.extend(model for model in other.models if model not in self.models)

    def to_entry(self) -> dict[str, Any]:
        """The ``lorien tune`` workload entry of this task."""
        entry: dict[str, Any] = {"name": self.name} if self.name else {}
        entry[self.op] = compact_params(self.op, self.params)
        if self.epilogues:
            entry["epilogue"] = dict(sorted(self.epilogues.items(), key=lambda item: (-item[1], item[0])))
        entry["weight"] = int(self.weight) if float(self.weight).is_integer() else self.weight
        if self.models:
            entry["models"] = list(self.models)
        entry.update(self.extra)
        return entry

    @classmethod
    def from_entry(cls, entry: Any, where: str) -> Task:
        """A task from a ``lorien tune`` workload entry written with an op shorthand."""
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: a workload is a mapping, got {entry!r:.80}")
        ops = [key for key in entry if key in OP_FIELDS]
        if len(ops) != 1:
            raise ConfigError(f"{where}: expected one op shorthand ({', '.join(OP_FIELDS)}), got keys {sorted(entry)}")
        op = ops[0]
        if not isinstance(entry[op], dict):
            raise ConfigError(f"{where}: '{op}' needs a mapping of parameters, got {entry[op]!r:.80}")
        weight = entry.get("weight", 1)
        check_weight(weight, where)
        epilogue = entry.get("epilogue") or {}
        check_epilogue(epilogue, where)
        models = entry.get("models") or []
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise ConfigError(f"{where}: 'models' must be a list of model names, got {models!r:.80}")
        extra = {k: v for k, v in entry.items() if k != op and k not in TASK_KEYS}
        try:
            return cls(op, dict(entry[op]), weight=weight, name=str(entry.get("name", "")), models=list(models),
                       epilogues=Counter(epilogue), extra=extra)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc


def check_weight(weight: Any, where: str) -> None:
    """A task weight is a positive number (occurrences in the models, or a priority)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
        raise ConfigError(f"{where}: 'weight' must be a positive number, got {weight!r}")


def check_epilogue(epilogue: Any, where: str) -> None:
    """An epilogue record maps patterns such as ``bias+relu`` to positive occurrence counts."""
    if not isinstance(epilogue, dict):
        raise ConfigError(f"{where}: 'epilogue' maps patterns such as bias+relu to counts, got {epilogue!r:.80}")
    for pattern, count in epilogue.items():
        parts = str(pattern).split("+")
        if not all(part in EPILOGUE_PARTS for part in parts):
            raise ConfigError(f"{where}: epilogue pattern {pattern!r} has parts outside {list(EPILOGUE_PARTS)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"{where}: epilogue {pattern!r} count must be a positive integer, got {count!r}")


def merge_tasks(tasks: Iterable[Task]) -> list[Task]:
    """Identical tasks folded into one (first occurrence's name and place kept)."""
    merged: dict[tuple[Any, ...], Task] = {}
    for task in tasks:
        if task.key in merged:
            merged[task.key].merge(task)
        else:
            merged[task.key] = Task(task.op, dict(task.params), task.weight, task.name, list(task.models),
                                    Counter(task.epilogues), dict(task.extra))
    return list(merged.values())


# ---------------------------------------------------------------- tasks from operator shapes

def conv_task(data: Sequence[int], kernel: Sequence[int], stride: Sequence[int], pads: Sequence[int],
              dilation: Sequence[int], groups: int, dtype: str) -> tuple[str, dict[str, Any]]:
    """The shorthand of a 2-d convolution on NCHW ``data`` with an OIHW ``kernel``: depthwise
    when every input channel is its own group, grouped conv2d otherwise."""
    n, c, h, w = data
    k, _, kh, kw = kernel
    common = {"N": n, "C": c, "H": h, "W": w, "kernel": (kh, kw), "stride": tuple(stride),
              "padding": tuple(pads), "dilation": tuple(dilation), "dtype": dtype}
    if groups == c and groups > 1 and k % c == 0:
        return "depthwise_conv2d", {**common, "multiplier": k // c}
    return "conv2d", {**common, "K": k, "groups": groups}


def matmul_task(a: Sequence[int], b: Sequence[int], dtype: str) -> tuple[str, dict[str, Any]]:
    """The shorthand of a matmul with NumPy semantics: a 2-d right operand is a dense layer
    over all leading rows of the left one; batched operands make a batch_matmul."""
    a, b = list(a), list(b)
    if len(a) == 1:
        a = [1, *a]
    if len(b) == 1:
        b = [*b, 1]
    if len(b) == 2:
        return "dense", {"M": math.prod(a[:-1]), "N": b[1], "K": a[-1], "dtype": dtype}
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + batch_a
    batch_b = [1] * (width - len(batch_b)) + batch_b
    batch = [max(x, y) for x, y in zip(batch_a, batch_b, strict=True)]
    return "batch_matmul", {"B": math.prod(batch), "M": a[-2], "N": b[-1], "K": a[-1], "dtype": dtype}


def same_pads(size: Sequence[int], kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
              upper: bool) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) of 'same' padding: output = ceil(input / stride); the odd
    pixel goes at the end (``upper``) or the start."""
    before, after = [], []
    for x, k, s, d in zip(size, kernel, stride, dilation, strict=True):
        total = max((math.ceil(x / s) - 1) * s + (k - 1) * d + 1 - x, 0)
        small, large = total // 2, total - total // 2
        before.append(small if upper else large)
        after.append(large if upper else small)
    return (before[0], before[1], after[0], after[1])


def channel_vector(const_shape: Sequence[int], out_shape: Sequence[int], axis: int) -> bool:
    """True when a constant of ``const_shape`` broadcasts along every axis of ``out_shape``
    but ``axis``, where it has the output's extent: a per-channel bias."""
    axis = axis % len(out_shape)
    if len(const_shape) > len(out_shape):
        return False
    aligned = [1] * (len(out_shape) - len(const_shape)) + list(const_shape)
    return all(d == 1 or (i == axis and d == out_shape[axis]) for i, d in enumerate(aligned))
