"""The object store contract on memory://, file:// and s3:// (moto), plus each backend's own cases."""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
import time
from array import array

import pytest
import trio

from mink.storage.objectstore import (
    FaultyObjectStore,
    FileObjectStore,
    LatencyObjectStore,
    MemoryObjectStore,
    ObjectExists,
    ObjectNotFound,
    ObjectRange,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectStoreUnavailable,
    RetryPolicy,
    open_object_store,
)
from mink.storage.wal import wal_key
from tests.support.s3 import S3Faults, boto3_client, canned_s3_error, s3_options

FAST_RETRY = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


@pytest.fixture(params=["memory", "file", "s3"])
def store_spec(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict]:
    if request.param == "memory":
        return "memory://", {}
    if request.param == "file":
        return f"file://{tmp_path}", {}
    endpoint = request.getfixturevalue("s3_endpoint")
    return request.getfixturevalue("s3_bucket_url"), {**s3_options(endpoint), "retry": FAST_RETRY}


@pytest.fixture
async def store(store_spec, aio_loop):
    url, options = store_spec
    store = open_object_store(url, **options)
    yield store
    await store.aclose()


async def s3_store(url: str, endpoint: str, **options):
    return open_object_store(url, **{**s3_options(endpoint), "retry": FAST_RETRY, **options})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the contract, on every backend --


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", b""),
        (b"hello", b"hello"),
        (bytearray(b"bytearray"), b"bytearray"),
        (memoryview(b"xxview")[2:], b"view"),
        ([b"scatter", memoryview(b"-gather-"), bytearray(b"!")], b"scatter-gather-!"),
        ([], b""),
    ],
)
async def test_create_then_get(store, data, expected):
    await store.create("a/b/c", data)
    got = await store.get("a/b/c")
    assert type(got) is bytes and got == expected


async def test_create_copies_the_callers_buffer(store):
    buf = bytearray(b"before")
    await store.create("k", [memoryview(buf)])
    buf[:] = b"after!"
    assert await store.get("k") == b"before"


@pytest.mark.parametrize(
    "start, end",
    [
        (0, None),
        (5, None),
        (5, 10),
        (0, 1),
        (10239, None),
        (100, 100_000),
        (10240, None),
        (20_000, None),
        (20_000, 30_000),
        (7, 7),
        (9, 3),
        (0, 0),
    ],
)
async def test_ranged_get_is_a_slice(store, start, end):
    blob = bytes(range(256)) * 40
    await store.create("ranged", blob)
    assert await store.get("ranged", start, end) == blob[start:end]


async def test_large_object_and_range(store):
    blob = os.urandom(1 << 20) + bytes(3 << 20)
    await store.create("big", [blob[: 1 << 21], memoryview(blob)[1 << 21 :]])
    assert await store.get("big") == blob
    assert await store.get("big", 1000, 1000 + (1 << 20)) == blob[1000 : 1000 + (1 << 20)]


async def test_create_refuses_an_existing_key(store):
    await store.create("wal/1/1/1", b"first")
    with pytest.raises(ObjectExists):
        await store.create("wal/1/1/1", b"second, longer")
    with pytest.raises(ObjectExists):
        await store.create("wal/1/1/1", b"first")
    assert await store.get("wal/1/1/1") == b"first"


async def test_concurrent_creates_of_one_key_one_wins(store):
    results: dict[int, str] = {}

    async def attempt(i: int) -> None:
        try:
            await store.create("contended", f"writer {i}".encode())
            results[i] = "ok"
        except ObjectExists:
            results[i] = "exists"

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(attempt, i)
    winners = [i for i, r in results.items() if r == "ok"]
    assert len(winners) == 1 and len(results) == 8
    assert await store.get("contended") == f"writer {winners[0]}".encode()


async def test_missing_object(store):
    for args in [(), (0, 10), (5, None), (3, 3)]:
        with pytest.raises(ObjectNotFound):
            await store.get("no/such/key", *args)


async def test_delete_is_idempotent(store):
    await store.create("d/k", b"x")
    await store.delete("d/k")
    await store.delete("d/k")
    await store.delete("never/existed")
    with pytest.raises(ObjectNotFound):
        await store.get("d/k")
    assert await store.list("d/") == []
    await store.create("d/k", b"again")  # a deleted key can be created anew
    assert await store.get("d/k") == b"again"


async def test_list_by_prefix(store):
    keys = ["wal/1/1/00000001", "wal/1/1/00000002", "wal/1/2/x", "wal/10/1/y", "streams/t-0/a", "top"]
    for key in keys:
        await store.create(key, b"v")
    assert await store.list("") == sorted(keys)
    assert await store.list("wal/1/") == ["wal/1/1/00000001", "wal/1/1/00000002", "wal/1/2/x"]
    assert await store.list("wal/1") == ["wal/1/1/00000001", "wal/1/1/00000002", "wal/1/2/x", "wal/10/1/y"]
    assert await store.list("wal/1/1/0000000") == ["wal/1/1/00000001", "wal/1/1/00000002"]
    assert await store.list("streams/t-0/a") == ["streams/t-0/a"]
    assert await store.list("t") == ["top"]
    assert await store.list("nope/") == []
    assert await store.list("wal/../") == []


async def test_list_start_after(store):
    keys = [f"wal/1/2/{seq:012d}" for seq in range(1, 16)] + ["wal/1/3/000000000001"]
    for key in keys:
        await store.create(key, b"v")
    if hasattr(store, "list_page_size"):
        store.list_page_size = 4  # StartAfter on the first page only, then the token
    assert await store.list("wal/1/2/", "wal/1/2/000000000009") == keys[9:15]
    assert await store.list("wal/1/", "wal/1/2/000000000015") == keys[15:]
    assert await store.list("wal/1/2/", "wal/1/2/000000000099") == []
    assert await store.list("wal/1/2/", None) == keys[:15]


async def test_list_spans_pages(store):
    if hasattr(store, "list_page_size"):  # s3: small pages instead of >1000 keys
        store.list_page_size = 7
        count = 40
    else:
        count = 1100
    keys = [f"many/{i:05d}" for i in range(count)]
    limiter = trio.CapacityLimiter(32)

    async def create(key: str) -> None:
        async with limiter:
            await store.create(key, b"")

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(create, key)
    await store.create("other/1", b"")
    faults = await S3Faults.install(store) if hasattr(store, "list_page_size") else None
    assert await store.list("many/") == keys
    assert len(await store.list("")) == count + 1
    if faults is not None:
        assert faults.sent["ListObjectsV2"] == 6 + 6  # ceil(40 / 7) pages, twice


