"""Incremental fetch sessions (KIP-227), as Kafka's FetchSession and FetchManager keep them.

A consumer with many partitions otherwise names every one of them in every Fetch, and every
answer names them all again. With a session, the broker remembers the partitions and their
fetch positions: the client sends only what changed (partitions added, positions moved,
partitions forgotten), and the broker answers only partitions with something new (records, a
changed high watermark or log start, an error).

The request's (session_id, session_epoch) says which kind of fetch it is:
- epoch -1 (FINAL): a full fetch with no session; a session it names is closed.
- epoch 0 (INITIAL): a full fetch that opens a new session (closing the one it names), if
  the cache has room; otherwise it is answered as a full fetch with session id 0.
- epoch > 0: an incremental fetch in the session named, whose next epoch it must be
  (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH otherwise).

The cache is per node, bounded (`max.incremental.fetch.session.cache.slots`); a full cache
evicts its least recently used session once that one has been idle for
`min.incremental.fetch.session.eviction.ms`, Kafka's rule for sessions of equal standing.
Sessions are node-wide, not tied to a connection, as in Kafka.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1


def next_epoch(epoch: int) -> int:
    """FetchMetadata.nextEpoch: epochs wrap to 1, never 0 (which means "new session")."""
    return 1 if epoch >= 2**31 - 1 else epoch + 1


class CachedPartition:
    """A partition of a session: the position the client last sent, and what the broker last
    told it, so that an incremental answer leaves it out when nothing changed."""

    __slots__ = ("partition", "fetch_offset", "partition_max_bytes", "current_leader_epoch",
                 "high_watermark", "log_start_offset")

    def __init__(self, request) -> None:
        self.partition = request.partition
        self.high_watermark = -1  # never answered yet: the first answer always includes it
        self.log_start_offset = -1
        self.update(request)

    def update(self, request) -> None:
        self.fetch_offset = request.fetch_offset
        self.partition_max_bytes = request.partition_max_bytes
        self.current_leader_epoch = getattr(request, "current_leader_epoch", -1)

    def must_respond(self, has_records: bool, error, high_watermark: int,
                     log_start_offset: int) -> bool:
        """Kafka's CachedPartition.maybeUpdateResponseData, updating the cached answer."""
        respond = has_records
        if high_watermark != self.high_watermark:
            respond, self.high_watermark = True, high_watermark
        if log_start_offset != self.log_start_offset:
            respond, self.log_start_offset = True, log_start_offset
        if error:
            # sent every time it is there; a -1 watermark resends the partition once it clears
            respond, self.high_watermark = True, -1
        return respond


class FetchSession:
    __slots__ = ("id", "epoch", "uses_topic_ids", "partitions", "last_used")

    def __init__(self, session_id: int, uses_topic_ids: bool, now: float) -> None:
        self.id = session_id
        self.epoch = next_epoch(INITIAL_EPOCH)  # the epoch the next request must carry
        self.uses_topic_ids = uses_topic_ids
        # (topic name or topic id, partition) -> CachedPartition, in the order answers are
        # built: a partition answered moves to the end, so a response full at max_bytes
        # starts with the others next time (Kafka's round robin within a session)
        self.partitions: OrderedDict[tuple[Hashable, int], CachedPartition] = OrderedDict()
        self.last_used = now

    def answered(self, key: tuple[Hashable, int]) -> None:
        self.partitions.move_to_end(key)


class FetchSessionCache:
    def __init__(self, max_slots: int, eviction_s: float, rng: random.Random | None = None):
        self.max_slots = max_slots
        self.eviction_s = eviction_s
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()  # least recent first
        self._rng = rng or random.Random()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def partitions_cached(self) -> int:
        return sum(len(s.partitions) for s in self._sessions.values())

    def get(self, session_id: int, now: float) -> FetchSession | None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_used = now
            self._sessions.move_to_end(session_id)
        return session

    def remove(self, session_id: int) -> None:
        self._sessions.pop(session_id, None)

    def create(self, uses_topic_ids: bool, now: float) -> FetchSession | None:
        """A new session, or None when the cache is full of sessions still in use."""
        if self.max_slots <= 0:
            return None
        if len(self._sessions) >= self.max_slots:
            oldest_id, oldest = next(iter(self._sessions.items()))
            if now - oldest.last_used < self.eviction_s:
                return None
            del self._sessions[oldest_id]
            self.evictions += 1
        session_id = self._rng.randint(1, 2**31 - 1)
        while session_id in self._sessions:
            session_id = self._rng.randint(1, 2**31 - 1)
        session = FetchSession(session_id, uses_topic_ids, now)
        self._sessions[session_id] = session
        return session
