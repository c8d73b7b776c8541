"""What a dialect's tuning run reports after every measured batch."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lorien.record import TuningRecord


@dataclass
class TuneProgress:
    """What a tuning run has done so far (handed to the per-batch callback).

    ``best_config`` is the dialect's config of the fastest candidate (an AutoTVM config
    entity, a list of Ansor steps, ...). ``trials`` counts the ``resumed`` ones: measurements
    of earlier attempts of the job replayed into the tuner, not measured again.
    """

    total: int
    trials: int = 0
    resumed: int = 0
    errors: int = 0
    best_cost_s: float = math.inf
    best_config: Any = None
    committed: int = 0
    records: list[TuningRecord] = field(default_factory=list)


BatchCallback = Callable[[TuneProgress, list[TuningRecord]], None]
