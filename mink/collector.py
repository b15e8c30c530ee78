"""Python's garbage collector as a node runs it.

A full collection scans every tracked object with the event loop stopped, so a node's
settings keep full passes rare and short: fewer, larger young collections (a node allocates
many short-lived objects per request), and what start-up built frozen out of the scans
(DESIGN, "Performance notes"). Benchmarks of a node's parts run under the same settings, or
they measure collector pauses a node does not have."""

from __future__ import annotations

import gc

THRESHOLDS = (20_000, 20, 20)


def tune() -> None:
    gc.set_threshold(*THRESHOLDS)


def freeze_heap() -> None:
    """Keep everything alive now out of later full collections."""
    gc.collect()
    gc.freeze()
