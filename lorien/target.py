"""Target strings: parse TVM's CLI form and JSON dict form into one canonical string.

A target such as ``llvm -keys=cpu -mcpu=core-avx2`` or ``{"kind": "llvm", "mcpu": "znver3"}``
becomes a :class:`Target` with a canonical string (kind first, then ``-key=value`` options
sorted by key, keys always present) and an alternate key (``llvm_cpu``, ``cuda_gpu``) that
groups targets of the same device family, Lorien's ``TargetIDKeys``.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from functools import lru_cache

from lorien.errors import TargetError

#: Target kinds Lorien knows, with TVM's default device keys.
DEFAULT_KEYS: dict[str, tuple[str, ...]] = {
    "llvm": ("cpu",),
    "c": ("cpu",),
    "cuda": ("cuda", "gpu"),
    "nvptx": ("cuda", "gpu"),
    "rocm": ("rocm", "gpu"),
    "opencl": ("opencl", "gpu"),
    "vulkan": ("vulkan", "gpu"),
    "metal": ("metal", "gpu"),
    "webgpu": ("webgpu", "gpu"),
    "hexagon": ("hexagon",),
    "ext_dev": ("ext_dev",),
    "hybrid": ("cpu",),
}

#: Longest alternate key (kind plus device keys) taken: stores name a directory after it.
MAX_ALTERNATE_KEY = 80
#: Options whose value is a list (comma separated on the CLI).
_LIST_OPTIONS = {"keys", "mattr", "libs"}
#: Options dropped from the canonical string when empty.
_DROP_IF_EMPTY = {"tag"}


@dataclass(frozen=True)
class Target:
    """A parsed compilation target."""

    kind: str
    options: dict[str, object] = field(default_factory=dict)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.options.get("keys", ()))  # type: ignore[arg-type]

    @property
    def canonical(self) -> str:
        """Kind followed by sorted ``-key=value`` options; list values joined by commas."""
        parts = [self.kind]
        for name in sorted(self.options):
            value = self.options[name]
            parts.append(f"-{name}={_format_value(value)}")
        return " ".join(parts)

    @property
    def alternate_key(self) -> str:
        """Kind plus device keys other than the kind itself: ``llvm_cpu``, ``cuda_gpu``."""
        extra = [key for key in self.keys if key != self.kind]
        return "_".join([self.kind, *extra])

    @property
    def is_gpu(self) -> bool:
        return "gpu" in self.keys

    def get(self, name: str, default: object = None) -> object:
        return self.options.get(name, default)

    def __str__(self) -> str:
        return self.canonical


def _format_value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(_format_value(item) for item in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _coerce_scalar(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _normalize(kind: str, options: dict[str, object], source: str) -> Target:
    if not kind or not isinstance(kind, str) or not kind.replace("_", "").isalnum():
        raise TargetError(f"unparseable target {source!r}: bad kind {kind!r}")
    if kind not in DEFAULT_KEYS:
        known = ", ".join(sorted(DEFAULT_KEYS))
        raise TargetError(f"unknown target kind {kind!r} in {source!r} (known kinds: {known})")
    normalized: dict[str, object] = {}
    for name, value in options.items():
        if name in _DROP_IF_EMPTY and value in ("", None):
            continue
        if name in _LIST_OPTIONS:
            if isinstance(value, str):
                value = [item for item in value.split(",") if item]
            value = tuple(str(item) for item in value)  # type: ignore[union-attr]
        elif isinstance(value, (list, tuple)):
            value = tuple(value)
        normalized[name] = value
    if "keys" not in normalized or not normalized["keys"]:
        keys = list(DEFAULT_KEYS[kind])
        device = normalized.get("device")
        if isinstance(device, str) and device not in keys:
            keys.insert(0, device)
        normalized["keys"] = tuple(keys)
    target = Target(kind, normalized)
    if len(target.alternate_key) > MAX_ALTERNATE_KEY:
        raise TargetError(f"target {source!r:.200}: its device keys make a family key of "
                          f"{len(target.alternate_key)} characters (at most {MAX_ALTERNATE_KEY})")
    return target


@lru_cache(maxsize=4096)
def parse_target(text: str) -> Target:
    """Parse a TVM CLI target string or a JSON dict string.

    Raises :class:`TargetError` naming the offending string when it cannot be parsed.
    """
    if not isinstance(text, str):
        raise TargetError(f"unparseable target {text!r}: expected a string")
    stripped = text.strip()
    if not stripped:
        raise TargetError("unparseable target '': empty string")
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise TargetError(f"unparseable target {text!r}: {exc}") from exc
        return parse_target_dict(data, source=text)
    try:
        tokens = shlex.split(stripped)
    except ValueError as exc:
        raise TargetError(f"unparseable target {text!r}: {exc}") from exc
    kind, options = tokens[0], {}
    for token in tokens[1:]:
        if not token.startswith("-"):
            raise TargetError(f"unparseable target {text!r}: option {token!r} does not start with '-'")
        name, sep, value = token.lstrip("-").partition("=")
        if not name:
            raise TargetError(f"unparseable target {text!r}: empty option name in {token!r}")
        options[name] = _coerce_scalar(value) if sep else True
    return _normalize(kind, options, text)


def parse_target_dict(data: object, source: str | None = None) -> Target:
    """Parse TVM's JSON dict form (``{"kind": "llvm", "mcpu": "znver3", ...}``)."""
    source = source if source is not None else json.dumps(data)
    if not isinstance(data, dict) or "kind" not in data:
        raise TargetError(f"unparseable target {source!r}: a JSON target needs a 'kind'")
    options = {name: value for name, value in data.items() if name not in ("kind", "host")}
    for name, value in options.items():
        if isinstance(value, dict):
            raise TargetError(f"unparseable target {source!r}: nested option {name!r} is not supported")
    return _normalize(str(data["kind"]), options, source)


