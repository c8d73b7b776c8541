"""Full tuning logs archived to a local directory or ``s3://bucket/prefix``; text read from either.

The DynamoDB store keeps only the serving view (best configs); every measured record goes to
an archive as a native TVM log (``--commit-log-to``). S3 URIs take the same endpoint options as
store URIs: ``s3://bucket/prefix?endpoint_url=http://127.0.0.1:PORT&region=us-east-1``; without
them boto3's own settings apply (``AWS_ENDPOINT_URL_S3``, ``AWS_REGION``, profiles).
Credentials always come from the standard AWS chain and never appear in messages.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
)

from lorien.dialect import native_log_format
from lorien.errors import StoreError, StoreUnreachableError
from lorien.record import TuningRecord

_CREDENTIAL_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
    "InvalidToken", "InvalidClientTokenId", "403",
})


@dataclass(frozen=True)
class S3Location:
    """A bucket, a key (or prefix) and the endpoint options of an ``s3://`` URI."""

    bucket: str
    key: str
    endpoint_url: str | None = None
    region: str | None = None

    @property
    def url(self) -> str:
        """``s3://bucket/key`` without options."""
        return f"s3://{self.bucket}/{self.key}"

    def child(self, name: str) -> S3Location:
        key = f"{self.key.rstrip('/')}/{name}" if self.key else name
        return S3Location(self.bucket, key, self.endpoint_url, self.region)

    def uri(self) -> str:
        """The URI with its endpoint options, so that it can be opened again."""
        query = []
        if self.endpoint_url:
            query.append(f"endpoint_url={self.endpoint_url}")
        if self.region:
            query.append(f"region={self.region}")
        return self.url + ("?" + "&".join(query) if query else "")


def is_s3_uri(uri: str) -> bool:
    return str(uri).startswith("s3://")


def parse_s3_uri(uri: str) -> S3Location:
    """Parse ``s3://bucket/key?endpoint_url=..&region=..``."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc:
        raise StoreError(f"not an S3 URI: {uri!r} (expected s3://bucket/key)")
    options = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    unknown = sorted(set(options) - {"endpoint_url", "region"})
    if unknown:
        raise StoreError(f"unknown option(s) {', '.join(unknown)} in S3 URI s3://{parts.netloc}{parts.path}")
    return S3Location(parts.netloc, parts.path.lstrip("/"), options.get("endpoint_url"),
                      options.get("region"))


def s3_client(location: S3Location) -> Any:
    """A boto3 S3 client for the location's endpoint and region (standard credential chain)."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session()
    region = location.region or session.region_name or "us-east-1"
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5)
    return session.client("s3", endpoint_url=location.endpoint_url, region_name=region, config=config)


def _s3_error(exc: Exception, location: S3Location, action: str) -> StoreError:
    where = location.endpoint_url or "AWS S3"
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return StoreUnreachableError(f"S3 endpoint {where} is unreachable while trying to {action} {location.url}")
    if isinstance(exc, NoCredentialsError):
        return StoreError(f"no AWS credentials found to {action} {location.url}; set them through the "
                          "standard chain (AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws)")
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return StoreError(f"S3 bucket {location.bucket!r} does not exist at {where} (while trying to "
                              f"{action} {location.url})")
        if code in ("NoSuchKey", "404"):
            return StoreError(f"no S3 object {location.url} at {where}")
        if code in _CREDENTIAL_CODES or status in (401, 403):
            return StoreError(f"AWS credentials were rejected by S3 at {where} ({code}) while trying to "
                              f"{action} {location.url}; check the standard credential chain")
        return StoreError(f"S3 could not {action} {location.url} at {where}: {code}")
    return StoreError(f"S3 could not {action} {location.url} at {where}: {type(exc).__name__}")


def read_bytes_uri(uri: str | Path) -> bytes:
    """The bytes of a local file or an S3 object."""
    uri = str(uri)
    if not is_s3_uri(uri):
        path = Path(uri.removeprefix("file://"))
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise StoreError(f"no such file: {path}") from None
    location = parse_s3_uri(uri)
    try:
        return s3_client(location).get_object(Bucket=location.bucket, Key=location.key)["Body"].read()
    except (ClientError, BotoCoreError) as exc:
        raise _s3_error(exc, location, "read") from None


def read_text_uri(uri: str | Path) -> str:
    """The UTF-8 text of a local file or an S3 object (job specifications, logs)."""
    data = read_bytes_uri(uri)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreError(f"{uri} is not UTF-8 text: {exc}") from None


