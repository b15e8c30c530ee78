"""S3 endpoint (moto server) for the tests.

Fixtures:
- `s3_endpoint` (session): starts moto's server on a free loopback port and yields its URL,
  e.g. "http://127.0.0.1:43121". For the whole session it sets dummy credentials and a region
  in os.environ (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY = "testing", AWS_DEFAULT_REGION /
  AWS_REGION = "us-east-1") and restores the previous values at the end: subprocess nodes started
  by later tests inherit them, and a developer's real credentials can never reach moto (nor
  moto's dummy ones a real service: the endpoint is never put in the environment, pass it
  explicitly, see `s3_options`).
- `s3_bucket_url` (function): a new, empty bucket; yields "s3://<bucket>/mink" and empties and
  removes the bucket afterwards.

Helpers:
- `s3_options(endpoint)`: the keyword arguments for `open_object_store` to reach the endpoint.
- `canned_s3_error(status, code)`: an S3 error response, as a botocore `before-send` handler returns it
  instead of sending the request; `S3Faults` installs such a handler on a store (retry tests).
"""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

REGION = "us-east-1"
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"
_ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
    "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
}
_bucket_counter = itertools.count()


def s3_options(endpoint: str) -> dict[str, Any]:
    """Keyword arguments for `open_object_store(url, **s3_options(endpoint))`."""
    return {
        "endpoint_url": endpoint,
        "region": REGION,
        "access_key_id": ACCESS_KEY_ID,
        "secret_access_key": SECRET_ACCESS_KEY,
    }


def boto3_client(endpoint: str) -> Any:
    """A plain (sync) boto3 S3 client for fixtures and assertions."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    saved_env = {name: os.environ.get(name) for name in _ENV}
    os.environ.update(_ENV)
    werkzeug_log = logging.getLogger("werkzeug")  # one INFO line per request otherwise
    saved_level = werkzeug_log.level
    werkzeug_log.setLevel(logging.WARNING)
    # Port 0: the server binds a free port itself (no race with another process).
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        werkzeug_log.setLevel(saved_level)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def s3_bucket_url(s3_endpoint: str) -> Iterator[str]:
    bucket = f"mink-test-{os.getpid()}-{next(_bucket_counter)}-{uuid.uuid4().hex[:6]}"
    client = boto3_client(s3_endpoint)
    client.create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/mink"
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            objects = [{"Key": item["Key"]} for item in page.get("Contents", ())]
            if objects:
                client.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
        client.delete_bucket(Bucket=bucket)
    except Exception:  # a test may have removed it; moto forgets everything at the end anyway
        pass
    finally:
        client.close()


# -- fault injection below the S3 store's retry loop --


class _CannedBody:
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def read(self) -> bytes:
        return self._data


def canned_s3_error(status: int, code: str, message: str = "injected by the test") -> Any:
    """An aiobotocore response with an S3 XML error, as `before-send` handlers return it."""
    from aiobotocore.awsrequest import AioAWSResponse
    from botocore.awsrequest import HTTPHeaders

    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><RequestId>mink-test</RequestId></Error>"
    ).encode()
    headers = HTTPHeaders()
    headers["Content-Type"] = "application/xml"
    headers["Content-Length"] = str(len(body))
    return AioAWSResponse("http://injected", status, headers, _CannedBody(body))


class S3Faults:
    """Intercepts requests of an S3ObjectStore's client before they are sent.

        faults = await S3Faults.install(store)
        faults.fail("PutObject", 2, status=503, code="SlowDown")   # next two PUTs get a 503
        faults.fail("GetObject", None, exc=...)                     # every GET raises
        faults.sent["PutObject"]                                    # requests seen, per operation

    A factory given as `exc` may also return a response (e.g. store the object behind the
    client's back with boto3, then answer 503, to fake a lost response).
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.sent: dict[str, int] = {}
        self._rules: list[list[Any]] = []  # [operation, remaining or None, response-or-exception factory]

    @classmethod
    async def install(cls, store: Any) -> S3Faults:
        client = await store._ensure_client()
        faults = cls(store)
        client.meta.events.register("before-send.s3.*", faults._handler)
        return faults

    def fail(
        self,
        operation: str,
        n: int | None = 1,
        *,
        status: int = 503,
        code: str = "SlowDown",
        exc: Callable[[], Any] | None = None,
    ) -> None:
        make = exc if exc is not None else (lambda: canned_s3_error(status, code))
        self._rules.append([operation, n, make])

    def clear(self) -> None:
        self._rules.clear()

    def _handler(self, request: Any, **kwargs: Any) -> Any:
        operation = kwargs["event_name"].rsplit(".", 1)[-1]
        self.sent[operation] = self.sent.get(operation, 0) + 1
        for rule in self._rules:
            if rule[0] in (operation, "*"):
                if rule[1] is not None:
                    rule[1] -= 1
                    if rule[1] <= 0:
                        self._rules.remove(rule)
                result = rule[2]()
                if isinstance(result, BaseException):
                    raise result
                return result
        return None
