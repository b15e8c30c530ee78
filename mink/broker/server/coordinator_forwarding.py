"""Coordinator forwarding (issue 25): a group or transaction-coordinator request reaching a
node that does not coordinate its group or transactional id is sent to the node that does,
in an Envelope from the client's principal and address, answered there as if the client had
sent it, and its answer returned as it is.

Why: behind a load balancer every node advertises one address, so the client's connection
to "the coordinator" FindCoordinator named lands on any node; answering NOT_COORDINATOR
there would make it loop forever. FindCoordinator itself is answered where it arrives.

- Which node coordinates: the live leader, in this node's view, of the key's partition of
  __consumer_offsets (a group) or __transaction_state (a transactional id), as
  FindCoordinator answers. This node, or no live leader: the request is handled here, and
  answers as it always did (COORDINATOR_LOAD_IN_PROGRESS while it opens, NOT_COORDINATOR
  or COORDINATOR_NOT_AVAILABLE when the coordinator is not known; the client looks again).
- One hop: a request that arrived in an Envelope is handled where it arrived, never
  forwarded again (NOT_COORDINATOR there if that node no longer coordinates).
- Several keys in one request (DescribeGroups, DeleteGroups, OffsetFetch v8+,
  ConsumerGroupDescribe, DescribeTransactions, AddPartitionsToTxn v4+): forwarded only when
  every key has the same other coordinator; otherwise handled here, each key not coordinated
  here answering NOT_COORDINATOR as before (not split per coordinator).
- Bounds: a call waits for its answer up to the request's own timeout (JoinGroup: its
  rebalance timeout, v0 its session timeout; every other request, which names none: the
  clients' default request timeout, 30 s) plus ANSWER_MARGIN; reaching the coordinator is
  one attempt of at most CONNECT_TIMEOUT. A coordinator that cannot be reached, refuses the
  Envelope, or does not answer in time: the request is handled here, which answers
  NOT_COORDINATOR (the error the client retries on after looking up the coordinator again;
  nothing is resent by this node).
- Order on the client's connection: the answer goes back in the connection's order as any
  response. JoinGroup and SyncGroup, which wait for the group, let the connection's next
  request start as soon as they are on their way (as they do when handled here); every
  other request only once its answer came, so a client's OffsetCommit is in place before
  its next request is handled.
- Connections (`forwarding.EnvelopeLinks`): kept open, one call at a time each, as many as
  calls at once per target, so no request waits behind another client's JoinGroup.
- Checks: the coordinator checks the ACLs as the original principal from the original
  address (the group's READ, the transactional id's WRITE, ...): nothing is checked here.
  Quotas: the client is charged on the node it spoke to, not on the coordinator.
- Off with `coordinator_forwarding = false`: NOT_COORDINATOR, as before.
"""

from __future__ import annotations

import datetime
import logging

import trio
from kio.schema.envelope.v0 import EnvelopeRequest

from mink.broker.server.forwarding import ForwardingFailed, is_forwarded
from mink.protocol.apis import ApiKey
from mink.protocol.envelope import address_bytes, serialize_principal
from mink.protocol.messages import MalformedResponse, decode_response

log = logging.getLogger(__name__)

GROUP, TRANSACTION = "group", "transactional id"
DEFAULT_TIMEOUT = 30.0  # seconds: request.timeout.ms's default in the Java client, librdkafka
ANSWER_MARGIN = 5.0  # beyond the request's timeout, for the coordinator's own answer
MAX_TIMEOUT = 30 * 60.0  # group.max.session.timeout.ms's default: no rebalance waits longer
# Requests that wait for the group: the connection's next request does not wait for them.
WAITING = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})


