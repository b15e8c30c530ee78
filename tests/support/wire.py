"""A TCP proxy that reads the Kafka protocol passing through it and counts the per-partition
error codes of Produce and Fetch responses: what a client was answered, counted on the wire,
whatever the client library does with it (librdkafka retries NOT_LEADER_OR_FOLLOWER without
telling the application).

It runs in a thread of its own (the subprocess-cluster tests are synchronous). Bytes are
forwarded as they arrive; a copy of each direction is cut into frames on the side, the
requests' (api key, version) remembered by correlation id, and each response decoded with
the request's schema.
"""

from __future__ import annotations

import collections
import contextlib
import struct
import threading

import trio

from mink.protocol.apis import ApiKey
from mink.protocol.messages import decode_response

COUNTED = {ApiKey.PRODUCE: "produce", ApiKey.FETCH: "fetch"}


class _Frames:
    """Cuts a byte stream into size-prefixed frames."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= 4:
            (size,) = struct.unpack_from(">i", self.buffer)
            if len(self.buffer) < 4 + size:
                break
            frames.append(bytes(self.buffer[4:4 + size]))
            del self.buffer[:4 + size]
        return frames


class KafkaWireCounter:
    """Forwards connections from a local port to `upstream` and counts, per API ("produce",
    "fetch") and error name, the partitions answered with each error code. `route_to` sends
    the connections opened later elsewhere (a load balancer whose target changed)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.address: tuple[str, int] | None = None
        self.errors: collections.Counter[tuple[str, int]] = collections.Counter()
        self.responses: collections.Counter[str] = collections.Counter()
        self.undecoded = 0
        self._lock = threading.Lock()

    def route_to(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)

    def count(self, api: str, error_code: int) -> int:
        with self._lock:
            return self.errors[(api, error_code)]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        async with trio.open_nursery() as nursery:
            for extra in listeners[1:]:
                await extra.aclose()
            self.address = listeners[0].socket.getsockname()[:2]
            task_status.started(self.address)
            await trio.serve_listeners(self._serve, listeners[:1], handler_nursery=nursery)

    async def _serve(self, client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream(*self.upstream)
        except OSError:
            await client.aclose()
            return
        requests: dict[int, tuple[int, int]] = {}
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, self._requests(requests),
                               nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, self._responses(requests),
                               nursery.cancel_scope)

    @staticmethod
    async def _pump(source, target, frames_seen, connection: trio.CancelScope) -> None:
        frames = _Frames()
        try:
            while data := await source.receive_some(65536):
                await target.send_all(data)
                for frame in frames.feed(data):
                    frames_seen(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        connection.cancel()  # either side ending ends the connection

    def _requests(self, requests: dict):
        def seen(frame: bytes) -> None:
            api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame)
            requests[correlation_id] = (api_key, api_version)
        return seen

    def _responses(self, requests: dict):
        def seen(frame: bytes) -> None:
            (correlation_id,) = struct.unpack_from(">i", frame)
            api_key, api_version = requests.pop(correlation_id, (None, None))
            if api_key not in COUNTED:
                return
            try:
                _, body = decode_response(api_key, api_version, frame)
            except Exception:  # noqa: BLE001 - counted, and the test looks at it
                self.undecoded += 1
                return
            codes = [p.error_code for t in body.responses
                     for p in (t.partition_responses if api_key == ApiKey.PRODUCE
                               else t.partitions)]
            with self._lock:
                self.responses[COUNTED[api_key]] += 1
                for code in codes:
                    self.errors[(COUNTED[api_key], int(code))] += 1
        return seen

    @contextlib.contextmanager
    def in_thread(self, timeout: float = 10.0):
        """Serve in a daemon thread with its own trio.run; listening when this returns."""
        listening = threading.Event()
        stop: list = []

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                stop.append((trio.lowlevel.current_trio_token(), nursery.cancel_scope))
                await nursery.start(self.run)
                listening.set()

        thread = threading.Thread(target=trio.run, args=(main,), daemon=True,
                                  name="kafka-wire-counter")
        thread.start()
        if not listening.wait(timeout):
            raise RuntimeError("the wire counter did not start listening")
        try:
            yield self
        finally:
            token, scope = stop[0]
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)
            thread.join(timeout)
