"""s3://bucket/prefix — S3 (or a compatible service) through aiobotocore and trio_asyncio.

The caller runs inside `trio_asyncio.open_loop()` (a node opens it once at start-up). Every
operation crosses into asyncio once per request: one coroutine function below does the whole
request, reading the body included, and the retry loop with its back-off sleeps runs on the
trio side. The aiobotocore client is created on first use (or by `check()`), inside the asyncio
loop, and closed by `aclose()`; botocore's own retries are off, ours apply.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import botocore.exceptions as bex
import trio
import trio_asyncio
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from .base import (
    Data,
    ObjectExists,
    ObjectNotFound,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectStoreUnavailable,
    RetryPolicy,
    as_buffers,
    check_key,
    check_range,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# Error codes worth another attempt (besides any 5xx and 429).
_RETRIABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",  # 400: the service gave up waiting for our upload
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",  # 409: a conflicting operation is in progress, try again
        "ConditionalRequestConflict",  # 409: concurrent conditional writes, try again
    }
)
_AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AccountProblem",
    }
)
# Failures of the connection or of the response stream (reset, timeout, truncated body).
_TRANSIENT_EXCEPTIONS = (
    bex.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ...
    bex.HTTPClientError,  # ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
    bex.IncompleteReadError,
    bex.FlexibleChecksumError,  # a body corrupted on the way
    aiohttp.ClientError,
    asyncio.TimeoutError,
    TimeoutError,
    OSError,
)


class S3ObjectStore:
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        retry: RetryPolicy | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_pool_connections: int = 64,
        list_page_size: int = 1000,
    ) -> None:
        if not bucket:
            raise ObjectStoreConfigError("s3:// URL without a bucket: write s3://<bucket>/<prefix>")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix.lstrip("/")
        self.endpoint_url = (
            endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        )
        self.region = (
            region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        )
        if (access_key_id is None) != (secret_access_key is None):
            raise ObjectStoreConfigError("give both access_key_id and secret_access_key, or neither")
        self.retry = retry or RetryPolicy()
        self.list_page_size = list_page_size
        # None until check() has tried it: does the service refuse If-None-Match: * on an
        # existing key? (AWS S3 and moto do; some S3-compatible servers ignore it.)
        self.conditional_create_enforced: bool | None = None
        self._client_kwargs: dict[str, Any] = dict(
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            config=AioConfig(
                # A local endpoint has no per-bucket DNS names.
                s3={"addressing_style": "path"} if self.endpoint_url else {},
                max_pool_connections=max_pool_connections,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                retries={"total_max_attempts": 1},  # no retries inside botocore: ours apply
                user_agent_extra="mink",
            ),
        )
        if access_key_id is not None:
            self._client_kwargs.update(
                aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key
            )
        self._session = get_session()
        self._client: Any = None
        self._client_cm: Any = None
        self._client_lock = trio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3ObjectStore('s3://{self.bucket}/{self.prefix}'{where})"

    async def __aenter__(self) -> S3ObjectStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def client(self) -> Any:
        """The aiobotocore client once created (tests register botocore event handlers on it)."""
        return self._client

    # -- plumbing --

    async def _ensure_client(self) -> Any:
        if self._client is not None:
            return self._client
        _require_loop()
        async with self._client_lock:
            if self._closed:
                raise ObjectStoreError("the object store is closed")
            if self._client is None:
                try:
                    self._client_cm, self._client = await trio_asyncio.aio_as_trio(self._open_client)()
                except (ValueError, bex.BotoCoreError) as exc:
                    raise ObjectStoreConfigError(f"cannot create the S3 client for {self!r}: {exc}") from exc
        return self._client

    async def _open_client(self) -> tuple[Any, Any]:  # asyncio side
        cm = self._session.create_client("s3", **self._client_kwargs)
        return cm, await cm.__aenter__()

    async def _call(
        self,
        op: str,
        key: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        attempts: list[int] | None = None,
    ) -> T:
        """Run `fn(client, *args)` in asyncio, retrying transient failures with back-off."""
        if self._closed:
            raise ObjectStoreError("the object store is closed")
        _require_loop()
        client = self._client if self._client is not None else await self._ensure_client()
        run = trio_asyncio.aio_as_trio(fn)
        failures = 0
        while True:
            if attempts is not None:
                attempts[0] += 1
            try:
                return await run(client, *args)
            except Exception as exc:
                error = self._translate(op, key, exc)
                if error is not None:
                    raise error from exc
                failures += 1
                if failures >= self.retry.attempts:
                    raise ObjectStoreUnavailable(
                        f"S3 {op} of {self._where(key)} failed {failures} times, last: {_describe(exc)}"
                    ) from exc
                delay = self.retry.delay(failures)
                log.debug("S3 %s of %s failed (%s), retrying in %.3fs", op, key, _describe(exc), delay)
                await trio.sleep(delay)

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def _endpoint(self) -> str:
        return self.endpoint_url or f"AWS S3 ({self.region})"

    def _translate(self, op: str, key: str, exc: Exception) -> ObjectStoreError | None:
        """Our error for `exc`, or None if another attempt may succeed."""
        if isinstance(
            exc, (bex.NoCredentialsError, bex.PartialCredentialsError, bex.CredentialRetrievalError)
        ):
            return ObjectStoreConfigError(
                f"no usable AWS credentials for {self._where('')} ({exc}): pass access_key_id and "
                f"secret_access_key, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        if isinstance(exc, bex.ClientError):
            status, code, message = _error_info(exc)
            if status >= 500 or status == 429 or code in _RETRIABLE_CODES:
                return None
            if op == "create" and (status == 412 or code == "PreconditionFailed"):
                return ObjectExists(key)
            if code == "NoSuchBucket" or (op == "check" and status == 404):
                return ObjectStoreConfigError(
                    f"the bucket {self.bucket!r} does not exist at {self._endpoint()}: "
                    f"create it or fix the s3:// URL"
                )
            if status == 404 or code in ("NoSuchKey", "NotFound"):
                return ObjectNotFound(key)
            if status == 403 or code in _AUTH_CODES:
                return ObjectStoreConfigError(
                    f"S3 refused {op} of {self._where(key)} at {self._endpoint()} ({code}: {message}): "
                    f"check the credentials (access_key_id / AWS_ACCESS_KEY_ID, "
                    f"secret_access_key / AWS_SECRET_ACCESS_KEY) and the bucket's permissions"
                )
            if status == 301 or code in (
                "PermanentRedirect",
                "AuthorizationHeaderMalformed",
                "IllegalLocationConstraintException",
            ):
                return ObjectStoreConfigError(
                    f"the bucket {self.bucket!r} is not in region {self.region} ({code}: {message}): "
                    f"set the region (AWS_REGION) to the bucket's"
                )
            return ObjectStoreError(f"S3 {op} of {self._where(key)}: {code} (HTTP {status}): {message}")
        if isinstance(exc, _TRANSIENT_EXCEPTIONS):
            return None
        return ObjectStoreError(f"S3 {op} of {self._where(key)} failed: {_describe(exc)}")

    # -- operations --

    async def create(self, key: str, data: Data) -> None:
        check_key(key)
        body = data if isinstance(data, bytes) else b"".join(as_buffers(data))
        full = self.prefix + key
        attempts = [0]
        try:
            await self._call("create", key, _put, self.bucket, full, body, attempts=attempts)
        except ObjectExists:
            if attempts[0] == 1:
                raise
            # A retry was refused: an earlier attempt of this very call may have stored the
            # object and only its response got lost. Keys are unique per writer (a WAL key
            # carries node, node epoch and sequence number), so nobody else creates this key;
            # an object of our size is taken to be ours. Comparing content would cost a GET;
            # the size costs a HEAD, on this rare path only.
            try:
                stored = await self._call("head", key, _head, self.bucket, full)
            except ObjectNotFound:
                raise ObjectExists(key) from None
            if stored != len(body):
                raise
            log.info("S3 create of %s: a retry found the object of an earlier attempt", self._where(key))

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(start, end)
        full = self.prefix + key
        if end is not None and end <= start:
            await self._call("get", key, _head, self.bucket, full)  # still ObjectNotFound if missing
            return b""
        if start == 0 and end is None:
            byte_range = None
        else:
            byte_range = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
        data, ranged = await self._call("get", key, _get, self.bucket, full, byte_range)
        if byte_range is not None and not ranged:
            data = data[start:end]  # the service ignored the Range header
        return data

    async def delete(self, key: str) -> None:
        check_key(key)
        await self._call("delete", key, _delete, self.bucket, self.prefix + key)

    async def delete_many(self, keys: list[str]) -> None:
        """Delete up to 1000 keys in one DeleteObjects request (absent keys are no error)."""
        for key in keys:
            check_key(key)
        for start in range(0, len(keys), 1000):
            batch = [self.prefix + k for k in keys[start:start + 1000]]
            await self._call("delete", batch[0], _delete_many, self.bucket, batch)

    async def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        full_prefix = self.prefix + prefix
        full_start = None if start_after is None else self.prefix + start_after
        cut = len(self.prefix)
        keys: list[str] = []
        token: str | None = None
        while True:  # one request (and one crossing) per page, each retried on its own
            page, token = await self._call(
                "list", prefix, _list_page, self.bucket, full_prefix, token, self.list_page_size,
                full_start,
            )
            keys.extend(k[cut:] for k in page)
            if token is None:
                return keys  # S3 lists in UTF-8 binary order, which is str order

    async def check(self) -> None:
        try:
            await self._check()
        except ObjectStoreUnavailable as exc:
            raise ObjectStoreConfigError(
                f"cannot reach the S3 endpoint {self._endpoint()} "
                f"({_describe(exc.__cause__ or exc)}): "
                f"check endpoint_url / AWS_ENDPOINT_URL and that the service is up"
            ) from exc

    async def _check(self) -> None:
        await self._ensure_client()
        await self._call("check", "", _head_bucket, self.bucket)
        await self._call("list", "", _list_page, self.bucket, self.prefix, None, 1)
        probe = f".mink-check-{secrets.token_hex(8)}"
        await self.create(probe, b"mink")
        try:
            try:
                await self._call("create", probe, _put, self.bucket, self.prefix + probe, b"mink")
            except ObjectExists:
                self.conditional_create_enforced = True
            else:
                self.conditional_create_enforced = False
                log.warning(
                    "%s does not refuse PUT with If-None-Match: * on an existing key; objects are still "
                    "safe because every writer uses its own keys",
                    self._endpoint(),
                )
            if await self.get(probe) != b"mink":
                raise ObjectStoreConfigError(f"an object written to {self._where(probe)} did not read back")
        finally:
            await self.delete(probe)

    async def aclose(self) -> None:
        self._closed = True
        cm, self._client_cm, self._client = self._client_cm, None, None
        if cm is not None:
            if trio_asyncio.current_loop.get() is None:
                log.warning(
                    "%r closed after its trio_asyncio loop: its connections were not closed cleanly", self
                )
                return
            with trio.CancelScope(shield=True):
                await trio_asyncio.aio_as_trio(cm.__aexit__)(None, None, None)


def _require_loop() -> None:
    if trio_asyncio.current_loop.get() is None:
        raise ObjectStoreError(
            "the s3:// store runs aiobotocore through trio_asyncio: "
            "call it inside `async with trio_asyncio.open_loop():`"
        )


# -- the asyncio side: one coroutine per request --


async def _put(client: Any, bucket: str, key: str, body: bytes, conditional: bool = True) -> None:
    if conditional:
        await client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
    else:
        await client.put_object(Bucket=bucket, Key=key, Body=body)


async def _get(client: Any, bucket: str, key: str, byte_range: str | None) -> tuple[bytes, bool]:
    try:
        if byte_range is None:
            response = await client.get_object(Bucket=bucket, Key=key)
        else:
            response = await client.get_object(Bucket=bucket, Key=key, Range=byte_range)
    except bex.ClientError as exc:
        if _error_info(exc)[1] == "InvalidRange":  # starts at or past the end: like a slice
            return b"", True
        raise
    async with response["Body"] as body:
        data = await body.read()
    return data, "ContentRange" in response


async def _head(client: Any, bucket: str, key: str) -> int:
    response = await client.head_object(Bucket=bucket, Key=key)
    return response["ContentLength"]


async def _delete(client: Any, bucket: str, key: str) -> None:
    await client.delete_object(Bucket=bucket, Key=key)


async def _delete_many(client: Any, bucket: str, keys: list[str]) -> None:
    response = await client.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
    errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
    if errors:
        raise ObjectStoreUnavailable(f"DeleteObjects failed for {len(errors)} keys: "
                                     f"{errors[0].get('Code')} {errors[0].get('Message')}")


async def _list_page(
    client: Any, bucket: str, prefix: str, token: str | None, page_size: int,
    start_after: str | None = None,
) -> tuple[list[str], str | None]:
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
    if token is not None:
        kwargs["ContinuationToken"] = token
    elif start_after is not None:  # S3 ignores StartAfter once a token is given
        kwargs["StartAfter"] = start_after
    response = await client.list_objects_v2(**kwargs)
    keys = [item["Key"] for item in response.get("Contents", ())]
    return keys, response.get("NextContinuationToken") if response.get("IsTruncated") else None


async def _head_bucket(client: Any, bucket: str) -> None:
    await client.head_bucket(Bucket=bucket)


def _error_info(exc: bex.ClientError) -> tuple[int, str, str]:
    response = exc.response or {}
    error = response.get("Error", {})
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    code = str(error.get("Code", "") or status)
    return int(status), code, str(error.get("Message", ""))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
