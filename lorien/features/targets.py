"""Target features: what a record's target and build fields say about the machine that ran it.

``tg_vector_lanes`` (float32 lanes of the widest vector register the code used), ``tg_cores``
(threads of its parallel loops) and the data cache sizes of one core (``tg_l1d_kb``,
``tg_l2_kb``, ``tg_l3_kb``) come from the record's ``build`` JSON where Lorien measured it, else
from its target string (``-mcpu`` gives the vector width, ``-num-cores`` the cores); what
neither says is NaN (the training mean after normalization). Split knobs are also described
relative to the target (:func:`relative_knob_features`: the innermost factor in vector
registers), so what one target teaches about tiles carries over to a target with other
vectors. With them one cost model ranks the configs of several targets, and a model trained
on one target transfers to another.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from lorien.errors import LorienError
from lorien.record import build_fields

#: Target feature columns, in order.
TARGET_FEATURES = ("tg_vector_lanes", "tg_cores", "tg_l1d_kb", "tg_l2_kb", "tg_l3_kb")
#: The build field each target feature is read from.
_BUILD_FIELDS = {"tg_vector_lanes": "vector_lanes", "tg_cores": "threads", "tg_l1d_kb": "l1d_kb",
                 "tg_l2_kb": "l2_kb", "tg_l3_kb": "l3_kb"}


_SPLIT_FACTOR = re.compile(r"sp_(.+)_(\d+)")


def relative_knob_features(features: Mapping[str, Any]) -> dict[str, Any]:
    """Split knobs relative to the target's vectors: for every split ``sp_<knob>_<i>``, its
    innermost factor in vector registers (``tr_<knob>_vectors`` = factor / tg_vector_lanes)
    and whether it fills whole registers (``tr_<knob>_whole``: 1 or 0). NaN where the vector
    width is unknown. Values are numbers or NumPy arrays (a column each), and so are the results.
    """
    innermost: dict[str, int] = {}
    for name in features:
        match = _SPLIT_FACTOR.fullmatch(name)
        if match:
            innermost[match[1]] = max(innermost.get(match[1], 0), int(match[2]))
    if not innermost:
        return {}
    lanes = np.asarray(features.get("tg_vector_lanes", math.nan), dtype=np.float64)
    relative: dict[str, Any] = {}
    for knob, position in innermost.items():
        try:
            factor = np.asarray(features[f"sp_{knob}_{position}"], dtype=np.float64)
        except (TypeError, ValueError):  # a knob whose values are not numbers
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            vectors = factor / lanes
            whole = np.where(np.isfinite(vectors), np.mod(factor, lanes) == 0, math.nan)
        relative[f"tr_{knob}_vectors"] = vectors if vectors.ndim else float(vectors)
        relative[f"tr_{knob}_whole"] = whole if whole.ndim else float(whole)
    return relative


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


@functools.lru_cache(maxsize=4096)
def target_features(target: str, build: str = "") -> dict[str, float]:
    """Target features of a record from its target string and build JSON (NaN: unknown)."""
    fields = build_fields(build)
    features = {name: _number(fields.get(field)) for name, field in _BUILD_FIELDS.items()}
    if math.isnan(features["tg_vector_lanes"]) or math.isnan(features["tg_cores"]):
        from_target = _from_target_string(target)
        for name, value in from_target.items():
            if math.isnan(features[name]):
                features[name] = value
    return features


def _from_target_string(target: str) -> dict[str, float]:
    """Vector width from ``-mcpu`` and cores from ``-num-cores`` of a CPU target (else NaN)."""
    from lorien.target import parse_target

    try:
        parsed = parse_target(target)
    except LorienError:
        return {}
    found = {"tg_cores": _number(parsed.get("num-cores"))}
    if parsed.get("mcpu") is not None:
        from lorien.engine.cpu import cpu_target

        try:
            found["tg_vector_lanes"] = float(cpu_target(parsed).lanes)
        except LorienError:  # not a CPU target, another architecture, a CPU LLVM does not know
            pass
    return found


def local_target_features(target: str | None) -> dict[str, float]:
    """The target features records measured on this machine for ``target`` carry (what a
    proposal for ``target`` is scored with); for a target the CPU engine does not build, what
    its target string says."""
    from lorien.engine.cpu import CPU_KINDS, cpu_target
    from lorien.target import parse_target

    if target is not None and parse_target(target).kind not in CPU_KINDS:
        return target_features(target, "")
    return target_features(target or "llvm", cpu_target(target).build_json())
