"""Long-lived, pipelined connections to the other nodes, for forwarded Produce requests
(`produce_forwarding.py`): one connection per target node, opened when first needed, kept
open, its Envelopes sent back to back and their answers matched in order.

Why one connection per target and not several: a producer's pipelined requests must reach
the leader in the order this node applied them, and the leader applies one connection's
requests in arrival order (`connection.py`); several connections would not keep that order.

- `submit` queues a call without awaiting: calls to one target are sent in the order they
  were submitted, by the target's one writer task; a reader task matches the answers to
  the calls in flight (responses come in request order; the correlation id is checked).
- A call is bounded by its deadline. One not sent by then fails as not sent (nothing was
  written: the caller may say NOT_LEADER_OR_FOLLOWER); one sent and not answered by then,
  or in flight when the connection is lost (the peer restarted, a reset), fails as *lost*:
  its outcome is unknown and it is never resent here (a resend is only safe for an
  idempotent producer; the client decides, after a retriable error).
- A target that cannot be reached is tried again with a backoff until the call's deadline;
  its address is read from the view at each attempt (a restarted peer may have moved).
- KIP-368: on a SASL inter-broker listener with `connections_max_reauth_ms` the peer closes
  a connection whose session ended; the pool opens a new one before that, once the calls
  in flight on the old one are answered (so the order is kept).
- The pool's tasks run in the pool's nursery (`run`), a task of the node's nursery: the
  node stopping closes every connection.
"""

from __future__ import annotations

import collections
import logging

import trio
from kio.schema.envelope.v0 import EnvelopeRequest

from mink.client import KafkaClient, KafkaClientError, MalformedResponse
from mink.protocol.apis import ApiKey

log = logging.getLogger(__name__)

ENVELOPE_VERSION = 0
CONNECT_TIMEOUT = 5.0  # one connection attempt (TCP, TLS, SASL)
MAX_BACKOFF = 1.0  # between attempts to reach a target
MAX_QUEUED = 10_000  # calls waiting for one target's connection; beyond, refused at once
# Bytes asked of the socket per read of answers (more when a frame needs more): a read into
# a fresh 1 MiB buffer (KafkaClient.receive's) cost 45 us more than one into 64 KiB, for
# answers of a few hundred bytes.
ANSWER_READ_BYTES = 64 * 1024

NOT_SENT = "not sent"  # nothing reached the target: nothing was written
LOST = "lost"  # sent, and no answer: the outcome is unknown

_IO_ERRORS = (OSError, EOFError, trio.BrokenResourceError, trio.ClosedResourceError,
              KafkaClientError, MalformedResponse)


class PeerCall:
    """One Envelope to one target, and how it ended: `response` (the EnvelopeResponse) or
    `failure` (NOT_SENT or LOST) with `reason`."""

    __slots__ = ("envelope", "deadline", "done", "sent", "response", "failure", "reason",
                 "correlation_id", "connection")

    def __init__(self, envelope: EnvelopeRequest, deadline: float) -> None:
        self.envelope = envelope
        self.deadline = deadline  # trio time: sent by then, or not at all
        self.done = trio.Event()
        self.sent = False
        self.response = None
        self.failure: str | None = None
        self.reason = ""
        self.correlation_id = -1
        self.connection: _Connection | None = None  # the one it was sent on

    def answer(self, response) -> None:
        if not self.done.is_set():
            self.response = response
            self.done.set()

    def fail(self, failure: str, reason: str) -> None:
        if not self.done.is_set():
            self.failure = failure
            self.reason = reason
            self.done.set()

    async def wait(self, until: float) -> None:
        """Wait for the answer until `until` (trio time); past it, the call ends as lost
        when it was sent (its answer is then dropped), as not sent otherwise."""
        with trio.move_on_at(until):
            await self.done.wait()
        if not self.done.is_set():
            if self.connection is not None:
                # As Kafka's NetworkClient after a request timeout: the connection is closed
                # (its other calls in flight end as lost too), the next call opens a new one.
                self.connection.lose("a call went unanswered past its deadline")
            self.fail(LOST if self.sent else NOT_SENT, "no answer in time" if self.sent
                      else "not sent in time")


class PeerPool:
    """The node's connections to the other nodes (one per target)."""

    def __init__(self, node) -> None:
        self.node = node
        self._peers: dict[int, _Peer] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                for peer in self._peers.values():
                    peer.stop("this node is stopping")
                self._peers.clear()

    def submit(self, target: int, envelope: EnvelopeRequest, deadline: float) -> PeerCall:
        """Queue an Envelope for node `target`, without awaiting: calls to one target are
        sent in the order they were submitted."""
        call = PeerCall(envelope, deadline)
        if self._nursery is None:
            call.fail(NOT_SENT, "this node is not serving")
            return call
        peer = self._peers.get(target)
        if peer is None:
            peer = self._peers[target] = _Peer(self, target)
            self._nursery.start_soon(peer.run)
        if len(peer.queue) >= MAX_QUEUED:
            call.fail(NOT_SENT, f"{MAX_QUEUED} calls already wait for node {target}")
            return call
        peer.queue.append(call)
        peer.wakeup.set()
        return call

    def connected(self, target: int) -> bool:
        """Whether an open connection to `target` is in the pool (for tests and metrics)."""
        peer = self._peers.get(target)
        return peer is not None and peer.connection is not None and not peer.connection.lost


