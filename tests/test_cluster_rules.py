"""Seed 000's rule tables as table-driven tests of the pure functions that implement them:
"Opening a bucket" (`plan_open`) and "Assignment" (`plan_orphan_moves`, `plan_rebalance`)."""

from __future__ import annotations

import uuid
from collections import Counter

import msgspec
import pytest

from mink.broker.cluster.coordinator import plan_orphan_moves, plan_rebalance
from mink.broker.cluster.sync import HELD_BY, OpenPlan, StreamInView, plan_open
from mink.storage import controlplane as md

ME, MY_EPOCH = 1, 7
GRACE = 2.0


def stream(open_: bool, by: int | None, by_epoch: int | None, opened_at: int | None,
           leader_epoch: int = 5) -> StreamInView:
    return StreamInView(leader_epoch=leader_epoch, stream_open=open_, opened_by_node=by,
                        opened_by_epoch=by_epoch, open_leader_epoch=opened_at)


# (case, stream state, live nodes -> epoch, seconds held so far, plan)
OPENING_A_BUCKET = [
    ("opened by another live node: HeldBy",
     stream(True, 2, 3, 4), {1: 7, 2: 3}, 0.0, HELD_BY),
    ("opened by another live node, still within the grace",
     stream(True, 2, 3, 4), {1: 7, 2: 3}, GRACE - 0.1, HELD_BY),
    ("opened by another live node, grace elapsed: open anyway (the epoch fences)",
     stream(True, 2, 3, 4), {1: 7, 2: 3}, GRACE, OpenPlan()),
    ("opened by a dead node: fence it, then open at the view's epoch",
     stream(True, 2, 3, 4), {1: 7}, 0.0, OpenPlan(fence=(2, 3))),
    ("opened by a dead node at the current leader epoch: fence it and take a fresh epoch",
     stream(True, 2, 3, 5), {1: 7}, 0.0, OpenPlan(fence=(2, 3), fresh_epoch=True)),
    ("opened by an earlier incarnation of a live node: that incarnation is dead",
     stream(True, 2, 3, 4), {1: 7, 2: 4}, 0.0, OpenPlan(fence=(2, 3))),
    ("opened by this node's own earlier epoch: dead, nothing to fence",
     stream(True, ME, MY_EPOCH - 1, 4), {1: 7}, 0.0, OpenPlan()),
    ("own earlier epoch at the current leader epoch: this node restarted, fresh epoch",
     stream(True, ME, MY_EPOCH - 1, 5), {1: 7}, 0.0, OpenPlan(fresh_epoch=True)),
    ("closed at the current leader epoch: this node restarted, fresh epoch, then open",
     stream(False, ME, MY_EPOCH - 1, 5), {1: 7}, 0.0, OpenPlan(fresh_epoch=True)),
    ("closed at an older epoch: open at the leader epoch of the view",
     stream(False, 2, 3, 4), {1: 7, 2: 3}, 0.0, OpenPlan()),
    ("never opened: open at the leader epoch of the view",
     stream(False, None, None, None), {1: 7}, 0.0, OpenPlan()),
    ("open by this very incarnation at this epoch (its log was closed): fresh epoch",
     stream(True, ME, MY_EPOCH, 5), {1: 7}, 0.0, OpenPlan(fresh_epoch=True)),
]


@pytest.mark.parametrize("case, state, live, held_for, plan", OPENING_A_BUCKET,
                         ids=[row[0] for row in OPENING_A_BUCKET])
def test_opening_a_bucket(case, state, live, held_for, plan):
    assert plan_open(state, ME, MY_EPOCH, live, held_for, GRACE) == plan


def make_view(leaders: list[int | None], live: list[int]) -> md.View:
    partitions = [md.PartitionRecord(i, leader, 3, "open", leader, 1, 3)
                  for i, leader in enumerate(leaders)]
    return md.View(version=1, cluster_id="c", coordinator=live[0],
                   nodes=[md.NodeInfo(n, 1, "h", 9000 + n, None, None) for n in live],
                   topics=[md.TopicView(uuid.uuid4(), "t", {}, partitions)])


