"""The registry of workload functions, with the API of TVM's ``tvm.auto_scheduler.workload_registry``.

It describes computations, not a tuning system: every dialect that tunes a compute DAG names
its workloads through it (one that speaks Ansor's vocabulary may re-export it under TVM's
names). The built-in workloads register when :mod:`lorien.builtin_workloads` is imported.

A workload is a function registered by name that returns its input and output tensors
(Lorien's compute DSL); its key is ``json.dumps([func_name, *args])``, exactly as an Ansor
log writes it::

    @register_workload
    def matmul_add(N, L, M, dtype):
        ...
        return [A, B, C, out]

    key = make_workload_key(matmul_add, (1024, 1024, 1024, "float32"))
    # '["matmul_add", 1024, 1024, 1024, "float32"]'
    tensors = workload_key_to_tensors(key)

Workloads extracted from a graph are keyed by a DAG hash instead,
``[hash, *shapes of the I/O tensors]``: :func:`register_workload_tensors` registers tensors
under such a key (Lorien's own hash from :meth:`ComputeDAG.workload_key`, or TVM's key of a
log, when you know which computation it hashes). A key nobody registered is never guessed:
:func:`workload_key_to_tensors` raises :class:`UnregisteredWorkloadError` naming it.

Entries serialize as plain data (a function by ``module:qualname``, tensors as the DAG's JSON),
so measurement workers and other processes rebuild them, and the registry saves to and loads
from a JSON file (:func:`save_workload_func_registry`, :func:`load_workload_func_registry`).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lorien.engine import te
from lorien.engine.dag import ComputeDAG
from lorien.errors import WorkloadError
from lorien.workload import json_workload_key

#: name -> function, or full hashed key -> tensors (TVM's ``WORKLOAD_FUNC_REGISTRY``).
WORKLOAD_FUNC_REGISTRY: dict[str, Callable[..., Sequence[te.Tensor]] | list[te.Tensor]] = {}
#: function name -> NumPy reference factory ``(*args) -> ((*inputs) -> outputs)``, where one exists.
REFERENCES: dict[str, Callable[..., Any]] = {}

_HASH = re.compile(r"[0-9a-f]{32}\Z")


class UnregisteredWorkloadError(WorkloadError):
    """A workload key whose function name or DAG hash nobody registered."""


def _func_name(func: str | Callable[..., Any]) -> str:
    return func if isinstance(func, str) else func.__name__


def register_workload(func_name: str | Callable[..., Any], f: Callable[..., Any] | None = None,
                      override: bool = False, reference: Callable[..., Any] | None = None):
    """Register a workload function by name; usable as ``@register_workload``,
    ``@register_workload("name")`` or ``register_workload("name", f)``.

    ``reference`` takes the workload's arguments and returns a NumPy function of its input
    arrays giving the expected outputs of measured kernels; without one the DAG is evaluated
    generically with NumPy (:meth:`ComputeDAG.evaluate`: exact, slower for large reductions).
    """
    if callable(func_name):
        return register_workload(func_name.__name__, func_name, override, reference)

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        if func_name in WORKLOAD_FUNC_REGISTRY and not override:
            if WORKLOAD_FUNC_REGISTRY[func_name] is function:
                return function
            raise WorkloadError(f"workload {func_name!r} is already registered (pass override=True to replace it)")
        WORKLOAD_FUNC_REGISTRY[func_name] = function
        if reference is not None:
            REFERENCES[func_name] = reference
        return function

    return register(f) if f is not None else register


def register_workload_tensors(workload_key: str, tensors: Sequence[te.Tensor]) -> str:
    """Register the I/O tensors of a DAG-hashed workload under its full key; returns the key."""
    parse_workload_key(workload_key)
    WORKLOAD_FUNC_REGISTRY[workload_key] = list(tensors)
    return workload_key


def serialize_args(args: Sequence[Any]) -> list[Any]:
    """Arguments as JSON data: tuples become lists; anything else must already be JSON."""
    def plain(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise WorkloadError(f"workload argument {value!r} ({type(value).__name__}) is not JSON data")
    return [plain(arg) for arg in args]


def make_workload_key(func: str | Callable[..., Any], args: Sequence[Any]) -> str:
    """``'["func_name", arg, ...]'`` of a registered function and its arguments."""
    name = _func_name(func)
    if name not in WORKLOAD_FUNC_REGISTRY:
        raise UnregisteredWorkloadError(f"workload function {name!r} is not registered "
                                        f"(registered: {', '.join(registered_names()) or 'none'})")
    return json_workload_key([name, *serialize_args(args)])


def parse_workload_key(workload_key: str) -> tuple[str, list[Any]]:
    """(name or hash, args) of a workload key; WorkloadError for anything else."""
    try:
        value = json.loads(workload_key)
    except (json.JSONDecodeError, TypeError) as exc:
        raise WorkloadError(f"workload key {workload_key!r:.200} is not JSON") from exc
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise WorkloadError(f"workload key {workload_key!r:.200} is not [func_name, args...]")
    return value[0], value[1:]


def is_hashed(name: str) -> bool:
    """Whether a key's first element is a DAG hash rather than a function name."""
    return bool(_HASH.match(name))