async def test_check_passes_on_a_good_store(store):
    await store.check()
    assert await store.list("") == []  # the probe leaves nothing behind


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/", "../x", "a/./b", "a/../b"])
async def test_invalid_keys_are_refused(store, key):
    with pytest.raises(ValueError):
        await store.create(key, b"x")
    with pytest.raises(ValueError):
        await store.get(key)


async def test_a_closed_store_refuses_work(store_spec, aio_loop):
    url, options = store_spec
    store = open_object_store(url, **options)
    await store.create("k", b"v")
    await store.aclose()
    with pytest.raises(ObjectStoreError):
        await store.get("k")
    await store.aclose()  # twice is fine


# -- factory --


@pytest.mark.parametrize(
    "url",
    ["ftp://x/y", "file://relative/path", "file:relative", "s3:///no-bucket", "nothing"],
)
def test_bad_urls_are_config_errors(url):
    with pytest.raises(ObjectStoreConfigError):
        open_object_store(url)


def test_factory_parses_urls(tmp_path):
    file_store = open_object_store(f"file://{tmp_path}/sub/../x?fsync=false")
    assert isinstance(file_store, FileObjectStore)
    assert file_store.root == f"{tmp_path}/x" and file_store.fsync is False
    assert open_object_store(f"file://{tmp_path}").fsync is True
    s3 = open_object_store("s3://bucket/some/prefix", endpoint_url="http://127.0.0.1:1")
    assert (s3.bucket, s3.prefix) == ("bucket", "some/prefix/")
    assert open_object_store("s3://bucket").prefix == ""


async def test_named_memory_stores_share_objects():
    a, b = open_object_store("memory://shared-test"), open_object_store("memory://shared-test")
    private = open_object_store("memory://")
    await a.create("k", b"v")
    assert await b.get("k") == b"v"
    assert await private.list("") == []


def test_retry_policy_backoff_has_full_jitter():
    policy = RetryPolicy(attempts=5, base_delay=0.1, max_delay=0.5)
    for failures, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (60, 0.5)]:
        delays = [policy.delay(failures) for _ in range(200)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > cap / 2  # spread over the whole interval
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


# -- file:// --


async def test_file_layout_and_no_leftovers(tmp_path):
    store = FileObjectStore(str(tmp_path))
    await store.create("wal/3/7/00000042", [b"ab", b"cd"])
    assert (tmp_path / "wal/3/7/00000042").read_bytes() == b"abcd"
    with pytest.raises(ObjectExists):
        await store.create("wal/3/7/00000042", b"other")
    assert sorted(p.name for p in (tmp_path / "wal/3/7").iterdir()) == ["00000042"]
    (tmp_path / "wal/3/7/.mink-tmp-deadbeef").write_bytes(b"crash leftover")
    assert await store.list("") == ["wal/3/7/00000042"]
    with pytest.raises(ValueError):
        await store.create("wal/.mink-tmp-x", b"reserved")


def _record_syncs(monkeypatch) -> list[int]:
    """The file store's fdatasyncs from now on, as the size of the file at each (a small
    object's create by Python's calls, which can be watched, not the compiled one's)."""
    from mink.storage.objectstore import file as file_store

    monkeypatch.setattr(file_store, "_create_file", None)
    sizes: list[int] = []
    real_sync = file_store._fdatasync

    def recording_sync(fd):
        sizes.append(os.fstat(fd).st_size)
        real_sync(fd)

    monkeypatch.setattr(file_store, "_fdatasync", recording_sync)
    return sizes


async def test_file_large_objects_are_synced_in_steps(tmp_path, monkeypatch):
    """Through the page cache, an object over 8 MiB is fdatasynced every MiB (a big
    background object must not make the WAL's fsyncs wait for all of its writeback); a
    WAL-sized one once, whole. (Written directly, nothing waits in the page cache: once.)"""
    from mink.storage.objectstore import file as file_store

    synced_at = _record_syncs(monkeypatch)
    store = FileObjectStore(str(tmp_path), direct=False)
    mib = 1024 * 1024
    small = os.urandom(file_store.STEPPED_SYNC_ABOVE)
    await store.create("small", small)
    assert synced_at == [len(small)]

    synced_at.clear()
    pieces = [os.urandom(n) for n in (3, mib - 1, 5 * mib + 7, 1, 3 * mib + 100_000)]
    await store.create("large", pieces)
    whole = b"".join(pieces)
    assert await store.get("large") == whole
    steps = len(whole) // mib
    assert synced_at == [k * mib for k in range(1, steps + 1)] + [len(whole)]

    synced_at.clear()
    await store.create("whole-steps", os.urandom(9 * mib))
    assert synced_at == [k * mib for k in range(1, 10)]

    # A WAL object is a produce's latency: synced once, whole, however large it grew.
    synced_at.clear()
    await store.create(wal_key(1, 2, 3), pieces)
    assert synced_at == [len(whole)]


async def test_file_key_below_an_object(tmp_path):
    store = FileObjectStore(str(tmp_path))
    await store.create("a", b"1")
    with pytest.raises(ObjectStoreError):
        await store.create("a/b", b"2")
    await store.create("d/e", b"3")
    with pytest.raises(ObjectStoreError) as info:
        await store.create("d", b"4")
    assert not isinstance(info.value, ObjectExists)
    with pytest.raises(ObjectNotFound):
        await store.get("d")


async def test_file_check_missing_folder(tmp_path):
    store = open_object_store(f"file://{tmp_path}/missing")
    with pytest.raises(ObjectStoreConfigError, match="does not exist.*mkdir -p"):
        await store.check()
    with pytest.raises(ObjectStoreConfigError, match="does not exist"):
        await store.create("k", b"v")  # the root is never created behind the operator's back
    assert not (tmp_path / "missing").exists()


async def test_file_check_not_a_folder(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ObjectStoreConfigError, match="not a folder"):
        await open_object_store(f"file://{tmp_path}/file").check()


async def test_file_check_unwritable_folder(tmp_path, monkeypatch):
    root = tmp_path / "readonly"
    root.mkdir()
    root.chmod(0o555)
    if os.geteuid() == 0:  # root ignores permissions: refuse creation below `root` as the kernel would
        real_open = os.open

        def refusing_open(path, flags, *args, **kwargs):
            if str(path).startswith(str(root)) and flags & os.O_CREAT:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing_open)
        # the compiled create's open is the kernel's, which lets root in: the Python one
        from mink.storage.objectstore import file as file_store
        monkeypatch.setattr(file_store, "_create_file", None)
    store = open_object_store(f"file://{root}")
    try:
        with pytest.raises(ObjectStoreConfigError, match="cannot write.*make it writable"):
            await store.check()
        with pytest.raises(ObjectStoreConfigError, match="permissions"):
            await store.create("k", b"v")
    finally:
        root.chmod(0o755)