def targets(moves) -> list[tuple[int, int]]:
    return [(partition, target) for _, partition, target, _ in moves]


# (event, leaders by partition (None: never led), live nodes, planner, expected moves)
ASSIGNMENT = [
    ("node stops heartbeating: its partitions to the least loaded, lowest id on ties",
     [1, 1, 2, 9, 9, 9], [1, 2, 3], plan_orphan_moves, [(3, 3), (4, 2), (5, 3)]),
    ("orphans with an empty node: it takes one, then ties go to the lowest id",
     [1, 2, 9, 9], [1, 2, 3], plan_orphan_moves, [(2, 3), (3, 1)]),
    ("node joins: nothing moves by itself",
     [1, 2, 3] * 2, [1, 2, 3, 4], plan_orphan_moves, []),
    ("no live node: nothing can move",
     [1, 2], [], plan_orphan_moves, []),
    ("rebalance: orphans first, then from above 110% to below 90%",
     [1, 1, 1, 1, 2, 9], [1, 2, 3], plan_rebalance, [(5, 3), (3, 2), (2, 3)]),
    ("rebalance of a balanced cluster moves nothing",
     [1, 2, 3, 4] * 3, [1, 2, 3, 4], plan_rebalance, []),
    ("rebalance never moves a partition that would only swap the imbalance",
     [1, 1, 2], [1, 2], plan_rebalance, []),
]


@pytest.mark.parametrize("event, leaders, live, planner, expected", ASSIGNMENT,
                         ids=[row[0] for row in ASSIGNMENT])
def test_assignment(event, leaders, live, planner, expected):
    if not live:
        view = md.View(version=1, cluster_id="c", coordinator=None, nodes=[],
                       topics=[md.TopicView(uuid.uuid4(), "t", {}, [
                           md.PartitionRecord(i, leader, 3, "open", leader, 1, 3)
                           for i, leader in enumerate(leaders)])])
    else:
        view = make_view(leaders, live)
    moves = planner(view)
    assert targets(moves) == expected
    assert all(epoch == 3 for *_, epoch in moves), "each move names the epoch it replaces"


# (event, leaders by partition, live nodes, draining nodes, planner, expected moves)
DRAINING = [
    ("a node drains (controlled shutdown, `mink cluster drain`): its partitions go to the "
     "least loaded others", [1, 1, 2, 2, 3, 3], [1, 2, 3], [2], plan_orphan_moves,
     [(2, 1), (3, 3)]),
    ("every live node drains: nothing moves between them", [1, 2], [1, 2], [1, 2],
     plan_orphan_moves, []),
    ("a dead node's partitions never go to a draining node", [1, 9, 9], [1, 2], [2],
     plan_orphan_moves, [(1, 1), (2, 1)]),
    ("every live node drains: a dead node's partitions still get a leader", [1, 9], [1], [1],
     plan_orphan_moves, [(1, 1)]),
    ("rebalance leaves a draining node out", [1, 1, 1, 1, 2, 2], [1, 2, 3], [3],
     plan_rebalance, [(3, 2)]),
    ("rebalance moves a draining node's partitions first", [1, 2, 3, 3], [1, 2, 3], [3],
     plan_rebalance, [(2, 1), (3, 2)]),
]


@pytest.mark.parametrize("event, leaders, live, draining, planner, expected", DRAINING,
                         ids=[row[0] for row in DRAINING])
def test_draining_nodes_take_no_work(event, leaders, live, draining, planner, expected):
    view = make_view(leaders, live)
    view = msgspec.structs.replace(view, nodes=[
        msgspec.structs.replace(n, draining="operator" if n.node_id in draining else None)
        for n in view.nodes])
    assert targets(planner(view)) == expected


def loads_after(view: md.View, moves) -> Counter:
    leaders = {p.partition: p.leader_node for p in view.topics[0].partitions}
    for _, partition, target, _ in moves:
        leaders[partition] = target
    return Counter(leaders.values())


