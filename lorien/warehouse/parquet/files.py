"""The files of a parquet store: a local directory or an S3 prefix, each publishing a file
atomically (a rename on disk, one PUT on S3)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from lorien.errors import StoreError, StoreUnreachableError
from lorien.storeuri import uri_flag
from lorien.warehouse.parquet.layout import STAGING_DIR
from lorien.warehouse.parquet.tables import write_parquet


class LocalFiles:
    """A directory on a local disk; publication is an atomic rename."""

    is_local = True

    def __init__(self, root: str, fsync: bool = False, preload: bool = False):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.fsync = fsync
        #: read and map each persisted serving index as it is opened (``?preload=true``,
        #: :func:`lorien.serving_index.preload_map`)
        self.preload = preload

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def check_readable(self) -> None:
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise StoreUnreachableError(f"store path {self.root!r} exists but is not a directory")

    def list(self, sub: str, sizes: bool = True) -> dict[str, int]:
        """Published parquet files under ``sub``: relative path -> size in bytes (0 for every
        file without ``sizes``, which saves a stat per file)."""
        self.check_readable()
        found: dict[str, int] = {}
        base = self._path(sub)
        stack = [(base, sub)]
        while stack:
            directory, rel = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except FileNotFoundError:
                continue
            except PermissionError as exc:
                raise StoreUnreachableError(f"cannot read store directory {directory!r}: {exc}") from exc
            for entry in entries:
                if entry.name.startswith((".", "_")):
                    continue
                if entry.is_dir():
                    stack.append((entry.path, f"{rel}/{entry.name}"))
                elif entry.name.endswith(".parquet"):
                    found[f"{rel}/{entry.name}"] = entry.stat().st_size if sizes else 0
        return found

    def stamp(self, sub: str) -> int | None:
        """The modification time (ns) of the directory ``sub``, which any file added to it,
        renamed into it or removed from it changes; None when there is no such directory."""
        try:
            return os.stat(f"{self.root}/{sub}").st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):
            return None

    def names(self, sub: str) -> list[str]:
        """Published parquet files directly in ``sub`` (one listing, no stat per file)."""
        try:
            entries = os.listdir(self._path(sub))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            self.check_readable()
            raise
        return [f"{sub}/{name}" for name in entries
                if name.endswith(".parquet") and not name.startswith((".", "_"))]

    def open(self, rel: str, read_dictionary: list[str] | None = None) -> pq.ParquetFile:
        """A file to read; ``read_dictionary`` names columns to keep dictionary-encoded."""
        return pq.ParquetFile(self._path(rel), memory_map=True, read_dictionary=read_dictionary)

    def stage(self, table: pa.Table, row_group_size: int | None) -> str:
        staging = self._path(STAGING_DIR)
        os.makedirs(staging, exist_ok=True)
        rel = f"{STAGING_DIR}/{uuid.uuid4().hex}.parquet.tmp"
        path = self._path(rel)
        try:
            write_parquet(table, path, row_group_size)
            if self.fsync:
                with open(path, "rb+") as handle:
                    os.fsync(handle.fileno())
        except OSError as exc:
            raise StoreError(f"cannot write {path!r}: {exc}") from exc
        return rel

    def publish(self, staged: str, rel: str) -> None:
        target = self._path(rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.utime(self._path(staged))  # a file's age counts from its publication
        os.rename(self._path(staged), target)

    def write(self, table: pa.Table, rel: str, row_group_size: int | None = None) -> None:
        self.publish(self.stage(table, row_group_size), rel)

    def delete(self, rel: str) -> None:
        try:
            os.remove(self._path(rel))
        except FileNotFoundError:
            pass

    def ages(self, rels: Iterable[str]) -> dict[str, float]:
        """Seconds since each file was last written (files that are gone are left out)."""
        now = time.time()
        found = {}
        for rel in rels:
            try:
                found[rel] = now - os.stat(self._path(rel)).st_mtime
            except FileNotFoundError:
                continue
        return found

    def stale_staged(self, older_than_s: float) -> list[str]:
        staging = self._path(STAGING_DIR)
        if not os.path.isdir(staging):
            return []
        cutoff = time.time() - older_than_s
        return [f"{STAGING_DIR}/{entry.name}" for entry in os.scandir(staging)
                if entry.stat().st_mtime < cutoff]


class S3Files:
    """A prefix in an S3 bucket; an object becomes visible only when its upload completes."""

    is_local = False

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None, region: str | None):
        from pyarrow import fs as pafs

        options: dict[str, Any] = {
            "region": region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            "connect_timeout": 5.0,
            "request_timeout": 30.0,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3),
        }
        if endpoint_url:
            parts = urlsplit(endpoint_url)
            if not parts.netloc:
                raise StoreError(f"bad endpoint_url {endpoint_url!r}: expected http(s)://host:port")
            options["endpoint_override"] = parts.netloc
            options["scheme"] = parts.scheme or "https"
        self._fs_module = pafs
        self.fs = pafs.S3FileSystem(**options)
        self.bucket = bucket
        self.root = f"{bucket}/{prefix.strip('/')}".rstrip("/")
        self.endpoint_url = endpoint_url
        self.region = options["region"]
        self._s3_client = None
        self._client_lock = threading.Lock()  # staging threads share one client
        self._bucket_checked = False

    def _unreachable(self, action: str, exc: OSError) -> StoreUnreachableError:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return StoreUnreachableError(f"cannot {action} s3://{self.root}{where}: {exc}")

    def check_readable(self) -> None:
        """Raise StoreUnreachableError unless the endpoint answers and the bucket exists (asked
        once per process)."""
        if self._bucket_checked:
            return
        try:
            info = self.fs.get_file_info(self.bucket)
        except OSError as exc:
            raise self._unreachable("reach", exc) from exc
        if info.type == self._fs_module.FileType.NotFound:
            raise StoreUnreachableError(f"bucket {self.bucket!r} of s3://{self.root} does not exist")
        self._bucket_checked = True

    def list(self, sub: str, sizes: bool = True) -> dict[str, int]:
        self.check_readable()
        selector = self._fs_module.FileSelector(f"{self.root}/{sub}", recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except OSError as exc:
            raise self._unreachable("list", exc) from exc
        found = {}
        for info in infos:
            if info.type != self._fs_module.FileType.File or not info.base_name.endswith(".parquet"):
                continue
            rel = info.path[len(self.root) + 1:]
            if any(part.startswith((".", "_")) for part in rel.split("/")):
                continue
            found[rel] = info.size
        return found

    def names(self, sub: str) -> list[str]:
        return list(self.list(sub))

    def stamp(self, sub: str) -> None:
        """Prefixes have no modification time: listings are refreshed by age instead."""
        return None

    def open(self, rel: str, read_dictionary: list[str] | None = None) -> pq.ParquetFile:
        """A file to read; ``read_dictionary`` names columns to keep dictionary-encoded."""
        try:
            return pq.ParquetFile(self.fs.open_input_file(f"{self.root}/{rel}"), read_dictionary=read_dictionary)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "not exist" in str(exc) or "NoSuchKey" in str(exc):
                raise FileNotFoundError(rel) from exc
            raise self._unreachable(f"read {rel}", exc) from exc

    def _client(self):
        with self._client_lock:
            return self._make_client()

    def _make_client(self):
        if self._s3_client is None:
            import boto3

            self._s3_client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region)
        return self._s3_client

    def write(self, table: pa.Table, rel: str, row_group_size: int | None = None) -> None:
        """One PUT of the whole file: the object appears complete or not at all."""
        import botocore.exceptions

        buffer = pa.BufferOutputStream()
        write_parquet(table, buffer, row_group_size)
        key = f"{self.root}/{rel}".split("/", 1)[1]
        try:
            self._client().put_object(Bucket=self.bucket, Key=key, Body=buffer.getvalue().to_pybytes())
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreUnreachableError(f"cannot write s3://{self.root}/{rel}: {exc}") from exc

    def stage(self, table: pa.Table, row_group_size: int | None) -> str:
        rel = f"{STAGING_DIR}/{uuid.uuid4().hex}.parquet.tmp"
        self.write(table, rel, row_group_size)
        return rel

    def publish(self, staged: str, rel: str) -> None:
        try:
            self.fs.move(f"{self.root}/{staged}", f"{self.root}/{rel}")
        except OSError as exc:
            raise self._unreachable(f"publish {rel}", exc) from exc

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(f"{self.root}/{rel}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._unreachable(f"delete {rel}", exc) from exc

    def ages(self, rels: Iterable[str]) -> dict[str, float]:
        """Seconds since each object was last written (objects that are gone are left out)."""
        rels = list(rels)
        try:
            infos = self.fs.get_file_info([f"{self.root}/{rel}" for rel in rels])
        except OSError as exc:
            raise self._unreachable("list", exc) from exc
        now = time.time()
        return {rel: now - info.mtime.timestamp() for rel, info in zip(rels, infos, strict=True)
                if info.type == self._fs_module.FileType.File and info.mtime is not None}

    def stale_staged(self, older_than_s: float) -> list[str]:
        selector = self._fs_module.FileSelector(f"{self.root}/{STAGING_DIR}", allow_not_found=True)
        cutoff = time.time() - older_than_s
        return [info.path[len(self.root) + 1:] for info in self.fs.get_file_info(selector)
                if info.mtime is not None and info.mtime.timestamp() < cutoff]


def open_files(location: str) -> LocalFiles | S3Files:
    if location.startswith("file:"):
        location = location[len("file:"):]
        if location.startswith("//"):
            location = location[2:]
    if location.startswith("s3://"):
        parts = urlsplit(location)
        if not parts.netloc:
            raise StoreError(f"bad S3 store URI {location!r}: expected s3://bucket/prefix")
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint_url", "region"}
        if unknown:
            raise StoreError(f"unknown option(s) {sorted(unknown)} in store URI {location!r} "
                             "(known: endpoint_url, region)")
        return S3Files(parts.netloc, parts.path, query.get("endpoint_url"), query.get("region"))
    path, _, query_text = location.partition("?")
    if not path:
        raise StoreError("empty parquet store path")
    query = {name: values[-1] for name, values in parse_qs(query_text).items()}
    unknown = set(query) - {"fsync", "preload"}
    if unknown:
        raise StoreError(f"unknown option(s) {sorted(unknown)} in store URI {location!r} (known: fsync, preload)")
    return LocalFiles(path, fsync=uri_flag(query, "fsync", location), preload=uri_flag(query, "preload", location))
