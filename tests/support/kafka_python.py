"""kafka-python consumers in a group, and the one race of kafka-python 3.0.12 they avoid."""

from __future__ import annotations

import time


def wait_for_partitions(consumer, topic: str, timeout: float = 30) -> None:
    """Return once `consumer` (subscribed to `topic`) knows the topic's partitions; call it
    before the first poll().

    kafka-python 3.0.12 can send its first JoinGroup before its first Metadata answer; as
    the leader it then assigns nothing, and the topic's partitions arriving next start a
    rebalance. If that rebalance's SyncGroup is still in flight when a poll() times out,
    nothing completes it (need_rejoin() is False once the leader has assigned): the member
    gets no partitions, sends no heartbeats and is expelled. Known partitions avoid that
    rebalance. Kafka's default group.initial.rebalance.delay.ms (3 s) hides it; tests run
    with 0."""
    deadline = time.monotonic() + timeout
    while not consumer.partitions_for_topic(topic):
        assert time.monotonic() < deadline, f"no partitions of {topic} in kafka-python's metadata"
        time.sleep(0.05)
