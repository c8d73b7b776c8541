"""Job specifications: one workload to tune with one dialect, tuner and budget.

A job is plain data, read with safe loaders only (``yaml.safe_load``, ``json.loads``): a
spec fetched from S3 can never run code on a worker. A job's id is a hash of its
normalized spec, so a resumed master recognizes the jobs it already finished.

Accepted documents (YAML or JSON, a local path or ``s3://bucket/key``)::

    {"dialect": "autotvm", "task_name": "dense.x86", "args": [...], "target": "llvm"}
    [job, job, ...]
    {"defaults": {"target": "llvm", "trials": 8}, "jobs": [job, job, ...]}
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lorien.errors import ConfigError
from lorien.tune.job import JOB_DEFAULTS

_REQUIRED_TYPES: dict[str, type | tuple[type, ...]] = {"dialect": str, "target": str}
_OPTIONAL_TYPES: dict[str, type | tuple[type, ...]] = {
    "task_name": str,
    "args": list,
    "workload_key": str,
    "tuner": str,
    "trials": int,
    "measure": dict,
    "commit_nbest": int,
    "seed": int,
    "name": str,
    "weight": (int, float),
    "models": list,
    "epilogue": dict,
}


@dataclass(frozen=True)
class Job:
    """One tuning job: its normalized spec (plain data, read into a
    :class:`lorien.tune.job.TuneJob` where it is tuned) and its id."""

    spec: dict[str, Any] = field(hash=False)
    job_id: str = ""

    @classmethod
    def from_spec(cls, spec: dict[str, Any], where: str = "job") -> Job:
        normalized = normalize_spec(spec, where)
        return cls(spec=normalized, job_id=job_id_of(normalized))

    @property
    def label(self) -> str:
        """A short human-readable name: the ``name`` field, or task and shapes."""
        if "name" in self.spec:
            return str(self.spec["name"])
        what = self.spec.get("task_name") or self.spec.get("workload_key", "?")
        return f"{self.spec['dialect']}:{what}"

    def to_json(self) -> str:
        return json.dumps(self.spec, sort_keys=True)


@dataclass
class JobList:
    """Jobs read from one document, plus one ConfigError per entry that did not validate."""

    jobs: list[Job]
    errors: list[ConfigError]
    source: str = ""


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def job_id_of(spec: dict[str, Any]) -> str:
    """Deterministic id of a normalized spec (16 hex characters)."""
    return hashlib.blake2b(canonical_json(spec).encode(), digest_size=8).hexdigest()


def normalize_spec(spec: Any, where: str = "job") -> dict[str, Any]:
    """Check a raw job mapping and fill in defaults; raises ConfigError naming ``where``."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: a job must be a mapping, got {type(spec).__name__} {spec!r:.80}")
    for key in _REQUIRED_TYPES:
        if key not in spec:
            raise ConfigError(f"{where}: missing required field {key!r} in {spec!r:.200}")
    for key, expected in {**_REQUIRED_TYPES, **_OPTIONAL_TYPES}.items():
        if key in spec and (not isinstance(spec[key], expected) or isinstance(spec[key], bool)):
            raise ConfigError(
                f"{where}: field {key!r} must be {_type_name(expected)}, got {spec[key]!r:.80}"
            )
    if "workload_key" not in spec and not ("task_name" in spec and "args" in spec):
        raise ConfigError(f"{where}: a job needs 'task_name' and 'args' (or 'workload_key')")
    if "trials" in spec and spec["trials"] < 1:
        raise ConfigError(f"{where}: 'trials' must be at least 1, got {spec['trials']}")
    try:
        canonical_json(spec)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: job is not plain JSON data: {exc}") from exc
    return {**JOB_DEFAULTS, **spec}


def _type_name(expected: type | tuple[type, ...]) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__


def parse_document(text: str, source: str = "<text>") -> Any:
    """Parse YAML or JSON text with safe loaders; python tags and the like are refused."""
    if source.lower().split("?", 1)[0].endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        raise ConfigError(
            f"{source}:{line}: refused YAML tag ({exc.problem}); job specs are plain data, "
            "python/object tags are never loaded"
        ) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}:{line}: invalid YAML: {problem}") from exc


def jobs_from_document(document: Any, source: str = "<text>") -> JobList:
    """Jobs of a parsed document; entries that fail validation become errors, not exceptions."""
    defaults: dict[str, Any] = {}
    if isinstance(document, dict) and "jobs" in document:
        defaults = document.get("defaults") or {}
        if not isinstance(defaults, dict):
            raise ConfigError(f"{source}: 'defaults' must be a mapping, got {defaults!r:.80}")
        entries = document["jobs"]
        if not isinstance(entries, list):
            raise ConfigError(f"{source}: 'jobs' must be a list, got {type(entries).__name__}")
    elif isinstance(document, dict):
        entries = [document]
    elif isinstance(document, list):
        entries = document
    else:
        raise ConfigError(f"{source}: expected a job, a list of jobs or {{jobs: [...]}}, got {document!r:.80}")
    jobs: list[Job] = []
    errors: list[ConfigError] = []
    for index, entry in enumerate(entries):
        where = f"{source}: jobs[{index}]"
        try:
            merged = {**defaults, **entry} if isinstance(entry, dict) else entry
            jobs.append(Job.from_spec(merged, where))
        except ConfigError as exc:
            errors.append(exc)
    return JobList(jobs=jobs, errors=errors, source=source)


def load_jobs(uri: str | os.PathLike[str]) -> JobList:
    """Read a job spec or job list from a local path or ``s3://bucket/key``."""
    source = str(uri)
    return jobs_from_document(parse_document(read_text(source), source), source)


def load_job(uri: str | os.PathLike[str]) -> Job:
    """Read exactly one job (``lorien tune --job URI``); raises ConfigError otherwise."""
    job_list = load_jobs(uri)
    if job_list.errors:
        raise job_list.errors[0]
    if len(job_list.jobs) != 1:
        raise ConfigError(f"{uri}: expected exactly one job, found {len(job_list.jobs)}")
    return job_list.jobs[0]


def read_text(uri: str) -> str:
    """Text of a local file or an S3 object (``s3://bucket/key?endpoint_url=..&region=..``;
    without options boto3's own settings and the standard credential chain apply)."""
    if uri.startswith("s3://"):
        from lorien.warehouse.archive import read_text_uri

        return read_text_uri(uri)
    path = Path(uri)
    try:
        return path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"job spec not found: {uri}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read job spec {uri}: {exc}") from exc


def spec_sibling(spec_uri: str, suffix: str) -> str:
    """A file beside a job spec: ``.../abc.json`` -> ``.../abc<suffix>`` (query options kept)."""
    path, sep, query = spec_uri.partition("?")
    stem = path[:-5] if path.endswith(".json") else path
    return f"{stem}{suffix}{sep}{query}"


def result_uri(spec_uri: str) -> str:
    """Where ``--job`` writes a spec's outcome: ``.../abc.json`` -> ``.../abc.result.json``."""
    return spec_sibling(spec_uri, ".result.json")