# -- s3:// --


async def test_s3_keys_live_under_the_prefix(s3_endpoint, s3_bucket_url, aio_loop):
    bucket = s3_bucket_url.removeprefix("s3://").split("/")[0]
    a = await s3_store(f"s3://{bucket}/node-a", s3_endpoint)
    b = await s3_store(f"s3://{bucket}/node-b/", s3_endpoint)
    try:
        await a.create("wal/1", b"a")
        await b.create("wal/1", b"b")
        assert await a.list("") == ["wal/1"] and await a.get("wal/1") == b"a"
        assert await b.list("wal/") == ["wal/1"] and await b.get("wal/1") == b"b"
        keys = [o["Key"] for o in boto3_client(s3_endpoint).list_objects_v2(Bucket=bucket)["Contents"]]
        assert keys == ["node-a/wal/1", "node-b/wal/1"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_s3_check_missing_bucket(s3_endpoint, aio_loop):
    store = await s3_store("s3://no-such-bucket-here/x", s3_endpoint)
    try:
        with pytest.raises(ObjectStoreConfigError, match="'no-such-bucket-here' does not exist"):
            await store.check()
        with pytest.raises(ObjectStoreConfigError, match="does not exist"):
            await store.create("k", b"v")
    finally:
        await store.aclose()


async def test_s3_check_dead_endpoint(aio_loop):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    store = await s3_store("s3://bucket/x", endpoint, connect_timeout=1.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreConfigError, match=f"cannot reach the S3 endpoint {endpoint}"):
            await store.check()
        with pytest.raises(ObjectStoreUnavailable, match="failed 3 times"):
            await store.get("k")
        assert time.monotonic() - t0 < 5
    finally:
        await store.aclose()


async def test_s3_check_refused_credentials(s3_endpoint, s3_bucket_url, aio_loop):
    store = await s3_store(s3_bucket_url, s3_endpoint)
    try:
        faults = await S3Faults.install(store)
        faults.fail("HeadBucket", None, status=403, code="403")  # a HEAD error has no body
        with pytest.raises(ObjectStoreConfigError, match="check the credentials"):
            await store.check()
        faults.clear()
        faults.fail("PutObject", None, status=403, code="InvalidAccessKeyId")
        with pytest.raises(ObjectStoreConfigError, match="InvalidAccessKeyId"):
            await store.check()
        assert faults.sent["PutObject"] == 1  # not retried
    finally:
        await store.aclose()


async def test_s3_check_without_credentials(s3_endpoint, s3_bucket_url, aio_loop, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = open_object_store(s3_bucket_url, endpoint_url=s3_endpoint, retry=FAST_RETRY)
    try:
        with pytest.raises(ObjectStoreConfigError, match="AWS_ACCESS_KEY_ID"):
            await store.check()
    finally:
        await store.aclose()


async def test_s3_conditional_create_is_enforced_by_moto(s3_endpoint, s3_bucket_url, aio_loop):
    store = await s3_store(s3_bucket_url, s3_endpoint)
    try:
        await store.check()
        assert store.conditional_create_enforced is True
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    "operation, status, code",
    [
        ("PutObject", 503, "SlowDown"),
        ("PutObject", 500, "InternalError"),
        ("GetObject", 503, "SlowDown"),
        ("GetObject", 400, "RequestTimeout"),
        ("ListObjectsV2", 502, "BadGateway"),
    ],
)
async def test_s3_transient_errors_are_retried(s3_endpoint, s3_bucket_url, aio_loop, operation, status, code):
    store = await s3_store(s3_bucket_url, s3_endpoint)
    try:
        faults = await S3Faults.install(store)
        if operation != "PutObject":
            await store.create("k", b"value")
        faults.fail(operation, 2, status=status, code=code)
        sent_before = faults.sent.get(operation, 0)
        if operation == "PutObject":
            await store.create("k", b"value")
        elif operation == "GetObject":
            assert await store.get("k", 1, 3) == b"al"
        else:
            assert await store.list("") == ["k"]
        assert faults.sent[operation] - sent_before == 3
        assert await store.get("k") == b"value"
    finally:
        await store.aclose()


async def test_s3_connection_errors_are_retried(s3_endpoint, s3_bucket_url, aio_loop):
    from botocore.exceptions import (
        ConnectionClosedError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    store = await s3_store(s3_bucket_url, s3_endpoint)
    try:
        faults = await S3Faults.install(store)
        faults.fail("PutObject", 1, exc=lambda: EndpointConnectionError(endpoint_url=s3_endpoint))
        faults.fail("PutObject", 1, exc=lambda: ConnectionClosedError(endpoint_url=s3_endpoint))
        await store.create("k", b"value")
        faults.fail("GetObject", 2, exc=lambda: ReadTimeoutError(endpoint_url=s3_endpoint))
        assert await store.get("k") == b"value"
        assert faults.sent == {"PutObject": 3, "GetObject": 3}
    finally:
        await store.aclose()


async def test_s3_retries_are_exhausted_in_bounded_time(s3_endpoint, s3_bucket_url, aio_loop):
    policy = RetryPolicy(attempts=4, base_delay=0.05, max_delay=0.1)
    store = await s3_store(s3_bucket_url, s3_endpoint, retry=policy)
    try:
        faults = await S3Faults.install(store)
        faults.fail("*", None, status=503, code="SlowDown")
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreUnavailable, match="failed 4 times.*SlowDown"):
            await store.create("k", b"v")
        assert time.monotonic() - t0 < 0.05 + 0.1 + 0.1 + 1.0  # the back-off sleeps + slack
        assert faults.sent["PutObject"] == 4
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    "operation, status, code, error",
    [
        ("GetObject", 404, "NoSuchKey", ObjectNotFound),
        ("GetObject", 403, "AccessDenied", ObjectStoreConfigError),
        ("PutObject", 412, "PreconditionFailed", ObjectExists),
        ("PutObject", 400, "InvalidArgument", ObjectStoreError),
        ("DeleteObject", 404, "NoSuchBucket", ObjectStoreConfigError),
    ],
)
async def test_s3_client_errors_are_not_retried(
    s3_endpoint, s3_bucket_url, aio_loop, operation, status, code, error
):
    store = await s3_store(s3_bucket_url, s3_endpoint)
    try:
        faults = await S3Faults.install(store)
        faults.fail(operation, None, status=status, code=code)
        with pytest.raises(error) as info:
            if operation == "GetObject":
                await store.get("k")
            elif operation == "PutObject":
                await store.create("k", b"v")
            else:
                await store.delete("k")
        assert not isinstance(info.value, ObjectStoreUnavailable)
        assert faults.sent[operation] == 1
    finally:
        await store.aclose()


