"""Phase-1 features of AutoTVM records: workload arguments and knob values, flat and named.

Names follow Lorien's featurization: workload arguments are ``in_<i>`` (tensor shapes then
dtypes) and ``attr_<i>`` (everything else); split knobs are ``sp_<knob>_<i>``, annotations
``an_<knob>``, other options ``ot_<knob>``, reorders ``re_<knob>``. Features are numbers or
strings: booleans count as numbers, None as the string ``"None"``.

:func:`featurize` gives one record's features (``thrpt`` last); :func:`featurize_batch` gives
the same features of many records column-wise, several times faster: workload features once
per distinct args, configs parsed a chunk at a time and grouped by their knob names.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from lorien.errors import DialectError
from lorien.features.columns import feature_array, rows_to_columns
from lorien.record import TuningRecord

#: Configs parsed into Python objects at once (bounds phase-1 memory).
PARSE_CHUNK = 8192

Features = dict[str, Any]


def _flatten(value: Any, out: list[Any]) -> None:
    if isinstance(value, (list, tuple)):
        for item in value:
            _flatten(item, out)
    else:
        out.append(value)


def _scalar(value: Any) -> Any:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return int(value)
    return value


def workload_features(args: list[Any]) -> Features:
    """``in_<i>`` for the shape and dtype of every tensor argument, ``attr_<i>`` for the rest."""
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


def knob_features(entity: list[Any]) -> Features:
    """One feature per split factor, annotation, option and reorder of a config entity list."""
    features: Features = {}
    for item in entity:
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            raise DialectError(f"config entity item {item!r} is not [name, kind, value]")
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
            raise DialectError(f"config entity {name!r} has unknown kind {kind!r} (known: sp, ot, an, re)")
    return features


def entity_of(config: Any) -> list[Any]:
    """The entity list of an AutoTVM config (a dict with ``entity``, or the list itself)."""
    if isinstance(config, dict):
        if "entity" not in config:
            raise DialectError(f"config has no 'entity' list: {str(config)[:120]}")
        config = config["entity"]
    if isinstance(config, list):
        return config
    raise DialectError(f"config is neither an entity list nor a dict: {str(config)[:120]}")


def config_entity(config_json: str) -> list[Any]:
    """The entity list of a record's config text (the full AutoTVM config object or the bare list)."""
    try:
        config = orjson.loads(config_json)
    except orjson.JSONDecodeError as exc:
        raise DialectError(f"config is not JSON: {config_json[:120]!r}") from exc
    return entity_of(config)


@lru_cache(maxsize=100_000)
def _args_features(args_json: str) -> Features:
    """Workload features of an args text (records of one workload repeat it; callers copy)."""
    try:
        args = orjson.loads(args_json)
    except orjson.JSONDecodeError as exc:
        raise DialectError(f"workload args are not JSON: {args_json[:120]!r}") from exc
    if not isinstance(args, list):
        raise DialectError(f"workload args are not a list: {args_json[:120]!r}")
    return workload_features(args)


def featurize(record: TuningRecord) -> Features:
    """Flat named features of one AutoTVM record, ``thrpt`` (GFLOPS, 0 when unknown) last."""
    features = dict(_args_features(record.args))
    features.update(knob_features(config_entity(record.config)))
    gflops = record.gflops
    features["thrpt"] = round(gflops, 4) if gflops is not None else 0.0
    return features


# ---- column-wise: many records at once ---------------------------------------------------

FeatureGroups = list[tuple[list[int], dict[str, Any]]]


def featurize_batch(records: pa.Table) -> tuple[FeatureGroups, list[tuple[int, str]]]:
    """The features of :func:`featurize` (without ``thrpt``) of a table of records, as
    ``(positions, columns)`` groups and ``(position, reason)`` of every record not featurized."""
    encoded = pc.dictionary_encode(records["args"]).combine_chunks()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    workload_rows: list[Features] = []
    bad_workloads: dict[int, str] = {}
    for code, text in enumerate(encoded.dictionary.to_pylist()):
        try:
            workload_rows.append(_args_features(text))
        except DialectError as exc:
            workload_rows.append({})
            bad_workloads[code] = str(exc)
    workload_table = pa.table({name: feature_array(values) for name, values in rows_to_columns(workload_rows).items()})
    groups, failed = config_columns(records["config"].to_pylist())
    pieces: FeatureGroups = []
    for positions, columns in groups:
        position_array = np.asarray(positions, dtype=np.int64)
        if bad_workloads:
            good = np.array([codes[p] not in bad_workloads for p in positions], dtype=bool)
            failed.extend((int(p), bad_workloads[codes[p]]) for p in position_array[~good])
            position_array = position_array[good]
            columns = {name: [v for v, g in zip(values, good, strict=False) if g] for name, values in columns.items()}
        if position_array.size == 0:
            continue
        arrays: dict[str, Any] = {}
        if workload_table.num_columns:
            taken = workload_table.take(pa.array(codes[position_array]))
            arrays.update({name: taken[name] for name in taken.column_names})
        arrays.update({name: feature_array(values) for name, values in columns.items()})
        pieces.append((position_array.tolist(), arrays))
    return pieces, failed


def config_columns(configs: list[str]) -> tuple[list[tuple[list[int], dict[str, list[Any]]]], list[tuple[int, str]]]:
    """Column-wise knob features of many AutoTVM config texts.

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
                    raise DialectError(f"config entity {name!r} has unknown kind {kind!r} (known: sp, ot, an, re)")
            names = tuple(names)
            layout = layouts.get(names)
            if layout is None:
                layout = layouts[names] = (list(knob_features(entity)), [], [])
            if len(values) != len(layout[0]):
                raise DialectError(f"config {configs[position][:120]!r} has a knob layout unlike "
                                   f"other configs with knobs {list(names)}")
        except DialectError as exc:
            failed.append((position, str(exc)))
            continue
        except (TypeError, ValueError, KeyError, IndexError):
            failed.append((position, f"config is not an AutoTVM entity list: {configs[position][:120]!r}"))
            continue
        layout[1].append(position)
        layout[2].append(values)
