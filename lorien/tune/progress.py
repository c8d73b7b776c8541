"""What a dialect's tuning run reports after every measured batch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorien.record import TuningRecord
from lorien.search.base import result_cost


@dataclass
class TuneProgress:
    """What a tuning run has done so far (handed to the per-batch callback).

    ``best_config`` is the dialect's config of the fastest candidate (an AutoTVM config
    entity, a list of Ansor steps, ...).
    """

    total: int
    trials: int = 0
    errors: int = 0
    best_cost_s: float = math.inf
    best_config: Any = None
    committed: int = 0
    records: list[TuningRecord] = field(default_factory=list)
    last_improvement: int = 0

    def count(self, configs: Sequence[Any], results: Sequence[Any], records: list[TuningRecord]) -> None:
        """Count one measured batch: its trials, its failures, the best config so far."""
        for config, result in zip(configs, results, strict=True):
            self.trials += 1
            cost = result_cost(result)
            if math.isinf(cost):
                self.errors += 1
            elif cost < self.best_cost_s:
                self.best_cost_s, self.best_config = cost, config
                self.last_improvement = self.trials
        self.records.extend(records)

    def stalled(self, early_stopping: int | None) -> bool:
        """Whether ``early_stopping`` trials went by without a better config."""
        return bool(early_stopping) and self.trials - self.last_improvement >= early_stopping


class BatchSink:
    """Where each measured batch goes before the next one starts: a commit to the store (if
    any) and the batch's lines appended to a native log (if any)."""

    def __init__(self, store: Any, nbest: int | None, log_path: str | Path | None,
                 encode: Callable[[TuningRecord], str]):
        self.store, self.nbest, self.encode = store, nbest, encode
        self.log_file = None
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            self.log_file = open(log_path, "a")  # noqa: SIM115 - closed by close()

    def write(self, records: list[TuningRecord], progress: TuneProgress) -> None:
        if self.store is not None:
            self.store.commit(records, nbest=self.nbest)
            progress.committed += len(records)
        if self.log_file is not None:
            self.log_file.write("".join(self.encode(record) + "\n" for record in records))
            self.log_file.flush()

    def close(self) -> None:
        if self.log_file is not None:
            self.log_file.close()


BatchCallback = Callable[[TuneProgress, list[TuningRecord]], None]
