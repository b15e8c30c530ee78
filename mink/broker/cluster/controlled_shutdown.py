"""Controlled shutdown (Kafka's `controlled.shutdown`; KRaft's "wantShutDown"): a node that is
asked to stop hands its work over before it leaves, so a node kept down for an upgrade costs
clients one metadata refresh, not `lease_ttl`.

1. The node marks itself draining in PostgreSQL ('shutdown', fenced by its node epoch; a
   change-log row). From then on it takes no new work: no new partitions, no coordinator
   lease (`ClusterCoordinator.hold_lease`).
2. The coordinator lease holder, woken by that row, moves every partition the node leads
   (the `__consumer_offsets` and `__transaction_state` partitions too, and with them group
   and transaction coordination) to the other live nodes, one fenced LeadBucket each, at
   fresh leader epochs (`plan_orphan_moves`). When the draining node is the holder itself it
   makes these moves under its own lease, then releases the lease for another node.
3. The node's sync sees the moves, closes its logs (appends not yet in a WAL object fail
   with NOT_LEADER_OR_FOLLOWER, clients refresh their metadata and retry at the new leader)
   and marks the streams closed, so the new leaders open them at once.
4. It waits until every partition it led is open by its new leader at its new epoch, and
   for the WAL objects still on their way to be decided, so in-flight produce requests get
   their real answer; then the node leaves as before (leases released, membership expired).

Every wait is bounded by `controlled_shutdown_timeout_ms`; past it (or on a second signal)
the node stops at once, as it did before: its partitions then move after `lease_ttl`.
"""

from __future__ import annotations

import logging

import trio

from mink.storage import controlplane as md

log = logging.getLogger(__name__)

# How often the hand-over's progress is read (one small statement).
POLL = 0.025
# After the last WAL object was decided: time for handlers to write their answers.
ANSWER_GRACE = 0.1


async def stop_in_node(node, timeout: float) -> None:
    """Ask the node for a controlled shutdown and wait for it (for `mink serve`). It runs in
    the node's own task (`serve_shutdown_requests`), where the node's trio_asyncio loop is
    current, which the metadata store's calls need."""
    node.shutdown_requested.set()
    with trio.move_on_after(timeout + 1):
        await node.handed_over.wait()


async def serve_shutdown_requests(node) -> None:
    """In the node's nursery: wait for a shutdown request, then hand everything over."""
    await node.shutdown_requested.wait()
    try:
        await controlled_shutdown(node, node.config.controlled_shutdown_timeout_ms / 1000)
    finally:
        node.handed_over.set()


async def controlled_shutdown(node, timeout: float) -> bool:
    """Hand this node's partitions over to the other live nodes, bounded by `timeout`
    seconds. True if everything was open elsewhere in time (or there was nothing to hand
    over), False if the node stops without (timeout, no other node, PostgreSQL down)."""
    node.stopping = True
    started = trio.current_time()
    with trio.move_on_after(timeout) as scope:
        try:
            done = await _hand_over(node)
        except md.MetadataError as exc:
            log.warning("controlled shutdown: %s; stopping without it", exc)
            return False
    if scope.cancelled_caught:
        log.warning("controlled shutdown: partitions not all open elsewhere within %.1fs; "
                    "stopping anyway (the rest move after lease_ttl)", timeout)
        return False
    if done:
        log.info("controlled shutdown: everything handed over in %.3fs",
                 trio.current_time() - started,
                 extra={"event": "controlled_shutdown",
                        "seconds": round(trio.current_time() - started, 3)})
    return done


async def _hand_over(node) -> bool:
    if not node.membership.may_lead() or node.streams is None:
        return False  # not leading anything: nothing to hand over
    me = node.node_id
    if not [b for b in node.view.assignable if b != me]:
        log.info("controlled shutdown: no other node takes work; leaving at once")
        return False
    led = [(t.topic_id, p.index) for t in node.view.topics.values() for p in t.partitions
           if p.leader == me]
    if not await node.metadata.drain_node(me, node.membership.node_epoch, "shutdown"):
        return False  # this registration is not current any more: nothing of ours to move
    log.info("controlled shutdown: asking the coordinator to move %d partitions", len(led),
             extra={"event": "controlled_shutdown_started", "partitions": len(led)})
    node.coordinator.wake()  # the holder itself moves its partitions, then hands the lease on
    while await node.metadata.not_handed_over(me, led):
        await trio.sleep(POLL)
    await node.sync.refresh_view()  # close what moved now, not at the next sync
    streams = node.streams
    while streams is not None and streams.wal.objects_in_flight:
        await trio.sleep(POLL)  # in-flight appends get their real outcome
    await trio.sleep(ANSWER_GRACE)
    return True
