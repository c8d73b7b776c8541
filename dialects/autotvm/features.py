"""Phase-1 features of an AutoTVM record: workload arguments and knob values, flat and named.

Names follow Lorien's featurization: scalar workload attributes are ``attr_<i>``, tensor
shapes and dtypes ``in_<i>``, split knobs ``sp_<knob>_<i>``, annotations ``an_<knob>``,
other options ``ot_<knob>``, reorders ``re_<knob>``; the throughput ``thrpt`` (GFLOPS, 0 for
failed records) comes last.
"""

from __future__ import annotations

from typing import Any

import orjson

from lorien.errors import DialectError
from lorien.record import TuningRecord


def config_entity(config_json: str) -> list[list[Any]]:
    """The entity list of a record's config (the full AutoTVM config object or the bare list)."""
    value = orjson.loads(config_json)
    if isinstance(value, dict):
        value = value.get("entity")
    if not isinstance(value, list):
        raise DialectError(f"AutoTVM config has no entity list: {config_json[:200]}")
    return value


def workload_features(args: list[Any]) -> dict[str, Any]:
    """``in_<i>`` for the shape and dtype of every tensor argument, ``attr_<i>`` for the rest."""
    features: dict[str, Any] = {}
    counters = {"attr": 0, "in": 0}

    def add(value: Any, prefix: str) -> None:
        if isinstance(value, (list, tuple)):
            for item in value:
                add(item, prefix)
            return
        features[f"{prefix}_{counters[prefix]}"] = value
        counters[prefix] += 1

    for arg in args:
        if isinstance(arg, (list, tuple)) and arg and arg[0] == "TENSOR":
            add(list(arg[1:]), "in")
        else:
            add(arg, "attr")
    return features


def knob_features(entity: list[list[Any]]) -> dict[str, Any]:
    """One feature per split factor, annotation, option and reorder of a config."""
    features: dict[str, Any] = {}
    for item in entity:
        if len(item) != 3:
            raise DialectError(f"malformed AutoTVM entity {item!r}: expected [name, kind, value]")
        name, kind, value = item
        if kind == "sp":
            for i, factor in enumerate(value):
                features[f"sp_{name}_{i}"] = factor
        elif kind == "an":
            features[f"an_{name}"] = ";".join(str(v) for v in value) if isinstance(value, list) else str(value)
        elif kind == "ot":
            features[f"ot_{name}"] = value
        elif kind == "re":
            features[f"re_{name}"] = ";".join(str(v) for v in value)
        else:
            raise DialectError(f"unknown AutoTVM entity kind {kind!r} in knob {name!r}")
    return features


def featurize(record: TuningRecord) -> dict[str, Any]:
    """Flat named features of one AutoTVM record, ``thrpt`` (GFLOPS) last."""
    args = orjson.loads(record.args)
    if not isinstance(args, list):
        raise DialectError(f"record {record.record_id}: args are not a list: {record.args[:200]}")
    features = workload_features(args)
    features.update(knob_features(config_entity(record.config)))
    gflops = record.gflops
    features["thrpt"] = round(gflops, 4) if gflops is not None else 0.0
    return features