def write_bytes_uri(uri: str | Path, data: bytes) -> str:
    """Write a local file (parents created) or an S3 object; return the URI written."""
    uri = str(uri)
    if not is_s3_uri(uri):
        path = Path(uri.removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
        partial.write_bytes(data)
        partial.replace(path)
        return str(path)
    location = parse_s3_uri(uri)
    try:
        s3_client(location).put_object(Bucket=location.bucket, Key=location.key, Body=data)
    except (ClientError, BotoCoreError) as exc:
        raise _s3_error(exc, location, "write") from None
    return location.uri()


def write_text_uri(uri: str | Path, text: str) -> str:
    """Write UTF-8 text to a local file or an S3 object; return the URI written."""
    return write_bytes_uri(uri, text.encode("utf-8"))


def list_uri(prefix: str | Path) -> list[str]:
    """Files under a local directory, or objects under an S3 prefix (as URIs), sorted."""
    prefix = str(prefix)
    if not is_s3_uri(prefix):
        root = Path(prefix.removeprefix("file://"))
        if not root.exists():
            return []
        return sorted(str(path) for path in root.rglob("*") if path.is_file())
    location = parse_s3_uri(prefix)
    client = s3_client(location)
    uris: list[str] = []
    key_prefix = location.key.rstrip("/") + "/" if location.key else ""
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket,
                                                                     Prefix=key_prefix):
            for entry in page.get("Contents", []):
                uris.append(S3Location(location.bucket, entry["Key"], location.endpoint_url,
                                       location.region).uri())
    except (ClientError, BotoCoreError) as exc:
        raise _s3_error(exc, location, "list") from None
    return sorted(uris)


def join_uri(dest: str, name: str) -> str:
    """``name`` inside a local directory or an S3 prefix (the prefix's endpoint options kept)."""
    if is_s3_uri(dest):
        return parse_s3_uri(dest).child(name).uri()
    return str(Path(dest.removeprefix("file://")) / name)


def archive_log(path: str | Path, dest: str, name: str | None = None) -> str:
    """Copy a tuning log file into the archive ``dest`` (directory or S3 prefix); return its URI."""
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"cannot archive {path}: no such file")
    target = join_uri(dest, name or path.name)
    if is_s3_uri(target):
        location = parse_s3_uri(target)
        try:
            s3_client(location).upload_file(str(path), location.bucket, location.key)
        except (ClientError, BotoCoreError) as exc:
            raise _s3_error(exc, location, "upload") from None
        except S3UploadFailedError as exc:
            cause = exc.__cause__ or exc.__context__
            raise _s3_error(cause if cause is not None else exc, location, "upload") from None
        return target
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    return target


def encode_archive_lines(records: list[TuningRecord], dialect: str) -> tuple[str, str]:
    """(file suffix, text) of one dialect's records: the native TVM log, else Lorien JSON lines."""
    native = native_log_format(dialect)
    if native is None:
        lines = [orjson.dumps({k: v for k, v in record.to_row().items() if k != "cost_s"}).decode()
                 for record in records]
        return ".lorien.jsonl", "\n".join(lines) + "\n"
    from lorien.formats import encode_record

    record_format, suffix = native
    return suffix, "".join(encode_record(record, record_format).rstrip("\n") + "\n" for record in records)


def archive_records(records: Iterable[TuningRecord], dest: str, name: str | None = None) -> list[str]:
    """Write records (failed ones included) to the archive as full logs, one file per dialect.

    Returns the URIs written. File names are ``<name>-<dialect><suffix>``; ``name`` defaults to
    a UTC timestamp plus a random tag, so concurrent committers never overwrite each other.
    """
    by_dialect: dict[str, list[TuningRecord]] = {}
    for record in records:
        by_dialect.setdefault(record.dialect, []).append(record)
    stem = name or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:10]}"
    written = []
    for dialect, dialect_records in sorted(by_dialect.items()):
        suffix, text = encode_archive_lines(dialect_records, dialect)
        written.append(write_text_uri(join_uri(dest, f"{stem}-{dialect}{suffix}"), text))
        entries = _workload_entries(dialect_records)
        if entries:  # records name their workload by hash: the entries go beside them
            lines = "".join(orjson.dumps({"workload_hash": digest, "entry": orjson.loads(text)}).decode() + "\n"
                            for digest, text in sorted(entries.items()))
            written.append(write_text_uri(join_uri(dest, f"{stem}-{dialect}.workloads.jsonl"), lines))
    return written


def _workload_entries(records: list[TuningRecord]) -> dict[str, str]:
    """The workload entries (hash -> JSON) that records naming their workload by hash (as
    MetaSchedule's do) refer to, as far as this process has read them (see
    :func:`lorien.formats.meta_schedule.remember_workloads`)."""
    from lorien.formats import meta_schedule

    return meta_schedule.known_workloads(meta_schedule.referenced_hashes(records))
