"""Liveness and readiness, as orchestrators probe them.

/healthz says only that the process runs and its event loop answers: it never touches
PostgreSQL or the object store, so an outage of either does not make an orchestrator
restart every node (nodes ride out such outages by themselves). /readyz says whether the
node serves Kafka clients now: registered, its view loaded, not self-fenced.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Readiness:
    registered: bool
    view_loaded: bool
    not_fenced: bool

    @property
    def ready(self) -> bool:
        return self.registered and self.view_loaded and self.not_fenced


def readiness(node) -> Readiness:
    """Read from the node's own state only: no await, no outside call."""
    registered = node.ready.is_set() and node.membership.node_epoch > 0
    view_loaded = node.view.version >= 0 and node.node_id in node.view.brokers
    # may_lead: leading (registered again after any fence) and within the validity
    # deadline of its last successful renewal.
    return Readiness(registered, view_loaded, node.membership.may_lead())
