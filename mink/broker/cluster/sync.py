"""Seed 000's "opening a bucket" as a pure function.

Each node tails the view; for a partition it should lead but has not open, `plan_open`
decides from the stream state in the view what to do before opening. The sync loop in
`mink.broker.node` applies the plan (fence, fresh epoch, open) with PostgreSQL's fenced
operations; nothing here does I/O.

| stream state in the view                      | plan                                        |
| --------------------------------------------- | ------------------------------------------- |
| opened by another node that is live           | HeldBy: retry at the next sync              |
|   ... and still so after the grace            | open anyway (the epoch fence keeps it safe) |
| opened by a node that is dead                 | fence that node's epoch, then open          |
| opened by another incarnation of a live node  | that incarnation is dead: fence it, open    |
| opened by this node's own earlier epoch       | dead too (nothing to fence: re-registering  |
|                                               | raised the epoch), then as below            |
| opened or closed at the current leader epoch  | this node (or the opener) ran at this epoch |
|                                               | before: take a fresh leader epoch, open     |
| closed at an older epoch                      | open at the leader epoch of the view        |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamInView:
    """What the view says of one partition's stream."""

    leader_epoch: int  # the partition's current leader epoch
    stream_open: bool
    opened_by_node: int | None
    opened_by_epoch: int | None
    open_leader_epoch: int | None  # the leader epoch it was last opened at


@dataclass(frozen=True)
class OpenPlan:
    held_by: bool = False  # leave it to its opener for now; retry at the next sync
    fence: tuple[int, int] | None = None  # (node, node epoch) to fence before opening
    fresh_epoch: bool = False  # take a new leader epoch (expecting the view's) before opening


HELD_BY = OpenPlan(held_by=True)


def plan_open(stream: StreamInView, node_id: int, node_epoch: int,
              live_epochs: Mapping[int, int], held_for: float, grace: float) -> OpenPlan:
    """The plan for opening `stream` on node (`node_id`, `node_epoch`).

    `live_epochs` maps each live node to its current epoch; `held_for` is how long this
    node has found the stream held by its live opener (0 the first time).
    """
    fence = None
    opener = (stream.opened_by_node, stream.opened_by_epoch)
    if stream.stream_open and opener != (node_id, node_epoch):
        other = stream.opened_by_node
        if other != node_id and live_epochs.get(other) == stream.opened_by_epoch:
            if held_for < grace:
                return HELD_BY  # the opener has not seen the move yet
        elif other != node_id and other is not None:
            fence = (other, stream.opened_by_epoch)  # its late commits must be refused
    fresh = stream.open_leader_epoch == stream.leader_epoch
    return OpenPlan(fence=fence, fresh_epoch=fresh)
