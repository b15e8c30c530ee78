"""The node's client quotas (Kafka's ClientQuotaManager, one per quota type).

Quotas live in PostgreSQL (`client_quotas`, sql/0015_quotas.sql); every node reads them all
again whenever its view version moves (`refresh`, called by the sync task after each view
refresh: a change's change-log row and NOTIFY reach every node within a sync, about a
second). Each node measures and enforces on its own, as each Kafka broker does: a quota is
per node.

A request is charged after its handler ran, as Kafka's KafkaApis does: a Produce its
request's bytes (`producer_byte_rate`), a Fetch the bytes of its response
(`consumer_byte_rate`; a Fetch that would pass the quota is answered empty instead, the
bytes unrecorded, as Kafka does), every request its handler time (`request_percentage`).
The throttle time is the largest of the violated quotas'; the connection sends it in
`throttle_time_ms` and mutes itself that long (`mink/broker/server/connection.py`).
"""

from __future__ import annotations

import logging
import math

import trio

from mink.broker.quotas.entities import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    Entity,
    resolve,
)
from mink.broker.quotas.rate import Rate, throttle_time
from mink.broker.quotas.request_time import HandlerTime
from mink.storage.controlplane import MetadataUnavailable
from mink.storage.controlplane.quotas import alter_client_quotas, client_quotas

log = logging.getLogger(__name__)

__all__ = ["ClientQuotaManager", "QuotaManager"]

# Sensors idle this long are dropped (Kafka expires them after an hour); a sensor idle past
# its windows measures zero anyway.
SENSOR_IDLE_S = 3600.0
MAX_SENSORS = 10_000


class ClientQuotaManager:
    """One quota type: its limits per entity and a Rate per metric-tags (user, client id)."""

    def __init__(self, quota_type: str, key: str, samples: int, window: float, *,
                 max_throttle: float | None = None) -> None:
        self.quota_type = quota_type  # Kafka's QuotaType: Produce, Fetch, Request
        self.key = key
        self.samples = samples
        self.window = window
        # Kafka caps the request quota's throttle at one window (ClientRequestQuotaManager)
        # and leaves the byte-rate quotas' uncapped (ClientQuotaManager).
        self.max_throttle = max_throttle
        self.limits: dict[Entity, float] = {}
        self._sensors: dict[tuple[str, str], Rate] = {}
        self._resolved: dict[tuple[str, str], tuple[float, tuple[str, str]] | None] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.limits)

    def set_limits(self, limits: dict[Entity, float]) -> None:
        self.limits = limits
        self._resolved.clear()  # sensors stay: a changed quota keeps the rate measured

    def quota(self, user: str, client_id: str) -> tuple[float, tuple[str, str]] | None:
        key = (user, client_id)
        try:
            return self._resolved[key]
        except KeyError:
            if len(self._resolved) >= MAX_SENSORS:  # client ids churning: start over
                self._resolved.clear()
            found = self._resolved[key] = resolve(self.limits, user, client_id)
            return found

    def _sensor(self, tags: tuple[str, str], now: float) -> Rate:
        rate = self._sensors.get(tags)
        if rate is None:
            if len(self._sensors) >= MAX_SENSORS:
                self._expire(now)
            rate = self._sensors[tags] = Rate(self.samples, self.window)
        return rate

    def _expire(self, now: float) -> None:
        idle = min(SENSOR_IDLE_S, self.samples * self.window)
        for tags in [t for t, r in self._sensors.items() if now - r.last_recorded > idle]:
            del self._sensors[tags]

    def record(self, user: str, client_id: str, value: float, now: float) -> float:
        """Charge `value`; the throttle in seconds (0 within the quota)."""
        found = self.quota(user, client_id)
        if found is None:
            return 0.0
        bound, tags = found
        rate = self._sensor(tags, now)
        rate.record(value, now)
        throttle = throttle_time(rate, bound, now)
        if self.max_throttle is not None:
            throttle = min(throttle, self.max_throttle)
        return throttle

    def unrecord(self, user: str, client_id: str, value: float, now: float) -> None:
        found = self.quota(user, client_id)
        if found is not None:
            self._sensor(found[1], now).record(-value, now)

    def max_value_in_window(self, user: str, client_id: str) -> float:
        """The most one request may take without being throttled for certain (Kafka bounds
        a Fetch's size by it): the quota over samples - 1 windows."""
        found = self.quota(user, client_id)
        if found is None:
            return math.inf
        return found[0] * (self.samples - 1) * self.window