def coordinated_keys(api_key: int, version: int, request) -> tuple[str, list[str]] | None:
    """(key type, keys) of a coordinator request; None for a request no coordinator
    answers (an InitProducerId without a transactional id: any node allocates)."""
    if api_key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
                   ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_DELETE,
                   ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.TXN_OFFSET_COMMIT):
        return GROUP, [request.group_id]
    if api_key == ApiKey.OFFSET_FETCH:
        if version >= 8:
            return GROUP, [group.group_id for group in request.groups]
        return GROUP, [request.group_id]
    if api_key == ApiKey.DESCRIBE_GROUPS:
        return GROUP, list(request.groups)
    if api_key == ApiKey.DELETE_GROUPS:
        return GROUP, list(request.groups_names)
    if api_key == ApiKey.CONSUMER_GROUP_DESCRIBE:
        return GROUP, list(request.group_ids)
    if api_key == ApiKey.INIT_PRODUCER_ID:
        if request.transactional_id is None:
            return None
        return TRANSACTION, [request.transactional_id]
    if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
        if version >= 4:
            return TRANSACTION, [t.transactional_id for t in request.transactions]
        return TRANSACTION, [request.v3_and_below_transactional_id]
    if api_key in (ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN):
        return TRANSACTION, [request.transactional_id]
    if api_key == ApiKey.DESCRIBE_TRANSACTIONS:
        return TRANSACTION, list(request.transactional_ids)
    return None


COORDINATED = frozenset({
    ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.OFFSET_DELETE, ApiKey.DESCRIBE_GROUPS,
    ApiKey.DELETE_GROUPS, ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE,
    ApiKey.TXN_OFFSET_COMMIT, ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN,
    ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN, ApiKey.DESCRIBE_TRANSACTIONS,
})


def coordinator_elsewhere(node, key_type: str, keys: list[str]) -> int | None:
    """The one other live node coordinating every key, or None (this node coordinates one
    of them, one has no live coordinator, or they have several)."""
    finder = node.groups if key_type == GROUP else node.transactions
    targets = set()
    for key in keys:
        error, broker = finder.coordinator_for(key)
        if error or broker is None:
            return None
        targets.add(broker.node_id)
    if len(targets) != 1:
        return None
    target = targets.pop()
    return None if target == node.node_id else target


def answer_timeout(api_key: int, version: int, request) -> float:
    """Seconds the coordinator may take to answer: the request's own timeout."""
    if api_key == ApiKey.JOIN_GROUP:
        waits = request.rebalance_timeout if version >= 1 else request.session_timeout
        if isinstance(waits, datetime.timedelta):
            return min(max(waits.total_seconds(), 0.0), MAX_TIMEOUT)
    return DEFAULT_TIMEOUT


def coordinated(handler):
    """`handler`, forwarded to the coordinator when another node coordinates the request."""

    async def handle(node, ctx, request):
        response = await forward_to_coordinator(node, ctx, request)
        if response is not None:
            return response
        return await handler(node, ctx, request)

    handle.__doc__ = handler.__doc__
    handle.handler = handler
    return handle


async def forward_to_coordinator(node, ctx, request):
    """The coordinator's response (a decoded body) when another node coordinates the
    request; None when it is to be handled here (see the module's docstring)."""
    if not node.config.coordinator_forwarding or is_forwarded(ctx):
        return None
    api_key, version = ctx.header.api_key, ctx.header.api_version
    keys = coordinated_keys(api_key, version, request)
    if keys is None or not keys[1]:
        return None
    target = coordinator_elsewhere(node, *keys)
    if target is None:
        return None
    deadline = trio.current_time() + answer_timeout(api_key, version, request) + ANSWER_MARGIN
    principal = ctx.principal
    envelope = EnvelopeRequest(
        request_data=bytes(ctx.frame),
        request_principal=serialize_principal(principal.principal_type, principal.name),
        client_host_address=address_bytes(ctx.client_host))
    if api_key in WAITING:
        ctx.applied()
    metrics = node.metrics
    try:
        response_data = await node.envelope_links.call(target, envelope, deadline)
        _, body = decode_response(api_key, version, response_data)
    except (ForwardingFailed, MalformedResponse) as exc:
        log.warning("forwarding api %d v%d (%s %s) to node %d failed, answered here: %s",
                    api_key, version, keys[0], keys[1][0], target, exc)
        metrics.coordinator_forward_error(target, api_key)
        return None
    metrics.coordinator_forwarded(target, api_key)
    ctx.applied()
    return body
