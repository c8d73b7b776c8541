"""Pytest plugin: real servers as separate processes on 127.0.0.1.

``moto_server`` (session) starts moto's server (S3, DynamoDB, Batch ... all on one port) as
its own process on a free port, waits until it answers, yields its endpoint URL and kills it
at the end. ``s3_bucket`` creates a fresh bucket per test. Dummy AWS credentials are set in
the environment for the whole session so boto3 and pyarrow never look for real ones.
Loaded from tests/conftest.py with ``pytest_plugins = ["servers"]``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}

MOTO_START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moto_command(port: int) -> list[str]:
    executable = shutil.which("moto_server")
    if executable:
        return [executable, "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def _wait_until_answering(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with code {process.returncode} before answering at {url}")
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1.0):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"moto server did not answer at {url} within {timeout_s:.0f} s")


@contextlib.contextmanager
def running_server(command: Callable[[int], list[str]], env: dict[str, str] | None = None,
                   output: Any = subprocess.DEVNULL, timeout_s: float = MOTO_START_TIMEOUT_S) -> Iterator[str]:
    """Start ``command(port)`` on a free port as its own process, wait until it answers, yield its
    URL, and kill it on the way out."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(command(port), stdout=output, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_until_answering(url, process, timeout_s)
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def aws_credentials() -> Iterator[dict[str, str]]:
    """Dummy AWS credentials and region in the environment for the session."""
    saved = {name: os.environ.get(name) for name in DUMMY_AWS_ENV}
    os.environ.update(DUMMY_AWS_ENV)
    yield dict(DUMMY_AWS_ENV)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def moto_server(aws_credentials: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL (``http://127.0.0.1:PORT``) of a moto server running as its own process."""
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with open(log_path, "wb") as log, running_server(_moto_command, {**os.environ, **aws_credentials}, log) as url:
        yield url


@pytest.fixture
def s3_client(moto_server: str):
    """A boto3 S3 client talking to the moto server."""
    import boto3

    return boto3.client("s3", endpoint_url=moto_server, region_name=DUMMY_AWS_ENV["AWS_REGION"])


@pytest.fixture
def s3_bucket(s3_client) -> str:
    """Name of a fresh, empty bucket on the moto server."""
    name = f"lorien-test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name