class _Connection:
    """One open connection to a target: the calls in flight, in the order sent."""

    def __init__(self, client: KafkaClient, target: int, renew_at: float | None) -> None:
        self.client = client
        self.target = target
        self.address = client.exchange.address
        self.renew_at = renew_at  # trio time: open a new one before the SASL session ends
        self.in_flight: collections.deque[PeerCall] = collections.deque()
        self.lost: str | None = None
        self.drained = trio.Event()
        self.drained.set()
        self._reader = trio.CancelScope()  # cancelled when lost: the stream is closed

    def lose(self, reason: str) -> None:
        """The connection is gone (or given up): every call in flight has an unknown
        outcome, and the reader stops and closes the stream."""
        if self.lost is None:
            self.lost = reason
            log.info("connection to node %d lost: %s", self.target, reason)
            self._reader.cancel()
        while self.in_flight:
            self.in_flight.popleft().fail(LOST, f"connection to node {self.target} lost: "
                                                f"{reason}")
        self.drained.set()

    async def read_answers(self) -> None:
        try:
            with self._reader:
                await self._read_answers()
        except _IO_ERRORS as exc:
            self.lose(str(exc) or type(exc).__name__)
        finally:
            self.lose("closed")
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.client.stream)

    async def _read_answers(self) -> None:
        client = self.client
        reader = client.exchange.reader
        while True:
            while (frame := reader.next_frame()) is None:
                data = await client.stream.receive_some(max(ANSWER_READ_BYTES,
                                                            reader.wanted()))
                if not data:
                    raise EOFError(f"{client.exchange.address} closed the connection")
                reader.feed(data)
            received, response = client.exchange.decode(ApiKey.ENVELOPE, ENVELOPE_VERSION,
                                                        frame)
            if not self.in_flight:
                raise KafkaClientError(f"an answer nobody asked for (id {received})")
            call = self.in_flight.popleft()
            if call.correlation_id != received:
                raise KafkaClientError(f"answered out of turn (correlation id "
                                       f"{received}, expected {call.correlation_id})")
            call.answer(response)
            if not self.in_flight:
                self.drained.set()

    async def send(self, call: PeerCall) -> None:
        correlation_id, frame = self.client.exchange.encode(ApiKey.ENVELOPE, ENVELOPE_VERSION,
                                                            call.envelope)
        call.correlation_id = correlation_id
        call.sent = True
        call.connection = self
        self.in_flight.append(call)
        self.drained = trio.Event()
        try:
            with trio.move_on_at(call.deadline) as scope:  # a peer that stopped reading
                await self.client.stream.send_all(frame)
            if scope.cancelled_caught:
                self.lose("could not send within the call's deadline")
        except _IO_ERRORS as exc:
            self.lose(str(exc) or type(exc).__name__)


class _Peer:
    """The queue and the connection to one target; `run` is its writer."""

    def __init__(self, pool: PeerPool, target: int) -> None:
        self.pool = pool
        self.target = target
        self.queue: collections.deque[PeerCall] = collections.deque()
        self.wakeup = trio.Event()
        self.connection: _Connection | None = None

    def stop(self, reason: str) -> None:
        while self.queue:
            self.queue.popleft().fail(NOT_SENT, reason)
        if self.connection is not None:
            self.connection.lose(reason)

    async def run(self) -> None:
        try:
            while True:
                if not self.queue:
                    self.wakeup = trio.Event()
                    await self.wakeup.wait()
                    continue
                call = self.queue.popleft()
                if call.done.is_set():
                    continue  # given up by its caller
                if trio.current_time() >= call.deadline:
                    call.fail(NOT_SENT, "not sent in time")
                    continue
                try:
                    connection = await self._connection(call.deadline)
                except _Unreachable as exc:
                    call.fail(NOT_SENT, str(exc))
                    continue
                if call.done.is_set():
                    continue
                await connection.send(call)
        finally:
            self.stop("this node is stopping")

    async def _connection(self, deadline: float) -> _Connection:
        node = self.pool.node
        connection = self.connection
        if connection is not None and connection.lost is None:
            broker = node.view.brokers.get(self.target)
            moved = broker is not None and f"{broker.host}:{broker.port}" != connection.address
            if not moved and (connection.renew_at is None
                              or trio.current_time() < connection.renew_at):
                return connection
            # A session about to end (KIP-368) or a peer at a new address: the calls in
            # flight are answered first, so the new connection keeps their order.
            with trio.move_on_at(deadline):
                await connection.drained.wait()
            connection.lose("replaced" if not moved else "the node moved")
        self.connection = None
        backoff = 0.05
        while True:
            broker = node.view.brokers.get(self.target)
            if broker is None or self.target == node.node_id:
                raise _Unreachable(f"node {self.target} is not a live other node")
            address = f"{broker.host}:{broker.port}"
            try:
                with trio.fail_at(min(deadline, trio.current_time() + CONNECT_TIMEOUT)):
                    client = await KafkaClient.connect(
                        address, client_id=f"mink-node-{node.node_id}",
                        security=node.inter_broker_security)
                break
            except (*_IO_ERRORS, trio.TooSlowError) as exc:
                reason = f"cannot reach node {self.target} at {address}: " \
                         f"{exc or type(exc).__name__}"
                remaining = deadline - trio.current_time()
                if remaining <= 0:
                    raise _Unreachable(reason) from None
                log.debug("%s; trying again", reason)
                await trio.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, MAX_BACKOFF)
        renew_at = None
        if client.session_lifetime_ms > 0:
            lifetime = client.session_lifetime_ms / 1000
            renew_at = trio.current_time() + lifetime - max(min(1.0, lifetime / 2),
                                                            lifetime / 10)
        connection = self.connection = _Connection(client, self.target, renew_at)
        nursery = self.pool._nursery
        if nursery is None:
            connection.lose("this node is stopping")
            await trio.aclose_forcefully(client.stream)
            raise _Unreachable("this node is stopping")
        nursery.start_soon(connection.read_answers)
        return connection


class _Unreachable(Exception):
    pass
