"""The console: a read-only page for people, served by every node, showing the whole cluster.

`/console` is one self-contained HTML page (inline CSS and script, nothing from a CDN) that
polls `/console/state` every two seconds. The state is built here: nodes with epochs and
liveness (PostgreSQL's node rows and this node's view), partitions by leader with their high
watermarks (the page turns successive watermarks into rates), consumer groups with members,
assignment and lag (PostgreSQL's group rows and offsets, so any node shows every group), and
the leadership changes this node's view went through (a move whose old leader is not live
is a failover). PostgreSQL is read only while someone looks: a refresh runs at most once a
second, and only within a minute of a request for the state.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from pathlib import Path

import msgspec
import trio

from mink.protocol.consumer_protocol import assigned_partitions
from mink.storage.controlplane import MetadataError
from mink.storage.controlplane.overview import groups, high_watermarks_all

log = logging.getLogger(__name__)

PAGE = (Path(__file__).with_name("console.html")).read_bytes()
REFRESH_S = 1.0
WATCHED_S = 60.0  # refresh while the state was asked for this recently
RECENT_CHANGES = 100

_json = msgspec.json.Encoder()


class Console:
    def __init__(self, node) -> None:
        self.node = node
        self.state: bytes = _json.encode({"ready": False})
        self.changes: collections.deque[dict] = collections.deque(maxlen=RECENT_CHANGES)
        self._leaders: dict[tuple[str, int], tuple[int | None, int]] | None = None
        self._asked_at = -math.inf
        self._asked = trio.Event()

    def current(self) -> bytes:
        """The last state built; wakes the refresher when nobody looked for a while."""
        self._asked_at = trio.current_time()
        self._asked.set()
        return self.state

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_leaders)
            await self._refresh_while_watched()

    async def _watch_leaders(self) -> None:
        """In memory only, and only when the view changed: cheap enough to run always, so
        the page shows moves that happened while nobody looked."""
        seen = None
        while True:
            view = self.node.view
            if view is not seen:
                seen = view
                self._note_leadership_changes(view)
            await trio.sleep(0.25)

    async def _refresh_while_watched(self) -> None:
        while True:
            if trio.current_time() - self._asked_at > WATCHED_S:
                self._asked = trio.Event()
                await self._asked.wait()
            try:
                with trio.move_on_after(5.0):
                    await self.refresh()
            except MetadataError as exc:  # the page shows the last state and its age
                log.info("console state not refreshed: %s", exc)
            await trio.sleep(REFRESH_S)

    async def refresh(self) -> None:
        node = self.node
        rows = await node.metadata.nodes()
        watermarks = await high_watermarks_all(node.metadata)
        group_rows = await groups(node.metadata)
        view = node.view
        led = collections.Counter(p.leader for t in view.topics.values() for p in t.partitions)
        nodes = [{"node_id": n.node_id, "epoch": n.epoch, "address": f"{n.host}:{n.port}",
                  "live": n.node_id in view.brokers, "partitions_led": led.get(n.node_id, 0),
                  "coordinator": n.node_id == view.coordinator}
                 for n in sorted(rows, key=lambda n: n.node_id)]
        topics = []
        for name in sorted(view.topics):
            topic = view.topics[name]
            topics.append({"topic": name, "internal": name.startswith("__"), "partitions": [
                {"partition": p.index, "leader": p.leader, "leader_epoch": p.leader_epoch,
                 "high_watermark": watermarks.get((name, p.index), (None, None))[0],
                 "log_start": watermarks.get((name, p.index), (None, None))[1]}
                for p in topic.partitions]})
        out_groups = []
        for group in group_rows:
            owners: dict[tuple[str, int], str] = {}
            members = []
            for member in group.members:
                assignment = (assigned_partitions(member.assignment)
                              if group.protocol_type == "consumer" else None) or {}
                for topic, partitions in assignment.items():
                    for partition in partitions:
                        owners[(topic, partition)] = member.member_id
                members.append({"member_id": member.member_id, "client_id": member.client_id,
                                "client_host": member.client_host,
                                "group_instance_id": member.group_instance_id,
                                "assignment": assignment})
            offsets = []
            for topic, partition, committed in group.offsets:
                end = watermarks.get((topic, partition), (None, None))[0]
                offsets.append({"topic": topic, "partition": partition,
                                "committed_offset": committed, "high_watermark": end,
                                "lag": None if end is None else max(0, end - committed),
                                "member": owners.get((topic, partition))})
            out_groups.append({"group": group.group_id, "generation": group.generation,
                               "state": "Stable" if group.members else "Empty",
                               "members": members, "offsets": offsets,
                               "lag": sum(o["lag"] or 0 for o in offsets)})
        self.state = _json.encode({
            "ready": True, "served_by": node.node_id, "cluster_id": view.cluster_id,
            "view_version": view.version, "coordinator": view.coordinator,
            "at": time.time(), "nodes": nodes, "topics": topics, "groups": out_groups,
            "changes": list(self.changes)})

    def _note_leadership_changes(self, view) -> None:
        leaders = {(t.name, p.index): (p.leader, p.leader_epoch)
                   for t in view.topics.values() for p in t.partitions}
        previous, self._leaders = self._leaders, leaders
        if previous is None:
            return
        now = time.time()
        for key, (leader, epoch) in sorted(leaders.items()):
            before = previous.get(key)
            if before is not None and before[0] != leader:
                self.changes.appendleft({
                    "at": now, "topic": key[0], "partition": key[1], "from": before[0],
                    "to": leader, "leader_epoch": epoch,
                    "failover": before[0] is not None and before[0] not in view.brokers})
