"""Resuming a job: what its earlier attempts (or runs) measured, for its dialect to replay.

Every record a job commits carries ``source = "lorien-job:<job id>"``, and a job commits batch
by batch. A retried attempt, a resumed master's attempt, or ``lorien tune`` run again on the
same config reads those records (:func:`earlier_records`: from the store, and from the job's
:class:`JobJournal` when it runs from a spec URI) and hands them to the tuning loop as
``tune_job(..., resume=records)``: the loop replays them into the tuner, counts them against
the budget and measures only the rest (see :mod:`lorien.tune.loop`).

A :class:`CommitGuard` is where the attempts of one job learn about each other: whether the
job is complete, and which attempt measures it now (a later attempt takes a job over; an
earlier one still running, such as a dead master's orphan, stops before its next commit).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from lorien.errors import StoreError
from lorien.record import TuningRecord

SOURCE_PREFIX = "lorien-job:"


def source_tag(job_id: str) -> str:
    """The ``source`` every record of a job is committed with."""
    return f"{SOURCE_PREFIX}{job_id}"


def job_source(spec: dict[str, Any], dialect: str | None = None) -> str:
    """The source tag of a job given by its spec (normalized first, as the master does); a
    dialect tuning a bare job dict names itself, and its target defaults to ``llvm``."""
    from lorien.tune.jobspec import Job

    if dialect is not None:
        spec = {**spec, "dialect": spec.get("dialect") or dialect, "target": spec.get("target") or "llvm"}
    return source_tag(Job.from_spec(spec).job_id)


def distinct_measurements(records: Iterable[TuningRecord]) -> list[TuningRecord]:
    """One record per config, the first measured, oldest first: what a resumed tuner replays.
    (A config measured twice -- a race of two attempts -- counts once.)"""
    first: dict[str, TuningRecord] = {}
    for record in sorted(records, key=lambda record: (record.timestamp, record.record_id)):
        first.setdefault(record.config, record)
    return list(first.values())


def earlier_records(store: Any, job_id: str, target: str | None = None,
                    guard: CommitGuard | None = None) -> list[TuningRecord]:
    """The distinct measurements of a job committed so far: its records in ``store`` (an open
    store, or None; read from its target's partition only, when ``target`` is given) and those
    its ``guard`` kept."""
    records: list[TuningRecord] = []
    if store is not None:
        from lorien.target import parse_target

        filters: dict[str, Any] = {"source": source_tag(job_id)}
        if target:
            filters["target_key"] = parse_target(target).alternate_key
        records += [TuningRecord.from_row(row) for row in store.scan(filters=filters).to_pylist()]
    if guard is not None:
        records += guard.records()
    return distinct_measurements(records)


def jobs_with_records(store_uri: str, job_ids: Iterable[str]) -> set[str]:
    """The jobs among ``job_ids`` that have records in the store, in one scan: a master asks
    once, so that a fresh job's attempt need not scan the store for what it never measured."""
    from lorien.warehouse import open_store

    tags = {source_tag(job_id): job_id for job_id in job_ids}
    if not tags:
        return set()
    with open_store(store_uri) as store:
        found = store.scan(filters={"source": sorted(tags)}, columns=["source"]).column("source").unique()
    return {tags[tag] for tag in found.to_pylist()}


class AttemptSuperseded(Exception):
    """A later attempt of the job took it over; this one stops without committing more."""


class CommitGuard:
    """Where the attempts of one job learn about each other. This default knows nothing (the
    store is asked instead): right where no two attempts of a job run at once (the local manager)."""

    def committed(self) -> int | None:
        """Records of the job when an earlier attempt completed it, else None."""
        return None

    def remember(self, records: int) -> None:
        """Note that the job is complete with ``records`` records."""

    def claim(self) -> bool:
        """This attempt measures the job from now on; True when another attempt claimed it before
        (then its records must be read, whatever the master knew when it started this one)."""
        return False

    def owns(self) -> bool:
        """Whether this attempt still measures the job (no later attempt claimed it)."""
        return True

    def keep(self, records: Sequence[TuningRecord]) -> None:
        """Keep a committed batch where a later attempt finds it (beside the store)."""

    def records(self) -> list[TuningRecord]:
        """The records of the job this guard kept (beside the store)."""
        return []


class JobJournal(CommitGuard):
    """A job's batches and owner kept beside its spec (a local path or ``s3://``), for
    ``lorien tune --job URI`` (what an AWS Batch container runs).

    ``<spec>.records/`` holds one JSON-lines object per committed batch, so a retried container
    finds what earlier ones measured whatever the store keeps (a DynamoDB store keeps only the
    best configs); ``<spec>.owner`` names the attempt measuring the job (``$AWS_BATCH_JOB_ID``
    and a random part); ``<spec>.result.json`` (written when an attempt ends) says whether the
    job is complete.
    """

    def __init__(self, spec_uri: str, token: str | None = None):
        from lorien.tune.jobspec import result_uri, spec_sibling

        self.records_uri = spec_sibling(spec_uri, ".records")
        self.owner_uri = spec_sibling(spec_uri, ".owner")
        self.result_uri = result_uri(spec_uri)
        # a Batch-level retry keeps its AWS_BATCH_JOB_ID: the random part tells attempts apart
        self.token = token or f"{os.environ.get('AWS_BATCH_JOB_ID', 'attempt')}-{uuid.uuid4().hex[:12]}"
        self._batches = 0

    def committed(self) -> int | None:
        from lorien.warehouse.archive import read_bytes_uri

        try:
            result = orjson.loads(read_bytes_uri(self.result_uri))
        except (StoreError, orjson.JSONDecodeError):
            return None
        if isinstance(result, dict) and not result.get("error") and not result.get("superseded"):
            return int(result.get("records", 0))
        return None

    def claim(self) -> bool:
        from lorien.warehouse.archive import read_bytes_uri, write_bytes_uri

        try:
            read_bytes_uri(self.owner_uri)
            claimed_before = True
        except StoreError:
            claimed_before = False
        write_bytes_uri(self.owner_uri, self.token.encode())
        return claimed_before

    def owns(self) -> bool:
        from lorien.warehouse.archive import read_bytes_uri

        try:
            return read_bytes_uri(self.owner_uri).decode() == self.token
        except StoreError:
            return True  # nobody claimed the job after us (the owner file is gone)

    def keep(self, records: Sequence[TuningRecord]) -> None:
        from lorien.warehouse.archive import join_uri, write_bytes_uri

        self._batches += 1
        lines = b"".join(orjson.dumps(record.to_row()) + b"\n" for record in records)
        write_bytes_uri(join_uri(self.records_uri, f"{self.token}-{self._batches:06d}.jsonl"), lines)

    def records(self) -> list[TuningRecord]:
        """Every record kept by any attempt of the job."""
        from lorien.warehouse.archive import list_uri, read_bytes_uri

        records = []
        for uri in list_uri(self.records_uri):
            records += [TuningRecord.from_row(orjson.loads(line))
                        for line in read_bytes_uri(uri).splitlines() if line.strip()]
        return records
