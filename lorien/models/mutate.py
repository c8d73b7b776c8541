"""``lorien mutate``: grow a task list into a training set with YAML rules.

Rules file (every key optional but ``rules``)::

    seed: 0                       # --seed overrides
    keep_originals: true          # the input tasks come first in the output (default true)
    rules:
      - op: conv2d                # tasks of this op (default: every task)
        vary:                     # per field, one of:
          N: [1, 4, 8]            #   a list of values
          H: {range: [7, 56], step: 7}      # start..stop inclusive, by step (default 1)
          C: {scale: [0.5, 2]}    #   factors of the task's own value (rounded, at least 1)
          W: {same_as: H}         #   the value another field got
        samples: 8                # per task: draw this many of the combinations (default: all)
    filters:                      # a mutant must pass every filter that applies to its op
      - {field: C, multiple_of: 8}
      - {field: gflop, max: 2}    # derived fields: gflop, and OH / OW of convolutions
      - {op: dense, field: M, in: [1, 16, 64]}

Each rule is applied to every input task of its op: the cartesian product of the fields'
candidate values gives the mutants (or ``samples`` of them, drawn with a generator seeded by
the seed, the rule and the task, so the output is the same on every run). Mutants that cannot
exist (an empty convolution output, groups that do not divide the channels, a size below 1)
are dropped, then those a filter rejects, then duplicates of a task already in the output.
A mutant keeps its origin's models and most frequent epilogue pattern and gets weight 1.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lorien.errors import ConfigError
from lorien.models.tasks import OP_FIELDS, PAIR_FIELDS, Task, canonical_params, output_hw, problems

RULES_KEYS = {"seed", "keep_originals", "rules", "filters"}
RULE_KEYS = {"op", "vary", "samples"}
FILTER_TESTS = {"min", "max", "multiple_of", "in"}
DERIVED_FIELDS = {"gflop", "OH", "OW"}


@dataclass
class Rules:
    """A parsed rules file."""

    rules: list[dict[str, Any]]
    filters: list[dict[str, Any]] = field(default_factory=list)
    seed: int = 0
    keep_originals: bool = True


@dataclass
class MutationReport:
    """What mutation made: counts of mutants generated and of those each check dropped."""

    originals: int = 0
    generated: int = 0
    invalid: Counter[str] = field(default_factory=Counter)
    filtered: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    tasks: list[Task] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain data (``--json``)."""
        return {"input_tasks": self.originals, "generated": self.generated, "invalid": dict(self.invalid),
                "filtered": dict(self.filtered), "duplicates": self.duplicates, "tasks": len(self.tasks)}

    def summary(self) -> str:
        lines = [f"{self.originals} input tasks, {self.generated} mutants generated; dropped "
                 f"{sum(self.invalid.values())} invalid, {sum(self.filtered.values())} filtered, "
                 f"{self.duplicates} duplicates; {len(self.tasks)} tasks written"]
        lines += [f"  invalid: {reason} x{count}" for reason, count in self.invalid.most_common(5)]
        if len(self.invalid) > 5:
            lines.append(f"  invalid: {len(self.invalid) - 5} other reasons")
        lines += [f"  filter {name}: dropped {count}" for name, count in self.filtered.most_common()]
        return "\n".join(lines)


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def _read_yaml(path: Path, what: str) -> Any:
    """A YAML document read with the safe loader; errors name the file."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc


def load_rules(path: str | Path) -> Rules:
    """Read and check a rules file; errors name the file and the rule or filter."""
    return parse_rules(_read_yaml(Path(path), "mutation rules"), str(path))


def parse_rules(document: Any, source: str = "<rules>") -> Rules:
    """Check a parsed rules document (see the module docstring for the format)."""
    if not isinstance(document, dict) or not isinstance(document.get("rules"), list) or not document["rules"]:
        raise _fail(source, "mutation rules are a mapping with a non-empty 'rules' list")
    unknown = set(document) - RULES_KEYS
    if unknown:
        raise _fail(source, f"unknown keys {sorted(unknown)} (known: {sorted(RULES_KEYS)})")
    seed = document.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _fail(source, f"'seed' must be an integer, got {seed!r}")
    keep = document.get("keep_originals", True)
    if not isinstance(keep, bool):
        raise _fail(source, f"'keep_originals' must be true or false, got {keep!r}")
    rules = [_check_rule(rule, f"{source}: rules[{i}]") for i, rule in enumerate(document["rules"])]
    filters = document.get("filters") or []
    if not isinstance(filters, list):
        raise _fail(source, f"'filters' must be a list, got {filters!r:.80}")
    return Rules(rules, [_check_filter(f, f"{source}: filters[{i}]") for i, f in enumerate(filters)], seed, keep)


def _fields_of(op: Any, where: str) -> set[str]:
    if op is None:
        return {name for required, optional in OP_FIELDS.values() for name in (*required, *optional)}
    if op not in OP_FIELDS:
        raise _fail(where, f"unknown op {op!r} (known: {', '.join(OP_FIELDS)})")
    required, optional = OP_FIELDS[op]
    return {*required, *optional}


def _check_rule(rule: Any, where: str) -> dict[str, Any]:
    if not isinstance(rule, dict) or not isinstance(rule.get("vary"), dict) or not rule["vary"]:
        raise _fail(where, f"a rule is a mapping with a non-empty 'vary' mapping, got {rule!r:.120}")
    unknown = set(rule) - RULE_KEYS
    if unknown:
        raise _fail(where, f"unknown keys {sorted(unknown)} (known: {sorted(RULE_KEYS)})")
    fields = _fields_of(rule.get("op"), where)
    for name, spec in rule["vary"].items():
        if name not in fields or name == "dtype":
            raise _fail(where, f"cannot vary {name!r} (fields: {sorted(fields - {'dtype'})})")
        _check_variation(spec, rule["vary"], f"{where}: vary.{name}")
    samples = rule.get("samples")
    if samples is not None and (not isinstance(samples, int) or isinstance(samples, bool) or samples < 1):
        raise _fail(where, f"'samples' must be a positive integer, got {samples!r}")
    return rule


def _check_variation(spec: Any, vary: dict[str, Any], where: str) -> None:
    if isinstance(spec, list):
        if not spec:
            raise _fail(where, "an empty list of values")
        return
    if not isinstance(spec, dict) or len(spec.keys() - {"step"}) != 1:
        raise _fail(where, f"expected a list of values, {{range: [start, stop], step: s}}, {{scale: factors}} "
                           f"or {{same_as: FIELD}}, got {spec!r:.120}")
    if "range" in spec:
        bounds, step = spec["range"], spec.get("step", 1)
        if (not isinstance(bounds, list) or len(bounds) != 2 or not all(isinstance(b, int) for b in bounds)
                or bounds[0] > bounds[1] or not isinstance(step, int) or step < 1):
            raise _fail(where, f"range needs [start, stop] integers with start <= stop and a positive integer "
                               f"step, got {spec!r}")
    elif "scale" in spec:
        factors = spec["scale"] if isinstance(spec["scale"], list) else [spec["scale"]]
        if not factors or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors):
            raise _fail(where, f"scale needs positive factors, got {spec['scale']!r}")
    elif "same_as" in spec:
        other = spec["same_as"]
        if other not in vary or isinstance(vary[other], dict) and "same_as" in vary[other]:
            raise _fail(where, f"same_as names a field varied by a list, range or scale in the same rule, "
                               f"got {other!r}")
    else:
        raise _fail(where, f"unknown variation {sorted(spec)} (range, scale, same_as)")
    if "step" in spec and "range" not in spec:
        raise _fail(where, "'step' goes with 'range'")


def _check_filter(spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(spec, dict) or "field" not in spec:
        raise _fail(where, f"a filter is a mapping with 'field' and tests {sorted(FILTER_TESTS)}, got {spec!r:.120}")
    tests = set(spec) - {"field", "op"}
    if not tests or tests - FILTER_TESTS:
        raise _fail(where, f"tests must be among {sorted(FILTER_TESTS)}, got {sorted(tests)}")
    fields = _fields_of(spec.get("op"), where) | DERIVED_FIELDS
    if spec["field"] not in fields:
        raise _fail(where, f"unknown field {spec['field']!r} (fields: {sorted(fields - {'dtype'})})")
    for test in tests - {"in"}:
        if isinstance(spec[test], bool) or not isinstance(spec[test], (int, float)):
            raise _fail(where, f"{test!r} needs a number, got {spec[test]!r}")
    if "in" in spec and not isinstance(spec["in"], list):
        raise _fail(where, f"'in' needs a list, got {spec['in']!r}")
    return spec


# ---------------------------------------------------------------- applying rules

def _candidates(name: str, spec: Any, value: Any) -> list[Any]:
    """Candidate values of one field, in order, without repeats."""
    if isinstance(spec, list):
        values = spec
    elif "range" in spec:
        start, stop = spec["range"]
        values = list(range(start, stop + 1, spec.get("step", 1)))
    else:
        factors = spec["scale"] if isinstance(spec["scale"], list) else [spec["scale"]]
        if name in PAIR_FIELDS or name == "padding":
            values = [[max(1 if name != "padding" else 0, round(v * f)) for v in value] for f in factors]
        else:
            values = [max(1, round(value * f)) for f in factors]
    unique: list[Any] = []
    for candidate in values:
        if candidate not in unique:
            unique.append(candidate)
    return unique


def _combinations(sizes: Sequence[int], samples: int | None, rng: random.Random) -> list[list[int]]:
    """Index tuples into the candidate lists: all of them, or ``samples`` drawn without repeats."""
    total = math.prod(sizes)
    indices = range(total) if samples is None or samples >= total else sorted(rng.sample(range(total), samples))
    combos = []
    for index in indices:
        digits = []
        for size in reversed(sizes):
            index, digit = divmod(index, size)
            digits.append(digit)
        combos.append(digits[::-1])
    return combos


def _mutants(task: Task, rule: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    vary = rule["vary"]
    free = [name for name, spec in vary.items() if not (isinstance(spec, dict) and "same_as" in spec)]
    candidates = [_candidates(name, vary[name], task.params[name]) for name in free]
    mutants = []
    for combo in _combinations([len(c) for c in candidates], rule.get("samples"), rng):
        params = dict(task.params)
        params.update({name: values[i] for name, values, i in zip(free, candidates, combo, strict=True)})
        params.update({name: params[spec["same_as"]] for name, spec in vary.items()
                       if isinstance(spec, dict) and "same_as" in spec})
        mutants.append(params)
    return mutants


def _field_value(task: Task, name: str) -> Any:
    if name == "gflop":
        return task.flop / 1e9
    if name in ("OH", "OW"):
        return output_hw(task.params)[name == "OW"] if task.op.endswith("conv2d") else None
    value = task.params.get(name)
    return list(value) if isinstance(value, tuple) else value


def _rejected_by(task: Task, filters: Sequence[dict[str, Any]]) -> str | None:
    """A readable name of the first filter the task fails, or None."""
    for spec in filters:
        if spec.get("op", task.op) != task.op:
            continue
        value = _field_value(task, spec["field"])
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        ok = all(("min" not in spec or v >= spec["min"]) and ("max" not in spec or v <= spec["max"])
                 and ("multiple_of" not in spec or v % spec["multiple_of"] == 0) for v in values)
        if "in" in spec:
            ok = ok and (value in spec["in"] or all(v in spec["in"] for v in values))
        if not ok:
            return ", ".join(f"{k}: {v}" for k, v in spec.items())
    return None


def mutate_tasks(tasks: Sequence[Task], rules: Rules, seed: int | None = None) -> MutationReport:
    """Apply ``rules`` to ``tasks``: the originals (if kept) then the surviving mutants, no duplicates."""
    seed = rules.seed if seed is None else seed
    report = MutationReport(originals=len(tasks))
    seen: set[tuple[Any, ...]] = set()
    if rules.keep_originals:
        for task in tasks:
            if task.key not in seen:
                seen.add(task.key)
                report.tasks.append(task)
    for rule_index, rule in enumerate(rules.rules):
        for task_index, task in enumerate(tasks):
            if rule.get("op", task.op) != task.op or not set(rule["vary"]) <= set(task.params):
                continue
            rng = random.Random(f"{seed}:{rule_index}:{task_index}")
            common = task.epilogues.most_common(1)
            epilogue = Counter({common[0][0]: 1}) if common else Counter()
            for number, params in enumerate(_mutants(task, rule, rng)):
                report.generated += 1
                try:
                    values = canonical_params(task.op, params)
                except ConfigError as exc:
                    report.invalid[str(exc)] += 1
                    continue
                reasons = problems(task.op, values)
                if reasons:
                    report.invalid[reasons[0]] += 1
                    continue
                mutant = Task(task.op, values, weight=1, name=f"{task.name}~r{rule_index}m{number}",
                              models=list(task.models), epilogues=epilogue, extra=dict(task.extra))
                rejected = _rejected_by(mutant, rules.filters)
                if rejected is not None:
                    report.filtered[rejected] += 1
                elif mutant.key in seen:
                    report.duplicates += 1
                else:
                    seen.add(mutant.key)
                    report.tasks.append(mutant)
    return report


def read_task_config(path: str | Path) -> tuple[list[Task], dict[str, Any]]:
    """The tasks of a ``lorien tune`` YAML written with op shorthands, and its other top-level settings."""
    path = Path(path)
    document = _read_yaml(path, "task list")
    if not isinstance(document, dict) or not isinstance(document.get("workloads"), list):
        raise ConfigError(f"{path}: a task list is a tuning YAML with a 'workloads' list")
    tasks = [Task.from_entry(entry, f"{path}: workloads[{i}]") for i, entry in enumerate(document["workloads"])]
    return tasks, {k: v for k, v in document.items() if k != "workloads"}
