"""KIP-848 consumer groups: the assignors and the reconciliation state machine (pure), and
confluent-kafka consumers with group.protocol=consumer against a real node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import trio
from kio.schema.errors import ErrorCode

from mink.broker.groups.assignors import range_, uniform
from mink.broker.groups.reconciliation import MemberState, Reconciled, reconcile
from mink.client import BlockingKafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested
from tests.test_interop import confluent_produce

HEARTBEAT_MS = 300
SESSION_MS = 3000
CONSUMER = Path(__file__).parent / "support" / "kip848_consumer.py"
TIMEOUT = 60


@pytest.fixture
def node_settings() -> dict:
    return dict(num_partitions=12, offsets_topic_num_partitions=3,
                group_consumer_heartbeat_interval_ms=HEARTBEAT_MS,
                group_consumer_session_timeout_ms=SESSION_MS)


# ---------------------------------------------------------------------------------------------
# Consumers in subprocesses


class ConsumerProcess:
    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        self.name = name
        self.events: list[dict] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(CONSUMER), bootstrap, group, topic],
            stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            event = json.loads(line)
            event["at"] = time.monotonic()
            self.events.append(event)

    def of(self, kind: str) -> list[dict]:
        return [e for e in list(self.events) if e["event"] == kind]

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for e in list(self.events):
            if e["event"] == "assigned":
                owned |= set(e["partitions"])
            elif e["event"] in ("revoked", "lost"):
                owned -= set(e["partitions"])
        return owned

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self._reader.join(5)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)


async def wait_for(predicate, timeout: float = TIMEOUT, what: str = "condition"):
    deadline = trio.current_time() + timeout
    while not predicate():
        if trio.current_time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await trio.sleep(0.05)


async def test_one_consumer_consumes(node):
    topic = "kip848-one"
    await trio.to_thread.run_sync(lambda: confluent_produce(
        node, topic, [{"value": str(i).encode(), "partition": i % 12} for i in range(120)]))
    c = ConsumerProcess(node, "g-one", topic, "a")
    try:
        await wait_for(lambda: len(c.of("message")) >= 120, what="120 messages")
        assert c.owned() == set(range(12))
    finally:
        c.stop()
