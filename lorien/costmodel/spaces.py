"""The config space zero-shot proposal works in, asked of the dialect that declares one
(:meth:`lorien.dialect.Dialect.proposal_space`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from lorien.errors import DialectError, LorienError, WorkloadError
from lorien.record import TuningRecord


class ProposalSpace(Protocol):
    """A workload's config space as a dialect hands it to zero-shot proposal."""

    task_name: str
    args: list[Any]

    def __len__(self) -> int: ...

    def config(self, index: int) -> Any: ...

    def features(self, configs: Sequence[Any]) -> list[dict[str, Any]]: ...

    def measure(self, configs: Sequence[Any], target: str, measure: dict[str, Any] | None = None,
                source: str = "lorien tune") -> list[TuningRecord]: ...


def proposal_space(workload_key: str | None = None, task_name: str | None = None,
                   args: Sequence[Any] | None = None, dialect: str | None = None) -> ProposalSpace:
    """The proposal space of a workload, given by its key or by ``task_name`` and ``args``.

    ``dialect`` names the dialect; without it, a key's dialect is told by its form and
    ``task_name``/``args`` go to the first installed dialect that declares proposal spaces
    and knows the workload.
    """
    from lorien.dialect import Dialect, available_dialects, dialect_of_workload_key, get_dialect

    if workload_key:
        return get_dialect(dialect or dialect_of_workload_key(workload_key)).proposal_space(workload_key)
    if task_name is None or args is None:
        raise LorienError("give a workload key or task_name and args")
    if dialect:
        plugin = get_dialect(dialect)
        return plugin.proposal_space(plugin.workload_key(task_name, list(args)))
    candidates = [plugin for plugin in map(get_dialect, available_dialects())
                  if type(plugin).proposal_space is not Dialect.proposal_space]
    reasons = []
    for plugin in candidates:
        try:
            return plugin.proposal_space(plugin.workload_key(task_name, list(args)))
        except (DialectError, WorkloadError) as exc:
            reasons.append(f"{plugin.name}: {exc}")
    raise LorienError(f"no dialect proposes configs for {task_name} {list(args)} "
                      f"({'; '.join(reasons) or 'none declares proposal spaces'})")
