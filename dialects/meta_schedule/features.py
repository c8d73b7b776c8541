"""Phase-1 features of a MetaSchedule record, flat and named like the autotvm dialect's.

Tensor argument shapes become ``in_<i>``; each sampling decision of instruction ``k`` gives
``sp_<k>_<j>`` (a tile size list, e.g. SamplePerfectTile) or ``ot_<k>`` (a single choice,
e.g. SampleCategorical); ``n_<Instruction>`` counts the instructions of each kind;
``thrpt`` (GFLOPS, 0 when unknown) comes last.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dialects.meta_schedule.records import tensor_shapes, trace
from lorien.record import TuningRecord


def featurize(record: TuningRecord) -> dict[str, Any]:
    """Flat named features of one MetaSchedule record, ``thrpt`` last."""
    features: dict[str, Any] = {}
    position = 0
    for _, shape in tensor_shapes(record):
        for extent in shape:
            features[f"in_{position}"] = extent
            position += 1
    instructions, decisions = trace(record)
    for k in sorted(decisions):
        value = decisions[k]
        if isinstance(value, list):
            for j, factor in enumerate(value):
                features[f"sp_{k}_{j}"] = factor
        else:
            features[f"ot_{k}"] = value
    kinds = Counter(str(inst[0]) for inst in instructions if isinstance(inst, list) and inst)
    features.update({f"n_{kind}": count for kind, count in sorted(kinds.items())})
    gflops = record.gflops
    features["thrpt"] = round(gflops, 4) if gflops is not None else 0.0
    return features
