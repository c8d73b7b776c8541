"""Schedules of the tuning systems replayed on the engine, and what replaying a log gave.

A dialect rebuilds an engine schedule from its own config (Ansor's steps, a MetaSchedule
trace) on a workload's compute DAG (:mod:`lorien.engine.dag`): a :class:`Replay`. Both
vocabularies carry TVM's ``auto_unroll_max_step`` pragma, applied by :func:`auto_unroll` as
TVM's UnrollLoop pass does. Replaying a whole log (every record built and its kernel checked
against NumPy) gives one :class:`ReplayOutcome` per record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lorien.engine import te
from lorien.engine.schedule import Schedule, Stage, leaf_extents


@dataclass
class Replay:
    """An engine schedule rebuilt from a dialect's config (Ansor steps, a MetaSchedule trace),
    its kernel arguments and notes."""

    schedule: Schedule
    args: list[te.Tensor]
    stage_names: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def packed(self) -> list[str]:
        """Arguments whose layout was rewritten (placeholders carrying a ``packing``)."""
        return [t.name for t in self.args if getattr(t.op, "packing", None) is not None]


@dataclass
class ReplayOutcome:
    """What replaying one log record here gave: ``ok``, ``unregistered`` (its workload is known
    to nobody here) or ``failed``."""

    path: str
    line: int
    workload_key: str
    status: str
    message: str = ""
    max_error: float | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        where = f"{Path(self.path).name}:{self.line}" + (f" {self.workload_key}" if self.workload_key else "")
        if self.status == "ok":
            extra = f"; {'; '.join(self.notes)}" if self.notes else ""
            return f"{where}: replayed, output matches NumPy (max abs error {self.max_error:.2g}){extra}"
        return f"{where}: {self.status}: {self.message}"


def auto_unroll(stage: Stage, axis: str, max_step: int) -> list[str]:
    """Apply ``auto_unroll_max_step`` at loop ``axis`` of a stage as TVM's UnrollLoop does:
    from the innermost loop outwards, a serial loop is unrolled while every loop inside it is
    and ``extent x statements in its body <= max_step`` (a vectorized innermost loop is one
    statement, extent-1 and already unrolled loops count as unrolled). The walk stops at a
    loop other stages are computed at and at the first reduce loop (which encloses the
    reduction's initialization). Extents are static (split factors), so a loop limited by a
    compute_at region counts at most its split extent. Returns the loops unrolled."""
    extents = leaf_extents(stage)
    attach_points = {st.attach[1] for st in stage.schedule.stages
                     if isinstance(st.attach, tuple) and st.attach[0] == stage.name}
    first_reduce = next((p for p, leaf in enumerate(stage.leaf) if stage.axes[leaf].kind == "reduce"), None)
    statements, unrolled = 1, []
    for position in range(len(stage.leaf) - 1, stage.leaf.index(axis) - 1, -1):
        leaf = stage.leaf[position]
        kind = stage.annotations.get(leaf, "serial")
        if leaf in attach_points or kind == "parallel" or (first_reduce is not None and position < first_reduce):
            break
        if kind == "vectorized" and position == len(stage.leaf) - 1:
            continue
        if kind == "unrolled" or extents[leaf] == 1:
            statements *= extents[leaf]
            continue
        if kind != "serial" or extents[leaf] * statements > max_step:
            break
        stage.unroll(leaf)
        statements *= extents[leaf]
        unrolled.append(leaf)
    return unrolled
