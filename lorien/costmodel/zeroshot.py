"""Zero-shot proposals: schedules for a workload nobody has tuned, chosen by a cost model.

Sample the dialect's config space of the workload, score every sample with the model, keep
the best ``topk``. Optionally measure them on the engine and commit the measurements to the
warehouse with ``source = "model:<model name>"`` so they are told apart from tuned records.

The dialect supplies the space, the features of its configs and the measurement: its
:meth:`lorien.dialect.Dialect.proposal_space` (see :mod:`lorien.costmodel.spaces`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lorien.costmodel.bundle import CostModel, space_features
from lorien.costmodel.spaces import ProposalSpace, proposal_space
from lorien.errors import LorienError
from lorien.record import TuningRecord


@dataclass
class Proposal:
    """One proposed config: its rank, model score and (after measuring) its throughput."""

    rank: int
    score: float
    entity: list[Any]
    index: int | None = None
    gflops: float | None = None
    error_no: int | None = None
    record: TuningRecord | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "score": self.score, "index": self.index, "config": self.entity,
                "gflops": self.gflops, "error_no": self.error_no}


def sample_indices(space_size: int, samples: int, seed: int = 0) -> np.ndarray:
    """Every index of a small space, else ``samples`` distinct random indices."""
    if space_size <= 0:
        raise LorienError("the config space is empty")
    if space_size <= samples:
        return np.arange(space_size)
    rng = np.random.default_rng(seed)
    if space_size < 10 * samples:
        return np.sort(rng.choice(space_size, size=samples, replace=False))
    chosen: set[int] = set()
    while len(chosen) < samples:
        chosen.update(int(i) for i in rng.integers(0, space_size, size=samples - len(chosen)))
    return np.array(sorted(chosen))


def propose(model: CostModel, workload_key: str | None = None, task_name: str | None = None,
            args: Sequence[Any] | None = None, topk: int = 5, samples: int = 16384, seed: int = 0,
            dialect: str | None = None, diverse: bool = True, target: str | None = None,
            space: ProposalSpace | None = None) -> list[Proposal]:
    """The ``topk`` configs the model scores best for ``target`` (default this host) among
    ``samples`` sampled from the workload's proposal space (``diverse``: with different
    innermost tiles, see :func:`diverse_top`); ``dialect`` as for
    :func:`lorien.costmodel.spaces.proposal_space`."""
    space = space or proposal_space(workload_key, task_name, args, dialect)
    model.template(space.task_name)  # fail early, naming the trained templates
    indices = sample_indices(len(space), samples, seed)
    configs = [space.config(int(i)) for i in indices]
    rows = space_features(space, configs, target)
    scores = model.score_features(space.task_name, rows)
    order = np.argsort(-scores, kind="stable")
    chosen = diverse_top(order, rows, topk) if diverse else list(order[:topk])
    return [Proposal(rank=rank + 1, score=float(scores[i]), entity=configs[i], index=int(indices[i]))
            for rank, i in enumerate(chosen)]


def _inner_tile(features: dict[str, Any]) -> tuple[Any, ...]:
    """The innermost factor of every split of a config (its register/vector tile): the
    ``sp_<knob>_<i>`` feature of the largest ``i`` of each knob."""
    inner: dict[str, tuple[int, Any]] = {}
    for name, value in features.items():
        if name.startswith("sp_"):
            knob, _, position = name[3:].rpartition("_")
            if position.isdigit() and int(position) >= inner.get(knob, (-1, None))[0]:
                inner[knob] = (int(position), value)
    return tuple(value for _, value in inner.values())


def diverse_top(order: np.ndarray, features: list[dict[str, Any]], topk: int) -> list[int]:
    """The ``topk`` best (``order`` is best first) of configs given by their raw features,
    skipping a config whose innermost split factors repeat those of one already chosen, so
    the proposals try different tiles; the best skipped ones fill up when too few differ."""
    chosen: list[int] = []
    skipped: list[int] = []
    tiles: set[tuple[Any, ...]] = set()
    for i in order:
        tile = _inner_tile(features[i])
        if tile in tiles:
            if len(skipped) < topk:
                skipped.append(int(i))
            continue
        tiles.add(tile)
        chosen.append(int(i))
        if len(chosen) == topk:
            return chosen
    return chosen + skipped[: topk - len(chosen)]


def measure_proposals(proposals: list[Proposal], model_name: str, task_name: str, args: Sequence[Any],
                      target: str = "llvm", store_uri: str | None = None, measure: dict[str, Any] | None = None,
                      dialect: str | None = None, commit: bool = True,
                      space: ProposalSpace | None = None) -> list[TuningRecord]:
    """Measure proposals on the engine; commit the records (``source = "model:<name>"``)."""
    from lorien.target import parse_target

    space = space or proposal_space(task_name=task_name, args=args, dialect=dialect)
    canonical = parse_target(target).canonical
    records = space.measure([p.entity for p in proposals], canonical, measure, source=f"model:{model_name}")
    for proposal, record in zip(proposals, records, strict=True):
        proposal.record = record
        proposal.gflops = record.gflops
        proposal.error_no = record.error_no
    if commit:
        from lorien.warehouse import open_store

        with open_store(store_uri) as store:
            store.commit(records)
    return records


@dataclass
class ZeroShotResult:
    """Proposals of one query, and how long proposing and measuring took."""

    task_name: str
    args: list[Any]
    target: str
    model: str
    proposals: list[Proposal]
    propose_s: float
    measure_s: float = 0.0
    committed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"task_name": self.task_name, "args": self.args, "target": self.target, "model": self.model,
                "propose_s": self.propose_s, "measure_s": self.measure_s, "committed": self.committed,
                "proposals": [p.to_dict() for p in self.proposals]}


def zero_shot(model: CostModel | str, workload_key: str | None = None, target: str = "llvm",
              task_name: str | None = None, args: Sequence[Any] | None = None, topk: int = 5,
              measure_top: int = 0, samples: int = 16384, store_uri: str | None = None,
              measure: dict[str, Any] | None = None, seed: int = 0, dialect: str | None = None) -> ZeroShotResult:
    """Propose ``topk`` configs; measure and commit the best ``measure_top`` of them."""
    if not isinstance(model, CostModel):
        model = CostModel.load(model)
    started = time.perf_counter()
    space = proposal_space(workload_key, task_name, args, dialect)
    proposals = propose(model, task_name=space.task_name, args=space.args, topk=max(topk, measure_top),
                        samples=samples, seed=seed, target=target, space=space)
    result = ZeroShotResult(space.task_name, list(space.args), target, model.name, proposals,
                            propose_s=time.perf_counter() - started)
    if measure_top > 0:
        started = time.perf_counter()
        records = measure_proposals(proposals[:measure_top], model.name, space.task_name, space.args, target=target,
                                    store_uri=store_uri, measure=measure, space=space)
        result.measure_s = time.perf_counter() - started
        result.committed = len(records)
    return result


def format_result(result: ZeroShotResult) -> str:
    """A readable table of proposals."""
    lines = [f"zero-shot proposals of model {result.model!r} for {result.task_name} on {result.target} "
             f"({result.propose_s:.2f}s to propose"
             + (f", {result.measure_s:.2f}s to measure, {result.committed} committed)" if result.committed else ")")]
    for proposal in result.proposals:
        measured = ""
        if proposal.error_no is not None:
            measured = f"  {proposal.gflops:.2f} GFLOPS" if proposal.gflops is not None else \
                f"  failed (error_no {proposal.error_no})"
        lines.append(f"  #{proposal.rank} score={proposal.score:.4f} index={proposal.index}{measured}  "
                     f"{proposal.entity}")
    return "\n".join(lines)


def run_predict_query(args: Any) -> int:
    """``lorien query --predict``: print (and with ``--measure K`` measure and commit) proposals."""
    import json

    if not args.model:
        raise LorienError("--predict needs --model DIR (a model written by `lorien train`)")
    result = zero_shot(args.model, workload_key=args.workload_key, target=args.target, topk=args.topk,
                       measure_top=args.measure, store_uri=args.store)
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_result(result))
    return 0


def warm_start_tuner(tuner: Any, model: CostModel | str, task_name: str, args: Sequence[Any],
                     samples: int = 512, seed: int = 0, target: str | None = None) -> int:
    """Prime a model-based tuner with the cost model's view of its space on ``target``.

    Scores ``samples`` configs of ``tuner.space`` with the model and hands them, scaled to
    [0, 1], to ``tuner.load_history(features, scores)`` in the tuner's own feature space
    (``tuner.feature_fn(indices)``), so its first plan already favours what the model
    predicts fast; history the tuner already holds (transfer records) is kept. Returns the
    number of configs scored.
    """
    if not isinstance(model, CostModel):
        model = CostModel.load(model)
    space = tuner.space
    indices = sample_indices(len(space), samples, seed)
    scores = model.score_configs(task_name, args, [space.get(int(i)).to_json_entity() for i in indices], target)
    spread = float(np.ptp(scores)) if scores.size else 0.0
    scaled = (scores - scores.min()) / spread if spread > 0 else np.ones_like(scores)
    features = tuner.feature_fn(indices)
    prior_x, prior_y = getattr(tuner, "history_x", None), getattr(tuner, "history_y", None)
    if prior_x is not None and prior_y is not None and prior_x.shape[1:] == features.shape[1:]:
        features, scaled = np.concatenate([prior_x, features]), np.concatenate([prior_y, scaled])
    tuner.load_history(features, scaled)
    return int(indices.size)
