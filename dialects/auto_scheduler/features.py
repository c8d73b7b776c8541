"""Phase-1 features of an auto-scheduler record, flat and named like the autotvm dialect's.

Workload arguments become ``attr_<i>``; every split step ``k`` gives ``sp_<k>_<j>`` (its
factors), every pragma ``ot_<k>`` (e.g. the auto-unroll step), every annotation ``an_<k>``;
``n_<KIND>`` counts the steps of each kind; ``thrpt`` (GFLOPS, 0 when unknown) comes last.
"""

from __future__ import annotations

from typing import Any

from dialects.auto_scheduler.records import STEP_KINDS, steps, workload
from lorien.record import TuningRecord


def _flatten(values: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for value in values:
        if isinstance(value, list):
            flat.extend(_flatten(value))
        else:
            flat.append(value)
    return flat


def featurize(record: TuningRecord) -> dict[str, Any]:
    """Flat named features of one auto-scheduler record, ``thrpt`` last."""
    _, args = workload(record)
    features: dict[str, Any] = {f"attr_{i}": value for i, value in enumerate(_flatten(args))}
    counts = dict.fromkeys(STEP_KINDS, 0)
    for k, step in enumerate(steps(record)):
        kind = step[0]
        counts[kind] += 1
        if kind == "SP" and len(step) > 4:
            for j, factor in enumerate(step[4]):
                features[f"sp_{k}_{j}"] = factor
        elif kind == "PR" and len(step) > 3:
            pragma = str(step[3])
            features[f"ot_{k}"] = int(pragma.split("$", 1)[1]) if "$" in pragma and pragma.split("$", 1)[1].isdigit() else pragma
        elif kind == "AN" and len(step) > 3:
            features[f"an_{k}"] = step[3]
    features.update({f"n_{kind}": count for kind, count in counts.items()})
    gflops = record.gflops
    features["thrpt"] = round(gflops, 4) if gflops is not None else 0.0
    return features