@pytest.mark.parametrize("stored, outcome", [(b"12345", None), (b"other size", ObjectExists)])
async def test_s3_create_whose_lost_first_attempt_landed(
    s3_endpoint, s3_bucket_url, aio_loop, stored, outcome
):
    """The first PUT stores the object but its answer is lost (here: replaced by a 503)."""
    store = await s3_store(s3_bucket_url, s3_endpoint)
    sync = boto3_client(s3_endpoint)
    try:
        faults = await S3Faults.install(store)

        def land_then_fail():
            sync.put_object(Bucket=store.bucket, Key=store.prefix + "wal/1", Body=stored)
            return canned_s3_error(503, "SlowDown")

        faults.fail("PutObject", 1, exc=land_then_fail)
        if outcome is None:
            await store.create("wal/1", b"12345")  # same size: our own earlier attempt
        else:
            with pytest.raises(outcome):
                await store.create("wal/1", b"12345")
        assert faults.sent == {"PutObject": 2, "HeadObject": 1}
        # A refusal on the first attempt never counts as success, whatever the size.
        with pytest.raises(ObjectExists):
            await store.create("wal/1", stored)
    finally:
        sync.close()
        await store.aclose()


# -- LatencyObjectStore, FaultyObjectStore --


async def test_latency_store_delays_each_request_concurrently(autojump_clock):
    store = LatencyObjectStore(MemoryObjectStore(), mean_s=0.020, jitter_s=0.010)
    t0 = trio.current_time()
    await store.create("k", b"v")
    assert 0.010 <= trio.current_time() - t0 <= 0.030
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(store.create, f"k{i}", b"v")
    assert trio.current_time() - t0 <= 0.030  # overlapping, not serialized
    assert await store.get("k") == b"v"
    assert len(await store.list("k")) == 51
    await store.delete("k")
    assert dict(store.counts) == {"create": 51, "get": 1, "list": 1, "delete": 1}


async def test_latency_store_bandwidth(autojump_clock):
    store = LatencyObjectStore(MemoryObjectStore(), mean_s=0.010, jitter_s=0.0, bytes_per_s=1e6)
    t0 = trio.current_time()
    await store.create("k", [bytes(500_000), memoryview(bytes(500_000))])
    assert trio.current_time() - t0 == pytest.approx(1.010)
    t0 = trio.current_time()
    await store.get("k", 0, 100_000)
    assert trio.current_time() - t0 == pytest.approx(0.110)


async def test_faulty_store_fail_next():
    store = FaultyObjectStore(MemoryObjectStore())
    store.fail_next("create", 2)
    for _ in range(2):
        with pytest.raises(ObjectStoreUnavailable, match="injected"):
            await store.create("k", b"v")
    with pytest.raises(ObjectNotFound):
        await store.get("k")
    await store.create("k", b"v")
    assert await store.get("k") == b"v"
    store.fail_next("get", exc=ObjectNotFound("gone"))
    with pytest.raises(ObjectNotFound, match="gone"):
        await store.get("k")
    store.fail_next("delete", key="other")
    await store.delete("k")  # another key: not affected
    with pytest.raises(ObjectStoreUnavailable):
        await store.delete("other")
    assert store.calls == [("create", "k")] * 2 + [("get", "k"), ("create", "k")] + [("get", "k")] * 2 + [
        ("delete", "k"),
        ("delete", "other"),
    ]


async def test_faulty_store_fail_after_the_operation_took_effect():
    store = FaultyObjectStore(MemoryObjectStore())
    store.fail_next("create", after=True)
    with pytest.raises(ObjectStoreUnavailable):
        await store.create("k", b"v")
    assert await store.get("k") == b"v"  # the upload landed, its answer was "lost"


async def test_faulty_store_predicate_and_removal():
    store = FaultyObjectStore(MemoryObjectStore())
    remove = store.fail_when(
        lambda op, key: key.startswith("wal/"), exc=lambda op, key: ObjectStoreError(f"{op}:{key}")
    )
    for _ in range(3):
        with pytest.raises(ObjectStoreError, match="create:wal/1"):
            await store.create("wal/1", b"v")
    await store.create("streams/1", b"v")
    remove()
    await store.create("wal/1", b"v")
    store.fail_next("*", 1)
    with pytest.raises(ObjectStoreUnavailable):
        await store.list("")
    assert await store.list("") == ["streams/1", "wal/1"]
    with pytest.raises(ValueError):
        store.fail_next("put")


async def test_faulty_store_stall():
    store = FaultyObjectStore(MemoryObjectStore())
    release = trio.Event()
    store.stall("create", release, n=1)
    done = trio.Event()

    async def create() -> None:
        await store.create("k", b"v")
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(create)
        await trio.sleep(0.01)
        assert not done.is_set()
        with pytest.raises(ObjectNotFound):
            await store.get("k")
        release.set()
    assert await store.get("k") == b"v"