def canonical_target(text: str) -> str:
    return parse_target(text).canonical


def alternate_key(text: str) -> str:
    return parse_target(text).alternate_key


def host_target() -> Target:
    """The target of this machine's CPU, as LLVM names it (e.g. ``llvm -mcpu=znver3``)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    cpu = llvm.get_host_cpu_name()
    return parse_target(f"llvm -mcpu={cpu}")


#: How a query target matches stored targets (see :func:`match_tier`).
MATCH_MODES = ("exact", "options", "family")


def match_mode(exact: bool = False, by_alternate_key: bool = False) -> str:
    """The match mode of a query's ``exact`` / ``by_alternate_key`` flags (at most one set)."""
    if exact and by_alternate_key:
        raise TargetError("a target query is either exact or by alternate key, not both")
    return "exact" if exact else "family" if by_alternate_key else "options"


@lru_cache(maxsize=65536)
def match_tier(query: str, stored: str, mode: str = "options") -> int | None:
    """How well a stored target answers a query target: lower is more specific, None is no match.

    ``options`` (the default): 0 for the query's own target, 1 for a stored target of the same
    family (kind and device keys: the alternate key) with the same value for every option the
    query names; ``llvm`` matches ``llvm -keys=cpu -mcpu=znver4``, ``llvm -mcpu=znver4``
    matches ``llvm -keys=cpu -mcpu=znver4 -num-cores=2``. ``exact``: the query's own target
    only. ``family``: every target of the family, all tier 0 (one pool, fastest first).
    """
    if mode not in MATCH_MODES:
        raise TargetError(f"unknown target match mode {mode!r} (known: {', '.join(MATCH_MODES)})")
    wanted = parse_target(query)
    try:
        found = parse_target(stored)
    except TargetError:  # a foreign spelling kept as logged matches only itself
        return 0 if stored == query else None
    if wanted.canonical == found.canonical:
        return 0
    if mode == "exact" or wanted.alternate_key != found.alternate_key:
        return None
    if mode == "family":
        return 0
    return 1 if all(found.options.get(name) == value for name, value in wanted.options.items()) else None
