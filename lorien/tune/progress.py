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
    last_improvement: int = 0
    #: The native log each batch is appended to ("" when the dialect has none).
    log_path: str = ""
    #: How ``best_config`` is kept: the dialect's config as the summary shows it (JSON data).
    summarize: Callable[[Any], Any] = field(default=lambda config: config, repr=False)

    def count(self, configs: Sequence[Any], results: Sequence[Any], records: list[TuningRecord]) -> None:
        """Count one measured batch: its trials, its failures, the best config so far."""
        for config, result in zip(configs, results, strict=True):
            self.trials += 1
            cost = result_cost(result)
            if math.isinf(cost):
                self.errors += 1
            elif cost < self.best_cost_s:
                self.best_cost_s, self.best_config = cost, self.summarize(config)
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


def next_candidates(tuner: Any, space: Any, wanted: int, measured: dict[bytes, Any],
                    key_of: Callable[[Any], bytes]) -> tuple[list[int], list[Any]]:
    """Up to ``wanted`` points (with their configs, ``space.get(index)``) whose configs (by
    ``key_of``) were never measured. Points that give a config measured before (several points
    can) teach the tuner that config's result instead of being measured again."""
    indices: list[int] = []
    candidates: list[Any] = []
    keys: set[bytes] = set()
    while len(candidates) < wanted and tuner.has_next():
        proposed = tuner.next_batch(wanted - len(candidates))
        if not proposed:
            break
        known_indices, known_results = [], []
        for index in proposed:
            config = space.get(index)
            key = key_of(config)
            if key in measured:
                known_indices.append(index)
                known_results.append(measured[key])
            elif key not in keys:
                keys.add(key)
                indices.append(index)
                candidates.append(config)
        if known_indices:
            tuner.update(known_indices, known_results)
    return indices, candidates


def upcoming_configs(tuner: Any, space: Any, wanted: int, measured: dict[bytes, Any], proposed: set[bytes],
                     key_of: Callable[[Any], bytes]) -> list[Any]:
    """Configs of the points the tuner will propose next whatever the pending batch measures
    (:meth:`~lorien.search.base.Tuner.upcoming`), less those measured or proposed already."""
    if wanted <= 0:
        return []
    configs = [space.get(index) for index in tuner.upcoming(wanted)]
    return [config for config in configs if key_of(config) not in measured and key_of(config) not in proposed]


def finish_batch(tuner: Any, indices: list[int], configs: list[Any], results: list[Any],
                 records: list[TuningRecord], progress: TuneProgress, sink: BatchSink,
                 on_batch: BatchCallback | None, early_stopping: int | None) -> bool:
    """What follows a measured batch in every dialect's loop: its records go to ``sink``
    before the tuner learns its results, it is counted and handed to ``on_batch``. Returns
    whether tuning goes on (False once ``early_stopping`` trials brought nothing better)."""
    sink.write(records, progress)
    tuner.update(indices, results)
    progress.count(configs, results, records)
    if on_batch is not None:
        on_batch(progress, records)
    return not progress.stalled(early_stopping)


def tune_batches(tuner: Any, space: Any, progress: TuneProgress, measured: dict[bytes, Any], batch_size: int,
                 early_stopping: int | None, sink: BatchSink,
                 measure: Callable[[list[Any]], list[Any]],
                 to_records: Callable[[list[Any], list[Any]], list[TuningRecord]],
                 on_batch: BatchCallback | None, key_of: Callable[[Any], bytes], builds_ahead: bool = False,
                 build_costs: bool = False) -> None:
    """The batches of the tuning loop (:mod:`lorien.tune.loop`): propose a batch, ``measure``
    its configs, turn (configs, results) into records, write them to ``sink``, teach the
    tuner; until the budget is spent, the space exhausted or ``early_stopping`` trials bring
    nothing better. ``measured``: results by config key (``key_of``), never measured again.
    ``builds_ahead``: ``measure(configs, ahead)`` is also handed the configs the tuner will
    propose next whatever this batch measures (:meth:`~lorien.search.base.Tuner.upcoming`, up
    to the rest of the budget), to build them with this batch: the build workers then wait for
    the slowest build once for all of them, not once a batch. ``build_costs``: ``measure`` also
    takes ``build_costs=`` (the tuner's guess at each config's build time, where it has one:
    ``tuner.build_costs(indices)``), to start the longest builds first; the configs are measured
    in the tuner's order all the same."""
    try:
        while progress.trials < progress.total and tuner.has_next():
            indices, candidates = next_candidates(tuner, space, min(batch_size, progress.total - progress.trials),
                                                  measured, key_of)
            if not candidates:
                break
            ahead = upcoming_configs(tuner, space, progress.total - progress.trials - len(candidates), measured,
                                     {key_of(config) for config in candidates}, key_of) if builds_ahead else []
            costs = tuner.build_costs(indices) if build_costs and hasattr(tuner, "build_costs") else None
            options = {"build_costs": costs} if costs is not None else {}
            results = measure(candidates, ahead, **options) if ahead else measure(candidates, **options)
            measured.update((key_of(config), result) for config, result in zip(candidates, results, strict=True))
            if not finish_batch(tuner, indices, candidates, results, to_records(candidates, results), progress, sink,
                                on_batch, early_stopping):
                break
    finally:
        sink.close()