@pytest.fixture(params=["compiled", "python"])
def range_copy(request, monkeypatch) -> str:
    """A direct compose's copy of ranges by the compiled helper (built by `pip install -e .`,
    as the tests' install does) or, where it was not built, in Python."""
    from mink.storage.objectstore import file as file_store

    if request.param == "compiled":
        assert file_store._range_copy is not None, "the compiled _range_copy was not built"
    else:
        monkeypatch.setattr(file_store, "_range_copy", None)
    return request.param


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct"])
async def test_file_compose_copies_ranges_of_other_objects_between_buffers(tmp_path, monkeypatch,
                                                                           direct, range_copy):
    """compose (tiering's stream objects on file://): buffers and other objects' ranges back
    to back, create-if-absent. Through the page cache: synced a MiB at a time as a large
    create is, the ranges copied by copy_file_range, or through a buffer where the
    filesystem refuses it. Directly (O_DIRECT): the ranges read around the page cache into
    an aligned buffer, the object synced once at its end."""
    from mink.storage.objectstore import file as file_store

    if direct:
        _skip_without_o_direct(tmp_path)
    synced_at = _record_syncs(monkeypatch)
    store = FileObjectStore(str(tmp_path), direct=direct)
    mib = 1024 * 1024
    a, b = os.urandom(3 * mib + 5), os.urandom(2 * mib)
    await store.create("wal/a", a)
    await store.create("wal/b", b)
    synced_at.clear()
    parts = [ObjectRange("wal/a", 7, 3 * mib), b"head", ObjectRange("wal/b", 0, 2 * mib),
             ObjectRange("wal/a", 3 * mib, 3 * mib + 5), ObjectRange("wal/a", 9, 9), b"tail"]
    await store.compose("stream/1", parts)
    whole = a[7:3 * mib] + b"head" + b + a[3 * mib:] + b"tail"
    assert await store.get("stream/1") == whole
    if direct:
        assert synced_at == [len(whole)]
    else:
        assert synced_at == [k * mib for k in range(1, len(whole) // mib + 1)] + [len(whole)]

    with pytest.raises(ObjectExists):
        await store.compose("stream/1", [b"other"])
    with pytest.raises(ObjectNotFound):
        await store.compose("stream/2", [b"x", ObjectRange("wal/missing", 0, 1)])
    with pytest.raises(ObjectStoreError, match="ends before"):
        await store.compose("stream/2", [ObjectRange("wal/b", mib, 2 * mib + 1)])
    with pytest.raises(ValueError):
        await store.compose("stream/2", [ObjectRange("wal/b", 5, 4)])
    assert await store.list("stream/") == ["stream/1"]
    assert sorted(p.name for p in (tmp_path / "stream").iterdir()) == ["1"]  # no temporaries

    def refused(*args):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(file_store, "_copy_file_range", refused)
    await store.compose("stream/3", parts)
    assert await store.get("stream/3") == whole


async def test_file_compose_reads_small_objects_through_the_page_cache(tmp_path, monkeypatch,
                                                                     range_copy):
    """A direct compose reads a range of an object written through the page cache (smaller
    than DIRECT_WRITE_ABOVE: a WAL object of a few flushes' data, which tiering copies within
    a minute, still cached) through the page cache, and one written directly with O_DIRECT:
    reading the cached ones around the cache was a device read for each of a stream
    object's hundreds of ranges, queued with the WAL's own writes."""
    import fcntl

    from mink.storage.objectstore import file as file_store

    _skip_without_o_direct(tmp_path)
    store = FileObjectStore(str(tmp_path), direct=True)
    small, large = os.urandom(file_store.DIRECT_WRITE_ABOVE - 1), os.urandom(3 << 20)
    await store.create("wal/small", small)
    await store.create("wal/large", large)
    read_direct: dict[int, set[bool]] = {}
    preadv = os.preadv

    def recording(fd, buffers, offset, *args):
        size = os.fstat(fd).st_size
        read_direct.setdefault(size, set()).add(
            bool(fcntl.fcntl(fd, fcntl.F_GETFL) & file_store._O_DIRECT))
        return preadv(fd, buffers, offset, *args)

    monkeypatch.setattr(os, "preadv", recording)
    opened = file_store._range_copy.opened() if file_store._range_copy else None
    await store.compose("stream/1", [ObjectRange("wal/small", 3, len(small)),
                                     ObjectRange("wal/large", 5, len(large)),
                                     ObjectRange("wal/small", 0, 3)])
    if range_copy == "python":
        assert read_direct == {len(small): {False}, len(large): {True}}
    else:  # each object opened once: (with O_DIRECT, through the page cache)
        direct_now, cached_now = file_store._range_copy.opened()
        assert (direct_now - opened[0], cached_now - opened[1]) == (1, 1)
    monkeypatch.undo()
    assert await store.get("stream/1") == small[3:] + large[5:] + small[:3]


async def test_file_scan_reads_objects_into_a_buffer_in_a_worker_thread(tmp_path):
    """scan (tiering's batch-header walk on file://): fn gets a reader that fills a buffer
    from any object at any position, short only at the object's end, in a worker thread;
    a missing object raises ObjectNotFound, and fn's own errors come out as they are."""
    store = FileObjectStore(str(tmp_path))
    await store.create("a", b"0123456789")
    await store.create("b/c", b"abcdef")
    main_thread = threading.get_ident()

    def fn(read_into):
        buf = memoryview(bytearray(4))
        out = []
        for key, position in [("a", 2), ("b/c", 0), ("a", 8), ("a", 10), ("b/c", 3)]:
            n = read_into(key, position, buf)
            out.append(bytes(buf[:n]))
        return out, threading.get_ident()

    got, thread = await store.scan(fn)
    assert got == [b"2345", b"abcd", b"89", b"", b"def"] and thread != main_thread
    with pytest.raises(ObjectNotFound):
        await store.scan(lambda read_into: read_into("missing", 0, memoryview(bytearray(1))))

    def fails(read_into):
        raise KeyError("mine")

    with pytest.raises(KeyError):
        await store.scan(fails)


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct"])
async def test_file_compose_paces_its_copy_a_step_at_a_time_on_the_event_loop(tmp_path, direct,
                                                                               range_copy):
    """compose's `pace(n)` runs on the event loop after each MiB written, however many
    ranges it took (tiering spreads a stream object's copy over its round with it: one call
    per row was one event-loop round trip per WAL flush); cancelled while it waits, compose
    leaves no object and no temporary file behind."""
    from mink.storage.objectstore import file as file_store

    store = FileObjectStore(str(tmp_path), direct=direct)
    mib = 1024 * 1024
    await store.create("wal/a", os.urandom(2 * mib + 10))
    asked: list[int] = []
    loop_thread = threading.get_ident()

    async def pace(nbytes: int) -> None:
        assert threading.get_ident() == loop_thread
        asked.append(nbytes)
        await trio.sleep(0)

    small = [ObjectRange("wal/a", i, i + 1000) for i in range(0, mib, 1000)]
    parts = [b"x" * 100, ObjectRange("wal/a", 0, 2 * mib + 10), *small, b"end"]
    await store.compose("stream/1", parts, pace=pace)
    wal = await store.get("wal/a")
    assert await store.get("stream/1") == b"x" * 100 + wal + wal[:len(small) * 1000] + b"end"
    total = 100 + len(wal) + len(small) * 1000 + 3
    assert asked and all(n == file_store.SYNC_STEP_BYTES for n in asked)
    assert len(asked) == total // file_store.SYNC_STEP_BYTES

    held = trio.Event()

    async def stuck(nbytes: int) -> None:
        held.set()
        await trio.sleep_forever()

    with trio.move_on_after(10) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: store.compose("stream/2", parts, pace=stuck))
            await held.wait()
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert await store.list("stream/") == ["stream/1"]
    assert sorted(p.name for p in (tmp_path / "stream").iterdir()) == ["1"]


def _skip_without_o_direct(path) -> None:
    """Skip where the test's folder refuses O_DIRECT (tmpfs): the store falls back there."""
    probe = os.path.join(str(path), "probe-o-direct")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            pytest.skip("this folder's filesystem refuses O_DIRECT")
        raise
    os.close(fd)
    os.unlink(probe)


def test_create_job_makes_an_object_in_the_helpers_threads(tmp_path):
    """The compiled create of a small object: the buffers (any number, empty ones too)
    written to a temporary file that becomes the object only if its name is free; each
    failure says its stage and errno and leaves no temporary file behind. The job's eventfd
    becomes readable when its thread is done, and closing it twice is harmless."""
    import select

    from mink.storage.objectstore import _create_file as cf

    def create(name, buffers, sync=True, parent=tmp_path):
        job = cf.CreateJob(os.fsencode(parent / ".mink-tmp-x"), os.fsencode(parent / name),
                           os.fsencode(parent), buffers, sync)
        fileno = job.fileno
        assert select.select([fileno], [], [], 10)[0] == [fileno]
        outcome = job.result()
        job.close()
        job.close()
        assert job.fileno == -1
        return outcome

    pieces = [os.urandom(n % 7) for n in range(3000)]  # more than one writev's iovecs
    assert create("a", [memoryview(p) for p in pieces]) == (cf.CREATED, 0)
    assert (tmp_path / "a").read_bytes() == b"".join(pieces)
    assert create("empty", [], sync=False) == (cf.CREATED, 0)
    assert (tmp_path / "empty").read_bytes() == b""
    assert create("a", [b"other"]) == (cf.LINK, errno.EEXIST)
    assert (tmp_path / "a").read_bytes() == b"".join(pieces)
    assert create("b", [b"x"], parent=tmp_path / "missing") == (cf.OPEN, errno.ENOENT)
    (tmp_path / "dir").mkdir()
    assert create("dir/", [b"x"])[0] == cf.LINK
    with pytest.raises(TypeError):
        create("c", ["not bytes"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "dir", "empty"]
    # A forked child has none of its parent's threads: its creates start their own.
    child = os.fork()
    if child == 0:
        try:
            os._exit(0 if create("forked", [b"child"]) == (cf.CREATED, 0) else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 10
    while (waited := os.waitpid(child, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    if waited == (0, 0):
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert waited[1] == 0, "the forked child's create did not end"
    assert (tmp_path / "forked").read_bytes() == b"child"


async def test_a_cancelled_create_ends_its_thread_and_leaves_a_whole_object(tmp_path):
    """A small create cancelled while its thread writes: the thread writes from the
    caller's buffers, so the create waits for it (shielded) and the object is whole; after
    many creates, concurrent and cancelled ones among them, no eventfd of theirs is left
    in the process, and no more threads than the helper parks for its creates."""
    from mink.storage.objectstore import _create_file
    from mink.storage.objectstore import file as file_store

    if file_store._create_file is None:
        pytest.skip("the compiled helper was not built")
    store = FileObjectStore(str(tmp_path))
    data = os.urandom(200_000)

    def threads_and_fds() -> tuple[int, int]:
        return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))

    await store.create("many/warm", data)  # the folder, trio's own threads and descriptors
    before = threads_and_fds()
    with trio.CancelScope() as scope:
        scope.cancel()
        await store.create("cancelled", bytearray(data))  # done: it returns, it was made
        await trio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    assert await store.get("cancelled") == data
    async with trio.open_nursery() as nursery:
        for n in range(20):
            nursery.start_soon(store.create, f"many/{n}", data)
        with trio.CancelScope() as scope:
            scope.cancel()
            await store.create("many/cancelled", data)
    assert sorted(await store.list("many/")) == sorted(
        [f"many/{n}" for n in range(20)] + ["many/cancelled", "many/warm"])
    threads, fds = threads_and_fds()
    assert fds == before[1]
    assert threads <= before[0] + _create_file.WORKERS_AT_MOST
    assert [p.name for p in tmp_path.rglob(".mink-tmp-*")] == []


async def test_file_create_without_its_folder_makes_it_the_python_way(tmp_path):
    """A create whose folder is missing (the WAL's folder of a new node epoch) or below an
    object: the compiled create's open fails, and the Python one makes the folder, or fails
    as it always did."""
    store = FileObjectStore(str(tmp_path))
    await store.create("wal/7/1", b"first")
    assert await store.get("wal/7/1") == b"first"
    with pytest.raises(ObjectStoreError, match="Not a directory"):
        await store.create("wal/7/1/x", b"below")
    with pytest.raises(ObjectStoreError, match="objects exist below"):
        await store.create("wal/7", b"over")
    with pytest.raises(ObjectExists):
        await store.create("wal/7/1", b"again")


def test_range_copier_copies_ranges_a_step_at_a_time(tmp_path):
    """The compiled copier of a direct compose: ranges of many objects, each object opened
    once (with O_DIRECT from a size on), land in the stage back to back; each step returns
    when the stage was written whole at the next offset, a read's rest carried to the next
    step, and the last step leaves the tail in the stage. A missing object (or a directory)
    stops it at that range with NOT_FOUND, an object ending before its range with SHORT, a
    refused read with OS_ERROR and its errno."""
    import mmap
    import random

    from mink.storage.objectstore import _range_copy as rc

    _skip_without_o_direct(tmp_path)
    rng = random.Random(5)
    block = 4096
    datas = [os.urandom(size) for size in (10, block, 3 * block + 7, 70_000, 300_000)]
    paths = []
    for n, data in enumerate(datas):
        (tmp_path / f"o{n}").write_bytes(data)
        paths.append(os.fsencode(tmp_path / f"o{n}"))
    ranges = []
    for _ in range(400):
        n = rng.randrange(len(datas))
        start = rng.randrange(len(datas[n]) + 1)
        ranges.append((n, start, rng.randint(start, min(len(datas[n]), start + 20_000))))
    ranges.append((4, 0, len(datas[4])))  # one read longer than the window
    expected = b"".join(datas[n][start:end] for n, start, end in ranges)

    def copier(ranges, window, dst_fd, stage, paths=paths, fill=0, offset=0):
        return rc.RangeCopier(dst_fd, stage, fill, offset, window, paths,
                              array("q", [r[0] for r in ranges]),
                              array("q", [r[1] for r in ranges]),
                              array("q", [r[2] for r in ranges]), os.O_DIRECT, 70_000)

    window = mmap.mmap(-1, 16 * block)
    stage = bytearray(3 * block)
    dst = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(dst, b"h" * 5, 0)  # the stage's first 5 bytes: written by the caller before
        stage[:5] = b"h" * 5
        opened = rc.opened()
        c = copier(ranges, window, dst, stage, fill=5)
        offsets = []
        while (status := c.step()) == rc.FLUSHED:
            offsets.append(c.offset)
            assert c.fill == 0
        assert status == rc.DONE
        assert offsets == [len(stage) * k for k in range(1, len(offsets) + 1)]
        assert c.offset + c.fill == 5 + len(expected) and c.index == len(ranges)
        os.pwrite(dst, stage[:c.fill], c.offset)
        c.close()
        assert (rc.opened()[0] - opened[0], rc.opened()[1] - opened[1]) == (2, 3)
        with open(tmp_path / "out", "rb") as f:
            assert f.read() == b"h" * 5 + expected

        (tmp_path / "dir").mkdir()
        stops = [([(0, 0, 10), (5, 0, 1)], [*paths, os.fsencode(tmp_path / "missing")],
                  rc.NOT_FOUND, 1),
                 ([(1, 0, 5), (5, 0, 0)], [*paths, os.fsencode(tmp_path / "dir")],
                  rc.NOT_FOUND, 1),
                 ([(1, 0, 5), (2, 5, len(datas[2]) + 1)], paths, rc.SHORT, 1)]
        for stop_ranges, stop_paths, status, index in stops:
            c = copier(stop_ranges, window, dst, bytearray(3 * block), paths=stop_paths)
            while (got := c.step()) == rc.FLUSHED:
                pass
            assert (got, c.index) == (status, index)
            c.close()
        misaligned = memoryview(bytearray(16 * block + 1))[1:]  # O_DIRECT refuses it
        c = copier([(4, 0, 10)], misaligned, dst, bytearray(3 * block))
        assert (c.step(), c.error) == (rc.OS_ERROR, errno.EINVAL)
        c.close()
        with pytest.raises(ValueError):
            copier([(len(paths), 0, 1)], window, dst, bytearray(3 * block))
        with pytest.raises(ValueError):
            copier([(0, 5, 4)], window, dst, bytearray(3 * block))
    finally:
        os.close(dst)


async def test_file_objects_are_written_and_read_around_the_page_cache(tmp_path, monkeypatch):
    """Where the filesystem takes O_DIRECT, create writes an object of 256 KiB or more
    through a reused aligned buffer a MiB at a time, its last part block through the page
    cache, and syncs it once; a smaller one goes through the page cache (an O_DIRECT write
    waits for the device). Large reads go around the page cache too. Every size about the
    block, step and threshold edges reads back byte for byte, whole and in ranges at odd
    offsets, and compose copies them exactly."""
    import fcntl

    from mink.storage.objectstore import file as file_store

    _skip_without_o_direct(tmp_path)
    syncs = _record_syncs(monkeypatch)
    writes: list[tuple[bool, int]] = []  # (O_DIRECT, bytes) of each aligned-buffer write
    real_pwrite_all = file_store._pwrite_all

    def recording_pwrite_all(fd, buf, offset):
        writes.append((bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), buf.nbytes))
        real_pwrite_all(fd, buf, offset)

    monkeypatch.setattr(file_store, "_pwrite_all", recording_pwrite_all)
    store = FileObjectStore(str(tmp_path))
    mib, block, small = 1024 * 1024, file_store.DIRECT_ALIGN, file_store.DIRECT_WRITE_ABOVE
    sizes = [0, 1, block - 1, block, block + 1, small - 1, small, small + block + 1, mib - 1,
             mib, mib + 1, 3 * mib + 517,
             file_store.STEPPED_SYNC_ABOVE + 1]  # the last: synced once too, not in steps
    made = {}
    for n, size in enumerate(sizes):
        data = os.urandom(size)
        pieces = [data[:size // 3], data[size // 3:size // 2], data[size // 2:]]
        key = f"objects/{n}"
        writes.clear()
        syncs.clear()
        await store.create(key, pieces)
        made[key] = data
        assert (tmp_path / "objects" / str(n)).stat().st_size == size
        assert syncs == [size]
        if size < small:
            assert writes == []
        else:
            assert sum(nbytes for direct, nbytes in writes if direct) == size - size % block
            assert sum(nbytes for direct, nbytes in writes if not direct) == size % block
    assert store.direct
    for key, data in made.items():
        assert await store.get(key) == data
        for start, end in [(1, None), (block - 3, 2 * block + 5), (5, 70_000), (mib - 7, mib + 9)]:
            assert await store.get(key, start, end) == data[start:end]

    big_key, block_key = f"objects/{sizes.index(3 * mib + 517)}", f"objects/{sizes.index(block)}"
    big = made[big_key]
    parts = [ObjectRange(big_key, 3, 5 + 2 * mib), b"x" * 5001,
             ObjectRange(block_key, 0, block), ObjectRange(big_key, 3 * mib, len(big))]
    await store.compose("stream/odd", parts)
    assert await store.get("stream/odd") == (big[3:5 + 2 * mib] + b"x" * 5001 + made[block_key]
                                             + big[3 * mib:])
    # the aligned buffers are kept for the next object, not mapped afresh each time
    kept = file_store._ALIGNED.take()
    file_store._ALIGNED.give(kept)
    assert file_store._ALIGNED.take() is kept
    file_store._ALIGNED.give(kept)


async def test_file_get_view_reads_into_memory_used_again_once_no_view_is_left(tmp_path):
    """get_view (the block cache's reads) gives get()'s bytes as a read-only memoryview. A
    direct read lands in aligned memory of its own, with no copy out of a buffer: the memory
    goes back to a bounded pool only when the last view of it (a slice included) is gone, and
    the next read of its size takes it from there. A view kept while others are read into
    used-again memory keeps its bytes."""
    from mink.storage.objectstore import _direct_read  # built by `pip install -e .`
    from mink.storage.objectstore import file as file_store

    _skip_without_o_direct(tmp_path)
    store = FileObjectStore(str(tmp_path))
    mib, block = 1024 * 1024, file_store.DIRECT_ALIGN
    data = os.urandom(5 * mib + 517)
    await store.create("o", data)
    for start, end in [(0, None), (1, None), (block - 3, 2 * block + 5), (5, 70_000),
                       (mib - 7, 2 * mib + 9), (3, 3), (len(data) - 9, len(data) + 100),
                       (len(data) + 1, None)]:
        view = await store.get_view("o", start, end)
        assert isinstance(view, memoryview) and view.readonly
        assert view == data[start:end] == await store.get("o", start, end)
    with pytest.raises(TypeError):
        (await store.get_view("o", 0, mib))[0] = 1

    whole = await store.get_view("o", 5, 5 + mib)
    kept = whole[100:200]
    del whole  # the slice keeps the memory: not back in the pool
    allocations = _direct_read.allocations()
    for n in range(40):  # each read's memory back in the pool once its view is dropped
        start = (n * 7919) % (4 * mib)
        view = await store.get_view("o", start, start + mib)
        assert view == data[start:start + mib]
        del view
    # (two sizes: a MiB from an aligned offset or not; trio may hold the last result a while)
    assert _direct_read.allocations() - allocations <= 4
    assert kept == data[105:205]  # its memory was not read into again
    before = _direct_read.idle_bytes()
    del kept
    assert _direct_read.idle_bytes() > before
    # many views dropped at once: the pool keeps at most its limit
    views = [await store.get_view("o", n, n + mib) for n in range(48)]
    del views
    assert 0 < _direct_read.idle_bytes() <= _direct_read.IDLE_LIMIT


async def test_file_get_view_without_the_compiled_helper_reads_the_same_bytes(tmp_path,
                                                                             monkeypatch):
    """Without the compiled helper (no C compiler at install) get_view reads into a reused
    aligned buffer and copies out once: the same bytes, as a memoryview."""
    from mink.storage.objectstore import file as file_store

    _skip_without_o_direct(tmp_path)
    monkeypatch.setattr(file_store, "_read_direct_view", None)
    store = FileObjectStore(str(tmp_path))
    mib = 1024 * 1024
    data = os.urandom(3 * mib + 517)
    await store.create("o", data)
    for start, end in [(0, None), (5, 5 + mib), (mib - 7, 3 * mib + 9), (2 * mib, 4 * mib),
                       (len(data) + 1, None)]:
        view = await store.get_view("o", start, end)
        assert isinstance(view, memoryview)
        assert view == data[start:end]


async def test_file_store_falls_back_to_the_page_cache_where_o_direct_is_refused(tmp_path,
                                                                               monkeypatch, caplog):
    """A filesystem that refuses O_DIRECT at open (tmpfs) or only at the first write or read
    (an alignment it wants larger): the operation goes through the page cache instead, and
    so does the store from then on, with one log line; `?direct=false` never tries."""
    import logging

    from mink.storage.objectstore import file as file_store
    from mink.storage.objectstore import open_object_store

    assert not open_object_store(f"file://{tmp_path}?direct=false").direct
    assert open_object_store(f"file://{tmp_path}").direct

    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & file_store._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    caplog.set_level(logging.INFO, logger="mink.storage.objectstore.file")
    store = FileObjectStore(str(tmp_path))
    with monkeypatch.context() as patched:
        patched.setattr(file_store, "_O_DIRECT", os.O_DIRECT if hasattr(os, "O_DIRECT") else 1)
        patched.setattr(os, "open", refusing_open)
        await store.create("a", b"refused at open" * 10_000)
        assert await store.get("a") == b"refused at open" * 10_000
    assert not store.direct
    assert sum("refused O_DIRECT" in r.getMessage() for r in caplog.records) == 1

    _skip_without_o_direct(tmp_path)

    def refused(*args):
        raise OSError(errno.EINVAL, "Invalid argument")

    data = os.urandom(2 * 1024 * 1024 + 3)
    store = FileObjectStore(str(tmp_path))
    with monkeypatch.context() as patched:
        patched.setattr(file_store, "_pwrite_all", refused)
        await store.create("b", data)
    assert not store.direct
    assert await store.get("b") == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary left

    store = FileObjectStore(str(tmp_path))
    with monkeypatch.context() as patched:
        patched.setattr(file_store, "_read_direct", refused)
        assert await store.get("b", 5) == data[5:]
    assert not store.direct

    store = FileObjectStore(str(tmp_path))
    with monkeypatch.context() as patched:
        # compose's direct read of its ranges in Python (the compiled helper's own refusal:
        # test_range_copier_copies_ranges_a_step_at_a_time)
        patched.setattr(file_store, "_range_copy", None)
        patched.setattr(os, "preadv", refused)
        await store.compose("c", [ObjectRange("b", 7, len(data)), b"end"])
    assert not store.direct
    assert await store.get("c") == data[7:] + b"end"
