"""Produce forwarding (seed 000, "table-addressed write forwarded"; issue 25): the partitions
of a Produce that this node does not lead are sent to their leaders, each leader's part as a
Produce of the same version (the client's transactional id, acks and timeout kept) inside an
Envelope from the client's principal and address, and the answers are merged into the one
response, in the request's order (`handlers/produce.py` builds it).

- Only for a request as the client sent it: one that arrived in an Envelope is never
  forwarded again (its partitions not led there answer NOT_LEADER_OR_FOLLOWER), so a
  request makes one hop at most. Off with `produce_forwarding = false`.
- The leader checks everything itself as the original principal (ACLs, KIP-890
  verification, producer sequences and epochs); the forwarding node checks nothing of the
  remote partitions first. Quotas: the client was charged its request's bytes here, where
  it spoke; the Envelope and the Produce in it are not charged on the leader.
- Order: a connection's requests are applied in arrival order, and their remote parts are
  queued for their leaders (`peers.py`: one pipelined connection per target) in that order
  too, before the next request starts. While a request waits for a leader (below), the
  later requests of its connection wait behind it before queueing theirs.
- A partition whose leader is not known or not live is waited for (the view polled), up to
  the request's `timeout_ms` (at least 1 s, at most 2 min): then, as a leader that could not
  be reached, it answers NOT_LEADER_OR_FOLLOWER with the current leader hint (KIP-951) and
  the client refreshes its metadata and retries. A partition moving here (still opening,
  or forwarded here before this node's view shows the move) is waited for by the handler,
  and an append refused here because its partition moved is forwarded to the new leader
  (`moved`, handlers/produce.py) within what is left of the request's timeout: no
  NOT_LEADER_OR_FOLLOWER while partitions move. A refused append whose partition this node
  leads again (it fenced itself, registered anew and re-led it) has no one else to wait
  for: NOT_LEADER_OR_FOLLOWER at once, and the client retries here.
- Outcomes: the leader's answer per partition as it gave it (error, base offset, log append
  time, log start, record errors, message). Nothing sent: NOT_LEADER_OR_FOLLOWER. Sent and
  not answered in time, or the connection lost with it in flight: REQUEST_TIMED_OUT, as
  Kafka answers a write whose outcome it does not know (an idempotent producer's retry is
  deduplicated by the leader; it is never resent here). The leader hint of a partition
  answered NOT_LEADER_OR_FOLLOWER is the newer of the leader's and this node's, and its
  endpoint the one of the listener the client came in on.
- acks=0: the parts are forwarded with acks=0; no response goes to the client, and if a
  leader refused a part the client's connection is closed, as a leader does for acks=0.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import NamedTuple

import trio
from kio.schema.envelope.v0 import EnvelopeRequest
from kio.schema.errors import ErrorCode

from mink.broker.server.peers import LOST, NOT_SENT, PeerCall
from mink.protocol.apis import ApiKey
from mink.protocol.envelope import address_bytes, serialize_principal
from mink.protocol.messages import MalformedResponse, decode_response, encode_request

log = logging.getLogger(__name__)

MIN_WAIT = 1.0  # seconds a forward may wait for a leader, whatever timeout_ms says
MAX_WAIT = 120.0
ANSWER_MARGIN = 2.0  # beyond timeout_ms, for the leader's own REQUEST_TIMED_OUT to arrive
LEADER_POLL = 0.05  # how often the view is looked at while a partition has no leader


class Leader(NamedTuple):
    """A leader hint (KIP-951), as `PartitionInfo` gives one to `_response`."""

    leader: int | None
    leader_epoch: int


class RecordError(NamedTuple):
    batch_index: int
    message: str | None


class Remote(NamedTuple):
    """A partition of the request to forward: its topic's and its own position in the
    request, its data, and its result (filled in when the answer comes)."""

    topic_position: int
    name: str
    data: object
    result: object


class Forwarded:
    """The remote partitions of one Produce: queued for their leaders (`dispatch`), then
    their answers written into their results (`settle`)."""

    def __init__(self, node, ctx, request, remote: list[Remote], moved: bool = False,
                 after: tuple[trio.Event, ...] = (), deadline: float | None = None) -> None:
        self.node = node
        self.ctx = ctx
        self.request = request
        self.remote = remote
        wait = min(max(request.timeout.total_seconds(), MIN_WAIT), MAX_WAIT)
        self.started = trio.current_time()
        self.send_deadline = self.started + wait
        if deadline is not None:
            # moved parts: the request's own deadline, which their wait for a commit used
            # already; an answer after it finds no client listening (kafka-python gives up
            # at its request's timeout)
            self.send_deadline = min(self.send_deadline, deadline)
        self.answer_deadline = self.send_deadline + ANSWER_MARGIN
        self.calls: list[tuple[int, list[Remote], PeerCall]] = []
        self.unrouted: list[Remote] = []  # no leader to send to: answered NOT_LEADER
        self.queued = trio.Event()  # every part is queued (or refused): the next may go
        # Parts refused here as moved after they were applied (`forward_moved`): not chained
        # behind the connection's later requests (those wait for them, `_behind`), and sent
        # once the view names their new leader.
        self.moved = moved
        self.after = after  # moved: the earlier requests' appends to the same partitions
        connection = ctx.connection
        self.previous: Forwarded | None = None if moved else connection.last_forwarded
        if not moved:
            connection.last_forwarded = self

    # -- dispatch: before ctx.applied() when nothing has to wait -----------------------------

    def try_dispatch(self) -> bool:
        """Queue every part now if nothing has to wait (the previous request of the
        connection is queued, every leader known); False when `dispatch_late` must."""
        previous = self.previous
        if previous is not None and not previous.queued.is_set() or self._behind():
            return False
        routes = self._routes()
        if routes is None:
            return False
        self.previous = None  # no chain of requests kept alive behind this one
        self._submit(routes)
        return True

    async def dispatch_late(self) -> None:
        """Wait for the previous request of the connection and for leaders (bounded), then
        queue what can be sent; the rest is answered NOT_LEADER_OR_FOLLOWER."""
        routes = None  # the deadline may pass before the first look
        try:
            with trio.move_on_at(self.send_deadline):
                if self.previous is not None:
                    await self.previous.queued.wait()
                for appended in self._behind():
                    await appended.wait()
                while (routes := self._routes()) is None:
                    await trio.sleep(LEADER_POLL)
            if routes is None:
                routes = self._routes(final=True)
            self._submit(routes)
        finally:
            self.previous = None
            self.queued.set()

    def _behind(self) -> list[trio.Event]:
        """The earlier requests of the connection whose appends here to partitions of this
        one are not settled: their parts refused as moved go to the new leader first. For
        moved parts, those of the requests before the one they belong to (never itself)."""
        if self.moved:
            return [event for event in self.after if not event.is_set()]
        appending = self.ctx.connection.appending
        return [event for item in self.remote
                if (event := appending.get((item.name, item.data.index))) is not None
                and not event.is_set()]

    def _routes(self, final: bool = False) -> dict[int, list[Remote]] | None:
        """The parts by target; None while a leader is not known or not live (unless
        `final`: those go to `unrouted`)."""
        node = self.node
        view = node.view
        routes: dict[int, list[Remote]] = {}
        unrouted = []
        for item in self.remote:
            topic = view.topics.get(item.name)
            leader = None
            if topic is not None and 0 <= item.data.index < len(topic.partitions):
                leader = topic.partitions[item.data.index].leader
            if (leader == node.node_id and self.moved and not final
                    and node.leader_log(topic, item.data.index) is None):
                return None  # refused by a move this node's view does not show yet
            # (led here again, by this node re-registered after fencing itself: no one
            # else to wait for; answered NOT_LEADER_OR_FOLLOWER now, retried here)
            if leader == node.node_id or topic is None:
                unrouted.append(item)  # opening here (or gone): NOT_LEADER_OR_FOLLOWER now
            elif leader is None or leader not in view.brokers:
                if not final:
                    return None
                unrouted.append(item)
            else:
                routes.setdefault(leader, []).append(item)
        self.unrouted = unrouted
        return routes

    def _submit(self, routes: dict[int, list[Remote]]) -> None:
        node, ctx, request = self.node, self.ctx, self.request
        origin = ctx.principal
        principal = _principal_bytes(origin.principal_type, origin.name)
        host = _address_bytes(ctx.client_host)
        version = ctx.header.api_version
        metrics = node.metrics
        partitions = sum(len(t.partition_data) for t in request.topic_data)
        for target, items in routes.items():
            if ctx.frame and not self.moved and len(items) == partitions:
                # every partition goes to this leader (a client through one address, or
                # with stale metadata): the request's frame as it came, not encoded again
                frame = ctx.frame
            else:
                frame = encode_request(ApiKey.PRODUCE, version, ctx.header.correlation_id,
                                       _part(request, items), ctx.header.client_id)[4:]
            envelope = EnvelopeRequest(request_data=frame, request_principal=principal,
                                       client_host_address=host)
            self.calls.append((target, items, node.peers.submit(target, envelope,
                                                                self.send_deadline)))
            metrics.produce_forwarded(target, len(items))
        self.queued.set()

    # -- settle: the answers into the results ------------------------------------------------

    async def settle(self) -> bool:
        """Wait for the answers (bounded) and write them into the results; True when every
        part was accepted (for acks=0: the leaders took them)."""
        if not self.queued.is_set():
            await self.dispatch_late()
        node = self.node
        accepted = True
        for item in self.unrouted:
            accepted = False
            self._not_sent(item, "no live leader to forward to")
        version = self.ctx.header.api_version
        for target, items, call in self.calls:
            await call.wait(self.answer_deadline)
            failure = call.failure
            response = call.response
            if failure is None and response.error_code != ErrorCode.none:
                error = ErrorCode(response.error_code)
                failure = LOST if error in (ErrorCode.unknown_server_error,
                                            ErrorCode.invalid_request) else NOT_SENT
                call.reason = f"node {target} refused the envelope: {error.name.upper()}"
            if failure is None and self.request.acks == 0:
                continue
            answers = None
            if failure is None:
                try:
                    answers = _answers(version, response.response_data)
                except MalformedResponse as exc:
                    failure, call.reason = LOST, f"node {target} answered: {exc}"
            if failure is not None:
                log.warning("forwarding a produce to node %d failed (%s): %s", target,
                            failure, call.reason)
                accepted = False
                for item in items:
                    if failure == NOT_SENT:
                        self._not_sent(item, call.reason)
                    else:
                        _fail(item.result, ErrorCode.request_timed_out,
                              f"forwarded to node {target}, no answer: {call.reason}")
                    node.metrics.produce_forward_error(target, item.result.error.name.upper())
                continue
            for item in items:
                answer = answers.get((item.name, item.data.index))
                result = item.result
                if answer is None:
                    _fail(result, ErrorCode.unknown_server_error,
                          f"node {target} did not answer for this partition")
                else:
                    self._take(item, answer)
                if result.error:
                    accepted = False
                    node.metrics.produce_forward_error(target, result.error.name.upper())
        return accepted

    def _not_sent(self, item: Remote, reason: str) -> None:
        result = item.result
        _fail(result, ErrorCode.not_leader_or_follower, None)
        topic = self.node.view.topics.get(item.name)
        if topic is not None and 0 <= item.data.index < len(topic.partitions):
            result.leader = topic.partitions[item.data.index]
        log.debug("produce to %s-%d not forwarded: %s", item.name, item.data.index, reason)

    def _take(self, item: Remote, answer) -> None:
        """The leader's answer for one partition, as it gave it."""
        result = item.result
        result.error = ErrorCode(answer.error_code)
        result.base_offset = answer.base_offset
        result.log_append_time = getattr(answer, "log_append_time", None)
        result.log_start_offset = getattr(answer, "log_start_offset", -1)
        result.message = getattr(answer, "error_message", None)
        result.record_errors = tuple(
            RecordError(e.batch_index, e.batch_index_error_message)
            for e in getattr(answer, "record_errors", ()))
        if result.error == ErrorCode.not_leader_or_follower:
            # KIP-951: the newer of the leader's hint and this node's view
            ours = None
            topic = self.node.view.topics.get(item.name)
            if topic is not None and 0 <= item.data.index < len(topic.partitions):
                ours = topic.partitions[item.data.index]
            theirs = getattr(answer, "current_leader", None)
            if theirs is not None and theirs.leader_id >= 0 and (
                    ours is None or ours.leader is None
                    or theirs.leader_epoch > ours.leader_epoch):
                result.leader = Leader(theirs.leader_id, theirs.leader_epoch)
            else:
                result.leader = ours


# What every Envelope of a connection repeats, serialized once (a forwarded Produce is on a
# producer's hot path; the principal's serialization cost a third of the time to queue it).
_principal_bytes = functools.lru_cache(maxsize=256)(serialize_principal)
_address_bytes = functools.lru_cache(maxsize=1024)(address_bytes)


def _fail(result, error: ErrorCode, message: str | None) -> None:
    result.error = error
    result.message = message
    result.base_offset = -1


def _part(request, items: list[Remote]):
    """The Produce for one leader: the request with only `items`, topics in the request's
    order (the client's transactional id, acks and timeout kept)."""
    by_topic: dict[int, list] = {}
    for item in items:
        by_topic.setdefault(item.topic_position, []).append(item.data)
    return dataclasses.replace(request, topic_data=tuple(
        dataclasses.replace(request.topic_data[position], partition_data=tuple(partitions))
        for position, partitions in sorted(by_topic.items())))


def _answers(version: int, response_data: bytes) -> dict[tuple[str, int], object]:
    _, body = decode_response(ApiKey.PRODUCE, version, response_data)
    return {(t.name, p.index): p for t in body.responses for p in t.partition_responses}
