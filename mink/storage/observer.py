"""What storage reports for metrics, without knowing who listens: the node passes in an
object with these methods (mink.broker.admin.metrics implements them); storage never
imports the broker. The defaults do nothing. Every call is on the trio thread, once per WAL
upload, commit or partition open/close, never per batch or record."""

from __future__ import annotations

import uuid


class StorageObserver:
    def wal_uploaded(self, size: int, seconds: float, failed: bool) -> None:
        """A WAL object's upload ended (`size` bytes with its footer)."""

    def wal_committed(self, seconds: float, accepted: int, refused: list[str]) -> None:
        """A CommitWal's outcome is known, `seconds` after it was first sent (repeats of an
        in-doubt commit included): `accepted` ranges committed, one refusal reason per
        range refused (`rejected_by_postgresql` for a statement PostgreSQL refused)."""

    def wal_commit_in_doubt(self) -> None:
        """A CommitWal attempt ended without a known outcome (timeout, lost connection)."""

    def partition_opened(self, topic_id: uuid.UUID, partition: int, leader_epoch: int) -> None:
        """This node opened a partition as its leader."""

    def partition_closed(self, topic_id: uuid.UUID, partition: int, reason: str) -> None:
        """This node stopped leading a partition (moved, fenced, refused at commit)."""


NO_OBSERVER = StorageObserver()