def registered_names() -> list[str]:
    return sorted(name for name, value in WORKLOAD_FUNC_REGISTRY.items() if callable(value))


def workload_key_to_tensors(workload_key: str) -> list[te.Tensor]:
    """The I/O tensors of a workload key (hashed keys by the whole key, functions by name)."""
    entry = WORKLOAD_FUNC_REGISTRY.get(workload_key)
    if entry is not None and not callable(entry):
        return list(entry)
    name, args = parse_workload_key(workload_key)
    function = WORKLOAD_FUNC_REGISTRY.get(name)
    if function is None or not callable(function):
        if is_hashed(name):
            raise UnregisteredWorkloadError(
                f"DAG-hashed workload {name} ({workload_key}) is not registered: Lorien cannot rebuild a "
                "computation from its hash; register its tensors with register_workload_tensors(key, tensors)")
        raise UnregisteredWorkloadError(f"workload function {name!r} is not registered "
                                        f"(registered: {', '.join(registered_names()) or 'none'})")
    try:
        tensors = list(function(*args))
    except (TypeError, ValueError, ArithmeticError, IndexError) as exc:
        raise WorkloadError(f"workload {workload_key}: {name}{tuple(args)} failed: "
                            f"{type(exc).__name__}: {exc}") from exc
    for tensor in tensors:
        if any(isinstance(dim, int) and dim <= 0 for dim in tensor.shape):
            raise WorkloadError(f"workload {workload_key}: {name}{tuple(args)} gives tensor {tensor.name} "
                                f"the shape {list(tensor.shape)}; every dimension must be positive")
    return tensors


def workload_dag(workload_key: str) -> ComputeDAG:
    """The ComputeDAG of a registered workload key."""
    return ComputeDAG(workload_key_to_tensors(workload_key))


def reference_of(workload_key: str) -> Callable[..., Any]:
    """NumPy function ``(*inputs) -> outputs`` of a workload: its registered reference, else
    the generic evaluation of its DAG."""
    name, args = parse_workload_key(workload_key)
    if workload_key not in WORKLOAD_FUNC_REGISTRY and name in REFERENCES:
        return REFERENCES[name](*args)
    return workload_dag(workload_key).evaluate


# ---------------------------------------------------------------- serialization

def _registry_name(workload_key: str) -> str:
    if workload_key in WORKLOAD_FUNC_REGISTRY:
        return workload_key
    name, _ = parse_workload_key(workload_key)
    if name not in WORKLOAD_FUNC_REGISTRY:
        raise UnregisteredWorkloadError(f"workload {workload_key!r} is not registered")
    return name


def _qualified(function: Any, what: str) -> str:
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        raise WorkloadError(f"{what} {function!r} cannot be serialized: register module-level functions "
                            "(not lambdas, closures or functions of __main__)")
    return f"{module}:{qualname}"


def serialize_workload_registry_entry(workload_key: str) -> tuple[str, dict[str, Any]]:
    """(registry name, plain-data entry) of a workload, for another process to register."""
    name = _registry_name(workload_key)
    value = WORKLOAD_FUNC_REGISTRY[name]
    entry: dict[str, Any] = ({"function": _qualified(value, f"workload function {name!r}")} if callable(value)
                             else {"dag": ComputeDAG(value).to_json()})
    if name in REFERENCES:
        entry["reference"] = _qualified(REFERENCES[name], f"reference of {name!r}")
    return name, entry


def _resolve(path: str) -> Any:
    module_name, _, qualname = path.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise WorkloadError(f"cannot import {path!r} named by a workload registry entry: {exc}") from exc
    return value


def deserialize_workload_registry_entry(data: tuple[str, dict[str, Any]] | list[Any]) -> None:
    """Register an entry written by :func:`serialize_workload_registry_entry` (if not already)."""
    name, entry = data
    if name in WORKLOAD_FUNC_REGISTRY:
        return
    reference = _resolve(entry["reference"]) if "reference" in entry else None
    if "function" in entry:
        register_workload(name, _resolve(entry["function"]), reference=reference)
    elif "dag" in entry:
        register_workload_tensors(name, ComputeDAG.from_json(entry["dag"]).io_tensors)
    else:
        raise WorkloadError(f"workload registry entry {name!r} has neither 'function' nor 'dag': {entry!r:.200}")


def save_workload_func_registry(filename: str | Path) -> int:
    """Write every registry entry to a JSON file; returns how many were written."""
    entries = dict(serialize_workload_registry_entry(name) for name in sorted(WORKLOAD_FUNC_REGISTRY))
    Path(filename).write_text(json.dumps(entries, indent=1, sort_keys=True))
    return len(entries)


def load_workload_func_registry(filename: str | Path) -> int:
    """Register the entries of a file written by :func:`save_workload_func_registry`."""
    path = Path(filename)
    try:
        entries = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"cannot read workload registry {path}: {exc}") from exc
    if not isinstance(entries, dict):
        raise WorkloadError(f"{path}: a workload registry file is a JSON object of entries")
    for name, entry in entries.items():
        deserialize_workload_registry_entry((name, entry))
    return len(entries)
