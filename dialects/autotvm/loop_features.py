"""Loop-nest features of a config: what the lowered kernel does, not which knobs made it.

The config is instantiated and lowered by the engine; the flat micro-op list is walked with
the trip count of every enclosing loop, giving trip-weighted counts of scalar and vector
loads, stores and arithmetic, the parallel extent, loop depth, code size (unrolling) and
local buffer sizes. Values are ``log2(1 + x)``. These are the "itervar"-style features the
XGBoost tuner can add to knob features.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dialects.autotvm.templates import Task

FEATURE_NAMES = (
    "uops", "loops", "max_depth", "parallel_extent", "innermost_extent",
    "scalar_loads", "vector_loads", "scalar_stores", "vector_stores",
    "scalar_alu", "vector_alu_lanes", "local_alloc", "global_alloc",
)


def program_features(program: Any) -> list[float]:
    """Trip-weighted counts of a lowered program (see :data:`FEATURE_NAMES`)."""
    counts = dict.fromkeys(FEATURE_NAMES, 0.0)
    trips = [1.0]
    parallel = 1.0
    counts["uops"] = len(program.uops)
    for uop in program.uops:
        op = uop.op
        if op == "LOOP":
            _name, extent, kind = uop.arg
            trips.append(trips[-1] * float(extent))
            counts["loops"] += 1
            counts["max_depth"] = max(counts["max_depth"], len(trips) - 1)
            counts["innermost_extent"] = float(extent)
            if kind == "parallel":
                parallel *= float(extent)
        elif op == "ENDLOOP":
            trips.pop()
        elif op == "LOAD":
            counts["vector_loads" if uop.lanes > 1 else "scalar_loads"] += trips[-1] * uop.lanes
        elif op == "STORE":
            counts["vector_stores" if uop.lanes > 1 else "scalar_stores"] += trips[-1] * uop.lanes
        elif op == "ALU" and uop.dtype.startswith("float"):
            counts["vector_alu_lanes" if uop.lanes > 1 else "scalar_alu"] += trips[-1] * uop.lanes
        elif op == "ALLOC":
            _name, size, scope = uop.arg
            counts["local_alloc" if scope == "local" else "global_alloc"] += float(size)
    counts["parallel_extent"] = parallel
    return [math.log2(1.0 + counts[name]) for name in FEATURE_NAMES]


class LoopFeatureFn:
    """``indices -> array`` of loop features of a task's configs, cached per index."""

    def __init__(self, task: Task):
        self.task = task
        self.cache: dict[int, list[float]] = {}

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        from lorien.engine.lower import lower

        rows = []
        for index in np.asarray(indices, dtype=np.int64).tolist():
            row = self.cache.get(index)
            if row is None:
                schedule, tensors = self.task.instantiate(self.task.config(index))
                row = self.cache[index] = program_features(lower(schedule, tensors))
            rows.append(row)
        return np.array(rows, dtype=float).reshape(len(rows), len(FEATURE_NAMES))
