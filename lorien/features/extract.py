"""Phase-1 feature extraction: one record -> flat named features.

The built-in extractor reads what AutoTVM records carry themselves: the workload arguments
(tensors become ``in_i`` features: shape dims then dtype; everything else ``attr_i``) and the
config entity list (``sp_<knob>_<i>`` split factors, ``an_<knob>`` annotations,
``ot_<knob>`` other options, ``re_<knob>`` reorders). A dialect that implements
:meth:`lorien.dialect.Dialect.featurize` takes precedence for its own records, so other
dialects plug in without touching this module.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import orjson

from lorien.errors import DialectError, LorienError

#: Configs parsed into Python objects at once (bounds phase-1 memory).
PARSE_CHUNK = 8192

#: Features of one record, in column order (``thrpt`` is added by the pipeline).
Features = dict[str, Any]


class FeatureError(LorienError):
    """A record whose workload or config cannot be turned into features."""


def _flatten(value: Any, out: list[Any]) -> None:
    if isinstance(value, (list, tuple)):
        for item in value:
            _flatten(item, out)
    else:
        out.append(value)


def _scalar(value: Any) -> Any:
    """Features are numbers or strings; booleans count as numbers, None as the string 'None'."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return int(value)
    return value


def workload_features(args: list[Any]) -> Features:
    """``attr_i`` / ``in_i`` features of AutoTVM workload arguments."""
    attrs: list[Any] = []
    inputs: list[Any] = []
    for arg in args:
        if isinstance(arg, (list, tuple)) and arg and arg[0] == "TENSOR":
            _flatten(list(arg[1:]), inputs)
        else:
            _flatten(arg, attrs)
    features: Features = {f"attr_{i}": _scalar(v) for i, v in enumerate(attrs)}
    features.update({f"in_{i}": _scalar(v) for i, v in enumerate(inputs)})
    return features


def config_features(entity: list[Any]) -> Features:
    """``sp_``/``an_``/``ot_``/``re_`` features of an AutoTVM config entity list."""
    features: Features = {}
    for item in entity:
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            raise FeatureError(f"config entity item {item!r} is not [name, kind, value]")
        name, kind, value = item
        if kind == "sp":
            for i, factor in enumerate(value):
                features[f"sp_{name}_{i}"] = _scalar(factor)
        elif kind == "ot":
            features[f"ot_{name}"] = _scalar(value)
        elif kind == "an":
            features[f"an_{name}"] = ";".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
        elif kind == "re":
            features[f"re_{name}"] = ";".join(str(v) for v in value)
        else:
            raise FeatureError(f"config entity {name!r} has unknown kind {kind!r} (known: sp, ot, an, re)")
    return features


def entity_of(config: Any) -> list[Any]:
    """The entity list of an AutoTVM config (a dict with ``entity``, or the list itself)."""
    if isinstance(config, dict):
        if "entity" not in config:
            raise FeatureError(f"config has no 'entity' list: {str(config)[:120]}")
        return config["entity"]
    if isinstance(config, list):
        return config
    raise FeatureError(f"config is neither an entity list nor a dict: {str(config)[:120]}")


class BuiltinExtractor:
    """The default AutoTVM-style extractor, with a cache of workload features per args text.

    Records of one workload repeat the same args text, so the workload part is computed once.
    """

    def __init__(self) -> None:
        self._workload_cache: dict[str, Features] = {}

    def workload(self, args_json: str) -> Features:
        cached = self._workload_cache.get(args_json)
        if cached is None:
            try:
                args = orjson.loads(args_json)
            except orjson.JSONDecodeError as exc:
                raise FeatureError(f"workload args are not JSON: {args_json[:120]!r}") from exc
            if not isinstance(args, list):
                raise FeatureError(f"workload args are not a list: {args_json[:120]!r}")
            cached = workload_features(args)
            if len(self._workload_cache) > 100_000:
                self._workload_cache.clear()
            self._workload_cache[args_json] = cached
        return cached

    def config(self, config_json: str) -> Features:
        try:
            config = orjson.loads(config_json)
        except orjson.JSONDecodeError as exc:
            raise FeatureError(f"config is not JSON: {config_json[:120]!r}") from exc
        return config_features(entity_of(config))

    def __call__(self, args_json: str, config_json: str) -> Features:
        features = dict(self.workload(args_json))
        features.update(self.config(config_json))
        return features