def test_a_joining_node_gets_its_share_at_a_rebalance():
    view = make_view([1, 2, 3] * 4, live=[1, 2, 3, 4])
    assert loads_after(view, plan_rebalance(view)) == {1: 3, 2: 3, 3: 3, 4: 3}


def test_rebalance_ends_inside_the_band():
    view = make_view([1] * 54 + [2] * 4 + [3] * 4 + [None] * 2, live=[1, 2, 3, 4])
    moves = plan_rebalance(view)
    assert {moves[0][1], moves[1][1]} == {62, 63}, "orphans first"
    loads = loads_after(view, moves)
    assert all(0.9 * 16 <= loads[n] <= 1.1 * 16 for n in (1, 2, 3, 4)), loads


# -- the view by deltas (issue 22) -------------------------------------------------------------

def _topic(name: str, leaders: list[int | None], epoch: int = 0, topic_id=None):
    from mink.broker.cluster.view import PartitionInfo, TopicInfo

    return TopicInfo(topic_id or uuid.uuid4(), name, tuple(
        PartitionInfo(i, leader, epoch) for i, leader in enumerate(leaders)))


def test_a_view_changed_by_a_delta_equals_one_built_whole():
    """with_changes: the changed topics replaced (one deleted, one moved, two added, one of
    them before the last name), the others shared; topics stay in name order; the indexes
    (by id, partitions per leader) are those of a view built from scratch."""
    from mink.broker.cluster.view import BrokerInfo, ClusterView

    a, b, d = _topic("a", [1, 2]), _topic("b", [2]), _topic("d", [1, 1, 3])
    brokers = {1: BrokerInfo(1, "h", 1), 2: BrokerInfo(2, "h", 2)}
    before = ClusterView(version=5, cluster_id="c", brokers=brokers,
                         topics={t.name: t for t in (a, b, d)})
    assert before.leader_counts() == Counter({1: 3, 2: 2, 3: 1})
    moved_a = _topic("a", [1, 1], epoch=1, topic_id=a.topic_id)
    c, e = _topic("c", [None]), _topic("e", [2])
    after = before.with_changes(8, {1: brokers[1]}, 1, {}, [a.topic_id, b.topic_id,
                                                            c.topic_id, e.topic_id],
                                [moved_a, c, e])
    assert list(after.topics) == ["a", "c", "d", "e"]
    assert after.topics["d"] is d, "an unchanged topic is shared"
    assert after.topics["a"] is moved_a and after.topic_by_id(b.topic_id) is None
    assert after.topic_by_id(c.topic_id) is c and after.partition(d.topic_id, 2).leader == 3
    assert after.partition(d.topic_id, 3) is None
    scratch = ClusterView(version=8, cluster_id="c", brokers={1: brokers[1]},
                          topics=dict(after.topics))
    assert after.leader_counts() == scratch.leader_counts() == Counter(
        {1: 4, 3: 1, None: 1, 2: 1})
    assert not after.leads_any(5) and after.leads_any(3)
    assert (after.version, after.coordinator, list(after.brokers)) == (8, 1, [1])
    assert before.leader_counts() == Counter({1: 3, 2: 2, 3: 1}), "the old view unchanged"


def test_orphans_are_seen_from_the_leader_counts():
    from mink.broker.cluster.coordinator import orphans_in
    from mink.broker.cluster.view import BrokerInfo, ClusterView

    def view(leaders, live, draining=()):
        return ClusterView(version=1, cluster_id="c", topics={"t": _topic("t", leaders)},
                           brokers={n: BrokerInfo(n, "h", n, draining=n in draining)
                                    for n in live})

    assert not orphans_in(view([1, 2, 1], [1, 2]))
    assert orphans_in(view([1, 3], [1, 2])), "a dead leader"
    assert orphans_in(view([1, None], [1, 2])), "no leader"
    assert orphans_in(view([1, 2], [1, 2], draining=[2])), "a draining leader, 1 may take"
    assert not orphans_in(view([1, 2], [1, 2], draining=[1, 2])), "every node drains"
    assert not orphans_in(view([1], [])), "nobody to move to"
