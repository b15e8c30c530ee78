"""Object stores: where Mink's data lives.

    store = open_object_store("s3://bucket/prefix" | "file:///abs/path" | "memory://[name]")
    await store.check()          # at start-up: a clear ObjectStoreConfigError if misconfigured
    await store.create(key, [header, batch1, batch2])   # create-if-absent, scatter-gather
    await store.get(key, start, end)                    # a byte range
    await store.aclose()

S3 runs through trio_asyncio: open `trio_asyncio.open_loop()` first (a node does, at start-up).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from .base import (
    Data,
    ObjectExists,
    ObjectNotFound,
    ObjectRange,
    ObjectStore,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectStoreUnavailable,
    RetryPolicy,
)
from .file import FileObjectStore
from .memory import MemoryObjectStore
from .testing import FaultyObjectStore, LatencyObjectStore

if TYPE_CHECKING:
    from .s3 import S3ObjectStore

__all__ = [
    "Data",
    "FaultyObjectStore",
    "FileObjectStore",
    "LatencyObjectStore",
    "MemoryObjectStore",
    "ObjectRange",
    "ObjectExists",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreConfigError",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "RetryPolicy",
    "S3ObjectStore",
    "open_object_store",
]

_FALSE = {"0", "false", "no", "off"}


def open_object_store(
    url: str,
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
) -> ObjectStore:
    """The store for `url`. No I/O happens here: call `check()` to validate the configuration.

    - `memory://` a private dict; `memory://<name>` one dict shared by all stores of that name
      in this process.
    - `file:///abs/path` a folder (must exist); `?fsync=false` skips fsync (tests only);
      `?direct=false` writes through the page cache even where O_DIRECT works.
    - `s3://bucket/prefix`: endpoint, region and credentials from the arguments, else from
      AWS_ENDPOINT_URL(_S3), AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID /
      AWS_SECRET_ACCESS_KEY (or botocore's other sources). The other arguments apply to S3 only.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        return MemoryObjectStore(parts.netloc + parts.path or None)
    if scheme == "file" or (not scheme and url.startswith("/")):
        if parts.netloc not in ("", "localhost"):
            raise ObjectStoreConfigError(
                f"file:// URL {url!r} names host {parts.netloc!r}: write an absolute path, file:///abs/path"
            )
        options = parse_qs(parts.query)
        fsync = options.get("fsync", ["true"])[-1].lower() not in _FALSE
        direct = options.get("direct", ["true"])[-1].lower() not in _FALSE
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ObjectStoreConfigError(f"file:// URL {url!r} needs an absolute path: file:///abs/path")
        return FileObjectStore(os.path.normpath(path), fsync=fsync, direct=direct)
    if scheme == "s3":
        from .s3 import S3ObjectStore

        return S3ObjectStore(
            parts.netloc,
            unquote(parts.path).lstrip("/"),
            endpoint_url=endpoint_url,
            region=region,
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
            retry=retry,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            list_page_size=list_page_size,
        )
    raise ObjectStoreConfigError(
        f"unsupported object store URL {url!r}: use s3://bucket/prefix, file:///abs/path or memory://"
    )


def __getattr__(name: str) -> Any:
    if name == "S3ObjectStore":  # imported on demand: aiobotocore is slow to import
        from .s3 import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