def config_columns(configs: list[str]) -> tuple[list[tuple[list[int], dict[str, list[Any]]]], list[tuple[int, str]]]:
    """Column-wise config features of many AutoTVM configs (the fast path of phase 1).

    Rows with the same knob names share one column layout, computed once. Returns one
    ``(positions, columns)`` pair per layout and ``(position, reason)`` for every row that
    could not be featurized.
    """
    layouts: dict[tuple[str, ...], tuple[list[str], list[int], list[list[Any]]]] = {}
    failed: list[tuple[int, str]] = []
    for offset in range(0, len(configs), PARSE_CHUNK):
        _config_chunk(configs, offset, layouts, failed)
    groups = []
    for feature_names, positions, rows in layouts.values():
        transposed = list(zip(*rows, strict=True))
        groups.append((positions, {name: list(values) for name, values in zip(feature_names, transposed, strict=False)}))
    return groups, failed


def _parse_chunk(configs: list[str]) -> list[Any]:
    """Parse many JSON texts at once (one orjson call); one by one if some text is bad."""
    try:
        parsed = orjson.loads("[" + ",".join(configs) + "]")
        if len(parsed) == len(configs):
            return parsed
    except orjson.JSONDecodeError:
        pass
    parsed = []
    for text in configs:
        try:
            parsed.append(orjson.loads(text))
        except orjson.JSONDecodeError:
            parsed.append(None)
    return parsed


def _config_chunk(configs: list[str], offset: int, layouts: dict[tuple[str, ...], Any],
                  failed: list[tuple[int, str]]) -> None:
    """Featurize ``configs[offset:offset + PARSE_CHUNK]`` into ``layouts`` (parsed objects of
    only one chunk are alive at a time: they take far more memory than the values)."""
    parsed = _parse_chunk(configs[offset:offset + PARSE_CHUNK])
    for position, config in enumerate(parsed, offset):
        try:
            entity = config["entity"] if type(config) is dict else config
            names: list[str] | tuple[str, ...] = []
            values: list[Any] = []
            for name, kind, value in entity:
                names.append(name)
                if kind == "sp":
                    values.extend(value)
                elif kind == "ot":
                    values.append(value)
                elif kind == "an" or kind == "re":
                    values.append(";".join(map(str, value)) if isinstance(value, list) else str(value))
                else:
                    raise FeatureError(f"config entity {name!r} has unknown kind {kind!r} (known: sp, ot, an, re)")
            names = tuple(names)
            layout = layouts.get(names)
            if layout is None:
                layout = layouts[names] = (list(config_features(entity)), [], [])
            if len(values) != len(layout[0]):
                raise FeatureError(f"config {configs[position][:120]!r} has a knob layout unlike "
                                   f"other configs with knobs {list(names)}")
        except FeatureError as exc:
            failed.append((position, str(exc)))
            continue
        except (TypeError, ValueError, KeyError, IndexError):
            failed.append((position, f"config is not an AutoTVM entity list: {configs[position][:120]!r}"))
            continue
        layout[1].append(position)
        layout[2].append(values)


@cache
def dialect_extractor(dialect_name: str) -> Callable[[Any], Features] | None:
    """The dialect's ``featurize(record)`` if it provides one, else None.

    A dialect that does not override :meth:`Dialect.featurize`, or is not installed (or not
    yet complete: its entry point names no object), has none.
    """
    from lorien.dialect import Dialect, get_dialect

    try:
        dialect = get_dialect(dialect_name)
    except (DialectError, AttributeError):
        return None
    if type(dialect).featurize is Dialect.featurize:
        return None
    return dialect.featurize


def record_features(record: Any) -> Features:
    """The raw features featurization gives a record (without ``thrpt``): its dialect's (or
    the built-in AutoTVM ones), the target features of its target and build, and its knobs
    relative to them (:mod:`lorien.features.targets`)."""
    from lorien.features.targets import relative_knob_features, target_features

    extractor = dialect_extractor(record.dialect)
    if extractor is not None:
        features = dict(extractor(record))
        features.pop("thrpt", None)
    else:
        features = {**workload_features(orjson.loads(record.args)),
                    **config_features(entity_of(orjson.loads(record.config)))}
    features.update(target_features(record.target, record.build))
    return {**features, **relative_knob_features(features)}