class QuotaManager:
    """The three quota types of a node, the stored entities, and the handler timer."""

    def __init__(self, node) -> None:
        self.node = node
        samples = node.config.quota_window_num
        window = node.config.quota_window_size_seconds
        self.produce = ClientQuotaManager("Produce", PRODUCER_BYTE_RATE, samples, window)
        self.fetch = ClientQuotaManager("Fetch", CONSUMER_BYTE_RATE, samples, window)
        self.request = ClientQuotaManager("Request", REQUEST_PERCENTAGE, samples, window,
                                          max_throttle=window)
        # entity -> {key: value}, as stored (DescribeClientQuotas answers from it)
        self.entities: dict[Entity, dict[str, float]] = {}
        self.loaded_version = -1
        self.timer: HandlerTime | None = None  # installed while request quotas exist

    # -- from PostgreSQL ---------------------------------------------------------------------

    async def refresh(self, view_version: int) -> None:
        """Read every quota again if the view moved since the last read."""
        if view_version == self.loaded_version:
            return
        rows = await client_quotas(self.node.metadata)
        entities: dict[Entity, dict[str, float]] = {}
        for user_part, client_part, key, value in rows:
            entities.setdefault((user_part, client_part), {})[key] = float(value)
        self.apply(entities)
        self.loaded_version = view_version

    def apply(self, entities: dict[Entity, dict[str, float]]) -> None:
        if entities != self.entities:
            log.info("client quotas: %d entities", len(entities))
        self.entities = entities
        for manager in (self.produce, self.fetch, self.request):
            manager.set_limits({e: v[manager.key] for e, v in entities.items()
                                if manager.key in v})
        self._install_timer(self.request.enabled)

    async def alter(self, ops) -> None:
        """Store validated ops (QuotaOp tuples), then read them back at once on this node."""
        version = await alter_client_quotas(self.node.metadata, ops)
        try:
            await self.node.sync.refresh_view()  # this node at once; the others by NOTIFY
        except MetadataUnavailable as exc:  # stored; the sync loop catches up
            log.warning("view refresh after a quota change failed: %s (version %d)", exc,
                        version)

    # -- the handler timer -------------------------------------------------------------------

    def _install_timer(self, wanted: bool) -> None:
        try:
            if wanted and self.timer is None:
                self.timer = HandlerTime()
                trio.lowlevel.add_instrument(self.timer)
            elif not wanted and self.timer is not None:
                timer, self.timer = self.timer, None
                trio.lowlevel.remove_instrument(timer)
        except RuntimeError:  # outside a trio run (unit tests of the rules)
            pass

    async def run(self) -> None:
        """Owns the timer's lifetime: removed when the node stops."""
        try:
            await trio.sleep_forever()
        finally:
            self._install_timer(False)

    # -- charging requests -------------------------------------------------------------------

    def record_produce(self, user: str, client_id: str, size: int, now: float) -> float:
        if not self.produce.limits:
            return 0.0
        return self.produce.record(user, client_id, size, now)

    def record_request_time(self, user: str, client_id: str, seconds: float,
                            now: float) -> float:
        if not self.request.limits:
            return 0.0
        return self.request.record(user, client_id, seconds * 100.0, now)

    def record_request_time_no_throttle(self, user: str, client_id: str, seconds: float,
                                        now: float) -> None:
        if self.request.limits:
            self.request.record(user, client_id, seconds * 100.0, now)
