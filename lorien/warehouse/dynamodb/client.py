"""The DynamoDB client: locations and their URIs, errors that say what to do, and calls that
retry throttling and transient network failures with jittered backoff."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ReadTimeoutError,
)

from lorien.errors import StoreError, StoreUnreachableError
from lorien.storeuri import uri_flag

log = logging.getLogger(__name__)

DEFAULT_REGION = "us-west-2"

THROTTLING_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "Throttling", "TooManyRequestsException", "SlowDown",
})
CREDENTIAL_CODES = frozenset({
    "UnrecognizedClientException", "InvalidClientTokenId", "InvalidSignatureException",
    "SignatureDoesNotMatch", "InvalidAccessKeyId", "ExpiredToken", "ExpiredTokenException",
    "AccessDeniedException", "AccessDenied", "MissingAuthenticationToken",
    "MissingAuthenticationTokenException", "403",
})
_TRANSIENT_NETWORK_ERRORS = (ConnectionClosedError, ReadTimeoutError)


class MissingTableError(StoreError):
    """The DynamoDB table named in a URI does not exist."""


@dataclass(frozen=True)
class DynamoDBLocation:
    """Where a table lives: its name, endpoint override and region."""

    table: str
    endpoint_url: str | None = None
    region: str | None = None
    create: bool = False
    archive: str | None = None

    @property
    def where(self) -> str:
        """The endpoint for messages (never with credentials)."""
        endpoint = (self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
                    or os.environ.get("AWS_ENDPOINT_URL"))
        if endpoint:
            return redact_url(endpoint)
        return f"AWS DynamoDB ({self.region or 'default region'})"

    @property
    def uri(self) -> str:
        query = []
        if self.endpoint_url:
            query.append(f"endpoint_url={redact_url(self.endpoint_url)}")
        if self.region:
            query.append(f"region={self.region}")
        return f"dynamodb:{self.table}" + ("?" + "&".join(query) if query else "")


def redact_url(url: str) -> str:
    """``url`` without any ``user:password@`` part."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def parse_dynamodb_uri(rest: str) -> DynamoDBLocation:
    """Parse the part of a ``dynamodb:`` URI after the scheme: ``TABLE?endpoint_url=..&region=..``."""
    table, _, query = rest.partition("?")
    table = table.strip().lstrip("/")
    if not table:
        raise StoreError(f"dynamodb URI 'dynamodb:{rest}' names no table (dynamodb:TABLE?endpoint_url=..)")
    options = {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}
    known = {"endpoint_url", "region", "create", "archive"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise StoreError(
            f"unknown option(s) {', '.join(unknown)} in dynamodb URI for table {table!r} "
            f"(known: {', '.join(sorted(known))})"
        )
    return DynamoDBLocation(
        table=table,
        endpoint_url=options.get("endpoint_url") or None,
        region=options.get("region") or None,
        create=uri_flag(options, "create", f"dynamodb:{rest}"),
        archive=options.get("archive") or None,
    )


def make_client(location: DynamoDBLocation) -> Any:
    """A DynamoDB client; credentials come from the standard AWS chain.

    botocore's own retries are off: :func:`call` retries throttling with jittered backoff.
    """
    session = boto3.session.Session()
    region = location.region or session.region_name or DEFAULT_REGION
    config = Config(
        retries={"total_max_attempts": 1},
        connect_timeout=5,
        read_timeout=60,
        max_pool_connections=32,
    )
    try:
        return session.client("dynamodb", endpoint_url=location.endpoint_url, region_name=region,
                              config=config)
    except (ValueError, NoRegionError) as exc:
        raise StoreError(f"cannot open a DynamoDB client for {location.where}: {exc}") from exc


def backoff_s(attempt: int, base_s: float = 0.05, cap_s: float = 2.0) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0.0, min(cap_s, base_s * (2 ** attempt)))


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _client_error_message(exc: ClientError) -> str:
    message = str(exc.response.get("Error", {}).get("Message", ""))
    if message.startswith("<?xml"):
        return ""
    return message


def translate_error(exc: Exception, location: DynamoDBLocation, operation: str) -> StoreError:
    """A :class:`StoreError` that says what went wrong and what to do, never naming secrets."""
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, *_TRANSIENT_NETWORK_ERRORS)):
        return StoreUnreachableError(
            f"DynamoDB endpoint {location.where} is unreachable ({type(exc).__name__} during "
            f"{operation} on table {location.table!r}); check endpoint_url/region"
        )
    if isinstance(exc, NoCredentialsError):
        return StoreError(
            f"no AWS credentials found for DynamoDB at {location.where}; set them through the "
            "standard chain (AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws, a role)"
        )
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "ResourceNotFoundException":
            return MissingTableError(
                f"DynamoDB table {location.table!r} does not exist at {location.where}; create it "
                f"with `lorien warehouse dynamodb create {location.table}"
                + (f" --endpoint-url {location.where}" if location.endpoint_url else "")
                + (f" --region {location.region}" if location.region else "") + "`"
            )
        if code in CREDENTIAL_CODES or status in (401, 403):
            return StoreError(
                f"AWS credentials were rejected by DynamoDB at {location.where} ({code or status} "
                f"during {operation}); check the standard credential chain (AWS_PROFILE, "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws/credentials)"
            )
        detail = _client_error_message(exc)
        return StoreError(
            f"DynamoDB {operation} on table {location.table!r} at {location.where} failed: "
            f"{code}{': ' + detail if detail else ''}"
        )
    return StoreError(f"DynamoDB {operation} on table {location.table!r} at {location.where} "
                      f"failed: {type(exc).__name__}")


def call(client: Any, location: DynamoDBLocation, operation: str, max_attempts: int = 10,
         **kwargs: Any) -> dict[str, Any]:
    """Call ``client.<operation>(**kwargs)``; back off with jitter on throttling.

    ``ConditionalCheckFailedException`` is re-raised as is (the caller merges and retries);
    every other failure becomes a :class:`StoreError` naming the table and endpoint.
    """
    method = getattr(client, operation)
    for attempt in range(max_attempts):
        try:
            return method(**kwargs)
        except ClientError as exc:
            code = error_code(exc)
            if code == "ConditionalCheckFailedException":
                raise
            if code in THROTTLING_CODES and attempt + 1 < max_attempts:
                delay = backoff_s(attempt)
                log.info("DynamoDB %s throttled (%s); retrying in %.3f s", operation, code, delay)
                time.sleep(delay)
                continue
            raise translate_error(exc, location, operation) from None
        except _TRANSIENT_NETWORK_ERRORS as exc:
            if attempt + 1 < min(max_attempts, 3):
                time.sleep(backoff_s(attempt))
                continue
            raise translate_error(exc, location, operation) from None
        except (BotoCoreError, NoCredentialsError) as exc:
            raise translate_error(exc, location, operation) from None
    raise AssertionError("unreachable")  # pragma: no cover - the loop always returns or raises


def paginate(client: Any, location: DynamoDBLocation, operation: str,
             **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Items of a query or scan, page after page (``LastEvaluatedKey``)."""
    start_key = None
    while True:
        if start_key is not None:
            kwargs["ExclusiveStartKey"] = start_key
        page = call(client, location, operation, **kwargs)
        yield from page.get("Items", [])
        start_key = page.get("LastEvaluatedKey")
        if not start_key:
            return

