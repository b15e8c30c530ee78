"""Fetch through any node (issue 25): the replica views of the partitions this node serves
consumer Fetches of without leading them, and how they learn of new commits.

A view (mink/storage/replica.py) opens at the first Fetch that needs it and is dropped after
`replica_view_idle_ms` without one; its reads go through the node's read caches, so its
memory is theirs (bounded in bytes), plus a few hundred bytes a view.

Learning of commits: a WAL commit writes no change-log row and no NOTIFY, so a non-leader
polls. One task per node runs one batched read (`partition_ends`) every
`replica_fetch_poll_ms` of the ends of only the partitions that long-polling Fetches are
waiting on right now, shared by every Fetch waiting on the node: N consumers waiting on the
same or different partitions cost one query per interval, none when nobody waits. A commit on
the leader is seen by a waiting Fetch at most one interval (plus a query) later. A Fetch that
does not wait reads the ends again itself when the view's are older than one interval, in
one batched query for all its partitions (so a busy consumer costs at most about one query
per interval too)."""

from __future__ import annotations

import logging
import uuid

import trio

from mink.storage.controlplane import MetadataError
from mink.storage.controlplane.replicas import partition_ends
from mink.storage.log import NotLeader
from mink.storage.replica import ReplicaView

log = logging.getLogger(__name__)

REFRESH_TIMEOUT = 1.0  # s: how long a Fetch waits for fresher ends of views it has


class ReplicaReads:
    def __init__(self, node) -> None:
        self.node = node
        self.views: dict[tuple[uuid.UUID, int], ReplicaView] = {}
        self._someone_waits = trio.Event()
        self.queries = 0       # reads of partition ends (polls and refreshes), for metrics
        self.polls = 0         # of which by the poller
        self.fetches_served = 0  # partitions of Fetches served from a view

    @property
    def poll_interval(self) -> float:
        return self.node.config.replica_fetch_poll_ms / 1000

    @property
    def idle_time(self) -> float:
        return self.node.config.replica_view_idle_ms / 1000

    async def views_for(self, keys: list[tuple[uuid.UUID, int]],
                        max_age: float | None = None) -> dict:
        """The views of these partitions, opened if new and with ends no older than
        `max_age` (one poll interval by default; one batched read for those that are
        not), except those Fetches wait on: the poller reads them every interval. A
        partition PostgreSQL does not know, or a read that failed, gets no view (the caller
        answers NOT_LEADER_OR_FOLLOWER)."""
        max_age = self.poll_interval if max_age is None else max_age
        streams = self.node.streams
        if streams is None:
            return {}
        now = trio.current_time()
        stale = []
        for key in keys:
            view = self.views.get(key)
            if view is not None and view.caches is not streams.caches:
                view.close(_gone())  # a new node incarnation: new caches
                del self.views[key]
                view = None
            if view is None or max_age == 0 or (
                    # a view Fetches wait on is the poller's to refresh
                    not view.waiters and now - view.learned_at >= max_age):
                stale.append(key)
        if stale:
            # Views it has are served with the ends they know if PostgreSQL is slow to
            # answer: a Fetch waits no longer than REFRESH_TIMEOUT for fresher ones.
            timeout = (REFRESH_TIMEOUT if all(k in self.views for k in stale)
                       else self.node.config.commit_timeout)
            try:
                await self._learn(stale, open_new=True, timeout=timeout)
            except (MetadataError, trio.TooSlowError) as exc:
                log.debug("reading partition ends for replica views: %r", exc)
        found = {}
        for key in keys:
            view = self.views.get(key)
            if view is not None:
                view.used_at = now
                found[key] = view
        return found

    def waiting(self) -> None:
        """A Fetch registered a waiter on a view: the poller polls."""
        self._someone_waits.set()

    async def _learn(self, keys: list, open_new: bool = False,
                     timeout: float | None = None) -> None:
        self.queries += 1
        with trio.fail_after(self.node.config.commit_timeout if timeout is None else timeout):
            ends = await partition_ends(self.node.metadata, keys)
        streams = self.node.streams
        now = trio.current_time()
        for key, (end, start, epoch, unstable) in ends.items():
            view = self.views.get(key)
            if view is not None:
                view.learned(end, start, epoch, now, unstable)
            elif open_new and streams is not None:
                self.views[key] = ReplicaView(key[0], key[1], epoch, end, start,
                                              streams.caches, now, unstable)

    async def run(self) -> None:
        """The poller: while Fetches wait on views, one read per interval of their ends;
        views idle for `replica_view_idle_ms` are dropped."""
        while True:
            waited_on = [key for key, view in self.views.items() if view.waiters]
            if waited_on:
                self.polls += 1
                try:
                    await self._learn(waited_on)
                except (MetadataError, trio.TooSlowError) as exc:
                    log.debug("polling partition ends: %r", exc)
                await trio.sleep(self.poll_interval)
                continue
            self._drop_idle()
            self._someone_waits = trio.Event()
            with trio.move_on_after(max(self.idle_time / 2, self.poll_interval)):
                await self._someone_waits.wait()

    def _drop_idle(self) -> None:
        now = trio.current_time()
        for key, view in list(self.views.items()):
            if not view.waiters and now - view.used_at >= self.idle_time:
                view.close(_gone())
                del self.views[key]


def _gone() -> NotLeader:
    return NotLeader("replica view dropped")
